"""Load on `keras-transformer-serve`: sentences/s and latency under concurrent clients,
against the same export translated directly (`OnnxTranslator`, batches of 32) in one run.

    python benchmarks/serve_load.py saved_models/transformer_de_en/onnx/1 --clients 1 8 32 128 \
        --signatures serving_default translate_greedy --batching on off
    python benchmarks/serve_load.py EXPORT --clients 128 --seconds 600   # the soak
    python benchmarks/serve_load.py EXPORT --clients 128 --seconds 600 --workers 2 \
        --threads 1 --kill-worker-every 120   # the soak, one worker SIGKILLed every 2 min
    python benchmarks/serve_load.py EXPORT --clients 128 --seconds 600 --workers 2 \
        --threads 1 --kill-worker-every 120 --abuse-share 0.1 --out results.json
        # the soak with 10% of the clients sending bad requests

The server runs in a process of its own on a local port; each client thread
sends one sentence per request (TF Serving's `{"instances": [s]}`), the next
as soon as the last is answered, for `--seconds`; sentences are Ding's
validation sentences (or `--sentences FILE`, one per line). Reports per
client count: requests/s, sentences/s, latency p50/p90/p99, errors, and
the server's batches (from its metadata) and its resident memory before
and after each row (`/proc`). `--batching off` starts the server with
`--max-batch 1 --max-wait-ms 0` (one request per call). `--workers`, `--threads`,
`--engine` and `--precision` are the server's (default: one worker on all cores, as
the rows of docs/serving.md were measured). The direct row is the ceiling:
the same sentences translated in batches without HTTP (`--no-direct` skips
it). Errors are counted by kind: the HTTP status the server answered (a 503
without `Retry-After` apart, `503 without Retry-After`), `hung` (no answer
within `--request-timeout`), `connection` (refused or reset) and `bad answer`
(not HTTP, or a 200 that is not JSON). The well-formed clients' outcomes are
counted in full (`well_formed`: sent, answered_200, refused_503, every other
outcome by kind), and each row ends with a verdict: whether every well-formed
request that was not refused with 503 + Retry-After (a full queue or a
killed worker: the documented outcome) got 200.
Each row also says where the CPU went: the clients' process and the server's
processes, in cores busy on average (the clients share the server's cores
unless pinned elsewhere). `--kill-worker-every S` SIGKILLs one of the
server's worker processes (taken from its metadata, in turn) every S
seconds during each row, and records when and which.

`--abuse-share F` makes that share of the client threads (rounded, at least
one when F > 0) abusers: each sends the bad requests of `ABUSE_CASES` in
turn, one at a time, each with `--abuse-timeout` seconds to be answered, for
the whole row. Their outcomes are counted per case, apart from the
well-formed clients': the status answered, `timeout` (no answer in time;
for `slow_body`, the connection still held open without an answer after
12 s), `closed` (the server closed the connection without an answer) or
`connection` (refused or reset); a 5xx is also counted as the case's
`server_error`. The cases: `banned_40k` (40,000 banned phrases),
`glossary_shared_first_word` (20,000 glossary terms starting with the same
word), `big_work` (256 sentences of 2,000 characters with beam 4),
`content_length_lie` (Content-Length: 10^9 and 10 bytes of body, then
waiting for the answer), `slow_body` (a valid body one byte every 0.5 s),
`beam_bool`, `beam_float`, `alpha_nan`, `alpha_inf`, `topk_overflow` (2^31),
`deep_json` (50,000 nested lists), `lone_surrogate` (`"\\ud800"`),
`text_plain_cross_origin` (a valid body as text/plain from another Origin),
`bad_host` (`Host: evil.example`), `no_such_path` (a GET) and `b64`
(`{"b64": ...}` instances, valid TF Serving input).

The resident memory of the server process and of each of its workers (from
its metadata, or its child processes when that does not answer in 5 s) is
sampled every `--sample-every` seconds during each row (`memory.samples`);
the row reports the server process's mean RSS over the row's first and last
minute and the growth between, and the same for server + workers.
`--out FILE` (or `--json FILE`) writes all of it as JSON. Run alone on the
machine; the CPU is named in the output.
"""

import argparse
import base64
import http.client
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# The bad requests the abusers send, in turn (see the module's docstring).
ABUSE_CASES = (
    "banned_40k", "glossary_shared_first_word", "big_work", "content_length_lie",
    "slow_body", "beam_bool", "beam_float", "alpha_nan", "alpha_inf", "topk_overflow",
    "deep_json", "lone_surrogate", "text_plain_cross_origin", "bad_host", "no_such_path",
    "b64",
)  # fmt: skip


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("export_dir")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--signatures", nargs="+", default=["serving_default"],
        help="serving_default (the export's beam) and/or translate_greedy",
    )  # fmt: skip
    parser.add_argument("--batching", nargs="+", default=["on"], choices=("on", "off"))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1, help="the server's --workers")
    parser.add_argument("--threads", type=int, default=0, help="the server's --threads")
    parser.add_argument("--engine", default="onnx", help="the server's --engine")
    parser.add_argument("--precision", default="float32", help="the server's --precision")
    parser.add_argument("--sentences", help="one sentence per line (default: Ding's validation)")
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=120.0,
        help="seconds a client waits for an answer before counting it hung",
    )
    parser.add_argument(
        "--kill-worker-every",
        type=float,
        default=0.0,
        help="SIGKILL one server worker every this many seconds (0: never)",
    )
    parser.add_argument(
        "--abuse-share", type=float, default=0.0,
        help="this share of the clients (at least one when > 0) send bad requests",
    )  # fmt: skip
    parser.add_argument(
        "--abuse-timeout", type=float, default=10.0,
        help="seconds an abuser waits for the answer to each bad request",
    )  # fmt: skip
    parser.add_argument(
        "--sample-every", type=float, default=10.0,
        help="seconds between samples of the server's and its workers' memory",
    )  # fmt: skip
    parser.add_argument(
        "--no-direct",
        action="store_true",
        help="skip the direct OnnxTranslator row (e.g. for CTranslate2)",
    )
    parser.add_argument(
        "--out", "--json", dest="json", metavar="FILE", help="write the results here (JSON)"
    )
    args = parser.parse_args(argv)
    if not 0.0 <= args.abuse_share <= 1.0:
        parser.error(f"--abuse-share must be between 0 and 1, not {args.abuse_share}")
    if args.sample_every <= 0:
        parser.error("--sample-every must be positive")
    return args


def _sentences(path):
    if path:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    from keras_transformer.data.sources import load_translation_data

    return [source for source, _ in load_translation_data("ding").splits["validation"]]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid):
    """The child processes of `pid` (`/proc`; FileNotFoundError once it is gone)."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children.extend(int(child) for child in f.read().split())
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return children


def _tree_sum(pid, read):
    """`read(pid)` summed over a process and its living descendants (`/proc`)."""
    total, pids = 0.0, [pid]
    while pids:
        current = pids.pop()
        try:
            total += read(current)
            pids.extend(_children(current))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _process_rss_mib(pid):
    """Resident memory of one process, in MiB (`VmRSS`; FileNotFoundError once gone)."""
    with open(f"/proc/{pid}/status") as f:
        return sum(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024


def _rss_mib(pid):
    """Resident memory of the server and its worker processes (their sum), in MiB."""
    return _tree_sum(pid, _process_rss_mib)


def _tree_cpu_seconds(pid):
    """User + system CPU seconds of a process and its living descendants (a killed
    worker's time is lost with it, so a row with kills under-counts the server)."""

    def cpu(current):
        with open(f"/proc/{current}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    return _tree_sum(pid, cpu)


def _machine_busy_seconds():
    """CPU seconds the whole machine spent not idle (every process, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _metadata(port, name, timeout=30):
    url = f"http://127.0.0.1:{port}/v1/models/{name}/metadata"
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)["server"]


def _killer(port, name, every, stop, kills):
    """SIGKILL the server's workers in turn, one every `every` seconds, until `stop`."""
    turn = 0
    while not stop.wait(every):
        try:
            workers = [w for w in _metadata(port, name)["worker_processes"] if w["pid"]]
        except OSError as e:
            kills.append({"time": time.time(), "error": str(e)})
            continue
        if not workers:
            continue
        target = workers[turn % len(workers)]
        turn += 1
        try:
            os.kill(target["pid"], signal.SIGKILL)
            kills.append({"time": time.time(), "pid": target["pid"], "index": target["index"]})
        except ProcessLookupError:
            pass


def _worker_pids(port, name, server_pid):
    """The server's workers, [(index, pid)], from its metadata or, when that does not
    answer within 5 s, its child processes (index None); and which of the two it was."""
    try:
        workers = _metadata(port, name, timeout=5)["worker_processes"]
        return [(w["index"], w["pid"]) for w in workers if w["pid"]], "metadata"
    except (OSError, ValueError, KeyError, http.client.HTTPException):
        try:
            return [(None, pid) for pid in _children(server_pid)], "children"
        except FileNotFoundError:
            return [], "children"


def _sample_memory(port, name, server_pid, begin):
    """One sample: the RSS (MiB) of the server process and of each of its workers."""
    sample = {"at_s": time.time() - begin}
    workers, sample["workers_from"] = _worker_pids(port, name, server_pid)
    try:
        sample["server_mib"] = _process_rss_mib(server_pid)
    except FileNotFoundError:
        sample["server_mib"] = None
    sample["workers"] = []
    for index, pid in workers:
        try:
            sample["workers"].append({"index": index, "pid": pid, "mib": _process_rss_mib(pid)})
        except FileNotFoundError:  # killed meanwhile
            continue
    sample["total_mib"] = (sample["server_mib"] or 0.0) + sum(w["mib"] for w in sample["workers"])
    return sample


def _sampler(port, name, server_pid, every, stop, samples, begin):
    """Samples memory at once, every `every` seconds until `stop`, and once more then."""
    samples.append(_sample_memory(port, name, server_pid, begin))
    while not stop.wait(every):
        samples.append(_sample_memory(port, name, server_pid, begin))
    samples.append(_sample_memory(port, name, server_pid, begin))


def _memory_summary(samples, every):
    """The series, and the mean RSS of the server process (and of server + workers) over
    the samples of the row's first minute and of its last minute, and the growth."""
    summary = {"every_s": every, "samples": samples}
    end = samples[-1]["at_s"] if samples else 0.0
    first = [s for s in samples if s["at_s"] <= 60.0]
    last = [s for s in samples if s["at_s"] >= end - 60.0]
    for key in ("server", "total"):
        means = []
        for window in (first, last):
            values = [s[f"{key}_mib"] for s in window if s[f"{key}_mib"] is not None]
            means.append(statistics.fmean(values) if values else None)
        summary[f"{key}_mib_first_minute"], summary[f"{key}_mib_last_minute"] = means
        grew = None if None in means else means[1] - means[0]
        summary[f"{key}_growth_mib"] = grew
    return summary


def _post(port, name, sentences, signature="serving_default", timeout=120):
    body = json.dumps({"instances": sentences, "signature_name": signature}).encode("utf-8")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models/{name}:predict", data=body,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def _error_kind(error):
    if isinstance(error, urllib.error.HTTPError):
        if error.code == 503 and not (error.headers or {}).get("Retry-After"):
            return "503 without Retry-After"
        return str(error.code)
    if not isinstance(error, OSError):  # http.client.HTTPException, or a 200 not JSON
        return "bad answer"
    reason = getattr(error, "reason", error)
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return "hung"
    return "connection"


def _abuse_requests(model):
    """The bad requests sent over HTTP, by case: (method, path, headers, body bytes);
    `content_length_lie` and `slow_body` are written on raw sockets instead."""
    path, json_type = f"/v1/models/{model}:predict", {"Content-Type": "application/json"}
    valid = json.dumps({"instances": ["Das Haus ist klein."]}).encode("utf-8")
    filler = "Das Haus ist klein, aber der Garten hinter dem Haus ist sehr groß. " * 40

    def dump(body):
        return json.dumps(body).encode("utf-8")

    bodies = {
        "banned_40k": dump({"instances": ["Das Haus ist klein."],
                            "banned": [f"w{i} x{i}" for i in range(40_000)]}),
        "glossary_shared_first_word": dump({
            "instances": ["Das ist der x7 und der x19999 im Haus."],
            "glossary": {f"der x{i}": f"the y{i}" for i in range(20_000)},
        }),
        "big_work": dump({"instances": [f"Satz {i}: {filler}"[:2000] for i in range(256)],
                          "beam_size": 4}),
        "beam_bool": dump({"instances": ["a"], "beam_size": True}),
        "beam_float": dump({"instances": ["a"], "beam_size": 4.0}),
        "alpha_nan": b'{"instances": ["a"], "alpha": NaN}',
        "alpha_inf": b'{"instances": ["a"], "alpha": Infinity}',
        "topk_overflow": dump({"instances": ["a"], "sampling_topk": 2**31}),
        "deep_json": b'{"instances": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        "lone_surrogate": rb'{"instances": ["\ud800"]}',
        "b64": dump({"instances": [{"b64": base64.b64encode(b"Das Haus.").decode("ascii")}]}),
    }  # fmt: skip
    requests = {case: ("POST", path, json_type, body) for case, body in bodies.items()}
    requests["text_plain_cross_origin"] = (
        "POST", path, {"Content-Type": "text/plain", "Origin": "http://evil.example"}, valid,
    )  # fmt: skip
    requests["bad_host"] = ("POST", path, dict(json_type, Host="evil.example"), valid)
    requests["no_such_path"] = ("GET", "/no/such/path", {}, None)
    return requests


def _raw_head(port, model, length):
    return (
        f"POST /v1/models/{model}:predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode("ascii")


def _read_status(sock, deadline):
    """The HTTP status answered on a raw socket; "closed" if the server closed the
    connection without one, "timeout" if none came by `deadline` (time.monotonic)."""
    data = b""
    while b"\r\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            return "timeout"
        except OSError:
            return "closed"
        if not chunk:
            return "closed"
        data += chunk
    status = data.split(b"\r\n", 1)[0].split()
    return status[1].decode("ascii", "replace") if len(status) > 1 else "closed"


def _content_length_lie(port, model, timeout):
    """Declares a body of 10^9 bytes, sends 10 and waits `timeout` s for the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(_raw_head(port, model, 1_000_000_000) + b'{"instance')
        return _read_status(sock, time.monotonic() + timeout)


def _slow_body(port, model, timeout, seconds=12.0, gap=0.5):
    """A valid body sent one byte every `gap` s for `seconds` at most: the status if
    the server answered meanwhile, "closed" if it closed the connection, "timeout"
    if it still held the connection open without an answer."""
    body = json.dumps({"instances": ["Das Haus ist klein, der Garten ist groß."]}).encode()
    deadline = time.monotonic() + seconds
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(_raw_head(port, model, len(body)))
        for byte in body:
            if select.select([sock], [], [], gap)[0]:  # an answer, or the end
                return _read_status(sock, time.monotonic() + 1.0)
            if time.monotonic() >= deadline:
                return "timeout"
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return _read_status(sock, time.monotonic() + 1.0)
        return _read_status(sock, time.monotonic() + timeout)


def _send_abuse(case, port, model, requests, timeout):
    """Sends one bad request; its outcome: the status, "timeout", "closed" or
    "connection" (see the module's docstring)."""
    try:
        if case == "content_length_lie":
            return _content_length_lie(port, model, timeout)
        if case == "slow_body":
            return _slow_body(port, model, timeout)
        method, path, headers, body = requests[case]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:  # a "Host" among the headers replaces http.client's own
            connection.request(method, path, body, headers)
            response = connection.getresponse()
            response.read()
            return str(response.status)
        finally:
            connection.close()
    except TimeoutError:
        return "timeout"
    except (http.client.RemoteDisconnected, BrokenPipeError, http.client.BadStatusLine):
        return "closed"
    except (OSError, http.client.HTTPException):
        return "connection"


class _Tally:
    """The well-formed clients' outcomes: the latencies of the 200s, the rest by kind."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latencies, self.errors, self.slowest_error = [], {}, 0.0

    def answered(self, seconds):
        with self.lock:
            self.latencies.append(seconds)

    def failed(self, kind, seconds):
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1
            self.slowest_error = max(self.slowest_error, seconds)

    def summary(self, clients):
        """`well_formed`: sent, answered_200, refused_503 (with Retry-After), the other
        outcomes by kind, and whether every request not refused with 503 got 200."""
        other = {kind: n for kind, n in self.errors.items() if kind != "503"}
        return {
            "clients": clients,
            "sent": len(self.latencies) + sum(self.errors.values()),
            "answered_200": len(self.latencies),
            "refused_503": self.errors.get("503", 0),
            "other": other,
            "all_answered": not other,
        }


class _AbuseTally:
    """The abusers' outcomes, per case."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cases = {
            case: {"sent": 0, "outcomes": {}, "server_error": 0, "latency_max_ms": 0.0}
            for case in ABUSE_CASES
        }

    def add(self, case, outcome, seconds):
        with self.lock:
            entry = self.cases[case]
            entry["sent"] += 1
            entry["outcomes"][outcome] = entry["outcomes"].get(outcome, 0) + 1
            entry["server_error"] += int(outcome.startswith("5"))
            entry["latency_max_ms"] = max(entry["latency_max_ms"], 1e3 * seconds)

    def summary(self, clients):
        return {
            "clients": clients,
            "server_errors": sum(c["server_error"] for c in self.cases.values()),
            "by_case": self.cases,
        }


def _abuser_count(clients, share):
    return min(clients, max(1, round(share * clients))) if share > 0 else 0


def _load(port, name, sentences, clients, seconds, signature="serving_default",
          timeout=120.0, server_pid=None, kill_every=0.0, abuse_share=0.0,
          abuse_timeout=10.0, sample_every=10.0):  # fmt: skip
    abusers = _abuser_count(clients, abuse_share)
    good_clients = clients - abusers
    good, bad = _Tally(), _AbuseTally()
    requests = _abuse_requests(name) if abusers else {}
    stop = time.time() + seconds

    def client(offset):
        i = offset
        while time.time() < stop:
            start = time.perf_counter()
            try:
                _post(port, name, [sentences[i % len(sentences)]], signature, timeout)
                good.answered(time.perf_counter() - start)
            except (OSError, ValueError, http.client.HTTPException) as e:
                good.failed(_error_kind(e), time.perf_counter() - start)
            i += good_clients

    def abuser(k):
        i = k  # each abuser starts at another case
        while time.time() < stop:
            case = ABUSE_CASES[i % len(ABUSE_CASES)]
            start = time.perf_counter()
            outcome = _send_abuse(case, port, name, requests, abuse_timeout)
            bad.add(case, outcome, time.perf_counter() - start)
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(good_clients)]
    abuse_threads = [threading.Thread(target=abuser, args=(k,)) for k in range(abusers)]
    kills, samples, stopping = [], [], threading.Event()
    begin = time.time()
    background = [
        threading.Thread(
            target=_sampler,
            args=(port, name, server_pid or os.getpid(), sample_every, stopping, samples, begin),
        )
    ]
    if kill_every:
        background.append(
            threading.Thread(target=_killer, args=(port, name, kill_every, stopping, kills))
        )  # fmt: skip
    own_cpu, server_cpu = time.process_time(), _tree_cpu_seconds(server_pid or os.getpid())
    machine_cpu = _machine_busy_seconds()
    for thread in background + threads + abuse_threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = max(time.time(), stop) - begin  # the well-formed clients' time (if any)
    for thread in abuse_threads:  # a slow_body case may outlast the row by 12 s
        thread.join()
    stopping.set()
    for thread in background:
        thread.join()
    elapsed = time.time() - begin
    cpu = {
        "clients": (time.process_time() - own_cpu) / elapsed,
        "server": (_tree_cpu_seconds(server_pid or os.getpid()) - server_cpu) / elapsed,
        "machine": (_machine_busy_seconds() - machine_cpu) / elapsed,
    }
    row = _row(good, clients, signature, wall, cpu, begin, kills)
    row["well_formed"] = good.summary(good_clients)
    if abusers:
        row["abuse"] = bad.summary(abusers)
    row["memory"] = _memory_summary(samples, sample_every)
    return row


def _row(good, clients, signature, wall, cpu, begin, kills):
    latencies, errors = good.latencies, good.errors
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0] * 99
    return {
        "clients": clients,
        "signature": signature,
        "requests_per_second": len(latencies) / wall,
        "latency_ms": {
            "p50": 1e3 * quantiles[49],
            "p90": 1e3 * quantiles[89],
            "p99": 1e3 * quantiles[98],
        },  # fmt: skip
        "latency_max_ms": 1e3 * max(latencies, default=0.0),
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        "slowest_error_ms": 1e3 * good.slowest_error,
        "seconds": wall,
        "cores_busy": cpu,
        "kills": [dict(k, at_s=k["time"] - begin) for k in kills],
    }


def _start_server(args, batching):
    """The server's process, its port and model name, once it answers every signature."""
    extra = ["--max-wait-ms", str(args.max_wait_ms), "--workers", str(args.workers),
             "--threads", str(args.threads), "--engine", args.engine, "--precision",
             args.precision, "--no-access-log"]  # fmt: skip
    if batching == "off":
        extra[:2] = ["--max-wait-ms", "0", "--max-batch", "1"]
    port, name = _free_port(), "loadtest"
    # The server's own messages (a failed start, each worker replaced) beside the results.
    log = open(args.json + ".server.log", "a") if args.json else subprocess.DEVNULL
    server = subprocess.Popen(
        [sys.executable, "-m", "keras_transformer.serving", args.export_dir, "--port",
         str(port), "--model-name", name, "--max-sentences", "1000", *extra],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    if log is not subprocess.DEVNULL:
        log.close()  # the server writes through its own copy of the descriptor
    for _ in range(600):
        try:
            for signature in args.signatures:  # the first call of each search
                _post(port, name, ["Haus"], signature)
            break
        except OSError:
            if server.poll() is not None:
                raise SystemExit(
                    f"The server exited with status {server.returncode} before it "
                    f"answered (its output: {args.json}.server.log)."
                ) from None
            time.sleep(0.2)
    else:
        server.kill()
        raise SystemExit("The server did not answer within 120 s.")
    return server, port, name


def _server_metrics(port):
    metrics_url = f"http://127.0.0.1:{port}/monitoring/prometheus/metrics"
    with urllib.request.urlopen(metrics_url, timeout=30) as r:
        counters = ("worker_restarts_total{", "requests_total{")
        lines = r.read().decode().splitlines()
    return [x for x in lines if any(c in x for c in counters) and not x.startswith("#")]


def main(argv=None):
    args = parse_args(argv)
    from keras_transformer.hardware import describe_cpu

    cpu = describe_cpu()["summary"]
    sentences = _sentences(args.sentences)[:2000]
    results, batches = [], {}
    for batching in args.batching:
        server, port, name = _start_server(args, batching)
        try:
            for signature in args.signatures:
                for clients in args.clients:
                    before = _rss_mib(server.pid)
                    row = _load(
                        port, name, sentences, clients, args.seconds, signature,
                        args.request_timeout, server.pid, args.kill_worker_every,
                        args.abuse_share, args.abuse_timeout, args.sample_every,
                    )  # fmt: skip
                    row.update(batching=batching, rss_mib_before=before,
                               rss_mib_after=_rss_mib(server.pid))  # fmt: skip
                    results.append(row)
                    print({k: v for k, v in row.items() if k != "memory"}, flush=True)
            batches[batching] = _metadata(port, name)["batches"]
            results[-1]["server_metrics"] = _server_metrics(port)
        finally:
            server.terminate()
            server.wait(timeout=60)
    direct_rate = None
    if not args.no_direct:
        direct = subprocess.run(
            [sys.executable, "-c", DIRECT, args.export_dir], input="\n".join(sentences[:500]),
            capture_output=True, text=True, cwd=ROOT, timeout=900,
        )  # fmt: skip
        direct_rate = float(direct.stdout.split()[-1]) if direct.returncode == 0 else None
    _print_table(cpu, results)
    print(
        f"direct OnnxTranslator, batches of 32: {direct_rate} sentences/s; "
        f"server batches: {batches}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu, "results": results, "direct_sentences_per_second": direct_rate,
                       "server_batches": batches, "abuse_cases": list(ABUSE_CASES)},
                      f, indent=1)  # fmt: skip


def _print_table(cpu, results):
    print(f"CPU: {cpu}")
    print(
        "| search | batching | clients | sentences/s | p50 | p90 | p99 | errors "
        "| RSS MiB before -> after | cores busy: clients, server, machine |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        q, busy = r["latency_ms"], r["cores_busy"]
        search = "greedy" if r["signature"] == "translate_greedy" else "beam"
        errors = f"{r['errors']} {r['errors_by_kind']}" if r["errors"] else "0"
        print(f"| {search} | {r['batching']} | {r['clients']} | {r['requests_per_second']:.1f} | "
              f"{q['p50']:.0f} ms | {q['p90']:.0f} ms | {q['p99']:.0f} ms | {errors} | "
              f"{r['rss_mib_before']:.0f} -> {r['rss_mib_after']:.0f} | "
              f"{busy['clients']:.2f}, {busy['server']:.2f}, {busy['machine']:.2f} |")  # fmt: skip
        _print_details(r)


def _print_details(r):
    """Under a row of the table: its kills, abuse per case, memory and verdict."""
    if r["kills"]:
        print(f"  killed: {[(round(k['at_s']), k.get('pid')) for k in r['kills']]}")
    abuse = r.get("abuse")
    if abuse:
        print(f"  abuse, {abuse['clients']} clients; server errors (5xx): "
              f"{abuse['server_errors']}")  # fmt: skip
        for case, c in abuse["by_case"].items():
            print(f"    {case}: sent {c['sent']}, {c['outcomes']}, server_error "
                  f"{c['server_error']}, slowest {c['latency_max_ms']:.0f} ms")  # fmt: skip
    m = r["memory"]

    def mib(x):
        return "?" if x is None else f"{x:.0f}"

    print(f"  RSS MiB, mean of the first -> last minute: server process "
          f"{mib(m['server_mib_first_minute'])} -> {mib(m['server_mib_last_minute'])} "
          f"(growth {mib(m['server_growth_mib'])}); server + workers "
          f"{mib(m['total_mib_first_minute'])} -> {mib(m['total_mib_last_minute'])} "
          f"(growth {mib(m['total_growth_mib'])}); {len(m['samples'])} samples")  # fmt: skip
    w = r["well_formed"]
    print(f"  well-formed ({w['clients']} clients): sent {w['sent']}, answered 200 "
          f"{w['answered_200']}, refused 503 + Retry-After {w['refused_503']}, other "
          f"{w['other'] or 0} -> every well-formed request not refused with 503 got 200: "
          f"{'YES' if w['all_answered'] else 'NO'}")  # fmt: skip


DIRECT = r"""
import sys, time
from keras_transformer import OnnxTranslator
sentences = sys.stdin.read().splitlines()
translator = OnnxTranslator(sys.argv[1], batch_size=32)
translator.translate(sentences[:32])
start = time.perf_counter()
translator.translate(sentences)
print(len(sentences) / (time.perf_counter() - start))
"""


if __name__ == "__main__":
    main()
