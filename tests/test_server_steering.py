"""Steering through `keras-transformer-serve`: a forced prefix, banned words and sampling
as request fields, on real server processes over the tiny export (`export_fixtures`).

Each answer is the translator's own for the same arguments (`OnnxTranslator` in a
process without TensorFlow, `CTranslate2Translator`): a forced prefix starts every
output; a banned word held by the free outputs is in none of the banned ones; one
seed gives one sample, `OnnxTranslator`'s for that seed; concurrent requests with
different prefixes and bans share batches and each gets its own; an export without
translate_steered.onnx, a field the engine lacks and a bad value are 400s of one
line. How batches are keyed (`serving_queue`): on the queue itself, without a server.
"""

import asyncio
import json
import os
import threading

import pytest
from export_fixtures import exported, held_out_sentences, onnx_jobs
from ports import HeldPort
from test_server import _metadata, _post, _start

SENTENCES = held_out_sentences(12, seed=21)
# One per sentence: words of the copy task, a word it never saw, and none ("").
PREFIXES = ["licht", "zebra licht", "", "baum haus"] * 3
BANNED = ["haus", "katze", "hund"]  # words the copy task's outputs hold most


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)


@pytest.fixture
def port():
    with HeldPort() as number:
        yield number


@pytest.fixture(scope="module")
def server(export):
    """One worker, and a long wait for others: concurrent requests share batches."""
    with HeldPort() as port:
        process = _start(export[1]["onnx"], port, "--max-wait-ms", "300", "--workers", "1")
        yield port
        process.terminate()
        process.wait(timeout=30)


SEEDS = list(range(101, 101 + len(SENTENCES)))
JOBS = {
    "plain": {},
    "prefix": {"target_prefix": PREFIXES},
    "banned": {"banned": BANNED},
    "sampled": {"sampling_topk": 0, "seed": 5},
    "sampled_6": {"sampling_topk": 0, "seed": 6},
    "top3_cold": {"sampling_topk": 3, "sampling_temperature": 0.7, "seed": SEEDS},
}


@pytest.fixture(scope="module")
def expected(export):
    """`OnnxTranslator.translate(SENTENCES, **JOBS[name])` for each name."""
    jobs = [{"name": name, "call": "translate", "sentences": SENTENCES, "kwargs": kwargs}
            for name, kwargs in JOBS.items()]  # fmt: skip
    results = onnx_jobs(export[1]["onnx"], jobs)
    return {name: results[name]["value"] for name in JOBS}


def _holds(ids, sequence):
    n = len(sequence)
    return any(ids[i : i + n] == sequence for i in range(len(ids) - n + 1))


@pytest.mark.slow
def test_a_forced_prefix_starts_every_output(server, expected):
    """Top-level (one for all, or one per sentence), in a row, and as a columnar input."""
    assert expected["prefix"] != expected["plain"]
    for body in (
        {"instances": SENTENCES, "prefix": PREFIXES},
        {
            "instances": [
                {"sentences": s, "prefix": p} for s, p in zip(SENTENCES, PREFIXES, strict=True)
            ]
        },
        {"inputs": {"sentences": SENTENCES, "prefix": PREFIXES}},
    ):
        status, answer = _post(server, body)
        assert status == 200, answer
        outputs = answer.get("predictions", answer.get("outputs"))
        assert outputs == expected["prefix"]
    for output, prefix in zip(expected["prefix"], PREFIXES, strict=True):
        assert output.startswith(prefix), (output, prefix)
    # A row without "prefix" is forced nothing, as "" is.
    rows = [{"sentences": SENTENCES[0], "prefix": "licht"}, SENTENCES[2]]
    assert _post(server, {"instances": rows}) == (
        200, {"predictions": [expected["prefix"][0], expected["plain"][2]]},
    )  # fmt: skip
    status, answer = _post(server, {"instances": SENTENCES[:2], "prefix": "licht"})
    assert status == 200 and all(t.startswith("licht") for t in answer["predictions"])
    rows = [{"sentences": SENTENCES[0], "prefix": "licht"}]
    status, answer = _post(server, {"instances": rows, "prefix": "licht"})
    assert status == 400 and "prefix is given twice" in answer["error"]


@pytest.mark.slow
def test_a_banned_word_is_in_no_output_that_held_it(server, expected, export):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(export[1]["onnx"], "vocab.model")
    )
    banned = [processor.encode(word) for word in BANNED]
    free = [processor.encode(t) for t in expected["plain"]]
    assert sum(any(_holds(ids, b) for b in banned) for ids in free) >= 2  # work for the ban
    assert expected["banned"] != expected["plain"]
    status, answer = _post(server, {"instances": SENTENCES, "banned": BANNED})
    assert (status, answer) == (200, {"predictions": expected["banned"]})
    for text in answer["predictions"]:
        assert not any(_holds(processor.encode(text), b) for b in banned), text


@pytest.mark.slow
def test_one_seed_gives_one_sample_and_onnx_translators_for_that_seed(server, expected):
    body = {"instances": SENTENCES, "sampling_topk": 0, "seed": 5}
    first, second = _post(server, body), _post(server, body)
    assert first == second == (200, {"predictions": expected["sampled"]})
    assert expected["sampled"] != expected["sampled_6"] and expected["sampled"] != expected["plain"]
    assert _post(server, dict(body, seed=6)) == (200, {"predictions": expected["sampled_6"]})
    # One seed per sentence, top-k and temperature.
    body = {"instances": SENTENCES, "sampling_topk": 3, "sampling_temperature": 0.7, "seed": SEEDS}
    assert _post(server, body) == (200, {"predictions": expected["top3_cold"]})


@pytest.mark.slow
def test_concurrent_requests_with_different_steering_share_batches_each_its_own(server, expected):
    """One sentence per request, each with its own prefix, or the ban: the steered graph
    takes them per row, so the requests share batches (fewer translate calls than
    requests) and each answer is the one it gets alone."""
    before = _metadata(server)["server"]["batches"]
    results, wanted = [None] * len(SENTENCES), []
    bodies = []
    for i, sentence in enumerate(SENTENCES):
        if i % 3 == 2:
            bodies.append({"instances": [sentence], "banned": BANNED})
            wanted.append(expected["banned"][i])
        else:
            bodies.append({"instances": [{"sentences": sentence, "prefix": PREFIXES[i]}]})
            wanted.append(expected["prefix"][i])

    def ask(i):
        results[i] = _post(server, bodies[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [(200, {"predictions": [w]}) for w in wanted]
    assert _metadata(server)["server"]["batches"] - before < len(bodies)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields,words",
    [
        ({"sampling_topk": -1}, "sampling_topk must be an integer in [0, 2147483647]"),
        ({"sampling_topk": 2.5}, "sampling_topk must be an integer in [0, 2147483647]"),
        ({"sampling_topk": 0, "sampling_temperature": 0}, "sampling_temperature must be"),
        ({"sampling_topk": 0, "seed": -1}, "seed must be an integer >= 0"),
        ({"sampling_topk": 0, "seed": [1]}, "seed must be an integer >= 0 or a list of 2"),
        ({"seed": 3}, "seed applies to sampling only"),
        ({"sampling_temperature": 0.5}, "sampling_temperature applies to sampling only"),
        ({"banned": "haus"}, "banned must be a list of words"),
        ({"banned": ["haus", 1]}, "banned must be a list of words"),
        ({"prefix": ["licht"]}, "prefix must be a string or a list of one string per sentence (2)"),
        ({"prefix": 3}, "prefix must be a string or a list"),
        ({"prefix": ["licht", None]}, "prefix 1 is a NoneType"),
        ({"prefix": "a" * 301}, "prefix 0 has 301 characters"),
    ],
)
def test_a_bad_steering_value_is_a_400_naming_its_field(server, expected, fields, words):
    status, answer = _post(server, {"instances": SENTENCES[:2], **fields})
    assert status == 400 and words in answer["error"] and "\n" not in answer["error"], answer
    assert _post(server, {"instances": SENTENCES[:1]}) == (
        200,
        {"predictions": expected["plain"][:1]},
    )


@pytest.mark.slow
def test_an_export_without_the_steered_graph_answers_400_naming_it(
    export, expected, tmp_path, port
):
    """An export of an older version (no translate_steered.onnx, no `translate.steering` in
    config.json) serves text as before and refuses steering with one line."""
    onnx_dir, older = export[1]["onnx"], tmp_path / "older"
    older.mkdir()
    for name in os.listdir(onnx_dir):
        if name not in ("translate_steered.onnx", "config.json"):
            os.symlink(os.path.join(onnx_dir, name), older / name)
    with open(os.path.join(onnx_dir, "config.json")) as f:
        config = json.load(f)
    del config["translate"]["steering"]
    (older / "config.json").write_text(json.dumps(config))
    process = _start(str(older), port, "--workers", "1")
    try:
        assert _metadata(port)["server"]["steering"] == []
        for fields in ({"prefix": "licht"}, {"banned": ["haus"]}, {"sampling_topk": 0}):
            status, answer = _post(port, {"instances": SENTENCES[:2], **fields})
            assert status == 400 and "no translate_steered.onnx" in answer["error"], answer
            assert "\n" not in answer["error"]
        assert _post(port, {"instances": SENTENCES}) == (200, {"predictions": expected["plain"]})
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
def test_the_ctranslate2_engine_steers_with_its_own_options(export, port):
    """Prefix and ban: `CTranslate2Translator`'s outputs; a seed (CTranslate2 has no
    per-sentence seeds) is a 400 naming the engine; sampling without one is served."""
    pytest.importorskip("ctranslate2")
    from keras_transformer.translators.ctranslate2_translator import CTranslate2Translator

    ct2_dir = export[1]["ctranslate2"]
    translator = CTranslate2Translator(ct2_dir)
    process = _start(ct2_dir, port, "--engine", "ctranslate2", "--workers", "1")
    try:
        status, answer = _post(port, {"instances": SENTENCES, "prefix": PREFIXES})
        assert (status, answer) == (
            200, {"predictions": translator.translate(SENTENCES, target_prefix=PREFIXES)},
        )  # fmt: skip
        status, answer = _post(port, {"instances": SENTENCES, "banned": BANNED})
        assert (status, answer) == (
            200, {"predictions": translator.translate(SENTENCES, banned=BANNED)},
        )  # fmt: skip
        status, answer = _post(port, {"instances": SENTENCES, "sampling_topk": 0, "seed": 1})
        assert status == 400 and "not supported by --engine ctranslate2" in answer["error"]
        status, answer = _post(port, {"instances": SENTENCES, "sampling_topk": 0})
        assert status == 200 and len(answer["predictions"]) == len(SENTENCES)
        status, answer = _post(
            port, {"instances": SENTENCES[:1], "sampling_topk": 0, "num_hypotheses": 2}
        )
        assert status == 400 and "num_hypotheses must be 1 with sampling" in answer["error"]
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_batches_are_keyed_on_sampling_settings_and_join_the_per_sentence_rows():
    """Steered requests share a batch whatever their prefixes, bans and seeds; a plain
    request never shares one with them (another graph); sampling requests share one
    only with the same top-k and temperature. The call's rows: each request's, in order,
    "" and [] where a request has none."""
    pytest.importorskip("prometheus_client")
    from keras_transformer.serving.metrics import Metrics
    from keras_transformer.serving.queue import RequestQueue, batch_settings

    async def batches():
        queue = RequestQueue(max_batch=64, max_wait_ms=0, max_queue=64, metrics=Metrics())
        beam = {"beam_size": 4}
        cold = dict(beam, sampling_topk=5, sampling_temperature=0.5)
        warm = dict(beam, sampling_topk=5, sampling_temperature=1.0)
        requests = {
            "prefix": queue.put(["a", "b"], beam, 30, rows={"target_prefix": ["A", "B"]}),
            "plain": queue.put(["c"], beam, 30),
            "banned": queue.put(["d"], beam, 30, rows={"banned": [["x"]]}),
            "warm": queue.put(["e"], warm, 30, rows={"seed": [1]}),
            "cold": queue.put(["f"], cold, 30, rows={"seed": [2]}),
            "warm_prefix": queue.put(["g"], warm, 30, rows={"seed": [3], "target_prefix": ["G"]}),
        }
        names = {id(request): name for name, request in requests.items()}
        taken = []
        while queue.sentences:
            batch = queue.take()
            taken.append(([names[id(r)] for r in batch], batch_settings(batch)))
        return taken

    taken = asyncio.run(batches())
    assert [names for names, _ in taken] == [
        ["prefix", "banned"], ["plain"], ["warm", "warm_prefix"], ["cold"]
    ]  # fmt: skip
    assert taken[0][1] == {
        "beam_size": 4, "target_prefix": ["A", "B", ""], "banned": [[], [], ["x"]],
    }  # fmt: skip
    assert taken[1][1] == {"beam_size": 4}
    assert taken[2][1] == {
        "beam_size": 4, "sampling_topk": 5, "sampling_temperature": 1.0, "seed": [1, 3],
        "target_prefix": ["", "G"],
    }  # fmt: skip
    assert taken[3][1]["seed"] == [2]


@pytest.mark.parametrize(
    "engine,supported,fields,words",
    [
        ("onnx", (), {"prefix": "licht"}, "no translate_steered.onnx, the graph that prefix"),
        ("onnx", (), {"sampling_topk": 0}, "no translate_steered.onnx, the graph that sampling"),
        ("ctranslate2", ("prefix", "banned", "sampling_topk", "sampling_temperature"),
         {"sampling_topk": 0, "seed": 4}, "seed is not supported by --engine ctranslate2"),
    ],
)  # fmt: skip
def test_a_field_the_engine_lacks_is_a_bad_request_naming_it(engine, supported, fields, words):
    from keras_transformer.serving import requests as serving_requests

    limits = serving_requests.Limits(max_characters=300)
    with pytest.raises(serving_requests.BadRequest, match=words):
        serving_requests.parse_steering(fields, None, 2, supported, engine, limits)
    plain = serving_requests.parse_steering(
        {"instances": ["a"]}, None, 1, supported, engine, limits
    )
    assert plain == ({}, None)
