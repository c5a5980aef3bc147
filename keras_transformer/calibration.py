"""Precision and XLA of the training step, chosen by timing them on this machine.

Which of float32, mixed_bfloat16 (and, on GPUs, mixed_float16), with or
without XLA, trains fastest depends on the machine in ways no CPU flag
tells: on a Xeon with AVX512-BF16 but no AMX, bf16 matrix products run at
half the float32 rate and `mixed_bfloat16` was the slowest of four
settings, while on a Zen 4 with the same flag it was the fastest. So
`training.run` times a few real steps of each candidate on batches of the
real shapes before training (`calibrate`), trains with the fastest, and
caches the choice per machine, model and batch shape (`cache_path()`), so
that later runs skip it.

Numerical safety: a candidate whose loss on the first batch (same initial
weights, no dropout) differs from float32's by more than `LOSS_TOLERANCE`
(relative) is not chosen.
"""

import dataclasses
import json
import logging
import math
import os
import time

logger = logging.getLogger(__name__)

# Relative difference of a candidate's first-batch loss from float32's that
# rejects it. bf16 keeps 8 bits of mantissa: on a freshly initialised model its
# loss differs from float32's by well under 1% (tests/test_calibration.py).
LOSS_TOLERANCE = 0.02
CACHE_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to run the training step."""

    dtype_policy: str
    jit_compile: bool

    @property
    def name(self):
        return self.dtype_policy + (" + XLA" if self.jit_compile else "")


@dataclasses.dataclass(frozen=True)
class Measurement:
    seconds_per_step: float
    loss: float


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The candidate chosen and what was measured (for the log and `run.json`)."""

    choice: Candidate
    measurements: dict  # candidate name -> Measurement
    rejected: tuple  # names of candidates whose loss diverged from float32's
    seconds: float  # what the calibration cost this run (0 when read from the cache)
    cached: bool

    @property
    def measured(self):
        """Whether candidates were timed (here or in a cached run), not just one taken."""
        return bool(self.measurements)

    def to_dict(self):
        return {
            "dtype_policy": self.choice.dtype_policy,
            "jit_compile": self.choice.jit_compile,
            "ms_per_step": {
                name: round(1000 * m.seconds_per_step, 1) for name, m in self.measurements.items()
            },
            "first_batch_loss": {name: m.loss for name, m in self.measurements.items()},
            "rejected": list(self.rejected),
            "seconds": self.seconds,
            "cached": self.cached,
        }

    @classmethod
    def from_dict(cls, record):
        measurements = {
            name: Measurement(ms / 1000.0, record["first_batch_loss"][name])
            for name, ms in record["ms_per_step"].items()
        }
        choice = Candidate(record["dtype_policy"], record["jit_compile"])
        return cls(choice, measurements, tuple(record["rejected"]), 0.0, True)

    def summary(self):
        timings = ", ".join(
            f"{name} {1000 * m.seconds_per_step:.0f} ms"
            + (" (loss diverged)" if name in self.rejected else "")
            for name, m in self.measurements.items()
        )
        where = "cached" if self.cached else f"measured in {self.seconds:.0f}s"
        return f"{timings} per step; training with {self.choice.name} ({where})"


def candidates(backend, cpu, has_gpu=False, multi_device=False, pack=True,
               dtype_policy=None, jit_compile=None):  # fmt: skip
    """The settings worth timing here; `dtype_policy` or `jit_compile`, when
    given, fix their axis.

    - precision: float32; mixed_bfloat16 where the hardware multiplies bf16
      (a GPU, or a CPU with AMX-BF16 or AVX512-BF16: elsewhere bf16 is emulated
      and slower than float32); mixed_float16 on a GPU.
    - XLA: JAX always compiles; torch never (`torch.compile` is not a
      candidate); TensorFlow on one device with packed rows, both (under
      `MirroredStrategy` XLA fails on logical CPU devices; length buckets
      give dozens of shapes, each an XLA compile).
    """
    if dtype_policy is not None:
        dtypes = [dtype_policy]
    elif has_gpu:
        dtypes = ["float32", "mixed_bfloat16", "mixed_float16"]
    else:
        dtypes = ["float32"] + (["mixed_bfloat16"] if cpu.get("bf16") else [])
    if jit_compile is not None:
        xla = [bool(jit_compile)]
    elif backend == "jax":
        xla = [True]
    elif backend == "tensorflow" and not multi_device and pack:
        xla = [False, True]
    else:
        xla = [False]
    return [Candidate(d, x) for d in dtypes for x in xla]


def run_candidates(config, machine):
    """This run's candidates (`candidates`): `--dtype-policy` and `--jit-compile` fix
    their axis; in a multi-worker run, one, since each worker timing its own steps
    could disagree, and every worker must train alike."""
    import keras

    from keras_transformer.distribution import is_multi_worker
    from keras_transformer.hardware import default_dtype_policy

    options = candidates(
        keras.backend.backend(), machine.cpu, machine.has_gpu,
        multi_device=machine.strategy is not None, pack=config.pack,
        dtype_policy=config.dtype_policy, jit_compile=config.jit_compile,
    )  # fmt: skip
    if len(options) > 1 and is_multi_worker(machine.strategy):
        fallback = "float32" if machine.has_gpu else default_dtype_policy(machine.cpu)
        options = [Candidate(config.dtype_policy or fallback, bool(config.jit_compile))]
    return options


def calibrated_model(build, candidate_list, batches, dataset, loss, key, seed, timed_steps=6):
    """The compiled model, with the precision and XLA setting that trains fastest here.

    With one candidate it is built as is. Otherwise each candidate is built
    from the same initial weights (`seed`), checked on the first batch against
    float32's loss, and timed over `timed_steps` steps after two untimed ones
    (`choose`); the fastest is kept, its weights and optimizer put back to
    where they started, and its traced step is the one `fit` then runs. The
    choice is cached under `key` (`machine_key`; `cache_path()`).

    Args:
        build: callable `candidate -> compiled model` (its optimizer built).
        candidate_list: `Candidate`s (`run_candidates`).
        batches, dataset: the training `data.Batches` and what `fit` reads of them.
        loss: the training loss, `(labels, logits) -> scalar`.

    Returns:
        `(model, calibration)`: `calibration.choice` the candidate trained; with one
        candidate nothing is measured (`calibration.measured` is False).
    """
    import keras

    if len(candidate_list) == 1:
        (only,) = candidate_list
        logger.info("Precision %s, XLA (jit_compile) %s", only.dtype_policy, only.jit_compile)
        return build(only), Calibration(only, {}, (), 0.0, False)
    result = read_cache(key)
    models = {}
    if result is None:

        def measure(candidate):
            keras.utils.set_random_seed(seed)  # the same initial weights for all
            model = build(candidate)
            models[candidate.name] = (model, _training_state(model))
            return _measure_steps(model, batches, dataset, loss, timed_steps)

        result = choose(list(candidate_list), measure)
        write_cache(key, result)
    logger.info("Calibration: %s", result.summary())
    if result.choice.name in models:
        model, start_state = models[result.choice.name]
        _restore_training_state(model, start_state)
    else:
        keras.utils.set_random_seed(seed)
        model = build(result.choice)
    return model, result


def step_seconds(model, calibrated, batches, dataset, loss, timed_steps=6):
    """The seconds a training step of `model` (the calibration's choice) takes here:
    what the calibration measured (or cached) for it, or, where it measured nothing
    (one candidate), timed now like a candidate, its weights and optimizer put back."""
    measured = calibrated.measurements.get(calibrated.choice.name)
    if measured is not None:
        return measured.seconds_per_step
    state = _training_state(model)
    seconds = _measure_steps(model, batches, dataset, loss, timed_steps).seconds_per_step
    _restore_training_state(model, state)
    return seconds


def _training_state(model):
    """The weights and optimizer variables of a compiled model whose optimizer is
    built (`build` builds it, in the strategy's scope), as numpy arrays."""
    import keras

    optimizer = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
    return model.get_weights(), optimizer


def _restore_training_state(model, state):
    weights, optimizer = state
    model.set_weights(weights)
    for variable, value in zip(model.optimizer.variables, optimizer, strict=True):
        variable.assign(value)


def _measure_steps(model, batches, dataset, loss, timed_steps, warmup_steps=2):
    """`Measurement`: the median seconds of `timed_steps` training steps after
    `warmup_steps` (the trace and compile), and the loss of the first batch with
    the initial weights (no dropout)."""
    import numpy as np

    features, labels = batches.batch(0)
    logits = model(features, training=False)  # eager: no trace of a predict function
    first_loss = float(loss(labels, logits))
    clock = _step_clock()
    model.fit(
        dataset, epochs=1, steps_per_epoch=warmup_steps + timed_steps, verbose=0,
        callbacks=[clock], shuffle=False,
    )  # fmt: skip
    return Measurement(float(np.median(clock.seconds[warmup_steps:])), first_loss)


def _step_clock():
    """A callback timing each training step; it reads the loss at every step's end,
    so that a backend that dispatches asynchronously (JAX) has finished the step."""
    import keras

    class StepClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []
            self._start = None

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            float(keras.ops.convert_to_numpy(logs["loss"]))
            self.seconds.append(time.perf_counter() - self._start)

    return StepClock()


def choose(candidate_list, measure, tolerance=LOSS_TOLERANCE):
    """Measures every candidate and returns the fastest whose loss agrees with float32's.

    Args:
        candidate_list: `Candidate`s; float32 (the first one without
            mixed precision, else the first) is the loss reference.
        measure: callable, candidate -> `Measurement`.
        tolerance: relative loss difference that rejects a candidate.

    Returns:
        `Calibration` (`seconds` is the time spent measuring).
    """
    if not candidate_list:
        raise ValueError("No candidate to calibrate.")
    start = time.time()
    measurements = {c.name: measure(c) for c in candidate_list}
    reference = next((c for c in candidate_list if c.dtype_policy == "float32"), None)
    reference_loss = measurements[reference.name].loss if reference else None
    rejected = []
    for c in candidate_list:
        loss = measurements[c.name].loss
        if not math.isfinite(loss) or (
            reference_loss is not None
            and abs(loss - reference_loss) > tolerance * abs(reference_loss)
        ):
            rejected.append(c.name)
    safe = [c for c in candidate_list if c.name not in rejected] or [reference or candidate_list[0]]
    choice = min(safe, key=lambda c: measurements[c.name].seconds_per_step)
    return Calibration(choice, measurements, tuple(rejected), time.time() - start, False)


def cache_path():
    """`$KERAS_TRANSFORMER_CACHE/calibration.json`, else under `$XDG_CACHE_HOME` (~/.cache)."""
    folder = os.environ.get("KERAS_TRANSFORMER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keras_transformer"
    )
    return os.path.join(folder, "calibration.json")


def machine_key(**facts):
    """A stable string of what the choice depends on: the machine (CPU model and
    cores, GPU), the framework versions, the model's shape and the batches'."""
    import keras

    versions = {"keras": keras.__version__}
    backend = keras.backend.backend()
    try:
        module = __import__({"tensorflow": "tensorflow"}.get(backend, backend))
        versions[backend] = module.__version__
    except ImportError:
        pass
    return json.dumps({"format": CACHE_FORMAT, "versions": versions, **facts}, sort_keys=True)


def read_cache(key, path=None):
    """The cached `Calibration` of `key`, or None."""
    try:
        with open(path or cache_path(), encoding="utf-8") as f:
            record = json.load(f).get(key)
        return Calibration.from_dict(record) if record else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cache(key, calibration, path=None):
    """Adds `calibration` under `key` to the cache file (atomically); failures only warn."""
    path = path or cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, encoding="utf-8") as f:
                records = json.load(f)
        except (OSError, ValueError):
            records = {}
        records[key] = dict(calibration.to_dict(), cached=False)
        temporary = f"{path}.tmp{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)
        os.replace(temporary, path)
    except OSError as error:
        logger.warning("Calibration not cached (%s): %s", path, error)
