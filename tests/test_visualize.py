"""Attention plots: the weights are attention probabilities, the PNGs show them."""

import shutil
import sys

import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer import Transformer
from keras_transformer.translators.keras_translator import Translator
from keras_transformer.visualize import (
    cross_attention_weights,
    main,
    plot_attention,
    plot_translation_attention,
    translation_attention,
)

matplotlib_image = pytest.importorskip("matplotlib.image")

ATOL = 1e-5
SOURCE = np.array([[5, 6, 7, 8, 3, 0, 0], [9, 10, 11, 12, 13, 14, 3]], "int32")  # (B=2, S=7)
OUTPUT = np.array([[20, 21, 22, 3], [30, 31, 32, 33]], "int32")  # (B=2, T=4), no BOS
CORPUS = ["guten morgen", "danke schön", "good morning", "thank you very much"] * 20


def _model():
    model = Transformer.from_preset(
        "tiny", vocab_size=60, dropout=0.0, d_model=32, d_ff=64, max_length=24
    )
    model.build()
    return model


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.mark.parametrize("head", [None, 0, 3])
def test_weights_rows_sum_to_one_and_padding_gets_zero(model, head):
    weights = cross_attention_weights(model, SOURCE, OUTPUT, head=head)
    assert weights.shape == (2, 4, 7)  # (B, T, S)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=ATOL)
    np.testing.assert_array_equal(weights[0, :, 5:], 0.0)  # sequence 0's two pad columns
    assert (weights[:, :, :5] > 0).all()


def test_weights_are_the_decoders_and_leave_its_logits_unchanged(model):
    """Row t is read with [BOS] + outputs[:t]; asking for scores changes no logit."""
    target = np.concatenate([np.full((2, 1), model.config.bos_id, "int32"), OUTPUT[:, :-1]], 1)
    encoder_outputs = model.encode(SOURCE)
    logits = model.decode(target, encoder_outputs, SOURCE)
    logits_too, scores = model.decode(target, encoder_outputs, SOURCE, return_attention_scores=True)
    np.testing.assert_allclose(ops.convert_to_numpy(logits_too), ops.convert_to_numpy(logits))
    cross = ops.convert_to_numpy(scores["cross_attention"])  # (B, L, N, T, S)
    config = model.config
    assert cross.shape == (2, config.num_layers, config.num_heads, 4, 7)
    assert tuple(scores["self_attention"].shape) == (2, config.num_layers, config.num_heads, 4, 4)
    np.testing.assert_allclose(
        cross_attention_weights(model, SOURCE, OUTPUT, layer=0, head=1), cross[:, 0, 1]
    )
    np.testing.assert_allclose(
        cross_attention_weights(model, SOURCE, OUTPUT), cross[:, -1].mean(axis=1), atol=1e-6
    )


def _cells(figure, path, shape):
    """The PNG's colour at the centre of each heat-map cell: `(T, S, 3)` RGB in [0, 1].
    The cells are found in `figure` (the one saved, or one laid out the same)."""
    image = matplotlib_image.imread(str(path))[..., :3]  # (H, W, 3), top row first
    box = figure.axes[0].get_window_extent()  # in pixels, origin at the bottom left
    rows, columns = shape
    xs = box.x0 + (np.arange(columns) + 0.5) * box.width / columns
    ys = box.y1 - (np.arange(rows) + 0.5) * box.height / rows  # row 0 at the top
    return image[(image.shape[0] - ys).astype(int)[:, None], xs.astype(int)[None, :]]


def _shows(figure, path, weights):
    """Whether the PNG's cells have the colours of `weights` (viridis, 0 to 1)."""
    import matplotlib

    expected = matplotlib.colormaps["viridis"](np.asarray(weights))[..., :3]
    return np.allclose(_cells(figure, path, np.shape(weights)), expected, atol=0.01)


def test_plot_attention_shows_the_weights(tmp_path):
    weights = np.random.dirichlet(np.ones(5), size=3)  # (T=3, S=5), rows sum to 1
    path = tmp_path / "attention.png"
    figure = plot_attention(weights, list("abcde"), ["x", "y", "</s>"], path=str(path), dpi=50)
    np.testing.assert_array_equal(figure.axes[0].images[0].get_array(), weights)
    width, height = figure.get_size_inches() * 50
    assert matplotlib_image.imread(str(path)).shape[:2] == (round(height), round(width))
    # The pixels show the weights, cell by cell: a blank image or other weights would not.
    assert _shows(figure, path, weights)
    assert not _shows(figure, path, weights[::-1])
    blank = tmp_path / "blank.png"
    plot_attention(
        np.zeros_like(weights), list("abcde"), ["x", "y", "</s>"], path=str(blank), dpi=50
    )
    assert not _shows(figure, blank, weights)
    with pytest.raises(ValueError, match=r"weights of shape \(3, 5\) do not match 2 output"):
        plot_attention(weights, list("abcde"), ["x", "y"])


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    proto = str(tmp_path_factory.mktemp("vocab") / "vocab.model")
    keras_hub.tokenizers.compute_sentence_piece_proto(
        tf.data.Dataset.from_tensor_slices(CORPUS),
        vocabulary_size=60,
        model_type="bpe",
        proto_output_file=proto,
    )
    return proto


def test_plot_translation_attention_writes_one_png_per_sentence(tmp_path, model, vocabulary):
    tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(proto=vocabulary, dtype="int32")
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=3)
    sentences = ["guten morgen", "danke"]
    paths = plot_translation_attention(translator, sentences, str(tmp_path / "plots"), head=0)
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["attention_000.png", "attention_001.png"]
    for sentence, path in zip(sentences, paths, strict=True):
        weights, source_pieces, output_pieces = translation_attention(translator, sentence, head=0)
        assert source_pieces[-1] == "</s>"
        assert weights.shape == (len(output_pieces), len(source_pieces))
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=ATOL)
        # The PNG is the figure plot_attention draws for these weights, at its size in
        # pixels, and its cells have their colours.
        layers = model.config.num_layers
        title = f"cross-attention, decoder layer {layers}/{layers}, head 0"
        expected = plot_attention(weights, source_pieces, output_pieces, title=title)
        width, height = expected.get_size_inches() * expected.dpi
        assert matplotlib_image.imread(path).shape[:2] == (round(height), round(width))
        assert _shows(expected, path, weights)


@pytest.fixture
def work_dir(tmp_path, model, vocabulary):
    """A work directory holding the tiny model and its vocabulary."""
    path = tmp_path / "work"
    path.mkdir()
    model.save(str(path / "model.keras"))
    shutil.copy(vocabulary, path / "vocab.model")
    return path


def test_command_writes_pngs_from_a_work_directory(tmp_path, work_dir, capsys):
    (work_dir / "run.json").write_text("{}")
    output_dir = tmp_path / "plots"
    argv = ["--work-dir", str(work_dir), "--output-dir", str(output_dir), "--beam-size", "1"]
    assert main([*argv, "guten morgen", "danke"]) == 0
    assert sorted(p.name for p in output_dir.iterdir()) == [
        "attention_000.png",
        "attention_001.png",
    ]
    assert capsys.readouterr().out.split() == [
        str(output_dir / "attention_000.png"),
        str(output_dir / "attention_001.png"),
    ]


def test_missing_matplotlib_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[plot\]'"):
        plot_attention(np.ones((1, 1)), ["a"], ["b"])


def test_translate_command_plots_attention(tmp_path, work_dir, model, capsys):
    from keras_transformer import translate

    (tmp_path / "input.txt").write_text("guten morgen\n\ndanke\n")
    output_dir = tmp_path / "plots"
    argv = ["--work-dir", str(work_dir), "--input", str(tmp_path / "input.txt"),
            "--beam-size", "1", "--plot-attention", str(output_dir), "--attention-head", "1"]  # fmt: skip
    assert translate.main(argv) == 0
    assert len(capsys.readouterr().out.split("\n")) == 4  # three translations, blank included
    # One PNG per non-blank sentence, each the plot of that sentence's weights.
    assert sorted(p.name for p in output_dir.iterdir()) == [
        "attention_000.png",
        "attention_001.png",
    ]
    translator = Translator(model, translate.workdir.load_tokenizer(str(work_dir)), beam_size=1)
    weights, source_pieces, output_pieces = translation_attention(translator, "danke", head=1)
    layers = model.config.num_layers
    title = f"cross-attention, decoder layer {layers}/{layers}, head 1"
    expected = plot_attention(weights, source_pieces, output_pieces, title=title)
    width, height = expected.get_size_inches() * expected.dpi
    path = output_dir / "attention_001.png"
    assert matplotlib_image.imread(str(path)).shape[:2] == (round(height), round(width))
    # Head 1's weights, cell by cell; another head's, or their mean, would not pass.
    assert _shows(expected, path, weights)
    for other in (0, None):
        other_weights, _, _ = translation_attention(translator, "danke", head=other)
        assert not _shows(expected, path, other_weights), other
