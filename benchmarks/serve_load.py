"""Load on `keras-transformer-serve`: sentences/s and latency under concurrent clients,
against the same export translated directly (`OnnxTranslator`, batches of 32) in one run.

    python benchmarks/serve_load.py saved_models/transformer_de_en/onnx/1 --clients 1 8 32 128 \
        --signatures serving_default translate_greedy --batching on off
    python benchmarks/serve_load.py EXPORT --clients 128 --seconds 600   # the soak
    python benchmarks/serve_load.py EXPORT --clients 128 --seconds 600 --workers 2 \
        --threads 1 --kill-worker-every 120   # the soak, one worker SIGKILLed every 2 min

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
it). Errors are counted by kind: the HTTP status the server answered, `hung`
(no answer within `--request-timeout`) and `connection` (refused or reset).
Each row also says where the CPU went: the clients' process and the server's
processes, in cores busy on average (the clients share the server's cores
unless pinned elsewhere). `--kill-worker-every S` SIGKILLs one of the
server's worker processes (taken from its metadata, in turn) every S
seconds during each row, and records when and which. Run alone on the
machine; the CPU is named in the output.
"""

import argparse
import json
import os
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
        "--no-direct",
        action="store_true",
        help="skip the direct OnnxTranslator row (e.g. for CTranslate2)",
    )
    parser.add_argument("--json", help="write the results here")
    return parser.parse_args(argv)


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


def _tree_sum(pid, read):
    """`read(pid)` summed over a process and its living descendants (`/proc`)."""
    total, pids = 0.0, [pid]
    while pids:
        current = pids.pop()
        try:
            total += read(current)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    pids.extend(int(child) for child in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _rss_mib(pid):
    """Resident memory of the server and its worker processes (their sum), in MiB."""

    def rss(current):
        with open(f"/proc/{current}/status") as f:
            return sum(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024

    return _tree_sum(pid, rss)


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


def _metadata(port, name):
    url = f"http://127.0.0.1:{port}/v1/models/{name}/metadata"
    with urllib.request.urlopen(url, timeout=30) as r:
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
        return str(error.code)
    reason = getattr(error, "reason", error)
    if isinstance(reason, (TimeoutError, socket.timeout)) or "timed out" in str(reason):
        return "hung"
    return "connection"


def _load(port, name, sentences, clients, seconds, signature="serving_default",
          timeout=120.0, server_pid=None, kill_every=0.0):  # fmt: skip
    latencies, errors, slowest = [], {}, [0.0]
    lock = threading.Lock()
    stop = time.time() + seconds

    def client(offset):
        i = offset
        while time.time() < stop:
            start = time.perf_counter()
            try:
                _post(port, name, [sentences[i % len(sentences)]], signature, timeout)
                with lock:
                    latencies.append(time.perf_counter() - start)
            except OSError as e:
                kind = _error_kind(e)
                with lock:
                    errors[kind] = errors.get(kind, 0) + 1
                    slowest[0] = max(slowest[0], time.perf_counter() - start)
            i += clients

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    kills, killing = [], threading.Event()
    killer = threading.Thread(target=_killer, args=(port, name, kill_every, killing, kills))
    own_cpu, server_cpu = time.process_time(), _tree_cpu_seconds(server_pid or os.getpid())
    machine_cpu = _machine_busy_seconds()
    begin = time.time()
    if kill_every:
        killer.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.time() - begin
    killing.set()
    if kill_every:
        killer.join()
    own_cpu = time.process_time() - own_cpu
    server_cpu = _tree_cpu_seconds(server_pid or os.getpid()) - server_cpu
    machine_cpu = _machine_busy_seconds() - machine_cpu
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
        "slowest_error_ms": 1e3 * slowest[0],
        "seconds": wall,
        "cores_busy": {
            "clients": own_cpu / wall,
            "server": server_cpu / wall,
            "machine": machine_cpu / wall,
        },
        "kills": [dict(k, at_s=k["time"] - begin) for k in kills],
    }


def main(argv=None):
    args = parse_args(argv)
    from keras_transformer.hardware import describe_cpu

    cpu = describe_cpu()["summary"]
    sentences = _sentences(args.sentences)[:2000]
    results, batches = [], {}
    for batching in args.batching:
        extra = ["--max-wait-ms", str(args.max_wait_ms), "--workers", str(args.workers),
                 "--threads", str(args.threads), "--engine", args.engine, "--precision",
                 args.precision, "--no-access-log"]  # fmt: skip
        if batching == "off":
            extra[:2] = ["--max-wait-ms", "0", "--max-batch", "1"]
        port, name = _free_port(), "loadtest"
        server = subprocess.Popen(
            [sys.executable, "-m", "keras_transformer.serve", args.export_dir, "--port",
             str(port), "--model-name", name, "--max-sentences", "1000", *extra],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            for _ in range(600):
                try:
                    for signature in args.signatures:  # the first call of each search
                        _post(port, name, ["Haus"], signature)
                    break
                except OSError:
                    time.sleep(0.2)
            for signature in args.signatures:
                for clients in args.clients:
                    before = _rss_mib(server.pid)
                    row = _load(
                        port, name, sentences, clients, args.seconds, signature,
                        args.request_timeout, server.pid, args.kill_worker_every,
                    )  # fmt: skip
                    row.update(batching=batching, rss_mib_before=before,
                               rss_mib_after=_rss_mib(server.pid))  # fmt: skip
                    results.append(row)
                    print(row, flush=True)
            batches[batching] = _metadata(port, name)["batches"]
            metrics_url = f"http://127.0.0.1:{port}/monitoring/prometheus/metrics"
            with urllib.request.urlopen(metrics_url, timeout=30) as r:
                counters = ("worker_restarts_total{", "requests_total{")
                lines = r.read().decode().splitlines()
            results[-1]["server_metrics"] = [
                x for x in lines if any(c in x for c in counters) and not x.startswith("#")
            ]
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
        if r["kills"]:
            print(f"  killed: {[(round(k['at_s']), k.get('pid')) for k in r['kills']]}")
    print(
        f"direct OnnxTranslator, batches of 32: {direct_rate} sentences/s; "
        f"server batches: {batches}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu, "results": results, "direct_sentences_per_second": direct_rate,
                       "server_batches": batches}, f, indent=1)  # fmt: skip


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
