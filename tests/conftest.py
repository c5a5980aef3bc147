"""Test set-up shared by every test module.

Under TensorFlow the one physical CPU is split into two logical devices
before TensorFlow initializes, so tests can run a real 2-replica
`MirroredStrategy`. Tests marked `multibackend` also run under JAX and
torch (`make test` runs them with `KERAS_BACKEND=jax` and `=torch`).
"""

import importlib.util
import logging
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# The calibration's cache (keras_transformer.calibration), for this process and
# the commands tests run: one per test session, not the user's.
os.environ["KERAS_TRANSFORMER_CACHE"] = tempfile.mkdtemp(prefix="keras-transformer-cache-")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )


# CTranslate2 picks its int8 GEMM when it is first imported, and test modules import it
# at collection (pytest.importorskip): first through the package, as its own code does.
if importlib.util.find_spec("ctranslate2") is not None:
    from keras_transformer.translators.ctranslate2_translator import import_ctranslate2

    import_ctranslate2()


# Put on a subprocess's PYTHONPATH by tests/test_without_tensorflow.py; imported
# here (as --doctest-modules would), it would hide TensorFlow from this process.
# site/: the sitecustomize.py that test_mixing.py and tests/mutations.py put there.
collect_ignore = ["without_tensorflow", "site"]


def pytest_configure(config):
    # A test's child processes are killed when pytest-timeout stops it (timeout_cleanup.py).
    import timeout_cleanup

    timeout_cleanup.register(config)


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield


@pytest.fixture(autouse=True)
def _package_log_level():
    """A command's `main()` run in this process (`configure_logging`) sets the package
    logger's level, WARNING for `translate`; without this, every later test's
    `caplog` at INFO or DEBUG sees none of the package's records (CI's stop 59)."""
    package = logging.getLogger("keras_transformer")
    level = package.level
    yield
    package.setLevel(level)


# `make test` installs every extra (KERAS_TRANSFORMER_REQUIRE_EXTRAS=1): there a test
# skipped because a package is missing or broken (`pytest.importorskip`'s "could not
# import", or "is not installed") is a failure, so a broken wheel cannot pass as a skip;
# so is a skip for the two logical CPU devices this file sets up under TensorFlow
# (test_distribution.py): their absence is a broken set-up, not another machine.
# Skips that say a test cannot apply (another backend) stay skips.
REQUIRE_EXTRAS = os.environ.get("KERAS_TRANSFORMER_REQUIRE_EXTRAS") == "1"
_NOT_A_SKIP = ("could not import", "is not installed", "needs the two logical CPU devices")


def _fails_under_make_test(report):
    if not (REQUIRE_EXTRAS and report.skipped):
        return False
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return any(words in reason for words in _NOT_A_SKIP)


def _fail(report):
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"make test installs every extra and splits the CPU in two, but: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _fails_under_make_test(report):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if _fails_under_make_test(report):
        _fail(report)
