"""Trains a Transformer: `python train.py` runs the CPU-sized default on the Ding corpus.

Only parses arguments (the flags are `TrainingConfig`'s fields, with their help and
defaults: `keras_transformer/training/options.py`) and checks what it can before
TensorFlow loads; everything else happens in `keras_transformer.training.run`.
"""

import argparse
import importlib.util
import os
import sys


def parse_args(argv=None):
    """The command line: one flag per `TrainingConfig` field (`training.options`), --debug
    and --verbose."""
    from keras_transformer.command_line import add_debug_flag, add_verbose_flag
    from keras_transformer.training.flags import add_arguments

    parser = add_arguments(argparse.ArgumentParser(description=__doc__))
    add_debug_flag(parser)
    add_verbose_flag(parser)
    return parser.parse_args(argv)


def _hardware():
    """`keras_transformer/hardware.py` loaded on its own: importing it through the
    package would first import TensorFlow (6 s) in a process about to be replaced."""
    package = importlib.util.find_spec("keras_transformer")
    path = os.path.join(package.submodule_search_locations[0], "hardware.py")
    spec = importlib.util.spec_from_file_location("keras_transformer_hardware", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_early(args):
    """The mistakes found without TensorFlow: a preset name, a bad value (`TrainingConfig`'s
    checks), a missing folder or file, a malformed glossary."""
    from keras_transformer.config import PRESETS
    from keras_transformer.training.options import TrainingConfig

    if args.preset is not None and args.preset not in PRESETS:
        raise ValueError(f"Unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}.")
    TrainingConfig(**{k: v for k, v in vars(args).items() if k not in ("debug", "verbose")})
    if args.ding_path is not None and not os.path.isfile(args.ding_path):
        raise FileNotFoundError(f"--ding-path {args.ding_path} is not a file.")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise NotADirectoryError(f"--data-dir {args.data_dir} is not a directory.")
    if args.mix is not None:
        for folder, _ in TrainingConfig(data_dir=args.data_dir, mix=args.mix).mixture:
            if not os.path.isdir(folder):
                raise NotADirectoryError(f"--mix {folder} is not a directory.")
    if args.terminology is not None:
        from keras_transformer.terminology import load_glossary

        load_glossary(args.terminology)  # a malformed line is named before anything loads
    if args.init_from is not None:
        from keras_transformer import workdir

        workdir.check(args.init_from, finished=True)


def main(argv=None):
    args = parse_args(argv)
    from keras_transformer.command_line import run_main

    run_main("train.py", args.debug, lambda: _main(args, argv))


def _main(args, argv):
    _check_early(args)
    hardware = _hardware()
    from keras_transformer.command_line import configure_logging

    # Before the re-exec: TensorFlow's C++ log level is an environment variable.
    configure_logging(args.verbose, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    if argv is None:  # a command line: set the allocator up before TensorFlow loads
        hardware.reexec_with_allocator_env()
    # In a log file, the frames of TFDS's progress bars (about 30) say nothing
    # the run's own lines do not.
    if not sys.stderr.isatty() and hardware.importable("tensorflow_datasets"):
        import tensorflow_datasets as tfds

        tfds.disable_progress_bar()
    from keras_transformer.training import run

    options = vars(args)
    del options["debug"], options["verbose"]
    run(**options)


if __name__ == "__main__":
    main()
