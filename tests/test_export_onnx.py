"""ONNX export: graph checks, Keras == ONNX Runtime to 1e-4, and OnnxTranslator == Keras."""

import os

import numpy as np
import pytest
from export_fixtures import exported, held_out_sentences, keras_translations, loaded_work_dir

pytestmark = pytest.mark.slow
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)


@pytest.fixture(scope="module")
def translator(export):
    from keras_transformer.onnx_translator import OnnxTranslator

    return OnnxTranslator(export[1]["onnx"])


@pytest.fixture(scope="module")
def sessions(translator):
    return translator.encoder, translator.decoder_step


def test_graphs_pass_checker_with_dynamic_axes_and_opset(export):
    import onnx

    onnx_dir = export[1]["onnx"]
    assert sorted(os.listdir(onnx_dir)) == [
        "config.json", "decoder_step.onnx", "encoder.onnx", "vocab.model"
    ]  # fmt: skip
    for name in ("encoder.onnx", "decoder_step.onnx"):
        model = onnx.load(os.path.join(onnx_dir, name))
        onnx.checker.check_model(model, full_check=True)
        opsets = {o.domain: o.version for o in model.opset_import}
        assert opsets[""] <= 18, opsets
        for value in model.graph.input:
            dims = value.type.tensor_type.shape.dim
            # Axis 0 (batch) and every length axis are symbolic, not fixed sizes.
            assert dims[0].dim_param and not dims[0].dim_value, (name, value.name)
            if value.name in ("source_ids", "source_mask"):
                assert dims[1].dim_param, (name, value.name)
            if value.name.startswith(("self_", "cross_")):
                assert dims[2].dim_param, (name, value.name)


def _source_batch(translator):
    # Different lengths, so the batch has padding; one sentence longer than any in training.
    return translator.encode(["haus", "katze hund baum", "brot milch kind frau mann schule tisch"])


def test_encoder_matches_keras(export, translator, sessions):
    model, _, _ = loaded_work_dir(export[0])
    source_ids = _source_batch(translator)
    encoder, _ = sessions
    cross_key, cross_value, source_mask = encoder.run(None, {"source_ids": source_ids})
    cache = model.init_cache(source_ids, 4)
    np.testing.assert_allclose(cross_key, np.asarray(cache["cross_key"]), atol=TOLERANCE)
    np.testing.assert_allclose(cross_value, np.asarray(cache["cross_value"]), atol=TOLERANCE)
    np.testing.assert_array_equal(source_mask, np.asarray(cache["source_mask"]))


def test_decoder_steps_match_keras(export, translator, sessions):
    """Five steps fed the same tokens: logits and caches agree at every step."""
    model, _, _ = loaded_work_dir(export[0])
    source_ids = _source_batch(translator)
    _, decoder_step = sessions
    cache = model.init_cache(source_ids, 6)
    onnx_cache = {k: np.asarray(v) for k, v in cache.items()}
    tokens = np.full(len(source_ids), 2, np.int32)
    for _ in range(5):
        logits, cache = model.decode_step(tokens, cache)
        onnx_logits, onnx_cache = translator._step(tokens, onnx_cache)
        np.testing.assert_allclose(onnx_logits, np.asarray(logits), atol=TOLERANCE)
        np.testing.assert_allclose(
            onnx_cache["self_key"], np.asarray(cache["self_key"]), atol=TOLERANCE
        )
        np.testing.assert_allclose(
            onnx_cache["self_value"], np.asarray(cache["self_value"]), atol=TOLERANCE
        )
        tokens = np.asarray(logits).argmax(axis=-1).astype(np.int32)


def test_sentencepiece_ids_equal_tf_text_ids(export, translator):
    """The `sentencepiece` package and the TF Text op of the SavedModel give the same ids."""
    import tensorflow as tf

    from keras_transformer.data import load_tokenizer

    tokenizer = load_tokenizer(os.path.join(export[0], "vocab.model"))  # keras-hub, TF Text op
    sentences = held_out_sentences(200) + ["", "  Haus  ", "Müller straße ß é", "日本語 テキスト"]
    expected = tokenizer(tf.constant(sentences))
    expected = expected.to_list() if hasattr(expected, "to_list") else expected
    assert [translator.processor.encode(s) for s in sentences] == expected


def test_greedy_translations_equal_keras(export, translator):
    sentences = held_out_sentences(200)
    expected = keras_translations(export[0], sentences, beam_size=1)
    assert translator.translate(sentences, beam_size=1) == expected
    assert len(set(expected)) > 50


def test_beam_translations_equal_keras(export, translator):
    sentences = held_out_sentences(50)
    assert translator.translate(sentences) == keras_translations(export[0], sentences, beam_size=4)


def test_numpy_beam_search_equals_decoding_beam_search():
    """The numpy port against `decoding.beam_search` on a toy step function."""
    from keras_transformer import decoding
    from keras_transformer.onnx_translator import beam_search

    rng = np.random.default_rng(0)
    table = rng.normal(size=(12, 12)).astype(np.float32) * 3  # next-token logits per token

    def step(token_ids, cache):
        logits = table[np.asarray(token_ids)] + np.asarray(cache["bias"])
        return logits, dict(cache, bias=np.asarray(cache["bias"]) * 0.5)

    cache = {"bias": rng.normal(size=(3, 12)).astype(np.float32)}
    start = np.full(3, 2, np.int32)
    limits = np.array([3, 7, 9], np.int32)
    for alpha in (0.0, 0.6, 1.5):
        expected, _ = decoding.beam_search(
            step, cache, start, 9, eos_id=3, beam_size=4, alpha=alpha, max_lengths=limits
        )
        got = beam_search(step, cache, start, 9, limits, eos_id=3, beam_size=4, alpha=alpha)
        np.testing.assert_array_equal(got, np.asarray(expected)[:, 0])


def test_translator_rejects_bad_arguments(tmp_path, translator):
    from keras_transformer.onnx_translator import OnnxTranslator

    with pytest.raises(FileNotFoundError, match="not an ONNX export"):
        OnnxTranslator(str(tmp_path))
    with pytest.raises(TypeError, match="list of sentences"):
        translator.translate("haus")
    with pytest.raises(TypeError, match="str or bytes.*int 5"):
        translator.translate(["haus", 5])
