"""`keras-transformer-serve` tried as an attacker or a careless client would: requests
that must be refused alone (400/403/404/408/413 in TF Serving's JSON error shape, never
a 5xx or a hang), limits that keep one request from holding everyone's, and the
operations TF Serving users rely on: version policies and their routes, a version
folder still being copied, a way back to an earlier version, a drain on SIGTERM.

Servers run a stand-in translator (`test_server_faults.stand_in`, whose batches are
logged), so what reaches a worker is seen; test_server_abuse.py runs a real ONNX
engine under property-based requests.
"""

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import threading
import time

import pytest
import test_server_faults
from test_server_faults import NAME, _in_background, _running

from keras_transformer.serving import requests as serving_requests
from keras_transformer.serving.requests import BadRequest, Limits

PREDICT = f"/v1/models/{NAME}:predict"
serve = test_server_faults.serve  # the fixture: servers over the stand-in, stopped after
INFO = {
    "beam_sizes": [1, 4],
    "default_beam": 4,
    "glossary": True,
    "steering": ("prefix", "banned", "sampling_topk", "sampling_temperature", "seed"),
}


def _raw(port, head, body=b"", wait=5.0):
    """`(status, headers text, body text)` of a raw HTTP exchange; status None when
    nothing came back within `wait` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(head.encode("latin-1") + body)
        data = b""
        try:
            while b"\r\n\r\n" not in data or not _complete(data):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            pass
    if not data:
        return None, "", ""
    head_text, _, rest = data.decode("utf-8", "replace").partition("\r\n\r\n")
    return int(head_text.split()[1]), head_text.lower(), rest


def _complete(data):
    head, _, rest = data.partition(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(rest) >= int(line.split(b":")[1])
    return False


def _post_head(length, host="localhost", extra=""):
    return (f"POST {PREDICT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n")  # fmt: skip


# ----------------------------------------------------------------------------- the schema


@pytest.mark.parametrize(
    "raw,words",
    [
        (b'{"instances": ["a"], "beam_size": true}', "beam_size must be an integer"),
        (b'{"instances": ["a"], "beam_size": 4.0}', "beam_size must be an integer"),
        (b'{"instances": ["a"], "alpha": NaN}', "NaN is not a JSON number"),
        (b'{"instances": ["a"], "alpha": Infinity}', "Infinity is not a JSON number"),
        (b'{"instances": ["a"], "alpha": 1e999}', "alpha must be a number in [0, 10]"),
        (b'{"instances": ["a"], "alpha": 11}', "alpha must be a number in [0, 10]"),
        (
            b'{"instances": ["a"], "sampling_topk": 0, "sampling_temperature": 1e-300}',
            "sampling_temperature must be a number in [0.001, 1000]",
        ),
        (b'{"instances": ["a"], "sampling_topk": 2147483648}', "sampling_topk must be an integer"),
        (b'{"instances": ["a"], "sampling_topk": 0, "seed": 2147483648}', "seed must be"),
        (b'{"instances": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested too deeply"),
        (b'{"instances": ["\\ud800"]}', "Instance 0 is not valid Unicode"),
        (b'{"instances": ["a"], "prefix": "\\udfff"}', "prefix 0 is not valid Unicode"),
        (b'{"instances": [{"b64": "not base64!"}]}', "b64 is not base64 of UTF-8"),
        (b'{"instances": [{"b64": "//79"}]}', "b64 is not base64 of UTF-8"),
        (b'{"instances": ["a"], "num_hypotheses": 2}', "needs the CTranslate2 engine"),
    ],
)
def test_a_wrong_type_or_value_is_a_bad_request_naming_the_field(raw, words):
    with pytest.raises(BadRequest, match=re.escape(words)) as refused:
        body = serving_requests.parse_body(raw)
        serving_requests.parse_request(body, INFO, Limits(), "onnx")
    assert refused.value.status == 400 and "\n" not in str(refused.value)


def test_tf_servings_b64_strings_are_read_as_utf8_text():
    text = "Grüße aus Köln"
    b64 = {"b64": __import__("base64").b64encode(text.encode()).decode()}
    for body in ({"instances": [b64]}, {"inputs": {"sentences": [b64]}}, {"inputs": b64},
                 {"instances": [{"sentences": b64, "prefix": b64}]}):  # fmt: skip
        parsed = serving_requests.parse_request(body, INFO, Limits(), "ctranslate2")
        assert parsed.sentences == [text]


@pytest.mark.parametrize(
    "fields,limits,words",
    [
        ({"banned": [f"w{i}" for i in range(65)]}, {}, "at most 64 (--max-banned)"),
        ({"banned": ["a " * 17]}, {}, "banned 0 has 17 words; this server takes at most 16"),
        ({"banned": ["x" * 201]}, {}, "at most 200 (--max-term-characters)"),
        ({"glossary": {f"der x{i}": "the" for i in range(257)}}, {}, "(--max-glossary)"),
        ({"glossary": [["a " * 17, "b"]]}, {}, "source term has 17 words"),
        ({"glossary": {"a": "b " * 17}}, {}, "target term has 17 words"),
        ({}, {"max_work": 4 * 9}, "has 40 characters x beam (4); this server takes at most 36"),
    ],
)
def test_each_list_a_request_carries_is_bounded_and_the_error_names_the_flag(fields, limits, words):
    body = {"instances": ["zehn zeichen"[:10]], **fields}
    with pytest.raises(BadRequest) as refused:
        serving_requests.parse_request(body, INFO, Limits(**limits), "onnx")
    assert words in str(refused.value)
    within = {"instances": ["a"], "banned": ["w"] * 64, "glossary": {"der x": "the"}}
    assert serving_requests.parse_request(within, INFO, Limits(), "onnx").glossary is not None


def test_glossary_matching_runs_off_the_event_loop(monkeypatch):
    """The annotation runs in a thread: here it waits for an event that only another
    coroutine of the same loop sets, so it finishes only if the loop went on meanwhile
    (run inside the loop, it would wait until its deadline and raise TimeoutError)."""
    from keras_transformer import terminology
    from keras_transformer.serving import app

    released = threading.Event()

    def slow_annotate(sentences, glossary):
        assert released.wait(5)
        return [s + "!" for s in sentences]

    monkeypatch.setattr(terminology, "annotate_all", slow_annotate)
    parsed = serving_requests.parse_request(
        {"instances": ["a"], "glossary": {"a": "b"}}, INFO, Limits(), "onnx"
    )

    async def both():
        loop = asyncio.get_running_loop()
        work = asyncio.create_task(app.annotated(parsed, loop.time() + 10, Limits()))
        await asyncio.sleep(0.05)
        released.set()  # a health check's turn: the loop is free
        return await work

    assert asyncio.run(both()) == ["a!"]


def test_a_glossary_cannot_grow_a_request_past_its_work_limit():
    """Terms written into the sentences make them longer: the work is counted again on
    the annotated sentences (999 one-letter words, each followed by a 200-letter term)."""
    from keras_transformer.serving import app

    parsed = serving_requests.parse_request(
        {"instances": [" ".join(["a"] * 999)], "glossary": {"a": "b" * 200}, "beam_size": 1},
        INFO, Limits(), "onnx",
    )  # fmt: skip

    async def run():
        return await app.annotated(parsed, asyncio.get_running_loop().time() + 10, Limits())

    with pytest.raises(BadRequest, match=r"with its glossary's terms has \d+ characters"):
        asyncio.run(run())


def test_the_queues_maps_hold_only_what_is_waiting():
    """Keys carry client-chosen values (alpha, the client's address): once their
    requests leave, the keys go, so no client can grow the server's memory."""
    from keras_transformer.serving.metrics import Metrics
    from keras_transformer.serving.queue import RequestQueue

    async def run():
        queue = RequestQueue(4, 0, 10_000, Metrics())
        for i in range(500):
            queue.put(["a"], {"beam_size": 4, "alpha": i / 7}, 30, client=f"10.0.{i}.1")
        while queue.sentences:
            queue.take()
        return len(queue._counts), len(queue._clients)

    assert asyncio.run(run()) == (0, 0)


# ----------------------------------------------------------------------------- over HTTP


def test_bad_requests_get_json_errors_and_never_reach_a_worker(serve):
    server = serve("--workers", "1", "--max-wait-ms", "0")
    port = server.port
    for raw in (b'{"instances": ["a"], "beam_size": true}', b'{"instances": ["\\ud800"]}',
                b'{"instances": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):  # fmt: skip
        status, _, body = _raw(port, _post_head(len(raw)), raw)
        assert status == 400 and set(json.loads(body)) == {"error"}, body
    for head, status_wanted in (
        ("GET /no/such/path HTTP/1.1\r\nHost: localhost\r\n\r\n", 404),
        (f"DELETE {PREDICT} HTTP/1.1\r\nHost: localhost\r\n\r\n", 405),
        (f"GET /v1/models/{NAME}/versions/7 HTTP/1.1\r\nHost: localhost\r\n\r\n", 404),
        (f"GET /v1/models/{NAME}/versions/x HTTP/1.1\r\nHost: localhost\r\n\r\n", 404),
        (f"POST /v1/models/{NAME}:explain HTTP/1.1\r\nHost: localhost\r\n"
         "Content-Length: 0\r\n\r\n", 404),
    ):  # fmt: skip
        status, headers, body = _raw(port, head)
        assert status == status_wanted and "application/json" in headers, (head, body)
        assert set(json.loads(body)) == {"error"}
    assert server.batches() == []
    assert server.post(["eins"])[:2] == (200, {"predictions": ["EINS"]})


def test_a_body_is_refused_by_its_size_before_it_is_read_and_by_its_pace(serve):
    server = serve("--workers", "1", "--max-body-bytes", "1000", "--body-timeout", "1")
    port = server.port
    # Content-Length over the limit, nothing sent: answered at once, the connection closed.
    asked = time.monotonic()
    status, headers, body = _raw(port, _post_head(1_000_000_000), b"{")
    assert status == 413 and "(--max-body-bytes)" in json.loads(body)["error"]
    assert "connection: close" in headers and time.monotonic() - asked < 3
    # Chunked, no length: refused once it grows past the limit.
    chunk = b'{"instances": ["' + b"a" * 2000 + b'"]}'
    chunked = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n"
    head = (f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            "Content-Type: application/json\r\n\r\n")  # fmt: skip
    assert _raw(port, head, chunked)[0] == 413
    # One byte at a time: 408 at --body-timeout, and others are answered meanwhile.
    body = json.dumps({"instances": ["langsam"]}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(_post_head(len(body)).encode())
        asked = time.monotonic()
        for byte in body[:4]:
            slow.sendall(bytes([byte]))
            assert server.post(["schnell"])[:2] == (200, {"predictions": ["SCHNELL"]})
            time.sleep(0.3)
        answer = slow.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 408") and "(--body-timeout)" in answer
    assert 0.9 < time.monotonic() - asked < 3
    assert [s for _, s in server.batches()] == [["schnell"]] * 4  # only the others ran
    # A client that leaves mid-body is no server error (499 in the log, nothing else).
    with socket.create_connection(("127.0.0.1", port), timeout=10) as gone:
        gone.sendall(_post_head(len(body)).encode() + body[:5])
    server.wait_for(lambda: server.metric("requests_total", code="499") == 1, "not counted")
    assert server.metric("requests_total", code="500") is None
    assert "Unhandled" not in server.output.read_text()


def test_host_and_origin_are_checked_and_clients_without_origin_pass(serve):
    server = serve("--workers", "1", "--allowed-origins", "https://app.example")
    port, body = server.port, json.dumps({"instances": ["a"]}).encode()
    cases = [
        ("evil.example", "", 403),  # DNS rebinding: a name that is not this server's
        ("localhost", "Origin: http://evil.example\r\nContent-Type: text/plain\r\n", 403),
        ("localhost", "Origin: null\r\n", 403),
        ("localhost", "", 200),  # curl, TF Serving's clients: no Origin
        (f"127.0.0.1:{port}", f"Origin: http://127.0.0.1:{port}\r\n", 200),  # its own page
        ("localhost", "Origin: https://app.example\r\n", 200),
    ]
    for host, extra, wanted in cases:
        status, headers, answer = _raw(port, _post_head(len(body), host, extra), body)
        assert status == wanted, (host, extra, answer)
        if wanted == 403:
            assert "is not allowed" in json.loads(answer)["error"]
    status, headers, _ = _raw(port, _post_head(len(body), "localhost",
                                               "Origin: https://app.example\r\n"), body)  # fmt: skip
    assert "access-control-allow-origin: https://app.example" in headers
    assert len(server.batches()) == 4  # the three allowed above, and this one


def test_every_address_needs_the_names_clients_use(tmp_path):
    from keras_transformer.serving import cli

    args = cli.parse_args([str(tmp_path), "--host", "0.0.0.0"])
    with pytest.raises(ValueError, match="--allowed-hosts"):
        cli.build_app(args)
    # A request larger than one client's share could never be queued: refused at start.
    args = cli.parse_args([str(tmp_path), "--max-sentences", "8", "--max-client-queue", "4"])
    with pytest.raises(ValueError, match="--max-sentences 8 exceeds --max-client-queue 4"):
        cli.build_app(args)


def test_one_client_cannot_fill_the_queue_for_the_others(serve):
    server = serve("--workers", "1", "--max-wait-ms", "0", "--timeout", "3", "--max-sentences",
                   "2", "--max-client-queue", "2", "--trusted-proxies", "127.0.0.1")  # fmt: skip
    hang, _ = _in_background(lambda: server.post(["HANG"]))
    server.wait_for(lambda: len(server.batches()) == 1, "no HANG")
    greedy = {"X-Forwarded-For": "10.0.0.1"}
    waiting, _ = _in_background(lambda: server.post(["a", "b"], headers=greedy))
    server.wait_for(lambda: server.metric("queue_sentences") == 2, "not queued")
    status, body, headers = server.post(["c"], headers=greedy)
    assert status == 503 and "(--max-client-queue)" in body["error"]
    assert headers["Retry-After"] == "1"
    other, answer = _in_background(
        lambda: server.post(["d"], headers={"X-Forwarded-For": "10.0.0.2"})
    )
    server.wait_for(lambda: server.metric("queue_sentences") == 3, "the other was refused")
    for thread in (hang, waiting, other):
        thread.join()


# ----------------------------------------------------------------------------- versions


def test_versions_are_served_by_policy_with_their_routes_and_a_way_back(serve, tmp_path):
    models = tmp_path / "models"
    for version, suffix in (("1", "-v1"), ("2", "-v2")):
        (models / version).mkdir(parents=True)
        (models / version / "suffix.txt").write_text(suffix)
    (models / "²").mkdir()  # str.isdigit says yes, int() says no: not a version
    server = serve("--workers", "1", "--version-policy", "latest", "--latest-versions", "2")
    assert server.post(["a"])[1] == {"predictions": ["A-v2"]}
    path = f"/v1/models/{NAME}/versions/1:predict"
    assert server.post(["a"], path=path)[1] == {"predictions": ["A-v1"]}
    assert json.loads(server.get(f"/v1/models/{NAME}/versions/1/metadata"))["model_spec"][
        "version"] == "1"  # fmt: skip
    # Version 3 arrives half-copied (it does not load), then whole: it is tried again.
    (models / "3").mkdir()
    (models / "3" / "broken").write_text("")
    server.wait_for(lambda: (server.state("3") or {}).get("state") == "END", "3 not tried")
    (models / "3" / "suffix.txt").write_text("-v3")
    (models / "3" / "broken").unlink()
    server.wait_for(lambda: server.state("3")["state"] == "AVAILABLE", "3 not tried again")
    server.wait_for(lambda: server.state("1")["state"] == "END", "1 not unloaded")
    assert server.post(["a"])[1] == {"predictions": ["A-v3"]}
    status, body, _ = server.post(["a"], path=path)
    assert status == 404 and "Version 1 is END" in body["error"]
    # The way back: the newest folder removed, the one before is served again.
    shutil.rmtree(models / "3")
    server.wait_for(lambda: server.state("3")["state"] == "END", "3 not unloaded")
    server.wait_for(lambda: server.state("1")["state"] == "AVAILABLE", "1 not back")
    assert server.post(["a"])[1] == {"predictions": ["A-v2"]}
    assert server.process.poll() is None


def test_a_specific_policy_serves_only_the_versions_named(serve, tmp_path):
    for version in ("1", "2", "3"):
        (tmp_path / "models" / version).mkdir(parents=True)
        (tmp_path / "models" / version / "suffix.txt").write_text(f"-v{version}")
    server = serve("--workers", "1", "--version-policy", "specific", "--versions", "1")
    assert server.post(["a"])[1] == {"predictions": ["A-v1"]}
    assert [v["version"] for v in json.loads(server.get(f"/v1/models/{NAME}"))[
        "model_version_status"]] == ["1"]  # fmt: skip


# ----------------------------------------------------------------------------- shutdown


def test_sigterm_to_the_process_group_answers_every_request_received(serve):
    """A service manager signals the whole group: the workers ignore it, the server
    stops listening, answers each request it has, starts no worker, and exits 0."""
    server = serve("--workers", "2", "--max-batch", "1", "--max-wait-ms", "0", delay=0.3,
                   new_session=True)  # fmt: skip
    pids = [w["pid"] for w in server.workers()]
    answers = []
    threads = [threading.Thread(target=lambda k=k: answers.append(server.post([f"s{k}"])))
               for k in range(8)]  # fmt: skip
    for thread in threads:
        thread.start()
    server.wait_for(  # every request received: running (logged) or queued
        lambda: len(server.batches()) + server.metric("queue_sentences") == 8, "not received"
    )
    os.killpg(server.process.pid, signal.SIGTERM)
    for thread in threads:
        thread.join()
    assert server.process.wait(timeout=30) == 0
    assert sorted(status for status, *_ in answers) == [200] * 8, answers
    assert len(server.batches()) == 8  # each ran on a worker that outlived the signal
    log = server.output.read_text()
    assert "starting a new one" not in log and "restart" not in log, log
    assert [pid for pid in pids if _running(pid)] == []
