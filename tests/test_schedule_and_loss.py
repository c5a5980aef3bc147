"""The learning-rate schedule, the label-smoothed loss and the masked accuracy against numpy."""

import numpy as np
import pytest
from keras import ops

from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy, TransformerSchedule


def _paper_rate(step, d_model, warmup_steps):
    """Section 5.3, with the paper's 1-based step."""
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


@pytest.mark.multibackend
@pytest.mark.parametrize("d_model, warmup_steps", [(512, 4000), (64, 100)])
def test_schedule_equals_paper_formula(d_model, warmup_steps):
    schedule = TransformerSchedule(d_model=d_model, warmup_steps=warmup_steps)
    steps = [
        1,
        2,
        10,
        warmup_steps // 2,
        warmup_steps - 1,
        warmup_steps,
        warmup_steps + 1,
        3 * warmup_steps,
        100_000,
    ]
    # Keras optimizers pass the 0-based iteration count.
    actual = [float(ops.convert_to_numpy(schedule(step - 1))) for step in steps]
    expected = [_paper_rate(step, d_model, warmup_steps) for step in steps]
    np.testing.assert_allclose(actual, expected, rtol=1e-5)
    scaled = TransformerSchedule(d_model=d_model, warmup_steps=warmup_steps, scale=2.0)
    np.testing.assert_allclose(float(ops.convert_to_numpy(scaled(9))), 2.0 * expected[2], rtol=1e-5)


@pytest.mark.multibackend
def test_schedule_peaks_at_warmup_steps():
    warmup_steps = 50
    schedule = TransformerSchedule(d_model=128, warmup_steps=warmup_steps)
    iterations = np.arange(0, 4 * warmup_steps)
    rates = ops.convert_to_numpy(schedule(iterations))
    assert int(np.argmax(rates)) + 1 == warmup_steps  # 1-based step of the peak
    np.testing.assert_allclose(rates.max(), (128 * warmup_steps) ** -0.5, rtol=1e-5)
    assert np.all(np.diff(rates[:warmup_steps]) > 0)
    assert np.all(np.diff(rates[warmup_steps:]) < 0)


def test_schedule_rejects_bad_values():
    with pytest.raises(ValueError, match="warmup_steps=0"):
        TransformerSchedule(d_model=512, warmup_steps=0)
    with pytest.raises(ValueError, match="d_model=-1"):
        TransformerSchedule(d_model=-1)


def _numpy_label_smoothed_ce(labels, logits, eps, pad_id, sample_weight=None):
    """Mean over real tokens of -sum_v q(v) log p(v), q = (1 - eps) one_hot + eps / V."""
    vocab_size = logits.shape[-1]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    target = np.full(logits.shape, eps / vocab_size)
    np.put_along_axis(target, labels[..., None], 1.0 - eps + eps / vocab_size, axis=-1)
    per_token = -(target * log_probs).sum(axis=-1)
    weights = (labels != pad_id).astype("float64")
    if sample_weight is not None:
        weights = weights * sample_weight
    return (per_token * weights).sum() / weights.sum()


@pytest.mark.multibackend
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_loss_equals_numpy_reference_and_ignores_padding(eps):
    rng = np.random.default_rng(0)
    labels = np.array([[5, 7, 3, 0, 0], [4, 4, 6, 8, 3]], "int32")
    logits = rng.normal(size=(2, 5, 11)).astype("float32") * 3
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)
    actual = float(ops.convert_to_numpy(loss(labels, logits)))
    np.testing.assert_allclose(actual, _numpy_label_smoothed_ce(labels, logits, eps, 0), rtol=1e-5)
    # Logits at padded positions do not matter.
    noisy = logits.copy()
    noisy[0, 3:] = rng.normal(size=(2, 11)) * 10
    np.testing.assert_allclose(float(ops.convert_to_numpy(loss(labels, noisy))), actual, rtol=1e-6)
    # An explicit sample weight multiplies the pad mask.
    weights = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], "float32")
    np.testing.assert_allclose(
        float(ops.convert_to_numpy(loss(labels, logits, sample_weight=weights))),
        _numpy_label_smoothed_ce(labels, logits, eps, 0, weights),
        rtol=1e-5,
    )
    # Another pad id.
    other = LabelSmoothedCrossEntropy(label_smoothing=eps, pad_id=4)
    np.testing.assert_allclose(
        float(ops.convert_to_numpy(other(labels, logits))),
        _numpy_label_smoothed_ce(labels, logits, eps, 4),
        rtol=1e-5,
    )


def test_loss_and_its_gradient_traced_with_unknown_dims():
    """As `model.fit` traces it on length-bucketed batches: vocabulary size unknown too."""
    import tensorflow as tf

    eps = 0.1
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)
    labels = np.array([[5, 7, 3, 0], [4, 4, 6, 8]], "int32")
    logits = np.random.default_rng(1).normal(size=(2, 4, 11)).astype("float32")

    @tf.function(input_signature=[tf.TensorSpec([None, None], "int32"), tf.TensorSpec([None] * 3)])
    def value_and_gradient(labels, logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(labels, logits)
        return value, tape.gradient(value, logits)

    value, gradient = value_and_gradient(labels, logits)
    np.testing.assert_allclose(
        float(value), _numpy_label_smoothed_ce(labels, logits, eps, 0), rtol=1e-5
    )
    # d/dlogits of the mean over the 7 real tokens: (softmax - smoothed target) / 7, 0 at pads.
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    target = np.full(logits.shape, eps / 11)
    np.put_along_axis(target, labels[..., None], 1.0 - eps + eps / 11, axis=-1)
    expected = (probs - target) / 7 * (labels != 0)[..., None]
    np.testing.assert_allclose(gradient.numpy(), expected, atol=1e-6)


def test_loss_rejects_bad_label_smoothing():
    with pytest.raises(ValueError, match="label_smoothing=1.0"):
        LabelSmoothedCrossEntropy(label_smoothing=1.0)


@pytest.mark.multibackend
def test_masked_accuracy_ignores_padding():
    labels = np.array([[1, 2, 3, 0], [4, 5, 0, 0]], "int32")
    predicted = np.array([[1, 2, 9, 0], [4, 9, 0, 0]])  # 3 of 5 real tokens right
    logits = np.eye(10, dtype="float32")[predicted]  # (2, 4, 10), argmax = predicted
    metric = MaskedAccuracy()
    metric.update_state(labels, logits)
    np.testing.assert_allclose(float(ops.convert_to_numpy(metric.result())), 3 / 5, rtol=1e-6)
    # A second batch accumulates over real tokens: 3 + 1 right of 5 + 2.
    metric.update_state(
        np.array([[7, 8, 0, 0]], "int32"), np.eye(10, dtype="float32")[[[7, 1, 5, 5]]]
    )
    np.testing.assert_allclose(float(ops.convert_to_numpy(metric.result())), 4 / 7, rtol=1e-6)
