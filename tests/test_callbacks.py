"""Callbacks of `training.run`'s `fit` on a toy model (fast, any backend)."""

import keras
import numpy as np
import pytest

from keras_transformer.callbacks import ValidationEpochs

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
