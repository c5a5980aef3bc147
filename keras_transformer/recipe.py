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


def paper_optimizer(
    d_model, warmup_steps=WARMUP_STEPS, learning_rate_scale=1.0, settable=False,
    accumulation_steps=1, ema_momentum=None,
):  # fmt: skip
    """Adam(0.9, 0.98, 1e-9) on `TransformerSchedule(d_model, warmup_steps, scale)`.

    `settable=True` gives Adam a plain learning-rate variable, starting at the
    schedule's first value, for a callback that sets it every step
    (`callbacks.Cooldown`): Keras cannot set a rate that is a schedule.
    `accumulation_steps=N` (> 1) updates the weights every N batches with the
    mean of their gradients (Keras's `gradient_accumulation_steps`; the
    schedule counts updates, not batches), so that N batches of B tokens make
    one update of about N x B tokens on a device that holds B.
    `ema_momentum` (e.g. 0.999) keeps an exponential moving average of the
    weights (Keras's `use_ema`), which `fit` writes into the model when it ends.
    """
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1. Received: {accumulation_steps}")
    schedule = TransformerSchedule(
        d_model, warmup_steps=warmup_steps, scale=learning_rate_scale,
        batches_per_update=accumulation_steps,
    )  # fmt: skip
    extra = {"gradient_accumulation_steps": accumulation_steps} if accumulation_steps > 1 else {}
    if ema_momentum is not None:
        extra.update(use_ema=True, ema_momentum=ema_momentum)
    if settable:
        return keras.optimizers.Adam(float(schedule(0)), **ADAM, **extra)
    return keras.optimizers.Adam(schedule, **ADAM, **extra)


def compile_with_paper_recipe(
    model,
    warmup_steps=WARMUP_STEPS,
    learning_rate_scale=1.0,
    label_smoothing=LABEL_SMOOTHING,
    settable_learning_rate=False,
    accumulation_steps=1,
    ema_momentum=None,
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
        accumulation_steps: batches whose mean gradient makes one update
            (`paper_optimizer`); 1: every batch.
        ema_momentum: keep an exponential moving average of the weights, which
            the model takes when `fit` ends (`paper_optimizer`); None: none.
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
            config.d_model,
            warmup_steps,
            learning_rate_scale,
            settable=settable_learning_rate,
            accumulation_steps=accumulation_steps,
            ema_momentum=ema_momentum,
        ),  # fmt: skip
        loss=paper_loss(config.pad_id, label_smoothing),
        metrics=[MaskedAccuracy(pad_id=config.pad_id)],
        **compile_kwargs,
    )
    return model
