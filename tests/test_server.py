"""`keras-transformer-serve` over HTTP: a real server process on a local port, spoken
to as TF Serving's REST clients do (`export/serving/client_rest.py` unchanged).

The translations are the ONNX export's own (`OnnxTranslator`, in a process without
TensorFlow); bad requests get TF Serving's error shape and one line, and the server
answers the next request; concurrent requests are batched together and each gets
its own translations; a request in flight at shutdown is answered; every engine and
precision is served as asked (`--engine ctranslate2 --precision int8` is CTranslate2's
int8, `--threads` reaches the runtime) and the metrics parse. Faults, overload and
versions, with a stand-in translator: test_server_faults.py.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from export_fixtures import exported, held_out_sentences, onnx_jobs
from ports import HeldPort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "export", "serving"))
import client_rest  # noqa: E402

NAME = "transformer_de_en"
SENTENCES = held_out_sentences(24, seed=21)

pytestmark = pytest.mark.slow


@pytest.fixture
def port():
    """A port for a test's own server, held until the test ends (ports.py)."""
    with HeldPort() as number:
        yield number


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)


def _start(onnx_dir, port, *args):
    """A server process, once its status says AVAILABLE (its output in a file: the
    access log would fill a pipe nobody reads)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    output = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_transformer.serving", onnx_dir, "--port", str(port),
         "--model-name", NAME, "--max-sentences", "40", "--max-characters", "300", *args],
        stdout=output, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline:
        if process.poll() is not None:
            output.seek(0)
            raise AssertionError(output.read()[-3000:])
        try:
            url = f"http://127.0.0.1:{port}/v1/models/{NAME}"
            with urllib.request.urlopen(url, timeout=2) as response:
                if json.load(response)["model_version_status"][0]["state"] == "AVAILABLE":
                    return process
        except (OSError, IndexError):
            pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError("the server did not start in 120 s")


def _metadata(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/{NAME}/metadata") as r:
        return json.load(r)


@pytest.fixture(scope="module")
def server(export):
    with HeldPort() as port:
        process = _start(export[1]["onnx"], port, "--max-wait-ms", "50", "--workers", "2")
        yield port
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def expected(export):
    """What OnnxTranslator gives for SENTENCES, beam (the export's default) and greedy."""
    jobs = [
        {"name": "beam", "call": "translate", "sentences": SENTENCES},
        {"name": "greedy", "call": "translate", "sentences": SENTENCES, "kwargs": {"beam_size": 1}},
    ]
    results = onnx_jobs(export[1]["onnx"], jobs)
    return {name: results[name]["value"] for name in ("beam", "greedy")}


def _post(port, body, path=f"/v1/models/{NAME}:predict"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_tf_serving_clients_get_the_exports_translations(server, expected):
    assert client_rest.translate(SENTENCES, port=server, model=NAME) == expected["beam"]
    greedy = client_rest.translate(SENTENCES, port=server, model=NAME, signature="translate_greedy")
    assert greedy == expected["greedy"]
    status, body = _post(server, {"inputs": {"sentences": SENTENCES[:3]}})
    assert (status, body) == (200, {"outputs": expected["beam"][:3]})
    status, body = _post(server, {"instances": SENTENCES[:2], "beam_size": 1})
    assert (status, body) == (200, {"predictions": expected["greedy"][:2]})
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/v1/models/{NAME}") as response:
        state = json.load(response)["model_version_status"][0]
    assert state["state"] == "AVAILABLE" and state["status"]["error_code"] == "OK"
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/v1/models/{NAME}/metadata") as r:
        signatures = json.load(r)["metadata"]["signature_def"]["signature_def"]
    assert set(signatures) == {"serving_default", "translate_greedy"}


@pytest.mark.parametrize(
    "body,status,words",
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"instances": ["\xff\xfe"]}', 400, "not valid UTF-8"),
        ({"instances": []}, 400, "instances are empty"),
        ({"instances": "Haus"}, 400, "list of strings"),
        ({"instances": ["Haus", 3]}, 400, "Instance 1 is a int"),
        ({"instances": ["a"], "inputs": ["b"]}, 400, "exactly one of"),
        ({"instances": ["a"] * 41}, 400, "at most 40 (--max-sentences)"),
        ({"instances": ["a" * 301]}, 400, "at most 300 (--max-characters)"),
        ({"instances": ["a"], "signature_name": "other"}, 400, "Unknown signature_name"),
        ({"instances": ["a"], "beam_size": 3}, 400, "beam_size must be an integer, one of"),
        (b"[" + b'"a",' * 400_000 + b'"a"]', 413, "(--max-body-bytes)"),
    ],
)
def test_a_bad_request_is_one_line_in_tf_servings_error_shape(
    server, expected, body, status, words
):
    got, answer = _post(server, body)
    assert got == status and set(answer) == {"error"}, answer
    assert (
        words in answer["error"]
        and "\n" not in answer["error"]
        and "Traceback" not in answer["error"]
    )
    assert client_rest.translate(SENTENCES[:1], port=server, model=NAME) == expected["beam"][:1]


def test_another_model_name_is_404(server):
    status, answer = _post(server, {"instances": ["a"]}, path="/v1/models/other:predict")
    assert status == 404 and "Servable not found" in answer["error"]


def test_concurrent_requests_are_batched_and_each_gets_its_own(server, expected):
    def batches():
        return _metadata(server)["server"]["batches"]

    before = batches()
    results = [None] * len(SENTENCES)

    def ask(i):
        results[i] = client_rest.translate([SENTENCES[i]], port=server, model=NAME)[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(SENTENCES))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == expected["beam"]
    assert batches() - before < len(SENTENCES)  # some requests shared a translate call


def test_the_page_works_offline(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/") as response:
        page = response.read().decode("utf-8")
    assert "<textarea" in page and f"/v1/models/{NAME}:predict" in page
    assert "http://" not in page and "https://" not in page  # no external fonts or scripts


def test_a_request_in_flight_at_shutdown_is_answered(export, expected, port):
    process = _start(export[1]["onnx"], port, "--max-wait-ms", "300")
    answer = {}

    def ask():
        answer["value"] = client_rest.translate(SENTENCES, port=port, model=NAME)

    thread = threading.Thread(target=ask)
    thread.start()
    time.sleep(0.1)  # the request waits for others (300 ms) when the signal comes
    process.send_signal(signal.SIGTERM)
    thread.join(timeout=60)
    assert process.wait(timeout=60) == 0  # drained: exit 0
    assert answer.get("value") == expected["beam"]


def test_two_workers_each_load_the_export_and_the_metrics_count_the_requests(server, expected):
    from prometheus_client.parser import text_string_to_metric_families

    def samples():
        url = f"http://127.0.0.1:{server}/monitoring/prometheus/metrics"
        with urllib.request.urlopen(url) as response:
            text = response.read().decode("utf-8")
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    workers = _metadata(server)["server"]["worker_processes"]
    assert len(workers) == 2 and len({w["pid"] for w in workers}) == 2
    assert {w["state"] for w in workers} <= {"idle", "busy"}
    before = samples()
    assert client_rest.translate(SENTENCES[:5], port=server, model=NAME) == expected["beam"][:5]
    assert _post(server, {"instances": []})[0] == 400
    after = samples()

    def grew(name, **labels):
        key = ("keras_transformer_serve_" + name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("requests_total", code="200") == 1 and grew("requests_total", code="400") == 1
    assert grew("sentences_total") == 5
    assert grew("request_latency_seconds_count") == 2
    assert after[("keras_transformer_serve_model_version", ())] == 1


def test_onnx_int8_with_threads_is_what_the_runtime_reports(export, port):
    onnx_dir = export[1]["onnx"]
    jobs = [{"name": "int8", "call": "translate", "sentences": SENTENCES[:6],
             "translator": {"precision": "int8"}}]  # fmt: skip
    reference = onnx_jobs(onnx_dir, jobs)["int8"]["value"]
    process = _start(onnx_dir, port, "--precision", "int8", "--threads", "2", "--workers", "1")
    try:
        runtime = _metadata(port)["server"]["runtime"]
        assert runtime["precision"] == "int8" and runtime["intra_op_num_threads"] == 2
        assert client_rest.translate(SENTENCES[:6], port=port, model=NAME) == reference
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_ctranslate2_int8_is_served_as_int8(export, port):
    from keras_transformer.translators.ctranslate2_translator import CTranslate2Translator

    ct2_dir = export[1]["ctranslate2"]
    int8 = CTranslate2Translator(ct2_dir, compute_type="int8").translate(SENTENCES)
    process = _start(ct2_dir, port, "--engine", "ctranslate2", "--precision", "int8",
                     "--threads", "2", "--workers", "1")  # fmt: skip
    try:
        server = _metadata(port)["server"]
        # CTranslate2's own report: int8 on a CPU is int8_float32 (int8 weights and
        # matrix products, the rest in float32); the float32 engine reports float32
        # (test_the_ctranslate2_engine_gives_the_n_best_with_scores_on_the_page_too).
        assert server["runtime"]["compute_type"] == "int8_float32"
        assert server["runtime"]["intra_threads"] == 2 and server["precision"] == "int8"
        status, body = _post(port, {"instances": SENTENCES})
        assert (status, body) == (200, {"predictions": int8})
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium from the system's packages (`make test` installs them with
    apt-get, as it installs the corpus), driven by Selenium with the system's driver
    (never Selenium Manager's download, which these machines cannot reach)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _translate_on_page(browser, port, text, **choices):
    """Types `text` into the page, picks `choices` (select id -> visible text),
    clicks Translate and returns what the page shows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"http://127.0.0.1:{port}/")
    browser.find_element(By.ID, "src").send_keys(text)
    for select, choice in choices.items():
        Select(browser.find_element(By.ID, select)).select_by_visible_text(choice)
    browser.find_element(By.ID, "go").click()
    out = browser.find_element(By.ID, "out")
    WebDriverWait(browser, 60).until(lambda _: out.text not in ("", "..."))
    return out.text


def test_a_person_types_sentences_into_the_page_and_sees_the_translations(
    server, expected, browser
):
    from selenium.webdriver.common.by import By

    shown = _translate_on_page(browser, server, "\n".join(SENTENCES[:3]))
    assert shown.split("\n") == expected["beam"][:3]
    shown = _translate_on_page(browser, server, SENTENCES[3], signature="greedy")
    assert shown == expected["greedy"][3]
    # The ONNX engine has no n-best: the page does not offer it.
    assert not browser.find_element(By.ID, "nbest").is_displayed()


def test_the_ctranslate2_engine_gives_the_n_best_with_scores_on_the_page_too(export, browser, port):
    from keras_transformer.translators.ctranslate2_translator import CTranslate2Translator

    ct2_dir = export[1]["ctranslate2"]
    reference = CTranslate2Translator(ct2_dir).translate(SENTENCES[:4], num_hypotheses=3)
    assert any(len({t for t, _ in n_best}) == 3 for n_best in reference)  # three different
    process = _start(ct2_dir, port, "--engine", "ctranslate2")
    try:
        assert _metadata(port)["server"]["runtime"]["compute_type"] == "float32"
        status, body = _post(port, {"instances": SENTENCES[:4], "num_hypotheses": 3})
        assert status == 200, body
        for got, n_best in zip(body["predictions"], reference, strict=True):
            assert got["translations"] == [t for t, _ in n_best]
            assert got["scores"] == pytest.approx([s for _, s in n_best], abs=1e-4)
            assert got["scores"] == sorted(got["scores"], reverse=True)
        status, body = _post(port, {"instances": SENTENCES[:1], "num_hypotheses": 9})
        assert status == 400 and "num_hypotheses must be an integer in [1, " in body["error"]
        shown = _translate_on_page(browser, port, SENTENCES[0], nbest="2")
        lines = shown.split("\n")
        assert [line.split(". ", 1)[1].rsplit("  (", 1)[0] for line in lines] == [
            t for t, _ in reference[0][:2]
        ]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_n_best_on_the_onnx_engine_is_a_bad_request_naming_the_engine(server):
    status, body = _post(server, {"instances": SENTENCES[:1], "num_hypotheses": 2})
    assert status == 400 and "--engine ctranslate2" in body["error"]
