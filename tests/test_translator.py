"""Translator: strings in, strings out; batching, order, bad input, the translate command."""

import json
import logging

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer
from keras_transformer.decoding import translate_ids
from keras_transformer.search import PAPER, SearchConfig
from keras_transformer.translators.keras_translator import Translator

CORPUS = [
    "the cat sat on the mat",
    "a dog runs in the park",
    "die katze sitzt auf der matte",
    "ein hund rennt im park",
    "good morning and thank you",
    "guten morgen und danke",
] * 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.model")
    keras_hub.tokenizers.compute_sentence_piece_proto(
        tf.data.Dataset.from_tensor_slices(CORPUS),
        vocabulary_size=60,
        model_type="bpe",
        proto_output_file=path,
    )
    tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(proto=path, dtype="int32")
    assert [tokenizer.token_to_id(t) for t in ("<pad>", "<unk>", "<s>", "</s>")] == [0, 1, 2, 3]
    tokenizer.proto_path = path
    return tokenizer


def tiny_model(max_length=24):
    model = Transformer.from_preset(
        "tiny", vocab_size=60, dropout=0.0, d_model=32, d_ff=64, max_length=max_length
    )
    model.build()
    return model


@pytest.mark.multibackend
def test_batched_translation_equals_one_by_one(tmp_path_factory):
    """On the trained copy-task fixture, whose outputs are sentences (checked: not
    blank, not all alike), so an all-EOS output could not pass."""
    from export_fixtures import held_out_sentences, trained

    work_dir = trained(tmp_path_factory)
    sentences = held_out_sentences(7, seed=3) + [""]
    translator = Translator.load(work_dir, beam_size=2, batch_size=3)
    batched = translator(sentences)
    assert batched[-1] == "" and all(batched[:-1]) and len(set(batched[:-1])) >= 5, batched
    for sentence, translation in zip(sentences, batched, strict=True):
        assert translator(sentence) == translation
    # Strings are the detokenized ids of translate_ids on the same source ids.
    source = translator.encode(sentences[:1])[0]
    search = translator.search
    ids = translate_ids(translator.model, np.array([source]), 2, search.alpha,
                        search.max_extra_length, stopping=search.stopping,
                        patience=search.patience)  # fmt: skip
    assert translator.decode(keras.ops.convert_to_numpy(ids)) == [batched[0]]


def test_source_ids_end_with_eos_and_output_stops_at_eos(tokenizer):
    translator = Translator(tiny_model(), tokenizer, beam_size=1)
    source = translator.encode(["the cat sat on the mat"])[0]
    assert source[-1] == 3 and 2 not in source and 0 not in source
    assert translator.decode([[10, 11, 3, 12, 0, 0]]) == translator.decode([[10, 11]])


def test_bad_input(tokenizer, caplog):
    translator = Translator(tiny_model(max_length=8), tokenizer, beam_size=2, max_extra_length=3)
    assert translator("") == ""
    assert translator(["", "   "]) == ["", ""]
    assert translator([]) == []
    with pytest.raises(TypeError, match="int"):
        translator(["the cat", 42])
    with pytest.raises(TypeError, match="NoneType"):
        translator([None])
    long_sentence = " ".join(["the cat sat on the mat"] * 5)
    with caplog.at_level(logging.WARNING, logger="keras_transformer.translators.keras_translator"):
        source = translator.encode([long_sentence])[0]
        translation = translator(long_sentence)
    assert "max_length=8" in caplog.text
    assert len(source) == 8 and source[-1] == 3
    assert isinstance(translation, str)
    with pytest.raises(ValueError, match="beam_size"):
        Translator(tiny_model(), tokenizer, beam_size=0)


@pytest.mark.multibackend
def test_search_config_is_the_translators_settings(tokenizer):
    model = tiny_model()
    assert Translator(model, tokenizer).search == PAPER
    search = SearchConfig(beam_size=2, alpha=0.0, max_extra_length=4)
    by_object = Translator(model, tokenizer, search=search)
    by_keywords = Translator(model, tokenizer, beam_size=2, alpha=0.0, max_extra_length=4)
    assert by_object.search == by_keywords.search == search
    sentences = ["the cat sat", "guten morgen und danke", ""]
    assert by_object(sentences) == by_keywords(sentences)
    # Keywords replace the object's settings where given.
    assert Translator(model, tokenizer, beam_size=1, search=search).search == search.replace(
        beam_size=1
    )
    with pytest.raises(ValueError, match="alpha must be a number >= 0"):
        Translator(model, tokenizer, alpha=-1.0)


def test_translate_command(tokenizer, tmp_path, capsys, monkeypatch):
    from keras_transformer import translate

    model = tiny_model()
    model.save(tmp_path / "model.keras")
    (tmp_path / "vocab.model").write_bytes(open(tokenizer.proto_path, "rb").read())
    (tmp_path / "run.json").write_text(json.dumps({"preset": "tiny"}))
    sentences = ["the cat sat", "", "guten morgen"]
    (tmp_path / "input.txt").write_text("\n".join(sentences) + "\n")
    args = ["--work-dir", str(tmp_path), "--beam-size", "2", "--max-extra-length", "4"]
    assert translate.main(args + ["--input", str(tmp_path / "input.txt")]) == 0
    lines = capsys.readouterr().out.split("\n")
    expected = Translator(model, tokenizer, beam_size=2, max_extra_length=4)(sentences)
    assert lines == expected + [""]
    # A mistake is one line and exit 2 (`command_line.run_main`); --debug raises it.
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--work-dir", str(tmp_path / "no-such-dir")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("keras-transformer-translate: error:") and "no-such-dir" in error
    with pytest.raises(FileNotFoundError, match="no-such-dir"):
        translate.main(["--work-dir", str(tmp_path / "no-such-dir"), "--debug"])


def _work_dir(path, model, tokenizer):
    """A work directory as `train.py` leaves it, for the loaders."""
    model.save(path / "model.keras")
    (path / "vocab.model").write_bytes(open(tokenizer.proto_path, "rb").read())
    (path / "run.json").write_text(json.dumps({"preset": "tiny"}))
    return str(path)


def test_from_preset_loads_a_work_directory(tokenizer, tmp_path):
    model = tiny_model()
    work_dir = _work_dir(tmp_path, model, tokenizer)
    loaded = Transformer.from_preset(work_dir)
    assert loaded.config == model.config
    for a, b in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    sentences = ["the cat sat", "guten morgen"]
    translator = Translator.from_preset(work_dir, beam_size=2, max_extra_length=4)
    assert translator.search.beam_size == 2
    assert translator(sentences) == Translator(model, tokenizer, beam_size=2, max_extra_length=4)(
        sentences
    )
    assert Translator.load(work_dir, beam_size=2, max_extra_length=4)(sentences) == translator(
        sentences
    )
    # Architecture presets keep their names (random weights, no tokenizer).
    assert Transformer.from_preset("tiny").config.vocab_size == 1000
    with pytest.raises(ValueError, match="overrides"):
        Transformer.from_preset(work_dir, dropout=0.1)
    with pytest.raises(ValueError, match="architecture preset"):
        Translator.from_preset("tiny")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no trained model"):
        Translator.from_preset(str(tmp_path / "empty"))


def test_a_work_directory_translates_with_its_runs_search(tokenizer, tmp_path, capsys):
    # run.json's test-decode settings are the default of Translator.from_preset
    # and of the translate command, as of the exports (`workdir.search_of`).
    from keras_transformer import translate, workdir

    model = tiny_model()
    work_dir = _work_dir(tmp_path, model, tokenizer)
    run_info = {"preset": "tiny", "metrics": {"beam_size": 3, "alpha": 1.0}}
    (tmp_path / "run.json").write_text(json.dumps(run_info))
    assert workdir.read_search(work_dir) == PAPER.replace(beam_size=3, alpha=1.0)
    assert Translator.from_preset(work_dir).search == PAPER.replace(beam_size=3, alpha=1.0)
    assert Translator.from_preset(work_dir, beam_size=1).search.alpha == 1.0  # flags replace
    sentences = ["the cat sat", "guten morgen"]
    (tmp_path / "input.txt").write_text("\n".join(sentences) + "\n")
    assert translate.main(["--work-dir", work_dir, "--input", str(tmp_path / "input.txt")]) == 0
    expected = Translator(model, tokenizer, beam_size=3, alpha=1.0)(sentences)
    assert capsys.readouterr().out.split("\n") == expected + [""]
    (tmp_path / "run.json").unlink()  # no run record: the paper's search
    assert workdir.read_search(work_dir) == PAPER


def test_the_command_keeps_the_runs_output_limit_unless_told(tokenizer, tmp_path, capsys):
    """The translate command uses the limit the run fitted and recorded (as Translator,
    the SavedModel and translate.onnx do), not the paper's +50, unless given the flag."""
    from keras_transformer import translate

    model = tiny_model()
    work_dir = _work_dir(tmp_path, model, tokenizer)
    run_info = {"preset": "tiny", "metrics": {"beam_size": 1, "max_extra_length": 1}}
    (tmp_path / "run.json").write_text(json.dumps(run_info))
    sentences = ["the cat sat", "guten morgen", "a"]
    (tmp_path / "input.txt").write_text("\n".join(sentences) + "\n")
    command = ["--work-dir", work_dir, "--input", str(tmp_path / "input.txt")]
    fitted = Translator(model, tokenizer, beam_size=1, max_extra_length=1)(sentences)
    paper = Translator(model, tokenizer, beam_size=1, max_extra_length=50)(sentences)
    assert fitted != paper  # the limit decides these outputs, so the check can fail
    assert translate.main(command) == 0
    assert capsys.readouterr().out.split("\n") == fitted + [""]
    assert translate.main(command + ["--max-extra-length", "50"]) == 0
    assert capsys.readouterr().out.split("\n") == paper + [""]


@pytest.mark.multibackend
def test_n_best_with_scores_are_the_beams_own_hypotheses(tokenizer):
    """`translate(..., num_hypotheses=K, return_scores=True)` gives the K
    hypotheses and scores of `beam_search` itself, best first; the first is
    the plain translation."""
    from keras_transformer.decoding import beam_search, output_limits, suppress_tokens

    model = tiny_model()
    translator = Translator(model, tokenizer, beam_size=3, max_extra_length=4)
    sentences = ["the cat sat", "", "good morning"]
    n_best = translator.translate(sentences, num_hypotheses=3, return_scores=True)
    assert n_best[1] == [("", 0.0)] * 3  # blank input does not run the model
    assert [hypotheses[0][0] for hypotheses in n_best] == translator(sentences)
    config = model.config
    for sentence, hypotheses in zip(sentences, n_best, strict=True):
        if not sentence:
            continue
        source = np.array(translator.encode([sentence]))
        buffer_length, max_lengths = output_limits(source, 4, config.max_length, config.pad_id)
        sequences, scores = beam_search(
            suppress_tokens(model.decode_step, (config.pad_id, config.bos_id)),
            model.init_cache(source, buffer_length), np.array([config.bos_id]), buffer_length,
            eos_id=config.eos_id, beam_size=3, alpha=translator.search.alpha,
            max_lengths=max_lengths, pad_id=config.pad_id,
        )  # fmt: skip
        expected_texts = translator.decode(keras.ops.convert_to_numpy(sequences)[0])
        assert [text for text, _ in hypotheses] == expected_texts
        np.testing.assert_allclose(
            [score for _, score in hypotheses], keras.ops.convert_to_numpy(scores)[0], atol=1e-5
        )
        assert all(a >= b for (_, a), (_, b) in zip(hypotheses, hypotheses[1:], strict=False))
    assert translator.translate(["the cat sat"], num_hypotheses=2) == [
        [text for text, _ in n_best[0][:2]]
    ]
    import keras_transformer

    assert keras_transformer.Translator is Translator  # one import for both translators
    text, score = translator.translate(["the cat sat"], return_scores=True)[0]
    assert text == n_best[0][0][0] and score == pytest.approx(n_best[0][0][1], abs=1e-5)
    with pytest.raises(ValueError, match="num_hypotheses must be between 1 and the beam size 3"):
        translator.translate(["the cat sat"], num_hypotheses=4)
