"""The machine a run trains on: hardware and distribution facts, set up once and frozen."""

import dataclasses
import logging
import os

import keras

from keras_transformer.distribution import (
    initialize_processes,
    is_chief_task,
    make_strategy,
    num_replicas,
)
from keras_transformer.hardware import (
    configure_threads,
    describe_accelerator,
    describe_cpu,
    system_gpus,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Machine:
    """What this process trains on; how it trains (precision, XLA) is `calibration`'s."""

    cpu: dict  # `hardware.describe_cpu()`
    threads: dict  # TensorFlow's thread pools ({} on other backends)
    has_gpu: bool
    gpu_name: str | None
    strategy: object  # a tf.distribute strategy, or None
    strategy_description: str
    num_replicas: int
    is_chief: bool
    task_name: str  # "worker_0": names a worker's folder in a multi-worker run

    def scope(self):
        """The strategy's scope, where variables are made (a null context without one)."""
        import contextlib

        return self.strategy.scope() if self.strategy else contextlib.nullcontext()


def set_up_machine(seed, logical_devices=None):
    """Threads (before TensorFlow runs its first op), the seed and the distribution."""
    initialize_processes()  # before JAX's first computation
    cpu = describe_cpu()
    threads = {}
    if keras.backend.backend() == "tensorflow":
        threads = configure_threads()
        logger.info("CPU: %s; TensorFlow threads: %s", cpu["summary"], threads)
    else:
        logger.info("CPU: %s; %s backend", cpu["summary"], keras.backend.backend())
    keras.utils.set_random_seed(seed)
    gpus = backend_gpus()
    gpu_name = gpus[0] if gpus else None
    line, warning = describe_accelerator(
        keras.backend.backend(), gpus, system_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    logger.info(line)
    if warning:
        logger.warning(warning)
    strategy, description = make_strategy(logical_devices)
    logger.info("Distribution: %s", description)
    is_chief, task_name = is_chief_task()
    return Machine(
        cpu=cpu,
        threads=threads,
        has_gpu=gpu_name is not None,
        gpu_name=gpu_name,
        strategy=strategy,
        strategy_description=description,
        num_replicas=num_replicas(strategy),
        is_chief=is_chief,
        task_name=task_name,
    )


def backend_gpus():
    """The names of the GPUs this process's backend sees ([] without one)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return [d.device_kind for d in jax.local_devices() if d.platform == "gpu"]
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return []
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    import tensorflow as tf

    return [
        tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
        for gpu in tf.config.list_physical_devices("GPU")
    ]
