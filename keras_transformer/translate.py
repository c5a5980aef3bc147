"""Translate sentences, one per line, with a trained model.

    python -m keras_transformer.translate --work-dir runs/small < source.txt
    keras-transformer-translate --work-dir runs/small --input source.txt --beam-size 4

Reads `<work_dir>/model.keras` and `<work_dir>/vocab.model` (written by
`python train.py`), one sentence per line from `--input` or stdin, and
writes one translation per line to stdout. A progress bar goes to stderr
when there are more sentences than one batch.
"""

import argparse
import logging
import os
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-transformer-translate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--work-dir", required=True, help="directory written by train.py")
    parser.add_argument(
        "--input", default="-", help="file with one sentence per line; '-' (default) is stdin"
    )
    parser.add_argument("--beam-size", type=int, default=4, help="1 runs greedy search (default 4)")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty (default 0.6)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    parser.add_argument(
        "--max-extra-length", type=int, default=50, help="output tokens beyond the input length"
    )
    parser.add_argument("--jit-compile", action="store_true", help="XLA (TensorFlow only)")
    parser.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar on stderr; auto: when there is more than one batch",
    )
    return parser.parse_args(argv)


def load(work_dir):
    """`(model, tokenizer)` from a work directory written by `python train.py`."""
    if not os.path.isdir(work_dir):
        raise FileNotFoundError(f"--work-dir {work_dir!r} is not a directory")
    try:
        from keras_transformer.training import load_trained
    except ImportError:
        load_trained = None
    if load_trained is not None:
        model, tokenizer, _ = load_trained(work_dir)
        return model, tokenizer
    import keras
    import keras_hub

    from keras_transformer import register_keras_classes

    register_keras_classes()  # load_model needs them

    model = keras.saving.load_model(os.path.join(work_dir, "model.keras"), compile=False)
    tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(
        proto=os.path.join(work_dir, "vocab.model"), dtype="int32"
    )
    return model, tokenizer


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    from keras_transformer.translator import Translator

    model, tokenizer = load(args.work_dir)
    translator = Translator(
        model,
        tokenizer,
        beam_size=args.beam_size,
        alpha=args.alpha,
        batch_size=args.batch_size,
        max_extra_length=args.max_extra_length,
        jit_compile=args.jit_compile,
    )
    if args.input == "-":
        lines = sys.stdin.read().splitlines()
    else:
        with open(args.input, encoding="utf-8") as f:
            lines = f.read().splitlines()
    progress = args.progress == "always" or (
        args.progress == "auto" and len(lines) > args.batch_size
    )
    for translation in translator.translate(lines, progress=progress):
        sys.stdout.write(translation + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
