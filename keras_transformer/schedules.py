"""The learning rate over a run: the paper's schedule (Section 5.3), and the
cooldown that ends it at 0 when a budget ends (`Cooldown`); dropout turned on
late in a budget (`LateDropout`)."""

import logging
import time

import keras
from keras import ops

from keras_transformer.layers.attention import MultiHeadAttention

logger = logging.getLogger(__name__)


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`.

    Linear warm-up for `warmup_steps`, then decay with the inverse square root
    of the step (https://arxiv.org/abs/1706.03762, Section 5.3, where
    `warmup_steps=4000`). The peak, at `step == warmup_steps`, is
    `scale * (d_model * warmup_steps)^-0.5`. Keras optimizers pass the
    0-based iteration count, so the schedule evaluates the paper's 1-based step.

    Args:
        d_model: int. Model width.
        warmup_steps: int. Steps of linear warm-up.
        scale: float. Multiplier of the whole curve (1.0 in the paper).
        batches_per_update: int. With gradient accumulation, the batches that make
            one update: Keras 3.15's optimizers call a schedule with the count of
            batches, not of updates (`BaseOptimizer._get_current_learning_rate`
            reads `_iterations`, though the `gradient_accumulation_steps` docs say
            otherwise), so the schedule divides it (tests/test_schedule_and_loss.py).

    Example:

    >>> schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    >>> round(float(schedule(3999)), 6)  # the peak, at step 4000
    0.000699
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, batches_per_update=1):
        if d_model <= 0:
            raise ValueError(f"d_model must be positive. Received: d_model={d_model}")
        if warmup_steps <= 0:
            raise ValueError(
                f"warmup_steps must be positive. Received: warmup_steps={warmup_steps}"
            )
        if batches_per_update < 1:
            raise ValueError(f"batches_per_update must be >= 1. Received: {batches_per_update}")
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)
        self.batches_per_update = int(batches_per_update)

    def __call__(self, step):
        if self.batches_per_update > 1:
            step = ops.floor_divide(step, self.batches_per_update)
        step = ops.cast(step, "float32") + 1.0  # the paper counts from 1
        decay = ops.minimum(ops.rsqrt(step), step * self.warmup_steps**-1.5)
        return self.scale * self.d_model**-0.5 * decay

    def get_config(self):
        return {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
            "batches_per_update": self.batches_per_update,
        }


class Cooldown(keras.callbacks.Callback):
    """Follows `schedule`, then decays the rate linearly to 0 over the last `fraction` of a budget.

    The budget is `minutes` of training (`TimeBudget`'s clock, started at
    `on_train_begin`) or `total_steps` steps of this `fit`, whichever ends
    first (steps counted from `initial_step`, so that a resumed run goes on
    where it stopped). Before the cooldown the rate is `schedule(step)`; in it,
    `schedule(step) * remaining / fraction`, where `remaining` is the share of
    the budget left. This is the warm-up / stable / decay shape: a rate that
    ends at 0 when the budget does beats one still at a quarter of its peak
    (Li et al., "Budgeted Training", 2020, https://arxiv.org/abs/1905.04753;
    Hägele et al., 2024, https://arxiv.org/abs/2405.18392, where a cooldown
    over the last 20% matched a cosine schedule fitted to the length).

    The model must be compiled with a settable rate
    (`compile_with_paper_recipe(..., settable_learning_rate=True)`). The rate
    is set before every step; under JAX, which keeps the training state
    outside the variables during an epoch and syncs it back whenever a
    callback reads `self.model`, every `jax_every` steps.

    Args:
        schedule: callable, step -> rate (`TransformerSchedule`).
        fraction: float in (0, 1]. Share of the budget that the cooldown takes.
        minutes: float or None. The time budget.
        total_steps: int or None. The step budget, counted from `initial_step`.
        initial_step: int. The optimizer's step at which the step budget began
            (0; `--init-from`'s last step).
        jax_every: int. Steps between rate updates under JAX.
    """

    def __init__(
        self, schedule, fraction, minutes=None, total_steps=None, initial_step=0, jax_every=10
    ):
        super().__init__()
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1]. Received: fraction={fraction}")
        if minutes is None and total_steps is None:
            raise ValueError("Cooldown needs a budget: minutes, total_steps or both.")
        self.schedule = schedule
        self.fraction = fraction
        self.seconds = None if minutes is None else minutes * 60.0
        self.total_steps = total_steps
        self.initial_step = initial_step
        self.every = jax_every if keras.backend.backend() == "jax" else 1
        self.start = self.first_step = None
        self.steps = 0

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if not hasattr(optimizer.learning_rate, "assign"):  # a schedule's value, not a variable
            raise ValueError(
                "Cooldown sets the learning rate, but this optimizer's rate is a schedule. "
                "Compile with compile_with_paper_recipe(..., settable_learning_rate=True)."
            )
        # After BackupAndRestore (earlier in the list): a resumed run goes on from its step.
        self.first_step = int(keras.ops.convert_to_numpy(optimizer.iterations))
        self.start = time.time()
        self.steps = 0

    def remaining(self):
        """Share of the budget left, in [0, 1]."""
        used = 0.0
        if self.seconds:
            used = (time.time() - self.start) / self.seconds
        if self.total_steps:
            done = self.first_step + self.steps - self.initial_step
            used = max(used, done / self.total_steps)
        return min(max(1.0 - used, 0.0), 1.0)

    def rate(self):
        """The rate for the next step."""
        factor = min(self.remaining() / self.fraction, 1.0)
        return float(self.schedule(self.first_step + self.steps)) * factor

    def on_train_batch_begin(self, batch, logs=None):
        if self.steps % self.every == 0:
            # Under JAX, `self.model` syncs the optimizer's state back into its
            # variables (Keras's `Callback.model`), and the next step reads them.
            self.model.optimizer.learning_rate.assign(self.rate())
        # Counted here, not in `on_train_batch_end`: a callback with no batch-end hook
        # lets Keras run the step loop ahead of the device (see `PhaseTimer`).
        self.steps += 1


class LateDropout(keras.callbacks.Callback):
    """Residual and embedding dropout off for the first `start` of a budget, then
    at the model's rates.

    Late dropout (Liu et al., "Dropout Reduces Underfitting", 2023,
    https://arxiv.org/abs/2303.01500, for models that overfit): without dropout
    a model learns fastest early; dropout turned on later is to keep it from
    overfitting the passes that remain. The rates are the model's (`dropout`; the attention
    dropout of `MultiHeadAttention` stays on throughout): the callback sets
    every other `keras.layers.Dropout` of the model to 0 at `on_train_begin`
    while less than `start` of the budget is spent, and back to its rate
    before the first step past it. A rate is read when the step is traced, so
    each change traces (and with XLA compiles) the training step again
    (`make_train_function(force=True)`; each backend's `fit` reads the new
    function at its next step): two traces a run more than without it, each
    seconds on a CPU, on the budget's clock.

    The budget is `minutes` of training, the run's earlier processes'
    included (`spent_seconds`), or `total_steps` steps from `initial_step`,
    whichever ends first: a resumed run keeps its place. Steps are counted in
    `on_train_batch_begin`, one a batch: `steps_per_execution` must be 1. In a
    run over several workers each switches on its own clock, so there the
    budget must be steps alone (`train.py` refuses a time budget).

    Args:
        start: float in (0, 1). Share of the budget spent without dropout.
        minutes: float or None. The run's whole time budget.
        total_steps: int or None. The step budget, counted from `initial_step`.
        spent_seconds: float. Training seconds of the run's earlier processes.
        initial_step: int. The optimizer's step at which the step budget began.
    """

    def __init__(self, start, minutes=None, total_steps=None, spent_seconds=0.0, initial_step=0):
        super().__init__()
        if not 0.0 < start < 1.0:
            raise ValueError(f"start must be in (0, 1). Received: start={start}")
        if minutes is None and total_steps is None:
            raise ValueError("LateDropout needs a budget: minutes, total_steps or both.")
        self.start_share = start
        self.seconds = None if minutes is None else minutes * 60.0
        self.total_steps = total_steps
        self.spent_seconds = spent_seconds
        self.initial_step = initial_step
        self.rates = {}  # layer -> its rate, while it is set to 0
        # The optimizer step dropout came on at (this `fit`'s first where it was on from
        # the start, a resumed run past `start`); None while it has not.
        self.on_step = None
        self._clock = self._first_step = None
        self._steps = 0

    def spent(self):
        """Share of the budget spent, in [0, 1]."""
        used = 0.0
        if self.seconds:
            used = (self.spent_seconds + time.time() - self._clock) / self.seconds
        if self.total_steps:
            done = self._first_step + self._steps - self.initial_step
            used = max(used, done / self.total_steps)
        return min(max(used, 0.0), 1.0)

    def on_train_begin(self, logs=None):
        if getattr(self.model, "steps_per_execution", 1) != 1:
            raise ValueError(
                "LateDropout counts one step a batch: compile with steps_per_execution=1. "
                f"Received: steps_per_execution={self.model.steps_per_execution}"
            )
        # After BackupAndRestore (earlier in the list): a resumed run keeps its step.
        self._first_step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        self._clock = time.time()
        self._steps = 0
        if self.spent() >= self.start_share:
            self.on_step = self._first_step
            logger.info("Dropout on from this process's first step (past --dropout-start).")
            return
        attention = {
            id(layer.dropout_layer)
            for layer in self.model._flatten_layers()
            if isinstance(layer, MultiHeadAttention)
        }
        for layer in self.model._flatten_layers():
            if isinstance(layer, keras.layers.Dropout) and id(layer) not in attention:
                if layer.rate > 0:
                    self.rates[layer] = layer.rate
                    layer.rate = 0.0
        if self.rates:
            self.model.make_train_function(force=True)

    def on_train_batch_begin(self, batch, logs=None):
        # Counted here, as `Cooldown` does: no batch-end hook (see `PhaseTimer`).
        if self.rates and self.spent() >= self.start_share:
            self.on_step = self._first_step + self._steps
            logger.info(
                "Dropout on at step %d, %.0f%% of the budget (--dropout-start %g).",
                self.on_step, 100 * self.spent(), self.start_share,
            )  # fmt: skip
            self._restore()
        self._steps += 1

    def on_train_end(self, logs=None):
        self._restore()  # the model leaves `fit` with its own rates

    def _restore(self):
        if not self.rates:
            return
        for layer, rate in self.rates.items():
            layer.rate = rate
        self.rates = {}
        self.model.make_train_function(force=True)
