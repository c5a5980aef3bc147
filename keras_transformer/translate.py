"""Translate sentences, one per line, with a trained model.

    python -m keras_transformer.translate --work-dir runs/small < source.txt
    keras-transformer-translate --work-dir runs/small --input source.txt --beam-size 4
    keras-transformer-translate --work-dir runs/small --input mono.en --sampling-topk 0 --seed 1
    keras-transformer-translate --work-dir runs/small --input source.txt --glossary terms.tsv

Reads `<work_dir>/model.keras` and `<work_dir>/vocab.model` (written by
`python train.py`), one sentence per line from `--input` or stdin, and
writes one translation per line to stdout. A progress bar goes to stderr
when there are more sentences than one batch. `--plot-attention DIR` also
writes one cross-attention heat map per sentence, `DIR/attention_NNN.png`
(`keras_transformer.visualize`; needs matplotlib).
"""

import argparse
import logging
import os
import sys

from keras_transformer import workdir
from keras_transformer.search import PAPER


def parse_args(argv=None):
    from keras_transformer.command_line import add_debug_flag, add_verbose_flag

    parser = argparse.ArgumentParser(
        prog="keras-transformer-translate", description=__doc__.split("\n\n")[0]
    )
    _input_flags(parser)
    _search_flags(parser)
    _output_flags(parser)
    _steering_flags(parser)
    _sampling_flags(parser)
    add_debug_flag(parser)
    add_verbose_flag(parser)
    return parser.parse_args(argv)


def _input_flags(parser):
    """The model's work directory and the sentences to translate."""
    parser.add_argument("--work-dir", required=True, help="directory written by train.py")
    parser.add_argument(
        "--input", default="-", help="file with one sentence per line; '-' (default) is stdin"
    )


def _search_flags(parser):
    """The beam (or greedy) search and its batches."""
    parser.add_argument(
        "--beam-size",
        type=int,
        help=f"1 runs greedy search (default: the run's, from run.json, else {PAPER.beam_size})",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        help=f"length penalty (default: the run's, from run.json, else {PAPER.alpha})",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    parser.add_argument(
        "--max-extra-length",
        type=int,
        default=None,
        help="output tokens beyond the input's scaled length (default: the run's fitted "
        f"limit, from run.json, else {PAPER.max_extra_length})",
    )
    parser.add_argument("--jit-compile", action="store_true", help="XLA (TensorFlow only)")


def _output_flags(parser):
    """What goes beside the translations: the progress bar and the attention plots."""
    parser.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar on stderr; auto: when there is more than one batch",
    )
    parser.add_argument(
        "--plot-attention",
        metavar="DIR",
        help="also write one cross-attention PNG per non-blank sentence to DIR",
    )
    parser.add_argument(
        "--attention-layer", type=int, default=-1, help="decoder layer plotted (default: last)"
    )
    parser.add_argument(
        "--attention-head", type=int, default=None, help="head plotted (default: mean of heads)"
    )


def _steering_flags(parser):
    """What the translations must start with, hold or avoid."""
    parser.add_argument(
        "--target-prefix",
        metavar="TEXT",
        help="every translation starts with TEXT and the search goes on from it",
    )
    parser.add_argument(
        "--target-prefix-file",
        metavar="FILE",
        help="one prefix per input line (an empty line: none)",
    )
    parser.add_argument(
        "--glossary",
        metavar="FILE",
        help="'source term<TAB>target term' per line: each term found in a sentence is "
        "followed by its translation between tags, which a model trained with "
        "train.py --terminology copies into its output",
    )
    parser.add_argument(
        "--banned",
        metavar="WORD",
        action="append",
        help="a word or phrase no translation may hold (its pieces alone, as SentencePiece "
        "splits it at the start of a word); repeat for more",
    )
    parser.add_argument(
        "--constraint",
        metavar="WORD",
        action="append",
        help="a word or phrase every translation must hold (dynamic beam allocation in the "
        "beam search); repeat for more",
    )


def _sampling_flags(parser):
    """Sampling instead of the search (back-translation)."""
    parser.add_argument(
        "--sampling-topk",
        type=int,
        default=1,
        help="1 (default) searches; K > 1 draws each token among the K most likely, 0 among "
        "all (back-translation), one output per line, without the beam",
    )
    parser.add_argument(
        "--sampling-temperature", type=float, default=1.0, help="of --sampling-topk (default 1)"
    )
    parser.add_argument(
        "--seed", type=int, help="of --sampling-topk: the same input and seed, the same output"
    )


def load(work_dir):
    """`(model, tokenizer)` from a work directory written by `python train.py`."""
    if not os.path.isdir(work_dir):
        raise FileNotFoundError(f"--work-dir {work_dir!r} is not a directory")
    return workdir.load_model(work_dir), workdir.load_tokenizer(work_dir)


def main(argv=None):
    from keras_transformer.command_line import run_main

    args = parse_args(argv)
    return run_main("keras-transformer-translate", args.debug, lambda: _main(args))


def _main(args):
    from keras_transformer.command_line import configure_logging

    # Warnings only, before TensorFlow loads: stdout is the translations.
    configure_logging(args.verbose, "%(levelname)s: %(message)s", level=logging.WARNING)
    glossary = _check_before_loading(args)
    translator = _translator(args)
    lines = _read_input(args.input)
    progress = args.progress == "always" or (
        args.progress == "auto" and len(lines) > args.batch_size
    )
    options = dict(
        target_prefix=_target_prefix(args, lines), sampling_topk=args.sampling_topk,
        sampling_temperature=args.sampling_temperature, seed=args.seed, glossary=glossary,
        banned=args.banned, constraints=args.constraint,
    )  # fmt: skip
    for translation in translator.translate(lines, progress=progress, **options):
        sys.stdout.write(translation + "\n")
    sys.stdout.flush()
    if args.plot_attention:
        _plot_attention(args, translator, lines, glossary)
    return 0


def _check_before_loading(args):
    """The glossary of `--glossary` (or None), once matplotlib for `--plot-attention` and
    the glossary's lines are checked: their errors come before the model loads."""
    if args.plot_attention:
        from keras_transformer import visualize

        visualize.check_matplotlib()  # before loading the model
    glossary = None
    if args.glossary is not None:  # a malformed line is named before the model loads
        from keras_transformer.terminology import load_glossary

        glossary = load_glossary(args.glossary)
    return glossary


def _translator(args):
    """The `Translator` of `--work-dir`'s model, with the run's search settings and the flags'."""
    from keras_transformer.translators.keras_translator import Translator

    model, tokenizer = load(args.work_dir)
    return Translator(
        model,
        tokenizer,
        beam_size=args.beam_size,
        alpha=args.alpha,
        batch_size=args.batch_size,
        max_extra_length=args.max_extra_length,
        jit_compile=args.jit_compile,
        search=workdir.read_search(args.work_dir),  # the flags given replace its settings
    )


def _read_input(path):
    """The lines of the file at `path`, or of stdin for '-'."""
    if path == "-":
        return sys.stdin.read().splitlines()
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def _target_prefix(args, lines):
    """`--target-prefix`'s text, `--target-prefix-file`'s lines (one per input line), or None."""
    prefix = args.target_prefix
    if args.target_prefix_file is not None:
        if prefix is not None:
            raise ValueError("Give --target-prefix or --target-prefix-file, not both.")
        with open(args.target_prefix_file, encoding="utf-8") as f:
            prefix = f.read().splitlines()
        if len(prefix) != len(lines):
            raise ValueError(
                f"--target-prefix-file {args.target_prefix_file} has {len(prefix)} lines for "
                f"{len(lines)} input lines: one prefix per line."
            )
    return prefix


def _plot_attention(args, translator, lines, glossary):
    """Writes one cross-attention heat map per non-blank line to `--plot-attention`."""
    from keras_transformer import visualize
    from keras_transformer.terminology import annotate_all

    paths = visualize.plot_translation_attention(
        translator,
        annotate_all([line for line in lines if line.strip()], glossary),
        args.plot_attention,
        layer=args.attention_layer,
        head=args.attention_head,
    )
    logging.getLogger(__name__).warning(
        "%d attention plots written to %s", len(paths), args.plot_attention
    )


if __name__ == "__main__":
    sys.exit(main())
