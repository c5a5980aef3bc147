"""What the command-line entry points share: expected mistakes end in one line.

A missing file, a wrong preset name or a work directory that is not
finished is the user's to fix, not a bug: the command prints
`<prog>: error: <what is wrong>` and exits with status 2, as argparse does
for a bad flag. `--debug` shows the traceback instead. Other libraries'
INFO logs stay out of a command's output; `--verbose` shows them
(`configure_logging`).
"""

import logging
import os
import sys

# The errors this package raises for a user's mistake (each names the value
# and what to do about it); anything else is a bug and keeps its traceback.
EXPECTED_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


def add_debug_flag(parser):
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )


def add_verbose_flag(parser):
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show other libraries' INFO logs (TensorFlow's C++ log, absl, tf2onnx, JAX)",
    )


def configure_logging(verbose, log_format, level=logging.INFO):
    """A command's log; call it before TensorFlow, JAX or tf2onnx is imported.

    This package's records from `level` up; other libraries' Python loggers
    from WARNING up, by the root logger's level rather than one by one: TFDS's
    through absl (six per run), tf2onnx's conversion (about 20 per export),
    TensorFlow's "Assets written to", JAX's "Unable to initialize backend
    'tpu'", matplotlib's font cache. TensorFlow's C++ log is set by
    `TF_CPP_MIN_LOG_LEVEL`, read once when TensorFlow loads:
    `hardware.tensorflow_log_level()`, unless the environment sets it (its
    CPU-instruction line at import goes; the oneDNN and CUDA-driver lines that
    TensorFlow 2.21 writes from static initializers, before it reads the
    variable, no setting reaches: tests/test_quiet_logs.py). `verbose` leaves
    both at INFO, this package's records too.
    """
    if verbose:
        level = logging.INFO
    else:
        from keras_transformer.hardware import tensorflow_log_level

        os.environ["TF_CPP_MIN_LOG_LEVEL"] = tensorflow_log_level()
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=log_format)
    logging.getLogger("keras_transformer").setLevel(level)


def run_main(prog, debug, body):
    """Calls `body()`; an `EXPECTED_ERRORS` exception becomes one line and exit 2."""
    try:
        return body()
    except EXPECTED_ERRORS as error:
        if debug:
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


# --------------------------------------------------------------------------- option reference

# The commands of docs/options.md: (the command as typed, module or file, what it is for).
COMMANDS = (
    ("python train.py", "train.py", "train, evaluate and export a model"),
    ("keras-transformer-translate", "keras_transformer.translate", "translate a file"),
    ("keras-transformer-average", "keras_transformer.averaging", "average checkpoints"),
    ("python export/all.py", "keras_transformer.export.cli", "export a finished run"),
    ("keras-transformer-serve", "keras_transformer.serving.cli", "serve an export over HTTP"),
)


class _Parser(Exception):
    def __init__(self, parser):
        super().__init__("parser captured")
        self.parser = parser


def command_parser(target, root):
    """The `argparse` parser of a command (`COMMANDS`), as its `parse_args` builds it,
    caught before it parses anything."""
    import argparse
    import importlib
    import importlib.util
    from unittest import mock

    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location("_command", os.path.join(root, target))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)

    def capture(self, args=None, namespace=None):
        raise _Parser(self)

    arguments = ("Export a finished run.",) if target.endswith("export.cli") else ()
    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
        try:
            module.parse_args(*arguments)
        except _Parser as caught:
            return caught.parser
    raise RuntimeError(f"{target}.parse_args built no parser")


def option_reference(root):
    """docs/options.md: every command's `--help`, generated from its parser (80 columns)."""
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width: fixed here
    lines = [
        "# Option reference",
        "",
        "Every command's options as its `--help` prints them, generated from the parsers",
        "(`python -m keras_transformer.command_line > docs/options.md`;",
        "`tests/test_docs.py` checks that this page is what it generates).",
        "",
    ]
    for command, target, purpose in COMMANDS:
        parser = command_parser(target, root)
        parser.prog = command
        lines += [f"## `{command}`: {purpose}", "", "```text", parser.format_help().rstrip()]
        lines += ["```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(option_reference(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
