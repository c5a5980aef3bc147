"""The learning rate over a run: the paper's schedule (Section 5.3), and the
cooldown that ends it at 0 when a budget ends (`Cooldown`)."""

import time

import keras
from keras import ops


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
