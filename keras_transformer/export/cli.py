"""Command line of `export/saved_model.py` and `export/onnx_model.py`."""

import argparse

from keras_transformer import workdir
from keras_transformer.command_line import add_verbose_flag, configure_logging
from keras_transformer.export import FORMATS
from keras_transformer.search import PAPER, STOPPING_RULES


def parse_args(description, argv=None):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--work-dir", default="work", help="finished training run (default: work)")
    parser.add_argument("--output-dir", default="saved_models", help="export root (saved_models)")
    parser.add_argument(
        "--name", default=None, help="model name (default: transformer_<src>_<tgt> from run.json)"
    )
    parser.add_argument("--version", type=int, default=None, help="default: newest + 1")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing version")
    parser.add_argument(
        "--beam-size", type=int, default=None, help=f"default: run.json's, else {PAPER.beam_size}"
    )
    parser.add_argument(
        "--alpha", type=float, default=None, help=f"default: run.json's, else {PAPER.alpha}"
    )
    parser.add_argument(
        "--stopping", default=None, choices=STOPPING_RULES,
        help=f"when a sentence's beam search stops (default: run.json's, else {PAPER.stopping})",
    )  # fmt: skip
    parser.add_argument(
        "--patience", type=float, default=None,
        help=f"k_finished: stop after beam_size * patience ends "
        f"(default: run.json's, else {PAPER.patience})",
    )  # fmt: skip
    parser.add_argument(
        "--formats",
        default=None,
        help=f"comma-separated, of {','.join(FORMATS)} (default: this command's)",
    )
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    if args.formats is not None:
        args.formats = tuple(args.formats.split(","))
        unknown = sorted(set(args.formats) - set(FORMATS))
        if unknown:
            parser.error(f"--formats must be of {FORMATS}. Received: --formats {args.formats}")
    return args


def main(formats, description, argv=None):
    """Parses flags and runs `export_all(formats=formats)`; returns the paths written."""
    args = parse_args(description, argv)
    formats = args.formats or formats
    configure_logging(args.verbose, "%(message)s")  # before TensorFlow and tf2onnx load
    from keras_transformer.export import default_name, export_all
    from keras_transformer.export.artifacts import check_work_dir

    try:
        run_info = check_work_dir(args.work_dir)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    # The flags, else the run's test-decode settings, else the paper's.
    try:
        search = workdir.search_of(run_info).replace(
            beam_size=args.beam_size, alpha=args.alpha, stopping=args.stopping,
            patience=args.patience,
        )  # fmt: skip
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    try:
        paths = export_all(
            args.work_dir,
            output_dir=args.output_dir,
            name=args.name or default_name(run_info),
            version=args.version,
            overwrite=args.overwrite,
            formats=formats,
            search=search,
        )
    except (FileExistsError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    for path in paths.values():
        print(path)
    return paths
