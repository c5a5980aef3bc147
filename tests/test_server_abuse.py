"""`keras-transformer-serve` with a real ONNX engine, under property-based requests:
every request drawn from the request schema's types, sizes, Unicode and nesting gets
200 or a 4xx JSON error (never a 5xx, never a hang), and a well-formed request sent
beside it, in the same batching window, gets the answer it gets alone. Then versions
of the same export swapped, removed and broken while clients translate.

Hypothesis runs derandomized (the same examples every run) with `max_examples`
stated below; the server batches requests that arrive within 150 ms of each other,
so the probe and the drawn request share a translate call whenever their settings
match (counted, and asserted to happen).
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from export_fixtures import exported, held_out_sentences
from ports import HeldPort

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "abused"
PREDICT = f"/v1/models/{NAME}:predict"
MAX_EXAMPLES = 100  # about 0.3 s each on a 2-core machine
PROBE = held_out_sentences(1, seed=5)[0]

pytestmark = pytest.mark.slow


def _start(models, port, *flags):
    """A real server process over `models` (an export or its versions), once AVAILABLE."""
    output = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_transformer.serving", str(models), "--port", str(port),
         "--model-name", NAME, "--workers", "1", "--max-sentences", "8",
         "--max-characters", "200", "--timeout", "20", "--body-timeout", "5", *flags],
        stdout=output, stderr=subprocess.STDOUT, cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    process.output = output.name
    deadline = time.time() + 120
    while time.time() < deadline:
        if process.poll() is not None:
            raise AssertionError(open(output.name).read()[-3000:])
        try:
            status = _get(port, f"/v1/models/{NAME}")["model_version_status"]
            if any(v["state"] == "AVAILABLE" for v in status):
                return process
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError("the server did not start in 120 s")


def _stop(process):
    process.terminate()
    assert process.wait(timeout=60) == 0, open(process.output).read()[-3000:]


def _get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.load(response)


def _post(port, data, timeout=30):
    """`(status, parsed JSON body or None)`; the body as bytes or a JSON value."""
    if not isinstance(data, bytes):
        data = json.dumps(data).encode("utf-8")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{PREDICT}", data=data,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, raw


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)[1]["onnx"]


@pytest.fixture(scope="module")
def server(export):
    with HeldPort() as port:
        process = _start(export, port, "--max-wait-ms", "150")
        yield port
        _stop(process)


# ----------------------------------------------------------------------------- requests

WORDS = ["haus", "katze", "baum", "Grüße", "日本", "🏠", "\u200b", "\x00", " ", "a" * 60]
json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["\ud800", "\udfff", "x\ud83d"]),
)  # fmt: skip
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)  # fmt: skip
sentences = st.lists(
    st.lists(st.sampled_from(WORDS), min_size=0, max_size=6).map(" ".join), min_size=1,
    max_size=3,
)  # fmt: skip


def _b64(texts):
    return [{"b64": base64.b64encode(t.encode("utf-8", "surrogatepass")).decode()} for t in texts]


instances = st.one_of(sentences, sentences.map(_b64), json_values,
                      st.lists(st.text(max_size=250), min_size=1, max_size=9))  # fmt: skip
FIELDS = {
    "signature_name": st.sampled_from(["serving_default", "translate_greedy", "other", 3]),
    "beam_size": st.one_of(st.sampled_from([1, 4, 2, 0, -1, True, 4.0, "4", 2**31]), json_values),
    "alpha": st.one_of(st.floats(allow_nan=True, allow_infinity=True), json_values),
    "num_hypotheses": st.sampled_from([1, 2, True, None]),
    "sampling_topk": st.one_of(st.sampled_from([0, 1, 2, 5, -1, 2**31, 2**63, True]),
                               json_values),
    "sampling_temperature": st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                      json_values),
    "seed": st.one_of(st.integers(-1, 2**64), st.lists(st.integers(0, 2**31), max_size=4)),
    "prefix": st.one_of(st.sampled_from(WORDS), st.lists(st.sampled_from(WORDS), max_size=4),
                        json_values),
    "banned": st.one_of(st.lists(st.sampled_from(WORDS), max_size=70), json_values),
    "glossary": st.one_of(st.dictionaries(st.sampled_from(WORDS), st.sampled_from(WORDS),
                                          max_size=3), json_values),
}  # fmt: skip
bodies = st.one_of(
    st.fixed_dictionaries({"instances": instances}, optional=FIELDS),
    st.fixed_dictionaries(
        {
            "inputs": st.one_of(
                instances,
                st.fixed_dictionaries(
                    {"sentences": instances}, optional={"prefix": FIELDS["prefix"]}
                ),
            )
        },
        optional=FIELDS,
    ),
    json_values,
).map(lambda body: json.dumps(body).encode("utf-8"))  # surrogates escaped, NaN as NaN
raw_bodies = st.one_of(
    st.binary(max_size=300),
    st.integers(1, 60_000).map(lambda depth: b'{"instances": ' + b"[" * depth + b"]" * depth + b"}"),
    st.sampled_from([b'{"instances": ["a"], "alpha": NaN}', b'{"instances": ["a"] ', b"",
                     b'{"instances": ["\\ud800"]}', b'{"instances": ["a"], "beam_size": 1e999}']),
)  # fmt: skip


def _answered_in_contract(status, body):
    """200 with predictions, or a 4xx with exactly TF Serving's one-line error."""
    if status == 200:
        return isinstance(body, dict) and set(body) <= {"predictions", "outputs"}
    return (
        400 <= status < 500 and isinstance(body, dict) and set(body) == {"error"}
        and isinstance(body["error"], str) and "\n" not in body["error"]
        and "Traceback" not in body["error"]
    )  # fmt: skip


def test_every_drawn_request_is_answered_in_contract_and_a_neighbour_is_unchanged(server):
    alone = _post(server, {"instances": [PROBE]})
    assert alone[0] == 200
    counts = {"examples": 0, "200": 0, "shared": 0}

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.one_of(bodies, raw_bodies))
    def check(data):
        before = _get(server, f"/v1/models/{NAME}/metadata")["server"]["batches"]
        answers = {}
        threads = [
            threading.Thread(target=lambda: answers.update(drawn=_post(server, data))),
            threading.Thread(target=lambda: answers.update(probe=_post(server, {"instances": [PROBE]}))),
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert set(answers) == {"drawn", "probe"}, "a request hung"
        status, body = answers["drawn"]
        assert _answered_in_contract(status, body), (data[:300], status, body)
        assert answers["probe"] == alone, (data[:300], answers["probe"])
        after = _get(server, f"/v1/models/{NAME}/metadata")["server"]["batches"]
        counts["examples"] += 1
        if status == 200:
            counts["200"] += 1
            counts["shared"] += after - before == 1  # both answered by one translate call

    check()
    assert counts["examples"] >= MAX_EXAMPLES and counts["200"] >= 10, counts
    assert counts["shared"] >= 3, counts  # the probe did share batches with drawn requests


def test_oversized_and_slow_bodies_hold_no_one(server):
    alone = _post(server, {"instances": [PROBE]})
    # A body that declares a gigabyte and sends nothing: 413 before a byte is read.
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        s.sendall(f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\n"
                  "Content-Length: 1000000000\r\n\r\n".encode())  # fmt: skip
        assert s.recv(4096).startswith(b"HTTP/1.1 413")
    # A client that sends a byte a second: 408 at --body-timeout, others served meanwhile.
    body = json.dumps({"instances": [PROBE]}).encode()
    with socket.create_connection(("127.0.0.1", server), timeout=15) as slow:
        slow.sendall(f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode())  # fmt: skip
        started = time.monotonic()
        while time.monotonic() - started < 5.5:
            try:
                slow.sendall(body[:1])
            except OSError:
                break
            assert _post(server, {"instances": [PROBE]}) == alone
            time.sleep(0.5)
        assert slow.recv(4096).startswith(b"HTTP/1.1 408")


def test_versions_swapped_removed_and_broken_mid_traffic(export, tmp_path):
    """Clients translate (plain and steered) while version 2 arrives, version 3 arrives
    broken, and version 2's folder is removed: every answer is 200 and the export's own,
    and the server ends on version 1 again (the way back)."""
    models = tmp_path / "models"
    shutil.copytree(export, models / "1")
    with HeldPort() as port:
        process = _start(models, port, "--max-wait-ms", "5", "--poll-seconds", "0.2")
        plain, steered = {"instances": [PROBE]}, {"instances": [PROBE], "prefix": "the"}
        expected = {"plain": _post(port, plain), "steered": _post(port, steered)}
        info = _get(port, f"/v1/models/{NAME}/metadata")["server"]
        assert info["runtime"]["warmup_ms"] > 0  # warmed up before it took traffic
        answers, stop = [], threading.Event()

        def client(kind, body):
            while not stop.is_set():
                answers.append((kind, _post(port, body)))

        threads = [threading.Thread(target=client, args=item)
                   for item in (("plain", plain), ("steered", steered))]  # fmt: skip
        for thread in threads:
            thread.start()

        def state(version):
            status = _get(port, f"/v1/models/{NAME}")["model_version_status"]
            return {v["version"]: v["state"] for v in status}.get(version)

        def wait(condition, what, seconds=90):
            deadline = time.time() + seconds
            while not condition():
                assert time.time() < deadline, what
                time.sleep(0.1)

        shutil.copytree(export, tmp_path / "staging")
        os.rename(tmp_path / "staging", models / "2")
        wait(lambda: state("1") == "END", "version 2 did not replace version 1")
        (models / "3").mkdir()
        (models / "3" / "config.json").write_text("{broken")
        wait(lambda: state("3") == "END", "version 3 was not tried")
        shutil.rmtree(models / "2")  # its steered graph's file goes with it
        wait(lambda: state("2") == "END" and state("1") == "AVAILABLE", "no way back to 1")
        time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join()
        _stop(process)
    assert len(answers) > 20
    for kind, answer in answers:
        assert answer == expected[kind], (kind, answer)
