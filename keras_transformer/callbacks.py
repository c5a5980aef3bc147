"""The callbacks of `training.run`'s `fit`, and their order (`training_callbacks`):
validation BLEU, learning-rate logging, NaN guard, time budget, phases, the run's clock."""

import logging
import math
import time

import keras

from keras_transformer import workdir
from keras_transformer.evaluation import make_translate_fn, score
from keras_transformer.hardware import importable
from keras_transformer.search import PAPER

logger = logging.getLogger(__name__)


class ValidationBleu(keras.callbacks.Callback):
    """Greedy-decodes a fixed validation sample every `every` epochs; logs `val_bleu`, `val_chrf`.

    Put it before `TensorBoard` in the callback list so that TensorBoard
    sees the values it adds to `logs`. `every=0` never decodes (on a 2-core
    CPU a decode of 300 sentences costs as much as 60 training steps).
    `seconds` is the time spent decoding.
    """

    def __init__(self, pairs, tokenizer, every=1):
        super().__init__()
        self.sources = [s for s, _ in pairs]
        self.references = [t for _, t in pairs]
        self.tokenizer = tokenizer
        self.every = every
        self.seconds = 0.0
        self._translate = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not self.sources or not self.every or (epoch + 1) % self.every:
            return
        if self._translate is None:
            self._translate = make_translate_fn(
                self.model, self.tokenizer, PAPER.replace(beam_size=1)
            )
        start = time.time()
        metrics = score(self._translate(self.sources), self.references)
        self.seconds += time.time() - start
        logs["val_bleu"], logs["val_chrf"] = metrics["bleu"], metrics["chrf"]
        logger.info(
            "epoch %d: validation BLEU %.2f chrF %.2f on %d sentences (greedy, %.0fs)",
            epoch + 1, metrics["bleu"], metrics["chrf"], metrics["segments"], time.time() - start,
        )  # fmt: skip


class EarlyStopping(keras.callbacks.EarlyStopping):
    """`keras.callbacks.EarlyStopping` on a metric that not every epoch has (validation
    chrF every `--validation-bleu-every` epochs): patience counts the epochs that
    have it; the others pass without Keras's warning. Keeps the best weights."""

    def __init__(self, metric, patience):
        monitor = {"chrf": "val_chrf", "bleu": "val_bleu", "loss": "val_loss"}[metric]
        mode = "min" if metric == "loss" else "max"
        super().__init__(monitor=monitor, mode=mode, patience=patience, restore_best_weights=True)

    def get_monitor_value(self, logs):
        return (logs or {}).get(self.monitor)

    def on_train_end(self, logs=None):
        if self.stopped_epoch > 0:
            logger.info(
                "Early stopping at epoch %d: %s has not improved for %d validations; keeping "
                "the weights of epoch %d (%s %.4f)", self.stopped_epoch + 1, self.monitor,
                self.patience, self.best_epoch + 1, self.monitor, self.best,
            )  # fmt: skip
        super().on_train_end(logs)


class LearningRateLogger(keras.callbacks.Callback):
    """Adds the current learning rate to `logs` (for TensorBoard and the history)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            optimizer = self.model.optimizer
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class TerminateOnNaN(keras.callbacks.TerminateOnNaN):
    """`TerminateOnNaN` that says what to try next, and lets steps run ahead.

    `async_safe`: under JAX and torch Keras then reads each step's loss in its
    callback thread while the next steps run, instead of waiting for every
    step to finish before it assembles and dispatches the next one. Training
    stops a few steps after a non-finite loss instead of at once; the weights
    are not kept (`BackupAndRestore` holds the last epoch's).
    """

    async_safe = True

    def on_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            logger.error(
                "Batch %d: the loss is %s; training stops. Try a lower learning rate (larger "
                "--warmup-steps), fewer --batch-tokens, or --preset with norm_first=True.",
                batch, loss,
            )  # fmt: skip
            # `_model`, not `model`: under JAX the property would sync the training
            # state back into the variables from this thread, under the running steps.
            self._model.stop_training = True


class TimeBudget(keras.callbacks.Callback):
    """Stops training after the first step that begins past `minutes` of training.

    Keras still runs that epoch's validation and `on_epoch_end` callbacks.
    """

    def __init__(self, minutes):
        super().__init__()
        self.seconds = minutes * 60.0
        self.start = None
        self.stopped = False

    def on_train_begin(self, logs=None):
        self.start = time.time()

    def on_train_batch_begin(self, batch, logs=None):
        # Checked as a step begins (that step still runs): no batch-end hook, so
        # under JAX and torch the step loop need not wait for the device.
        if not self.stopped and time.time() - self.start >= self.seconds:
            self.stopped = True
            self.model.stop_training = True
            logger.info("Time budget of %.1f minutes reached; training stops.", self.seconds / 60)


class ValidationEpochs(list):
    """Keras's `validation_freq` for "every `every` epochs and the last one".

    Keras validates after epoch `e` (1-based) when `e in validation_freq`. This
    list answers from a rule instead of its items: every `every`-th epoch, the
    last of `epochs`, and the epoch in which something stopped training early
    (`TimeBudget`, `TerminateOnNaN`), so a run always ends with a validation
    pass. A plain int would skip it when a time budget ends an odd epoch.
    """

    def __init__(self, every, epochs):
        super().__init__()
        self.every, self.epochs = every, epochs
        self.model = None  # set by `attach`; its `stop_training` marks the last epoch

    def attach(self, model):
        self.model = model
        return self

    def __contains__(self, epoch):
        stopping = getattr(self.model, "stop_training", False)
        return epoch % self.every == 0 or epoch >= self.epochs or stopping


class PhaseTimer(keras.callbacks.Callback):
    """Where the wall clock of `fit` goes: steps, validation, epoch-end work.

    Put it FIRST in the callback list and its `end_marker` LAST: the time
    between the two at `on_epoch_end` is what the other callbacks spent there
    (checkpoints, backups, validation BLEU, TensorBoard). It also records the
    validation-loss curve against minutes of training.

    Attributes:
        steps, step_seconds: training steps run and the time spent in them,
            from one `on_train_batch_begin` to the next (the last step of an
            epoch ends where validation or `on_epoch_end` begins); the first
            step, which traces the function, is in `first_step_seconds`. No
            batch-end hook: where no callback has one (or each is
            `async_safe`), Keras under JAX and torch dispatches the next step
            while the device runs the last, and the host's work per step
            (assembling the batch, copying it) overlaps the device's.
        validation_seconds: in `evaluate` passes over the validation data.
        epoch_end_seconds: in the other callbacks' `on_epoch_end`.
        fit_seconds: from `on_train_begin` to `on_train_end`.
        curve: list of `{"epoch", "step", "minutes", "val_loss"}`, one per epoch;
            `val_loss` None where the epoch had no validation pass.
    """

    def __init__(self):
        super().__init__()
        self.steps = 0
        self.step_seconds = self.first_step_seconds = 0.0
        self.validation_seconds = self.epoch_end_seconds = self.fit_seconds = 0.0
        self.curve = []
        self._clock = {}
        self.end_marker = _EpochEndMarker(self)

    def on_train_begin(self, logs=None):
        self._clock["train"] = time.time()

    def on_train_end(self, logs=None):
        self.fit_seconds = time.time() - self._clock["train"]

    def on_train_batch_begin(self, batch, logs=None):
        self._end_step()
        self._clock["step"] = time.time()

    def _end_step(self):
        """Closes the open step, if any, at this moment."""
        start = self._clock.pop("step", None)
        if start is None:
            return
        seconds = time.time() - start
        if self.steps == 0:
            self.first_step_seconds = seconds
        else:
            self.step_seconds += seconds
        self.steps += 1

    def on_test_begin(self, logs=None):
        self._end_step()
        self._clock["test"] = time.time()

    def on_test_end(self, logs=None):
        self.validation_seconds += time.time() - self._clock["test"]

    def on_epoch_end(self, epoch, logs=None):
        self._end_step()
        self._clock["epoch_end"] = time.time()
        self.curve.append(
            {
                "epoch": epoch + 1,
                "step": self.steps,
                "minutes": (time.time() - self._clock["train"]) / 60.0,
                "val_loss": float(logs["val_loss"]) if logs and "val_loss" in logs else None,
            }
        )


class _EpochEndMarker(keras.callbacks.Callback):
    def __init__(self, timer):
        super().__init__()
        self.timer = timer

    def on_epoch_end(self, epoch, logs=None):
        self.timer.epoch_end_seconds += time.time() - self.timer._clock["epoch_end"]


class TrainingClock(keras.callbacks.Callback):
    """Writes the run's training seconds, earlier processes' included, at every
    epoch end (`workdir.write_progress`), beside the backup taken then."""

    def __init__(self, work_dir, spent_seconds=0.0):
        super().__init__()
        self.work_dir = work_dir
        self.spent_seconds = spent_seconds
        self._start = None

    def on_train_begin(self, logs=None):
        self._start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        workdir.write_progress(self.work_dir, self.spent_seconds + time.time() - self._start)


def training_callbacks(
    work,
    validation_bleu,
    cooldown=None,
    minutes=None,
    spent_seconds=0.0,
    early_stopping=None,
    late_dropout=None,
):
    """`(callbacks, phases)`: the callbacks of a training `fit`, in the order they need.

    Args:
        work: the `workdir.WorkDir` that the backup, checkpoints, clock and logs go to.
        validation_bleu: a `ValidationBleu` (`every=0`: it never decodes).
        cooldown: a `schedules.Cooldown`, or None.
        minutes: the time budget of this `fit` (a `TimeBudget`), or None.
        spent_seconds: training time of the run's earlier processes (`TrainingClock`).
        early_stopping: an `EarlyStopping`, or None; after `ValidationBleu`, whose
            values it may follow.
        late_dropout: a `schedules.LateDropout`, or None.

    The order: `PhaseTimer` first and its end marker last (it times what the
    others do at epoch end); the backup before what reads the state it restores
    (the clock, the cooldown's and late dropout's step); `ValidationBleu` before `TensorBoard`,
    which then logs its values. The backup, checkpoints and TensorBoard save per
    epoch and are marked `async_safe`, as every other batch-end hook here: under
    JAX and torch Keras then dispatches the next step before the last one ends.
    """
    phases = PhaseTimer()
    backup = keras.callbacks.BackupAndRestore(work.backup, delete_checkpoint=False)
    checkpoint = keras.callbacks.ModelCheckpoint(work.checkpoint_pattern, save_weights_only=True)
    callbacks = [
        phases,
        backup,  # kept after training: the same command with a larger budget continues from it
        TrainingClock(work.path, spent_seconds),
        TerminateOnNaN(),
        *([cooldown] if cooldown is not None else []),
        *([late_dropout] if late_dropout is not None else []),
        LearningRateLogger(),
        validation_bleu,
        *([early_stopping] if early_stopping is not None else []),
        checkpoint,
        *_tensorboard(work),
        *([TimeBudget(minutes)] if minutes is not None else []),
        phases.end_marker,
    ]
    for callback in (backup, checkpoint):
        callback.async_safe = True  # per epoch: their batch-end hooks do nothing
    return callbacks, phases


def _tensorboard(work):
    """Keras's TensorBoard callback where it can write (`tf.summary`, on every backend)."""
    if not importable("tensorflow"):
        logger.info("No TensorBoard logs without TensorFlow; the curves are in run.json.")
        return []
    if not importable("tensorboard"):
        logger.warning(
            "TensorBoard is not installed (`pip install tensorboard`); no logs/ written."
        )
        return []
    # No graph under JAX and torch: TensorBoard writes it at the first step's end
    # through `self.model`, which under JAX syncs the training state into the
    # variables; from Keras's callback thread, while the next steps ran and donated
    # those buffers, that failed ("Buffer has been deleted or donated") or crashed
    # the process (a segmentation fault, tests/test_jax_data_parallel.py).
    write_graph = keras.backend.backend() == "tensorflow"  # whose callbacks run in step
    tensorboard = keras.callbacks.TensorBoard(work.logs, write_graph=write_graph)
    # Its batch-end hook writes nothing per epoch (no writer is pushed); this only
    # matters under JAX and torch (TensorFlow's Keras backend is not thread-safe).
    tensorboard.async_safe = True
    return [tensorboard]
