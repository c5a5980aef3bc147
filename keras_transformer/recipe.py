"""The paper's training recipe as one call, for `training.run()` and for a user's own `fit`.

Vaswani et al. (2017), Section 5.3: Adam with beta_1 = 0.9, beta_2 = 0.98,
epsilon = 1e-9 on the warm-up / inverse-square-root schedule; Section 5.4:
label smoothing 0.1. Padding counts in neither the loss nor the accuracy.

    model = Transformer.from_preset("small")
    compile_with_paper_recipe(model, warmup_steps=4000)
    model.fit(train_ds, validation_data=val_ds, epochs=10)

`train_ds` yields `({"source_ids": (B, S), "target_ids": (B, T)}, labels (B, T))`
as `keras_transformer.data.make_dataset` builds it.
"""

import keras

from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.schedules import TransformerSchedule

ADAM = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9}  # Section 5.3
LABEL_SMOOTHING = 0.1  # Section 5.4
WARMUP_STEPS = 4000  # Section 5.3


def paper_loss(pad_id=0, label_smoothing=LABEL_SMOOTHING):
    """`LabelSmoothedCrossEntropy` of the paper (padding ignored)."""
    return LabelSmoothedCrossEntropy(label_smoothing=label_smoothing, pad_id=pad_id)


def paper_optimizer(d_model, warmup_steps=WARMUP_STEPS, learning_rate_scale=1.0, settable=False):
    """Adam(0.9, 0.98, 1e-9) on `TransformerSchedule(d_model, warmup_steps, scale)`.

    `settable=True` gives Adam a plain learning-rate variable, starting at the
    schedule's first value, for a callback that sets it every step
    (`callbacks.Cooldown`): Keras cannot set a rate that is a schedule.
    """
    schedule = TransformerSchedule(d_model, warmup_steps=warmup_steps, scale=learning_rate_scale)
    if settable:
        return keras.optimizers.Adam(float(schedule(0)), **ADAM)
    return keras.optimizers.Adam(schedule, **ADAM)


def compile_with_paper_recipe(
    model,
    warmup_steps=WARMUP_STEPS,
    learning_rate_scale=1.0,
    label_smoothing=LABEL_SMOOTHING,
    settable_learning_rate=False,
    **compile_kwargs,
):
    """Compiles a `Transformer` with the paper's optimizer, schedule, loss and metric.

    Args:
        model: a `Transformer` (its `config` gives `d_model` and `pad_id`).
        warmup_steps: of `TransformerSchedule` (4000 in the paper).
        learning_rate_scale: `scale` of `TransformerSchedule` (1.0 in the paper).
        label_smoothing: of `LabelSmoothedCrossEntropy` (0.1 in the paper).
        settable_learning_rate: a plain rate variable instead of the schedule,
            for `callbacks.Cooldown` (`paper_optimizer`'s `settable`).
        **compile_kwargs: passed on to `model.compile` (`jit_compile`,
            `steps_per_execution`...).

    Returns:
        `model`, compiled.

    Example:

    >>> from keras_transformer import Transformer
    >>> model = compile_with_paper_recipe(Transformer.from_preset("tiny"), warmup_steps=100)
    >>> model.optimizer.beta_2, model.optimizer.epsilon, model.loss.label_smoothing
    (0.98, 1e-09, 0.1)
    """
    config = model.config
    model.compile(
        optimizer=paper_optimizer(
            config.d_model, warmup_steps, learning_rate_scale, settable=settable_learning_rate
        ),
        loss=paper_loss(config.pad_id, label_smoothing),
        metrics=[MaskedAccuracy(pad_id=config.pad_id)],
        **compile_kwargs,
    )
    return model
