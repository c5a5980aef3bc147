"""Trains a Transformer: `python train.py` runs the CPU-sized default on the Ding corpus.

Only parses arguments; everything happens in `keras_transformer.training.run`.
"""

import argparse
import importlib.util
import logging
import os
import sys


def parse_args(argv=None):
    from keras_transformer.search import STOPPING_RULES

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--preset", help="base | big | small | cpu | tiny (default cpu, or --init-from's)"
    )
    parser.add_argument(
        "--init-from",
        metavar="WORK_DIR",
        help="start from a finished run's weights and vocabulary (its architecture too), "
        "in a new --work-dir: train it longer, or fine-tune it on --data-dir",
    )
    parser.add_argument(
        "--dataset",
        default="ding",
        help="'ding' (local dictionary) or a TFDS name, e.g. wmt14_translate/de-en",
    )
    parser.add_argument(
        "--ding-path",
        help="the Ding dictionary file (default /usr/share/trans/de-en; a copy elsewhere, e.g. "
        "on a machine without the Debian package)",
    )
    parser.add_argument("--data-dir", help="folder of train.xx/train.yy, validation.*, test.* text")
    parser.add_argument(
        "--direction", help="source-target languages, e.g. de-en (default) or en-de"
    )
    parser.add_argument("--epochs", type=int, help="epochs (default: per preset)")
    parser.add_argument("--steps", type=int, help="steps per epoch (default: per preset)")
    parser.add_argument("--batch-tokens", type=int, help="tokens per batch and side")
    parser.add_argument(
        "--work-dir",
        default="work",
        help="output folder (default work/). Run the same command again there to resume a "
        "killed run, or with a larger --max-train-minutes / --epochs to continue a finished one",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete what an earlier run wrote in --work-dir and start again there",
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--vocab-size",
        type=int,
        help="shared BPE vocabulary size (default: the preset's)",
    )
    parser.add_argument(
        "--dropout",
        type=float,
        help="dropout of the model (default: the preset's on Ding; 0.3 on other corpora "
        "below 200k pairs)",
    )
    parser.add_argument(
        "--attention-dropout",
        type=float,
        help="dropout of the attention probabilities (default: the preset's, 0 as in the "
        "paper; keras-hub's layers and fairseq's --attention-dropout drop them)",
    )
    parser.add_argument(
        "--fused-attention",
        action=argparse.BooleanOptionalAction,
        help="attention through keras.ops.dot_product_attention (cuDNN / flash kernels on "
        "GPUs where the backend has them; the same results, tests/test_attention.py); "
        "default: off",
    )
    parser.add_argument(
        "--logical-devices", type=int, help="split the CPU into N devices for MirroredStrategy"
    )
    parser.add_argument("--warmup-steps", type=int, help="learning-rate warm-up steps")
    parser.add_argument(
        "--learning-rate-scale",
        type=float,
        help="multiplier of the paper's learning-rate curve (1.0 in the paper)",
    )
    parser.add_argument(
        "--sentence-repeats",
        type=int,
        help="full-sentence training pairs (capitalized, 3+ words, ending in . ! ?) this many "
        "times per pass over the data (default: the preset's; 1: once)",
    )
    parser.add_argument(
        "--cooldown",
        type=float,
        help="share of the budget (--max-train-minutes, or epochs x steps) at the end over "
        "which the learning rate decays linearly to 0 (0: the paper's curve to the end; "
        "default: the preset's)",
    )
    parser.add_argument(
        "--dtype-policy",
        choices=["float32", "mixed_bfloat16", "mixed_float16"],
        help="precision of training (mixed: float32 variables, saved model is float32); "
        "default: the fastest of the candidates timed at start-up (keras_transformer.calibration)",
    )
    parser.add_argument(
        "--max-train-minutes",
        type=float,
        help="stop at the first training step that ends past this many minutes",
    )
    parser.add_argument(
        "--validation-every",
        type=int,
        help="validation loss every N epochs and after the last (default: 2 for cpu, else 1)",
    )
    parser.add_argument("--validation-bleu-samples", type=int, default=300)
    parser.add_argument(
        "--validation-bleu-every",
        type=int,
        help="greedy validation BLEU every N epochs (0: never; default: per preset)",
    )
    parser.add_argument(
        "--test-samples", type=int, help="test pairs to decode (default: 1000 for cpu; 0: all)"
    )
    parser.add_argument(
        "--no-test", dest="test", action="store_false", help="skip the final test decoding"
    )
    parser.add_argument(
        "--average-last",
        type=int,
        help="average the last k epoch checkpoints, k <= N chosen by validation loss "
        "(1: no averaging; default: 3 for cpu, 8 for the others)",
    )
    parser.add_argument(
        "--no-pack",
        dest="pack",
        action="store_false",
        help="one pair per row in length buckets, instead of several pairs packed per row",
    )
    parser.add_argument(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        help="compile the training step with XLA (default: timed against the step without "
        "it at start-up where the backend allows both; JAX: always)",
    )
    parser.add_argument(
        "--beam-size", type=int, help="beam of the test decode and the exports (default: 4)"
    )
    parser.add_argument(
        "--alpha",
        type=float,
        help="length penalty of the test decode and the exports (default: 1.5 for cpu, else 0.6)",
    )
    parser.add_argument(
        "--stopping",
        choices=STOPPING_RULES,
        help="when a sentence's beam search stops: 'k_finished' once beam-size x patience "
        "hypotheses have ended (fairseq, CTranslate2), 'bound' when no alive one can win "
        "(exact, slower); of the test decode and the exports (default: k_finished for cpu, "
        "else bound)",
    )
    parser.add_argument(
        "--patience", type=float, help="of --stopping k_finished (default: 2.0 for cpu, else 1.0)"
    )
    parser.add_argument("--no-export", dest="export", action="store_false")
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="write the vocabulary and the tokenized splits to --work-dir and stop (as "
        "fairseq-preprocess); the same command without it, here or on another machine "
        "with the work directory copied, trains from them",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )
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
    """The mistakes found without TensorFlow: a preset name, a missing folder or file."""
    from keras_transformer.config import PRESETS

    if args.preset is not None and args.preset not in PRESETS:
        raise ValueError(f"Unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}.")
    if args.ding_path is not None and not os.path.isfile(args.ding_path):
        raise FileNotFoundError(f"--ding-path {args.ding_path} is not a file.")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise NotADirectoryError(f"--data-dir {args.data_dir} is not a directory.")
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
    # TensorFlow's C++ log level is read once, when it loads.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = hardware.tensorflow_log_level()
    if argv is None:  # a command line: set the allocator up before TensorFlow loads
        hardware.reexec_with_allocator_env()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Third-party INFO lines and, in a log file, the frames of TFDS's progress
    # bars (about 30) say nothing the run's own lines do not.
    hardware.quiet_third_party_loggers()
    if not sys.stderr.isatty() and hardware.importable("tensorflow_datasets"):
        import tensorflow_datasets as tfds

        tfds.disable_progress_bar()
    from keras_transformer.training import run

    options = vars(args)
    del options["debug"]
    run(**options)


if __name__ == "__main__":
    main()
