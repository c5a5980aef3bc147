"""The end-to-end tests catch the defects they are for: each mutation plants one defect
in every Python process its test starts (train.py, the server, the pytest process;
tests/site/sitecustomize.py, whose `MUTATIONS` name them and their tests), runs the
test, and expects it to fail.

    .venv/bin/python tests/mutations.py           # every mutation
    .venv/bin/python tests/mutations.py NAME ...  # some

Exit status 0 when every test failed on its mutation; a test that passed, or a
mutation planted in no process, is reported and exits 1. These runs train and
serve, minutes each, so they are not part of `make test`; the cheaper mutations
are planted inside the tests themselves (monkeypatched, asserting that the check
fails), e.g. test_ctranslate2.py's `compute_type` ignored, test_docs.py's
`model.fit` trained to NaN, test_harness.py's children left after a timeout.
"""

import importlib.util
import os
import subprocess
import sys
import tempfile
import time

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
SITE = os.path.join(TESTS, "site")


def mutations():
    """`{name: (module, patch, test node id)}` from tests/site/sitecustomize.py."""
    spec = importlib.util.spec_from_file_location(
        "mutation_site", os.path.join(SITE, "sitecustomize.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTATIONS


def run(name, test):
    """Runs `test` with mutation `name` planted; `(caught, seconds, output tail)`."""
    with tempfile.TemporaryDirectory() as folder:
        log = os.path.join(folder, "planted")
        env = dict(os.environ, KT_TEST_MUTATION=name, KT_TEST_MUTATION_LOG=log)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [SITE, os.environ.get("PYTHONPATH")]))
        start = time.time()
        completed = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
            cwd=ROOT, env=env, capture_output=True, text=True,
        )  # fmt: skip
        seconds = time.time() - start
        planted = open(log).read().split() if os.path.exists(log) else []
    output = (completed.stdout + completed.stderr)[-3000:]
    if not planted:
        return None, seconds, output
    return completed.returncode == 1, seconds, output


def main(names):
    table = mutations()
    unknown = [name for name in names if name not in table]
    if unknown:
        raise SystemExit(f"Unknown mutations {unknown}; there are {sorted(table)}")
    failures = 0
    for name in names or sorted(table):
        test = table[name][2]
        caught, seconds, output = run(name, test)
        verdict = {True: "caught", False: "NOT CAUGHT", None: "NOT PLANTED"}[caught]
        print(f"{name}: {verdict} by {test} ({seconds:.0f} s)", flush=True)
        if caught is not True:
            failures += 1
            print(output, flush=True)
        else:  # the assertion that failed
            lines = [line for line in output.splitlines() if line.startswith("E ")]
            print("\n".join(lines[:6]), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
