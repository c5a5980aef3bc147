"""Test set-up shared by every test module.

Under TensorFlow the one physical CPU is split into two logical devices
before TensorFlow initializes, so tests can run a real 2-replica
`MirroredStrategy`. Tests marked `multibackend` also run under JAX and
torch (`make test` runs them with `KERAS_BACKEND=jax` and `=torch`).
"""

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


# Put on a subprocess's PYTHONPATH by tests/test_without_tensorflow.py; imported
# here (as --doctest-modules would), it would hide TensorFlow from this process.
collect_ignore = ["without_tensorflow"]


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield


# `make test` installs every extra (KERAS_TRANSFORMER_REQUIRE_EXTRAS=1): there a test
# skipped because a package is missing or broken (`pytest.importorskip`'s "could not
# import", or "is not installed") is a failure, so a broken wheel cannot pass as a skip.
# Skips that say a test cannot apply (another backend, no second device) stay skips.
REQUIRE_EXTRAS = os.environ.get("KERAS_TRANSFORMER_REQUIRE_EXTRAS") == "1"
_MISSING = ("could not import", "is not installed")


def _missing_package(report):
    if not (REQUIRE_EXTRAS and report.skipped):
        return False
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return any(words in reason for words in _MISSING)


def _fail(report):
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"make test installs every extra, but: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _missing_package(report):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if _missing_package(report):
        _fail(report)
