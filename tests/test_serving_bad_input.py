"""Bad input to both served paths (SavedModel signature, OnnxTranslator): a defined
output or a clear error, never a crash or a hang."""

import numpy as np
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


@pytest.fixture(scope="module")
def onnx_translator(export):
    from keras_transformer.onnx_translator import OnnxTranslator

    return OnnxTranslator(export[1]["onnx"])


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


def test_saved_model_wrong_input_type_is_a_clear_error(serve):
    import tensorflow as tf

    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
        serve.signatures["serving_default"](sentences=tf.constant([1, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="indices"):
        serve.signatures["greedy_ids"](source_ids=tf.constant([[5, 10**6, 3]]))


def test_onnx_empty_string_and_empty_batch(onnx_translator, serve):
    assert onnx_translator.translate([]) == []
    assert onnx_translator.translate(["", " \t\u3000"], beam_size=1) == ["", ""]
    assert onnx_translator.translate(["", "haus"]) == serve(["", "haus"])
    assert onnx_translator.translate_ids(np.zeros((0, 3), np.int32)).shape[0] == 0


def test_onnx_very_long_sentence_is_truncated(onnx_translator, serve):
    assert onnx_translator.translate([LONG], beam_size=1) == serve([LONG], "translate_greedy")


def test_onnx_invalid_utf8_matches_saved_model(onnx_translator, serve):
    assert onnx_translator.translate([INVALID_UTF8], beam_size=1) == serve(
        [INVALID_UTF8], "translate_greedy"
    )


def test_onnx_wrong_input_type_is_a_clear_error(onnx_translator):
    with pytest.raises(TypeError, match="str or bytes"):
        onnx_translator.translate([None])
    with pytest.raises(ValueError, match=r"\(batch, length\)"):
        onnx_translator.translate_ids(np.array([1, 2, 3]))
