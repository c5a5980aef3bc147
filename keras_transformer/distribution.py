"""Distribution strategies for `model.fit`: one machine, several workers, JAX.

`make_strategy()` picks `MirroredStrategy` over several local GPUs (or the
CPU split into logical devices), TensorFlow's default strategy on one device,
`MultiWorkerMirroredStrategy` when `TF_CONFIG` is set, and
`keras.distribution.DataParallel` under JAX.
"""

import json
import os

import keras

from keras_transformer.model import Transformer


def _set_logical_cpus(count):
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current is not None and len(current) == count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * count
        )
    except RuntimeError:
        raise RuntimeError(
            f"--logical-devices {count}: TensorFlow is already initialized with "
            f"{len(tf.config.list_logical_devices('CPU'))} CPU device(s); split the CPU "
            "before any TensorFlow op runs."
        ) from None


PROCESS_VARIABLES = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)


def initialize_processes():
    """Joins this JAX process to the others of its run, where Keras's variables say so.

    Several JAX processes (one per host, or per GPU) train one model when
    each is started with `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator's
    `host:port`, first), `KERAS_DISTRIBUTION_NUM_PROCESSES` and
    `KERAS_DISTRIBUTION_PROCESS_ID` (Keras's own variables for
    `keras.distribution.initialize`, which calls `jax.distributed.initialize`).
    Must run before JAX's first computation. On CPUs the processes exchange
    gradients over Gloo. Returns the number of processes (1 without them).
    """
    if keras.backend.backend() != "jax":
        return 1
    count = os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES")
    if count is None or int(count) <= 1:
        return 1
    missing = [name for name in PROCESS_VARIABLES if not os.environ.get(name)]
    if missing:
        raise ValueError(
            f"KERAS_DISTRIBUTION_NUM_PROCESSES={count} needs {' and '.join(missing)} as well "
            "(the coordinator's host:port, and this process's index from 0)."
        )
    import jax

    # Collectives between CPU processes (JAX has none there by default); GPUs use NCCL.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    keras.distribution.initialize()
    return jax.process_count()


def process_share():
    """`(index, count)` of this process among those that feed one batch: under JAX
    with several processes each gives its own slice of every batch's rows."""
    if keras.backend.backend() != "jax":
        return 0, 1
    import jax

    return jax.process_index(), jax.process_count()


def make_strategy(logical_devices=None):
    """The distribution for this process; returns `(strategy or None, description)`.

    TensorFlow: `MultiWorkerMirroredStrategy` when `TF_CONFIG` is set,
    otherwise `MirroredStrategy` over `logical_devices` logical CPU devices or
    over all local GPUs when there are several, and no strategy (TensorFlow's
    default) on one device: a one-replica `MirroredStrategy` only adds
    per-step cross-replica bookkeeping (benchmarks/README.md, "Settled questions").
    JAX: `keras.distribution.DataParallel` over all devices when there are
    several (`num_replicas`: a batch's rows divide among them). torch: none.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        devices = keras.distribution.list_devices()
        if len(devices) == 1:
            # No distribution: Keras would read batches through its distributed
            # iterator, which drops the one-batch look-ahead of the plain one.
            return None, f"jax on one device: {devices[0]}"
        import jax

        processes = jax.process_count()
        # Several processes: each reads its own rows of every batch (`process_share`);
        # Keras's sharding of a dataset across processes takes tf.data only.
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=devices, auto_shard_dataset=processes == 1)
        )
        where = f" in {processes} processes" if processes > 1 else ""
        return None, f"jax DataParallel over {len(devices)} device(s){where}"
    if backend != "tensorflow":
        return None, f"{backend}: single device"
    import tensorflow as tf

    if os.environ.get("TF_CONFIG"):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        return strategy, f"MultiWorkerMirroredStrategy ({strategy.num_replicas_in_sync} replicas)"
    if logical_devices:
        if logical_devices < 1:
            raise ValueError(f"logical_devices must be >= 1. Received: {logical_devices}")
        _set_logical_cpus(logical_devices)
        devices = [f"/cpu:{i}" for i in range(logical_devices)]
        # Gradients summed on one device, not by TensorFlow's ring collectives: the
        # logical devices share one memory, and the collectives' instance keys can
        # pair different tensors across replicas ("Shape mismatch in the collective
        # instance", tensorflow/tensorflow#62790; seen here in compiled steps).
        strategy = tf.distribute.MirroredStrategy(
            devices=devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
        )
    else:
        gpus = tf.config.list_logical_devices("GPU")
        if len(gpus) <= 1:
            device = gpus[0].name if gpus else "/cpu:0"
            return None, f"default strategy on one device: {device}"
        strategy = tf.distribute.MirroredStrategy()
    devices = ", ".join(strategy.extended.worker_devices)
    return strategy, f"MirroredStrategy over {strategy.num_replicas_in_sync} device(s): {devices}"


def num_replicas(strategy):
    """The replicas a batch is split over: the strategy's, or under JAX the devices
    of `keras.distribution`'s data parallelism (rows must divide among them); 1."""
    if strategy is not None:
        return strategy.num_replicas_in_sync
    distribution = keras.distribution.distribution()
    if distribution is not None and getattr(distribution, "device_mesh", None) is not None:
        return int(distribution.device_mesh.devices.size)
    return 1


def is_multi_worker(strategy):
    """True when `strategy` spans several workers (replicas outside this process)."""
    return strategy is not None and strategy.num_replicas_in_sync > len(
        strategy.extended.worker_devices
    )


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiWorkerTransformer(Transformer):
    """`Transformer` whose `fit` and `evaluate` run under `MultiWorkerMirroredStrategy`.

    Keras 3.15's TensorFlow trainer fails there in two places
    (keras-team/keras#20585, tensorflow/tensorflow#72388); both overrides act
    only when the strategy spans several workers:

    1. `fit`/`evaluate` start with `_maybe_symbolic_build`, which averages the
       replicas' first batch with `strategy.reduce("MEAN", batch, axis=None)`
       (keras/src/backend/tensorflow/trainer.py, `_maybe_symbolic_build`).
       Across workers, `CollectiveAllReduce.reduce` calls `convert_to_tensor`
       on the nested batch: "Attempt to convert a value (PerReplica...)".
       Building needs only shapes and dtypes: this process's first replica's
       batch is used instead (which also keeps the ids integer).
    2. `reduce_per_replica(..., "auto")` reduces every log value with
       `strategy.reduce("MEAN", value, axis=0)` in multi-worker mode, and
       metric results are scalars: "Invalid reduction dimension 0 for input
       with 0 dimensions". `train_step`/`test_step` return them with shape
       (1,), so that the mean over axis 0 is the mean over replicas, a scalar.

    Apart from these, it is a `Transformer` (same config and weights);
    `train.py` saves a plain `Transformer` copy of it.
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self.distribute_strategy
        if iterator is not None and data_batch is None and is_multi_worker(strategy):
            for _, _, distributed_iterator in iterator:
                data_batch = keras.tree.map_structure(
                    lambda value: strategy.experimental_local_results(value)[0],
                    next(distributed_iterator),
                )
                break
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _logs_as_vectors(self, logs):
        if not is_multi_worker(self.distribute_strategy):
            return logs
        return keras.tree.map_structure(
            lambda value: keras.ops.reshape(value, (1,)) if len(value.shape) == 0 else value, logs
        )

    def train_step(self, data):
        return self._logs_as_vectors(super().train_step(data))

    def test_step(self, data):
        return self._logs_as_vectors(super().test_step(data))


def is_chief_task():
    """`(is_chief, task_id)` from `TF_CONFIG` (chief = worker 0 or the chief task), or
    under JAX from the process index (chief = process 0)."""
    index, count = process_share()
    if count > 1:
        return index == 0, f"process_{index}"
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    task_type, task_id = task.get("type", "worker"), int(task.get("index", 0))
    has_chief = "chief" in config.get("cluster", {})
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief)
    return is_chief, f"{task_type}_{task_id}"
