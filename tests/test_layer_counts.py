"""Separate encoder and decoder depths (`encoder_layers`, `decoder_layers`; None:
`num_layers`): the model builds them, saves and reloads them, decodes with a cache
of the decoder's depth, and exports them to CTranslate2 (`TransformerSpec`'s
`num_layers=(encoder, decoder)`), which translates as Keras does."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest

from keras_transformer import Transformer
from keras_transformer.config import TransformerConfig, get_preset

SOURCE = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]], dtype="int32")
TARGET = np.array([[2, 11, 12, 13], [2, 14, 15, 0]], dtype="int32")


def _deep_shallow(**overrides):
    return Transformer.from_preset(
        "tiny", vocab_size=40, dropout=0.0, encoder_layers=2, decoder_layers=1, **overrides
    )


def test_the_depths_default_to_num_layers_and_bad_ones_are_named():
    config = TransformerConfig(num_layers=3)
    assert (config.num_encoder_layers, config.num_decoder_layers) == (3, 3)
    config = dataclasses.replace(config, encoder_layers=4, decoder_layers=1)
    assert (config.num_encoder_layers, config.num_decoder_layers) == (4, 1)
    assert get_preset("tiny", decoder_layers=1).num_encoder_layers == get_preset("tiny").num_layers
    for name, value in (("encoder_layers", 0), ("decoder_layers", 1.5), ("decoder_layers", True)):
        with pytest.raises(ValueError, match=rf"{name}={value!r}"):
            TransformerConfig(**{name: value})


def test_a_config_saved_before_the_split_depths_loads_with_num_layers_for_both():
    old = {k: v for k, v in _deep_shallow().get_config().items() if not k.endswith("_layers")}
    old["num_layers"] = 3
    model = Transformer.from_config(old)
    assert (len(model.encoder_layers), len(model.decoder_layers)) == (3, 3)


def test_a_deep_encoder_with_a_shallow_decoder_builds_saves_and_decodes(tmp_path):
    model = _deep_shallow()
    logits = keras.ops.convert_to_numpy(
        model({"source_ids": SOURCE, "target_ids": TARGET}, training=False)
    )
    assert (len(model.encoder_layers), len(model.decoder_layers)) == (2, 1)
    config = model.get_config()
    assert (config["encoder_layers"], config["decoder_layers"]) == (2, 1)
    assert Transformer.from_config(config).get_config() == config
    # The decoding cache holds the decoder's layers, and a cached decode is the full call.
    cache = model.init_cache(SOURCE, max_length=6)
    assert tuple(cache["self_key"].shape)[:2] == (2, 1)
    assert tuple(cache["cross_key"].shape)[:2] == (2, 1)
    steps = []
    for t in range(TARGET.shape[1]):
        step, cache = model.decode_step(TARGET[:, t], cache)
        steps.append(keras.ops.convert_to_numpy(step))
    np.testing.assert_allclose(np.stack(steps, axis=1)[0], logits[0], atol=1e-4)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert (len(loaded.encoder_layers), len(loaded.decoder_layers)) == (2, 1)
    again = loaded({"source_ids": SOURCE, "target_ids": TARGET}, training=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again), logits, atol=1e-5)


@pytest.mark.slow
def test_the_ctranslate2_export_keeps_both_depths_and_translates_as_keras(tmp_path):
    """A tiny 2 + 1 model fitted a few steps on a copy task (`export_fixtures`): its
    CTranslate2 spec has 2 encoder and 1 decoder layers, and greedy search there gives
    Keras's translations."""
    pytest.importorskip("ctranslate2")
    import sentencepiece as spm
    from export_fixtures import SEED, _fit_copy_task, _train_vocab, held_out_sentences

    from keras_transformer import CTranslate2Translator
    from keras_transformer.export import export_all
    from keras_transformer.export.ctranslate2 import transformer_spec
    from keras_transformer.translators.keras_translator import Translator
    from keras_transformer.workdir import load

    keras.utils.set_random_seed(SEED)
    work = tmp_path / "work"
    work.mkdir()
    _train_vocab(str(work / "vocab.model"))
    processor = spm.SentencePieceProcessor(model_file=str(work / "vocab.model"))
    model = Transformer.from_preset(
        "tiny", vocab_size=processor.get_piece_size(), dropout=0.0, max_length=32,
        encoder_layers=2, decoder_layers=1,
    )  # fmt: skip
    _fit_copy_task(model, processor, steps=64)
    model.save(str(work / "model.keras"))
    run_info = {
        "config": dataclasses.asdict(model.config),
        "data": {"direction": "de-en"},
        "metrics": {"beam_size": 1, "alpha": 0.6},
    }
    (work / "run.json").write_text(json.dumps(run_info))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    spec = transformer_spec(model, pieces)
    assert (len(spec.encoder.layer), len(spec.decoder.layer)) == (2, 1)
    paths = export_all(str(work), str(tmp_path / "out"), formats=("ctranslate2",), search={})
    assert os.path.exists(os.path.join(paths["ctranslate2"], "model.bin"))
    sentences = held_out_sentences(40)
    loaded, tokenizer, _ = load(str(work))
    expected = Translator(loaded, tokenizer, beam_size=1, max_extra_length=50).translate(sentences)
    translator = CTranslate2Translator.load(paths["ctranslate2"])
    assert translator.translate(sentences, beam_size=1, max_extra_length=50) == list(expected)
    assert len(set(expected)) > 10  # the sentences translate differently
