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
