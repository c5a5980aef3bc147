"""Callbacks of `training.run`'s `fit` on a toy model (fast, any backend)."""

import keras
import numpy as np
import pytest

from keras_transformer.callbacks import ValidationEpochs
from keras_transformer.schedules import Cooldown, LateDropout

pytestmark = pytest.mark.multibackend


class _StopAfter(keras.callbacks.Callback):
    """Stops training at the end of a step of epoch `epoch` (1-based), as `TimeBudget` does."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch + 1

    def on_train_batch_end(self, batch, logs=None):
        if self.current == self.epoch:
            self.model.stop_training = True


class _ValidatedEpochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        if "val_loss" in (logs or {}):
            self.epochs.append(epoch + 1)


@pytest.mark.parametrize(
    "every, epochs, stop_at, expected",
    [
        (2, 5, None, [2, 4, 5]),  # every other epoch, and the last
        (2, 6, 3, [2, 3]),  # a budget that ends an odd epoch still validates it
        (1, 3, None, [1, 2, 3]),
        (3, 3, None, [3]),
    ],
)
def test_validation_epochs_every_n_and_the_last(every, epochs, stop_at, expected):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 1), "float32")
    seen = _ValidatedEpochs()
    callbacks = [seen] + ([_StopAfter(stop_at)] if stop_at else [])
    history = model.fit(
        x, y, batch_size=4, epochs=epochs, validation_data=(x, y), verbose=0,
        validation_freq=ValidationEpochs(every, epochs).attach(model), callbacks=callbacks,
    )  # fmt: skip
    assert seen.epochs == expected
    assert len(history.history["val_loss"]) == len(expected)


def _schedule(step):
    return 0.01 * (1 + step % 7)  # varies with the step, so a stale step shows


def _cooldown_fit(cooldown, epochs=2, rows=20):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    model.layers[0].kernel.assign(np.array([[0.5], [-0.2], [1.0]], "float32"))
    x, y = np.ones((rows, 3), "float32"), np.zeros((rows, 1), "float32")
    model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0, callbacks=[cooldown])
    return model


def test_cooldown_steps_take_the_schedule_then_a_linear_decay_to_zero():
    # 10 steps, the last half a cooldown: factors 1, 1, 1, 1, 1, 1, .8, .6, .4, .2.
    # JAX sets the rate every `jax_every` steps; the others every step.
    every = 3 if keras.backend.backend() == "jax" else 1
    model = _cooldown_fit(Cooldown(_schedule, 0.5, total_steps=10, jax_every=3))
    # Replay SGD on mean((x @ w)^2) with x = 1: every weight moves by 2 * lr * sum(w).
    w = np.array([0.5, -0.2, 1.0])
    for step in range(10):
        set_at = step - step % every
        rate = _schedule(set_at) * min((1 - set_at / 10) / 0.5, 1.0)
        w = w - 2 * rate * w.sum()
    kernel = keras.ops.convert_to_numpy(model.layers[0].kernel)[:, 0]
    np.testing.assert_allclose(kernel, w, rtol=1e-5)
    # The optimizer kept the last rate set (no stale copy of its state wrote over it).
    last = 9 - 9 % every
    expected = _schedule(last) * min((1 - last / 10) / 0.5, 1.0)
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(
        expected, rel=1e-6
    )


def test_cooldown_needs_a_settable_rate_and_a_budget():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 1), "float32")
    with pytest.raises(ValueError, match="settable_learning_rate=True"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[Cooldown(_schedule, 0.2, total_steps=4)])
    with pytest.raises(ValueError, match="needs a budget"):
        Cooldown(_schedule, 0.2)
    with pytest.raises(ValueError, match="fraction must be in"):
        Cooldown(_schedule, 0.0, total_steps=4)


def test_fits_callbacks_let_keras_dispatch_steps_ahead(tmp_path):
    """Under JAX and torch, Keras waits for every step to finish (to hand its logs to
    the callbacks) when any callback has a batch-end hook that is not `async_safe`;
    `fit`'s callbacks have none, so the host assembles and dispatches the next step
    while the device runs the last (benchmarks/README.md, "One GPU")."""
    from keras_transformer import workdir
    from keras_transformer.callbacks import ValidationBleu, training_callbacks

    cooldown = Cooldown(_schedule, 0.2, minutes=1.0)
    callbacks, _ = training_callbacks(
        workdir.WorkDir(str(tmp_path)), ValidationBleu([], None, every=0), cooldown, minutes=1.0
    )

    # Keras's rule (`CallbackList`): a callback lets steps go ahead if it says
    # `async_safe = True` or leaves the batch-end hooks as `Callback` has them.
    def blocks(callback):
        base = keras.callbacks.Callback
        hooks = ("on_batch_end", "on_train_batch_end")
        own = [h for h in hooks if getattr(type(callback), h) is not getattr(base, h)]
        return bool(own) and not getattr(callback, "async_safe", False)

    assert [type(c).__name__ for c in callbacks if blocks(c)] == []
    # A callback with an ordinary batch-end hook is caught: the check can fail.
    assert blocks(_StopAfter(1))


def test_training_callbacks_come_in_the_order_their_reads_need(tmp_path):
    from keras_transformer import workdir
    from keras_transformer.callbacks import (
        LearningRateLogger,
        PhaseTimer,
        TimeBudget,
        TrainingClock,
        ValidationBleu,
        training_callbacks,
    )

    bleu = ValidationBleu([], None, every=0)
    cooldown = Cooldown(_schedule, 0.2, minutes=1.0)
    work = workdir.WorkDir(str(tmp_path))
    late_dropout = LateDropout(0.5, minutes=1.0)
    callbacks, phases = training_callbacks(
        work, bleu, cooldown, minutes=1.0, spent_seconds=7.0, late_dropout=late_dropout
    )
    kinds = [type(c) for c in callbacks]
    position = {kind: kinds.index(kind) for kind in kinds}
    # The phase timer brackets the others' epoch-end work.
    assert callbacks[0] is phases and callbacks[-1] is phases.end_marker
    backup = position[keras.callbacks.BackupAndRestore]
    # What reads the restored state comes after the backup: the clock, the cooldown's and
    # late dropout's step.
    assert backup < position[TrainingClock] and backup < position[Cooldown]
    assert backup < position[LateDropout]
    assert position[Cooldown] < position[LearningRateLogger]  # logs the rate it set
    if keras.callbacks.TensorBoard in position:  # it logs the validation BLEU added to logs
        assert position[ValidationBleu] < position[keras.callbacks.TensorBoard]
    assert next(c for c in callbacks if isinstance(c, TrainingClock)).spent_seconds == 7.0
    assert next(c for c in callbacks if isinstance(c, TimeBudget)).seconds == 60.0
    # No budget, no cooldown, no late dropout: none of them.
    bare, _ = training_callbacks(work, bleu)
    assert not {Cooldown, LateDropout, TimeBudget} & {type(c) for c in bare}
    assert PhaseTimer in {type(c) for c in bare}
