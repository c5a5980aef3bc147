"""The paper's learning-rate schedule (Section 5.3)."""

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

    Example:

    >>> schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    >>> round(float(schedule(3999)), 6)  # the peak, at step 4000
    0.000699
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if d_model <= 0:
            raise ValueError(f"d_model must be positive. Received: d_model={d_model}")
        if warmup_steps <= 0:
            raise ValueError(
                f"warmup_steps must be positive. Received: warmup_steps={warmup_steps}"
            )
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0  # the paper counts from 1
        decay = ops.minimum(ops.rsqrt(step), step * self.warmup_steps**-1.5)
        return self.scale * self.d_model**-0.5 * decay

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}
