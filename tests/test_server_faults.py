"""Faults, overload and versions in `keras-transformer-serve`: real server processes on
local ports, spoken to over HTTP, whose workers run a stand-in translator
(`stand_in`, passed as `cli.main(factory=...)` and loaded by each worker
process) that fails on demand:

    "BOOM"   raises (a Python error in the translator)
    "HANG"   sleeps 30 s (a call that never returns in time)
    "CRASH"  kills its own process with SIGKILL (a native crash)
    other    upper-cased, plus the version folder's suffix.txt

Every call the workers make is appended to a log (STAND_IN_LOG: the worker's pid
and the batch's sentences), so a test sees which batches ran and which did not;
the server's own counts come from its Prometheus metrics, read with the Prometheus
client's parser.
"""

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from ports import HeldPort

from keras_transformer.serving.engines import LoadedTranslator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
NAME = "faulty"
SERVE = (
    f"import sys; sys.path.insert(0, {TESTS!r}); import test_server_faults as t; "
    "from keras_transformer.serving import cli; cli.main(sys.argv[1:], factory=t.stand_in)"
)


def stand_in(version_dir, config):
    """The workers' translator in these tests (see the module's docstring). A version
    folder with a file `broken` does not load; `load_seconds.txt` makes it load slowly;
    a file `glossary` makes it take a glossary (as a model trained with --terminology)."""

    def read(name, default=""):
        path = os.path.join(version_dir, name)
        return open(path).read().strip() if os.path.exists(path) else default

    if os.path.exists(os.path.join(version_dir, "broken")):
        raise RuntimeError("this version is broken")
    time.sleep(float(read("load_seconds.txt", "0")))
    suffix = read("suffix.txt")
    log = os.environ.get("STAND_IN_LOG")
    delay = float(os.environ.get("STAND_IN_DELAY", "0"))

    def translate(sentences, settings):
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "sentences": sentences}) + "\n")
        if "CRASH" in sentences:
            os.kill(os.getpid(), signal.SIGKILL)
        if "BOOM" in sentences:
            raise RuntimeError("injected fault in the translator")
        if "HANG" in sentences:
            time.sleep(30)
        time.sleep(delay)
        return [s.upper() + suffix for s in sentences]

    glossary = os.path.exists(os.path.join(version_dir, "glossary"))
    return LoadedTranslator(translate, (1, 4), 4, {"stand_in": True}, glossary=glossary)


# ----------------------------------------------------------------------------- helpers


class Served:
    """A server process over `models/` (version folders) in a test's tmp_path."""

    def __init__(self, tmp_path, *flags, versions=("1",), delay=0.0, wait=True,
                 new_session=False):  # fmt: skip
        self.models = tmp_path / "models"
        for version in versions:
            (self.models / version).mkdir(parents=True, exist_ok=True)
        self.log = tmp_path / "batches.jsonl"
        self.output = tmp_path / "server.log"
        self._held = HeldPort()  # until stop(): ports.py
        self.port = self._held.port
        env = dict(os.environ, PYTHONUNBUFFERED="1", STAND_IN_LOG=str(self.log),
                   STAND_IN_DELAY=str(delay))  # fmt: skip
        with open(self.output, "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", SERVE, str(self.models), "--port", str(self.port),
                 "--model-name", NAME, "--poll-seconds", "0.2", *flags],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                start_new_session=new_session,  # a process group of its own: killpg
            )  # fmt: skip
        if wait:
            self.wait_for(lambda: self.state() == "AVAILABLE", "the server did not start")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path):
        with urllib.request.urlopen(self.url(path), timeout=10) as response:
            return response.read().decode("utf-8")

    def state(self, version=None):
        """The newest version's state (or `version`'s), None while unreachable."""
        try:
            versions = json.loads(self.get(f"/v1/models/{NAME}"))["model_version_status"]
        except OSError:
            return None
        states = {v["version"]: v for v in versions}
        if version is None:
            return versions[0]["state"] if versions else None
        return states.get(version)

    def post(self, sentences, timeout=30, path=f"/v1/models/{NAME}:predict", headers=None,
             **fields):  # fmt: skip
        """`(status, body, headers)` of a predict request (`fields`: the request's others)."""
        body = json.dumps({"instances": sentences, **fields}).encode("utf-8")
        request = urllib.request.Request(
            self.url(path), data=body,
            headers={"Content-Type": "application/json", **(headers or {})},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.load(response), response.headers
        except urllib.error.HTTPError as error:
            return error.code, json.load(error), error.headers

    def metrics(self):
        """`{(name, labels as sorted tuple): value}` of the metrics endpoint, parsed
        by the Prometheus client's parser."""
        from prometheus_client.parser import text_string_to_metric_families

        samples = {}
        for family in text_string_to_metric_families(self.get("/monitoring/prometheus/metrics")):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def metric(self, name, **labels):
        return self.metrics().get(
            ("keras_transformer_serve_" + name, tuple(sorted(labels.items())))
        )

    def workers(self):
        return json.loads(self.get(f"/v1/models/{NAME}/metadata"))["server"]["worker_processes"]

    def batches(self):
        """The stand-in's calls so far: `[(pid, sentences)]`."""
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [(entry["pid"], entry["sentences"]) for entry in map(json.loads, lines)]

    def wait_for(self, condition, message, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{message}: exited\n{self.output.read_text()[-3000:]}")
            if condition():
                return
            time.sleep(0.05)
        raise AssertionError(f"{message}\n{self.output.read_text()[-3000:]}")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)
        self._held.close()


@pytest.fixture
def serve(tmp_path):
    servers = []

    def start(*flags, **kwargs):
        servers.append(Served(tmp_path, *flags, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def _concurrently(calls):
    """Runs each `() -> answer` in its own thread; their answers in order."""
    answers = [None] * len(calls)

    def run(i):
        answers[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def _in_background(call):
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(value=call()))
    thread.start()
    return thread, answer


# ----------------------------------------------------------------------------- faults


def test_a_failing_sentence_in_a_shared_batch_fails_only_its_own_request(serve):
    server = serve("--workers", "2", "--max-wait-ms", "300", "--timeout", "10")
    answers = _concurrently([
        lambda: server.post(["eins"]),
        lambda: (time.sleep(0.05), server.post(["BOOM"]))[1],
        lambda: (time.sleep(0.1), server.post(["zwei", "drei"]))[1],
    ])  # fmt: skip
    assert answers[0][:2] == (200, {"predictions": ["EINS"]})
    assert answers[2][:2] == (200, {"predictions": ["ZWEI", "DREI"]})
    assert answers[1][:2] == (500, {"error": "RuntimeError: injected fault in the translator"})
    # The shared batch ran (one call with all four sentences) and failed; then each
    # request ran alone, on the same worker.
    calls = server.batches()
    assert [sentences for _, sentences in calls] == [
        ["eins", "BOOM", "zwei", "drei"], ["eins"], ["BOOM"], ["zwei", "drei"]
    ]  # fmt: skip
    assert len({pid for pid, _ in calls}) == 1
    assert server.metric("batches_total", outcome="error") == 2  # the shared one, BOOM alone
    assert server.metric("batches_total", outcome="ok") == 2
    assert server.metric("batch_size_sentences_bucket", le="4.0") == 4
    assert server.metric("batch_size_sentences_bucket", le="2.0") == 3
    assert server.post(["vier"])[:2] == (200, {"predictions": ["VIER"]})


def test_a_hung_batch_holds_one_worker_and_the_other_serves_meanwhile(serve):
    server = serve("--workers", "2", "--max-wait-ms", "0", "--timeout", "3")
    start = time.perf_counter()
    thread, hung = _in_background(lambda: server.post(["HANG"]))
    server.wait_for(lambda: any(s == ["HANG"] for _, s in server.batches()), "HANG never ran")
    for word in ("fünf", "sechs", "sieben", "acht", "neun"):
        asked = time.perf_counter()
        assert server.post([word])[:2] == (200, {"predictions": [word.upper()]})
        assert time.perf_counter() - asked < 0.5  # not behind the hung batch
    thread.join()
    status, body, _ = hung["value"]
    assert status == 504 and "longer than 3 s (--timeout)" in body["error"]
    assert 2.9 < time.perf_counter() - start < 4.5  # answered at the timeout
    # Its worker, still stuck once every request of its batch had its 504, is killed
    # and replaced: the server is back to two workers.
    server.wait_for(lambda: server.metric("worker_restarts_total", reason="hung") == 1,
                    "the hung worker was not replaced")  # fmt: skip
    server.wait_for(lambda: [w["state"] for w in server.workers()] == ["idle", "idle"],
                    "no second worker again")  # fmt: skip
    assert server.post(["zehn"])[:2] == (200, {"predictions": ["ZEHN"]})


def test_a_worker_killed_under_load_is_replaced_and_no_request_hangs(serve):
    server = serve("--workers", "2", "--max-wait-ms", "2", "--timeout", "10", delay=0.05)
    first_pids = {w["pid"] for w in server.workers()}
    answers, errors = [], []
    stop = time.time() + 4

    def client(k):
        i = 0
        while time.time() < stop:
            asked = time.perf_counter()
            try:
                status, body, headers = server.post([f"satz {k} {i}"], timeout=15)
            except OSError as error:  # no answer in 15 s: a hang
                errors.append(error)
                continue
            answers.append((status, body, headers, time.perf_counter() - asked))
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    busy = []
    server.wait_for(lambda: busy.extend(w["pid"] for w in server.workers() if w["state"] == "busy")
                    or busy, "no busy worker")  # fmt: skip
    victim = busy[0]
    os.kill(victim, signal.SIGKILL)
    for thread in threads:
        thread.join()
    assert not errors
    codes = [status for status, *_ in answers]
    assert set(codes) <= {200, 503} and codes.count(200) > 20
    # Only the killed worker's batch failed (none, if it had just finished): at most
    # one request per client, answered 503 with Retry-After and what happened.
    lost = [(body, headers) for status, body, headers, _ in answers if status == 503]
    assert len(lost) <= 6
    for body, headers in lost:
        assert headers["Retry-After"] == "1" and f"(pid {victim})" in body["error"]
    assert max(seconds for *_, seconds in answers) < 5
    assert server.metric("worker_restarts_total", reason="crashed") == 1
    pids = {w["pid"] for w in server.workers()}
    assert victim not in pids and len(pids) == 2 and pids & first_pids


def _running(pid):
    """Whether process `pid` exists and has not exited (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state.split()[1] not in ("Z", "X")


@pytest.mark.parametrize("rounds", [3])
def test_sigterm_stops_every_worker_before_the_server_exits(serve, rounds):
    # Each round: two workers serve concurrent requests, then SIGTERM. The executors'
    # own shutdown only asks a worker to exit; a server that exited first left one
    # running, orphaned with its model (found after benchmarks/serve_load.py's grid).
    for _ in range(rounds):
        server = serve("--workers", "2", "--max-wait-ms", "2", delay=0.02)
        pids = [w["pid"] for w in server.workers()]
        answers = _concurrently([lambda k=k, s=server: s.post([f"satz {k}"]) for k in range(12)])
        assert {status for status, *_ in answers} == {200}
        server.stop()  # a drained server exits 0
        assert server.process.returncode == 0, server.output.read_text()
        assert [pid for pid in pids if _running(pid)] == []


def test_workers_end_with_a_server_killed_without_warning(serve):
    # SIGKILL (the OOM killer, `kill -9`, a crash) gives the server no chance to stop its
    # workers: each ends itself once it is reparented (found orphaned after a test run).
    server = serve("--workers", "2")
    pids = [w["pid"] for w in server.workers()]
    assert server.post(["eins"])[0] == 200
    server.process.kill()
    server.process.wait(timeout=10)
    deadline = time.monotonic() + 10
    while [pid for pid in pids if _running(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in pids if _running(pid)] == []


def test_a_native_crash_in_the_translator_is_an_error_for_its_request_only(serve):
    server = serve("--workers", "1", "--max-wait-ms", "0", "--timeout", "10")
    status, body, headers = server.post(["CRASH"])
    assert status == 503 and "stopped (a native crash, or it was killed)" in body["error"]
    assert headers["Retry-After"] == "1"
    # The one worker is replaced; the next request is answered by the new one.
    assert server.post(["elf"])[:2] == (200, {"predictions": ["ELF"]})
    assert server.metric("worker_restarts_total", reason="crashed") == 1


# ----------------------------------------------------------------------------- overload


def test_a_full_queue_answers_503_and_an_expired_request_is_never_translated(serve):
    server = serve("--workers", "1", "--max-wait-ms", "0", "--timeout", "2",
                   "--max-queue", "4", "--max-sentences", "4")  # fmt: skip
    hang, _ = _in_background(lambda: server.post(["HANG"]))
    server.wait_for(lambda: [s for _, s in server.batches()] == [["HANG"]], "no HANG")
    queued, waited = _in_background(lambda: server.post(["a", "b", "c", "d"]))
    server.wait_for(lambda: server.metric("queue_sentences") == 4, "nothing queued")
    status, body, headers = server.post(["e"])
    assert status == 503 and "at most 4 (--max-queue)" in body["error"]
    assert headers["Retry-After"] == "1"
    assert server.metric("rejected_requests_total") == 1
    hang.join()
    queued.join()
    assert waited["value"][0] == 504
    # The four waited behind HANG past their deadline: dropped from the queue, counted,
    # and no worker ever saw them.
    assert server.metric("dropped_requests_total", reason="expired") == 1
    assert server.metric("queue_sentences") == 0
    server.wait_for(lambda: server.post(["f"])[0] == 200, "the server did not recover")
    assert [s for _, s in server.batches()] == [["HANG"], ["f"]]


def test_a_client_that_disconnects_cancels_work_not_yet_started(serve):
    server = serve("--workers", "1", "--max-wait-ms", "0", "--timeout", "3")
    hang, _ = _in_background(lambda: server.post(["HANG"]))
    server.wait_for(lambda: len(server.batches()) == 1, "no HANG")
    body = json.dumps({"instances": ["weg"]}).encode("utf-8")
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(
            f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: localhost\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        server.wait_for(lambda: server.metric("queue_sentences") == 1, "not queued")
    server.wait_for(
        lambda: server.metric("dropped_requests_total", reason="disconnected") == 1,
        "the request of the client that left stayed queued",
    )  # fmt: skip
    assert server.metric("queue_sentences") == 0
    # Clients that leave mid-headers or mid-body harm no one either.
    for cut in (10, len(body) - 1):
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(
                f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: localhost\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body[:cut]
            )
    hang.join()
    server.wait_for(lambda: server.post(["da"])[0] == 200, "the server did not recover")
    assert [s for _, s in server.batches()] == [["HANG"], ["da"]]


# ----------------------------------------------------------------------------- operations


def test_the_metrics_count_what_was_sent_and_the_access_log_is_json(serve):
    server = serve("--workers", "1", "--max-wait-ms", "0")
    for words in (["eins"], ["zwei", "drei"], ["vier"]):
        assert server.post(words)[0] == 200
    assert server.post([])[0] == 400
    assert server.metric("requests_total", code="200") == 3
    assert server.metric("requests_total", code="400") == 1
    assert server.metric("request_latency_seconds_count") == 4
    assert server.metric("sentences_total") == 4
    assert server.metric("batches_total", outcome="ok") == 3
    assert server.metric("model_version") == 1
    assert server.metric("worker_processes", state="idle") == 1
    lines = [json.loads(x) for x in server.output.read_text().splitlines() if x.startswith("{")]
    predicts = [line for line in lines if line["path"].endswith(":predict")]
    assert [line["status"] for line in predicts] == [200, 200, 200, 400]
    assert predicts[1]["sentences"] == 2 and predicts[1]["version"] == "1"
    assert {"time", "method", "ms", "client"} <= set(predicts[0])


def test_the_server_listens_once_its_first_version_is_available(serve, tmp_path):
    # As TF Serving's core waits for its initial models: a client that reaches the
    # server finds it AVAILABLE (later versions show LOADING while the old one serves).
    (tmp_path / "models" / "1").mkdir(parents=True)
    (tmp_path / "models" / "1" / "load_seconds.txt").write_text("2")
    start = time.perf_counter()
    server = serve("--workers", "1", wait=False)
    server.wait_for(lambda: server.state() is not None, "never answered")
    assert time.perf_counter() - start > 2
    assert server.state() == "AVAILABLE"
    assert server.post(["eins"])[:2] == (200, {"predictions": ["EINS"]})


def test_a_first_version_that_does_not_load_ends_the_server_with_its_error(serve, tmp_path):
    (tmp_path / "models" / "1").mkdir(parents=True)
    (tmp_path / "models" / "1" / "broken").write_text("")
    server = serve("--workers", "1", wait=False)
    assert server.process.wait(timeout=60) == 1
    assert "this version is broken" in server.output.read_text()


def test_a_new_version_is_served_once_loaded_and_a_broken_one_leaves_it_serving(serve, tmp_path):
    server = serve("--workers", "2", "--max-wait-ms", "1")
    answers, stop = [], threading.Event()

    def client(k):
        while not stop.is_set():
            answers.append(server.post([f"satz {k}"]))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    # Version 2 appears as TF Serving expects, by a rename, and loads for a second.
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "suffix.txt").write_text("-v2")
    (staging / "load_seconds.txt").write_text("1")
    staging.rename(server.models / "2")
    server.wait_for(lambda: (server.state("2") or {}).get("state") == "LOADING", "not LOADING")
    assert server.state("1")["state"] == "AVAILABLE"
    server.wait_for(lambda: server.state("2")["state"] == "AVAILABLE", "version 2 not served")
    server.wait_for(lambda: server.state("1")["state"] == "END", "version 1 not unloaded")
    during = len(answers)
    server.wait_for(lambda: len(answers) > during + 10, "no answers after the swap")
    # Version 3 does not load: logged, reported, and version 2 goes on serving.
    (server.models / "3").mkdir()
    (server.models / "3" / "broken").write_text("")
    server.wait_for(lambda: server.state("3") and server.state("3")["state"] == "END",
                    "version 3 not tried")  # fmt: skip
    after = len(answers)
    server.wait_for(lambda: len(answers) > after + 10, "no answers after the broken version")
    stop.set()
    for thread in threads:
        thread.join()
    assert {status for status, _, _ in answers} == {200}  # answered throughout
    outputs = [body["predictions"][0] for _, body, _ in answers]
    assert outputs[0].endswith(("0", "1", "2")) and outputs[-1].endswith("-v2")
    first_v2 = next(i for i, text in enumerate(outputs) if text.endswith("-v2"))
    assert all(text.endswith("-v2") for text in outputs[first_v2 + 3 :])  # 3 in flight
    three = server.state("3")
    assert three["status"]["error_code"] == "UNKNOWN"
    assert "this version is broken" in three["status"]["error_message"]
    assert "Version 3" in server.output.read_text() and "version 2 goes on serving" in (
        server.output.read_text()
    )
    metadata = json.loads(server.get(f"/v1/models/{NAME}/metadata"))
    assert metadata["model_spec"]["version"] == "2"
    assert server.metric("model_version") == 2


# ----------------------------------------------------------------------------- flags


def test_port_0_takes_a_free_port_and_names_it_on_stdout_once_serving(tmp_path):
    # No port reserved beforehand: a script reads it from the server's first line on
    # stdout, which comes once the first version has loaded (1 s here).
    (tmp_path / "models" / "1").mkdir(parents=True)
    (tmp_path / "models" / "1" / "load_seconds.txt").write_text("1")
    with open(tmp_path / "stderr.log", "w") as errors:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(tmp_path / "models"), "--port", "0",
             "--model-name", NAME, "--workers", "1"],
            stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
    try:
        line, deadline = "", time.time() + 60
        while not line and time.time() < deadline and process.poll() is None:
            if select.select([process.stdout], [], [], 0.5)[0]:
                line = process.stdout.readline()
        match = re.fullmatch(r"Serving on http://127\.0\.0\.1:(\d+)\n", line)
        assert match, f"first stdout line {line!r}\n{(tmp_path / 'stderr.log').read_text()}"
        port = int(match[1])
        assert port != 0
        url = f"http://127.0.0.1:{port}/v1/models/{NAME}"
        with urllib.request.urlopen(url, timeout=10) as response:  # at once: no retry
            assert json.load(response)["model_version_status"][0]["state"] == "AVAILABLE"
        request = urllib.request.Request(
            url + ":predict", data=json.dumps({"instances": ["eins"]}).encode("utf-8"),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.load(response) == {"predictions": ["EINS"]}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        process.stdout.close()


def _refused(*flags):
    completed = subprocess.run(
        [sys.executable, "-m", "keras_transformer.serving", TESTS, *flags],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 2, completed.stderr[-2000:]
    (line,) = [x for x in completed.stderr.splitlines() if "error:" in x]
    return line


def test_a_flag_the_engine_cannot_honour_is_an_error_naming_the_engine():
    line = _refused("--engine", "onnx", "--precision", "int8_float32")
    assert "--precision int8_float32 does not apply to --engine onnx" in line
    line = _refused("--engine", "ctranslate2", "--precision", "bfloat16")
    assert "--engine ctranslate2 on cpu computes in" in line
    line = _refused("--max-sentences", "10", "--max-queue", "5")
    assert "--max-sentences 10 exceeds --max-queue 5" in line


def test_device_cuda_is_a_clear_error_where_no_gpu_is_present():
    import ctranslate2
    import onnxruntime

    if ctranslate2.get_cuda_device_count() == 0:
        line = _refused("--engine", "ctranslate2", "--device", "cuda")
        assert "CTranslate2 sees no CUDA device" in line
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        line = _refused("--engine", "onnx", "--device", "cuda")
        assert "no CUDAExecutionProvider" in line and "[onnx-gpu]" in line
