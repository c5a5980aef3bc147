"""Faults injected into `keras-transformer-serve`'s application (`serve.make_app`,
served by uvicorn in a thread) with a stand-in translator: a translation that
fails for one sentence fails only its own request, one that hangs is answered
504 at the timeout, and a client that leaves mid-request harms no one; the
server answers the next request after each."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from keras_transformer.serve import DynamicBatcher, make_app

NAME = "faulty"
LIMITS = {"max_body_bytes": 1 << 20, "max_sentences": 64, "max_characters": 500,
          "timeout_seconds": 1.0}  # fmt: skip


def _translate(sentences, settings):
    """Upper-cases; "BOOM" raises, "HANG" takes longer than the timeout."""
    if "BOOM" in sentences:
        raise RuntimeError("injected fault in the translator")
    if "HANG" in sentences:
        time.sleep(3)
    return [s.upper() for s in sentences]


@pytest.fixture(scope="module")
def port():
    import uvicorn

    batcher = DynamicBatcher(_translate, max_batch=64, max_wait_ms=200, workers=2)
    app = make_app(NAME, (1, 4), 4, LIMITS, "onnx", batcher)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, port=free, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started
    yield free
    server.should_exit = True
    thread.join(timeout=30)


def _post(port, sentences):
    body = json.dumps({"instances": sentences}).encode("utf-8")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models/{NAME}:predict", data=body,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def _concurrently(port, requests):
    answers = [None] * len(requests)

    def ask(i):
        answers[i] = _post(port, requests[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_a_translation_that_fails_fails_only_its_own_request(port):
    # Within the 200 ms window the three share a batch; it fails, and each is retried alone.
    answers = _concurrently(port, [["eins"], ["BOOM"], ["zwei", "drei"]])
    assert answers[0] == (200, {"predictions": ["EINS"]})
    assert answers[2] == (200, {"predictions": ["ZWEI", "DREI"]})
    status, body = answers[1]
    assert status == 500 and body == {"error": "RuntimeError: injected fault in the translator"}
    assert _post(port, ["vier"]) == (200, {"predictions": ["VIER"]})


def test_a_translation_that_hangs_is_504_at_the_timeout_and_others_go_on(port):
    start = time.perf_counter()
    status, body = _post(port, ["HANG"])
    assert status == 504 and "longer than 1 s (--timeout)" in body["error"]
    assert time.perf_counter() - start < 2.5  # answered at the timeout, not when it ends
    # The second worker serves others while the first is still stuck on HANG.
    assert _post(port, ["fünf"]) == (200, {"predictions": ["FÜNF"]})


def test_a_client_that_leaves_mid_request_harms_no_one(port):
    body = json.dumps({"instances": ["sechs"]}).encode("utf-8")
    for cut in (10, len(body) - 1):  # in the headers' promise, and one byte short
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(
                f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body[:cut]
            )
    # A client that sends a whole request and leaves before the answer.
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    assert _post(port, ["sieben"]) == (200, {"predictions": ["SIEBEN"]})
