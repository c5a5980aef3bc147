"""What the command-line entry points share: expected mistakes end in one line.

A missing file, a wrong preset name or a work directory that is not
finished is the user's to fix, not a bug: the command prints
`<prog>: error: <what is wrong>` and exits with status 2, as argparse does
for a bad flag. `--debug` shows the traceback instead.
"""

import sys

# The errors this package raises for a user's mistake (each names the value
# and what to do about it); anything else is a bug and keeps its traceback.
EXPECTED_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


def add_debug_flag(parser):
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )


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
