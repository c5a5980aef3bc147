"""Label-smoothed cross-entropy and accuracy that ignore padding (Section 5.4)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against `(1 - eps) * one_hot + eps / V`, padding excluded.

    "During training, we employed label smoothing of value eps_ls = 0.1"
    (https://arxiv.org/abs/1706.03762, Section 5.4). Positions whose label
    is `pad_id` get weight 0 and the sum is divided by the number of real
    tokens (reduction `mean_with_sample_weight`). Being a `keras.losses.Loss`
    with a reduction, it is scaled correctly across replicas under a
    distribution strategy: each replica averages over its own real tokens.

    The smoothed targets are materialized as a `(B, T, V)` float32 tensor
    (as `keras.losses.CategoricalCrossentropy(label_smoothing=...)` does), which
    lets the framework's fused softmax cross-entropy compute the loss and its
    gradient in one kernel; that is one logits-sized tensor more than a
    log-softmax and gather, and 1.3x to 1.5x faster on TensorFlow.

    Args:
        label_smoothing: float in [0, 1).
        pad_id: int. Label id that is ignored.
        reduction, name: as for `keras.losses.Loss`.

    Call arguments:
        y_true: `(B, T)` integer labels.
        y_pred: `(B, T, V)` logits.
    """

    def __init__(
        self,
        label_smoothing=0.1,
        pad_id=0,
        reduction="mean_with_sample_weight",
        name="label_smoothed_cross_entropy",
        **kwargs,
    ):
        super().__init__(reduction=reduction, name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"label_smoothing must be in [0, 1). Received: label_smoothing={label_smoothing}"
            )
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        labels = ops.cast(y_true, "int32")  # (B, T)
        logits = ops.cast(y_pred, "float32")  # (B, T, V)
        vocab_size = ops.shape(logits)[-1]  # a tensor when traced with an unknown dim
        eps = self.label_smoothing
        # Fused softmax cross-entropy: the gradient of a log_softmax + gather
        # form is a scatter into (B, T, V) (`benchmarks/README.md`, "Components").
        uniform = eps / ops.cast(vocab_size, "float32")
        targets = ops.one_hot(labels, vocab_size) * (1.0 - eps) + uniform
        return ops.categorical_crossentropy(targets, logits, from_logits=True)

    def __call__(self, y_true, y_pred, sample_weight=None):
        mask = ops.cast(ops.not_equal(ops.cast(y_true, "int32"), self.pad_id), "float32")
        if sample_weight is not None:
            mask = mask * ops.cast(sample_weight, "float32")
        return super().__call__(y_true, y_pred, sample_weight=mask)

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "pad_id": self.pad_id})
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.MeanMetricWrapper):
    """Token accuracy over positions whose label is not `pad_id`."""

    def __init__(self, pad_id=0, name="accuracy", dtype=None):
        super().__init__(fn=self._accuracy, name=name, dtype=dtype)
        self.pad_id = pad_id

    @staticmethod
    def _accuracy(y_true, y_pred):
        labels = ops.cast(y_true, "int32")
        predictions = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        return ops.cast(ops.equal(labels, predictions), "float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask = ops.cast(ops.not_equal(ops.cast(y_true, "int32"), self.pad_id), "float32")
        if sample_weight is not None:
            mask = mask * ops.cast(sample_weight, "float32")
        return super().update_state(y_true, y_pred, sample_weight=mask)

    def get_config(self):
        return {"pad_id": self.pad_id, "name": self.name, "dtype": self.dtype}
