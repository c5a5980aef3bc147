"""Bad input to the SavedModel's signatures: a defined output or a clear error, never a crash
or a hang. translate.onnx gets the same inputs in test_onnx_translate.py and must give the
same outputs."""

import pytest
from export_fixtures import exported, loaded_saved_model

pytestmark = pytest.mark.slow

LONG = " ".join(["haus katze"] * 5000)  # 10,000 words
INVALID_UTF8 = b"haus \xff\xfe katze \xc3"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)


@pytest.fixture(scope="module")
def serve(export):
    import tensorflow as tf

    loaded = loaded_saved_model(export[1]["saved_model"])
    signatures = dict(loaded.signatures)

    def run(sentences, name="serving_default"):
        out = signatures[name](sentences=tf.constant(sentences, dtype=tf.string))
        return [t.decode("utf-8") for t in out["translations"].numpy()]

    run.signatures = signatures
    run.loaded = loaded  # keeps the variables alive
    return run


@pytest.mark.parametrize("name", ["serving_default", "translate_greedy"])
def test_saved_model_empty_string(serve, name):
    """Blank sentences translate to "" (as `Translator`); the others in the batch are unaffected."""
    out = serve(["", "haus", " \t\u3000"], name)
    assert out[0] == "" and out[2] == ""
    assert out[1] == serve(["haus"], name)[0] != ""


def test_saved_model_empty_batch(serve):
    assert serve([]) == []
    assert serve([], "translate_greedy") == []
    import tensorflow as tf

    ids = serve.signatures["greedy_ids"](source_ids=tf.zeros((0, 0), tf.int32))["target_ids"]
    assert ids.shape[0] == 0


def test_saved_model_very_long_sentence_is_truncated(serve):
    """10,000 words: truncated to the model's max_length, translated in bounded time."""
    (long_output,) = serve([LONG])
    truncated = " ".join(LONG.split()[:40])
    assert long_output == serve([truncated])[0]


def test_saved_model_invalid_utf8_is_replaced(serve):
    replaced = INVALID_UTF8.decode("utf-8", errors="replace")
    assert serve([INVALID_UTF8]) == serve([replaced])


# Integers where the signature takes strings: refused before any op runs, with the
# dtype expected and the one given named (TensorFlow's own message).
WRONG_TYPE = r"input #0\(zero-based\) was expected to be a string tensor but is a int32 tensor"


def _refuses_integers(signature):
    """`signature(sentences=[1, 2])` raises InvalidArgumentError naming the two dtypes."""
    import tensorflow as tf

    with pytest.raises(tf.errors.InvalidArgumentError, match=WRONG_TYPE):
        signature(sentences=tf.constant([1, 2]))


def test_saved_model_wrong_input_type_is_a_clear_error(serve):
    import tensorflow as tf

    for name in ("serving_default", "translate_greedy"):
        _refuses_integers(serve.signatures[name])
    with pytest.raises(tf.errors.InvalidArgumentError, match="indices"):
        serve.signatures["greedy_ids"](source_ids=tf.constant([[5, 10**6, 3]]))


def test_the_wrong_type_check_fails_on_another_error():
    """The mutations the check is for (the old one took any TypeError, ValueError or
    InvalidArgumentError, whatever it said): an op failing inside the graph on the
    integers, and a Python error before it."""
    import tensorflow as tf

    def fails_inside(sentences):
        raise tf.errors.InvalidArgumentError(None, None, "StringSplit: input must be a string")

    def python_error(sentences):
        raise TypeError("Cannot convert [1, 2] to EagerTensor of dtype string")

    with pytest.raises(AssertionError, match="Regex pattern did not match"):
        _refuses_integers(fails_inside)
    with pytest.raises(TypeError):
        _refuses_integers(python_error)


def test_saved_model_refuses_a_wrong_rank(serve):
    """`sentences` is declared [batch]: a 2-D batch is an error, as in translate.onnx."""
    import tensorflow as tf

    for name in ("serving_default", "translate_greedy"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="sentences|Shape"):
            serve.signatures[name](sentences=tf.constant([["haus", "katze"]]))
