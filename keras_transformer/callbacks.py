"""Training callbacks: validation BLEU, learning-rate logging, NaN guard, time budget."""

import logging
import math
import time

import keras

from keras_transformer.evaluation import make_translate_fn, score

logger = logging.getLogger(__name__)


class ValidationBleu(keras.callbacks.Callback):
    """Greedy-decodes a fixed validation sample after each epoch; logs `val_bleu`, `val_chrf`.

    Put it before `TensorBoard` in the callback list so that TensorBoard
    sees the values it adds to `logs`.
    """

    def __init__(self, pairs, tokenizer, every=1):
        super().__init__()
        self.sources = [s for s, _ in pairs]
        self.references = [t for _, t in pairs]
        self.tokenizer = tokenizer
        self.every = every
        self._translate = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not self.sources or (epoch + 1) % self.every:
            return
        if self._translate is None:
            self._translate = make_translate_fn(self.model, self.tokenizer, beam_size=1)
        start = time.time()
        metrics = score(self._translate(self.sources), self.references)
        logs["val_bleu"], logs["val_chrf"] = metrics["bleu"], metrics["chrf"]
        logger.info(
            "epoch %d: validation BLEU %.2f chrF %.2f on %d sentences (greedy, %.0fs)",
            epoch + 1, metrics["bleu"], metrics["chrf"], metrics["segments"], time.time() - start,
        )  # fmt: skip


class LearningRateLogger(keras.callbacks.Callback):
    """Adds the current learning rate to `logs` (for TensorBoard and the history)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            optimizer = self.model.optimizer
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class TerminateOnNaN(keras.callbacks.TerminateOnNaN):
    """`TerminateOnNaN` that says what to try next."""

    def on_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            logger.error(
                "Batch %d: the loss is %s; training stops. Try a lower learning rate (larger "
                "--warmup-steps), fewer --batch-tokens, or --preset with norm_first=True.",
                batch, loss,
            )  # fmt: skip
        super().on_batch_end(batch, logs)


class TimeBudget(keras.callbacks.Callback):
    """Stops training after the first step that ends past `minutes` of training.

    Keras still runs that epoch's validation and `on_epoch_end` callbacks.
    """

    def __init__(self, minutes):
        super().__init__()
        self.seconds = minutes * 60.0
        self.start = None
        self.stopped = False

    def on_train_begin(self, logs=None):
        self.start = time.time()

    def on_train_batch_end(self, batch, logs=None):
        if not self.stopped and time.time() - self.start >= self.seconds:
            self.stopped = True
            self.model.stop_training = True
            logger.info("Time budget of %.1f minutes reached; training stops.", self.seconds / 60)


class WallTime(keras.callbacks.Callback):
    """Measures the time spent in training steps (validation excluded) and the steps run."""

    def __init__(self):
        super().__init__()
        self.seconds, self.steps, self._start = 0.0, 0, None

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.time()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds += time.time() - self._start
        self.steps += 1
