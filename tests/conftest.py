"""Test set-up shared by every test module.

Under TensorFlow the one physical CPU is split into two logical devices
before TensorFlow initializes, so tests can run a real 2-replica
`MirroredStrategy`. Tests marked `multibackend` also run under JAX and
torch (`make test` runs them with `KERAS_BACKEND=jax` and `=torch`).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield
