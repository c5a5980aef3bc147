"""Attention heat maps: which source pieces each output piece attends to.

    python -m keras_transformer.visualize --work-dir work --output-dir attention "Guten Morgen."

writes `attention/attention_000.png`, one PNG per sentence: the
cross-attention of one decoder layer (the last by default), one head or the
mean of all heads, source pieces on the x axis and output pieces on the y
axis. The library functions do the same from Python:

- `cross_attention_weights(model, source_ids, output_ids)`: `(B, T, S)`
  numpy weights, row t the attention of the decoder position that predicts
  output piece t;
- `translation_attention(translator, sentence)`: translates with the
  `Translator`'s search and returns the weights with their pieces;
- `plot_attention(weights, source_pieces, output_pieces, path)`: the heat
  map as a matplotlib `Figure`, saved as a PNG when `path` is given;
- `plot_translation_attention(translator, sentences, output_dir)`.

Plotting needs matplotlib, an optional extra: `pip install -e
".[plot]"` in the clone. Weights come from `Transformer.decode(...,
return_attention_scores=True)`, which leaves the default path unchanged.
"""

import argparse
import os
import sys

import numpy as np
from keras import ops

_INCHES_PER_CELL = 0.35
_MARGIN_INCHES = 1.5
_MIN_WIDTH_INCHES = 4.0  # room for the title


def check_matplotlib():
    """Raises an `ImportError` that says how to install matplotlib when it is missing."""
    _matplotlib_figure()


def _matplotlib_figure():
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            "Plotting attention needs matplotlib, an optional dependency: "
            "pip install -e '.[plot]' in the clone (or pip install matplotlib)"
        ) from error
    return Figure


def cross_attention_weights(model, source_ids, output_ids, layer=-1, head=None):
    """Cross-attention weights of one decoder layer for given outputs (teacher forcing).

    Args:
        model: a `Transformer`.
        source_ids: `(B, S)` int ids ending with EOS, `pad_id` for padding.
        output_ids: `(B, T)` int ids of the output, without BOS (as
            `Translator.translate_ids` returns them). The decoder reads
            `[BOS] + output_ids[:-1]`, so row t is the attention of the
            position that predicts `output_ids[t]`.
        layer: int. Decoder layer, Python-indexed (-1: the last).
        head: int or None. One head, or None for the mean over heads.

    Returns:
        `(B, T, S)` float32 numpy array; every row sums to 1 and padded
        source positions get 0.
    """
    config = model.config
    source_ids = ops.cast(source_ids, "int32")
    output_ids = ops.cast(output_ids, "int32")
    bos = ops.zeros_like(output_ids[:, :1]) + config.bos_id  # (B, 1)
    target_ids = ops.concatenate([bos, output_ids[:, :-1]], axis=1)  # (B, T)
    encoder_outputs = model.encode(source_ids, training=False)
    _, scores = model.decode(
        target_ids, encoder_outputs, source_ids, training=False, return_attention_scores=True
    )
    weights = ops.convert_to_numpy(scores["cross_attention"]).astype("float32")  # (B, L, N, T, S)
    weights = weights[:, layer]  # (B, N, T, S)
    return weights.mean(axis=1) if head is None else weights[:, head]  # (B, T, S)


def translation_attention(translator, sentence, layer=-1, head=None):
    """Translates `sentence` and returns `(weights (T, S), source_pieces, output_pieces)`.

    The output is the `Translator`'s own search result (its beam size and
    length penalty), cut after EOS; source pieces end with EOS too.
    """
    source_ids = translator.encode([sentence])[0]
    if not source_ids:
        raise ValueError(f"Nothing to plot for a blank sentence. Received: {sentence!r}")
    output_ids = translator.translate_ids([source_ids])[0]
    eos_id = translator.config.eos_id
    if eos_id in output_ids:
        output_ids = output_ids[: output_ids.index(eos_id) + 1]
    weights = cross_attention_weights(
        translator.model, np.array([source_ids]), np.array([output_ids]), layer=layer, head=head
    )[0]
    tokenizer = translator.tokenizer
    return weights, _pieces(tokenizer, source_ids), _pieces(tokenizer, output_ids)


def _pieces(tokenizer, ids):
    return [str(tokenizer.id_to_token(int(i))) for i in ids]


def plot_attention(weights, source_pieces, output_pieces, path=None, title=None, dpi=100):
    """A heat map of `(T, S)` attention weights; saved as a PNG when `path` is given.

    Args:
        weights: `(T, S)` array, row t the attention of output piece t.
        source_pieces: S strings, the x-axis labels.
        output_pieces: T strings, the y-axis labels.
        path: optional file name to save to (PNG).
        title: optional title.
        dpi: int. The saved PNG has `figure.get_size_inches() * dpi` pixels.

    Returns:
        `matplotlib.figure.Figure` (no pyplot state, nothing shown).
    """
    weights = np.asarray(weights)
    if weights.shape != (len(output_pieces), len(source_pieces)):
        raise ValueError(
            f"weights of shape {weights.shape} do not match {len(output_pieces)} output pieces "
            f"and {len(source_pieces)} source pieces"
        )
    figure_class = _matplotlib_figure()
    rows, columns = weights.shape
    figure = figure_class(
        figsize=(
            max(_MIN_WIDTH_INCHES, _MARGIN_INCHES + _INCHES_PER_CELL * columns),
            _MARGIN_INCHES + _INCHES_PER_CELL * rows,
        ),
        dpi=dpi,
    )
    axes = figure.add_subplot()
    image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(columns), source_pieces, rotation=90)
    axes.set_yticks(range(rows), output_pieces)
    axes.set_xlabel("source")
    axes.set_ylabel("output")
    if title:
        axes.set_title(title, fontsize="medium")
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=dpi)
    return figure


def plot_translation_attention(translator, sentences, output_dir, layer=-1, head=None):
    """Writes `output_dir/attention_{i:03d}.png` for each sentence; returns the paths."""
    os.makedirs(output_dir, exist_ok=True)
    paths = []
    num_layers = translator.config.num_decoder_layers
    which = "mean of heads" if head is None else f"head {head}"
    title = f"cross-attention, decoder layer {layer % num_layers + 1}/{num_layers}, {which}"
    for i, sentence in enumerate(sentences):
        weights, source_pieces, output_pieces = translation_attention(
            translator, sentence, layer=layer, head=head
        )
        path = os.path.join(output_dir, f"attention_{i:03d}.png")
        plot_attention(
            weights,
            source_pieces,
            output_pieces,
            path=path,
            title=title,
        )
        paths.append(path)
    return paths


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras_transformer.visualize",
        description="Plot the cross-attention of a trained model, one PNG per sentence.",
    )
    parser.add_argument("--work-dir", required=True, help="directory written by train.py")
    parser.add_argument("--output-dir", required=True, help="where the PNGs go")
    parser.add_argument(
        "sentences", nargs="*", help="sentences to translate; one per line from stdin if none"
    )
    parser.add_argument("--layer", type=int, default=-1, help="decoder layer (default: the last)")
    parser.add_argument("--head", type=int, default=None, help="one head (default: their mean)")
    parser.add_argument("--beam-size", type=int, default=4, help="1 runs greedy search")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    check_matplotlib()  # fail before loading the model when matplotlib is missing
    from keras_transformer.translators.keras_translator import Translator

    translator = Translator.from_preset(args.work_dir, beam_size=args.beam_size)
    sentences = args.sentences or [line for line in sys.stdin.read().splitlines() if line.strip()]
    paths = plot_translation_attention(
        translator, sentences, args.output_dir, layer=args.layer, head=args.head
    )
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
