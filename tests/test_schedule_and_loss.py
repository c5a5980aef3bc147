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


@pytest.mark.multibackend
def test_two_accumulated_batches_make_the_update_of_one_batch_twice_as_large():
    """`compile_with_paper_recipe(accumulation_steps=2)`: two batches of equal token
    counts give the optimizer the gradient one batch of both gives, at the same
    point of the schedule (Keras 3.15 would evaluate it at the batch count).

    Compared through Adam's first moments (`(1 - beta_1) * gradient` after one
    update), not the weights: Adam's first step is about `lr * sign(gradient)`,
    which float round-off flips where a gradient is about 0 (the key biases,
    whose gradient is 0 in exact arithmetic)."""
    import keras

    from keras_transformer import Transformer, compile_with_paper_recipe

    rng = np.random.default_rng(0)
    source = rng.integers(4, 64, size=(8, 9)).astype("int32")
    target = rng.integers(4, 64, size=(8, 10)).astype("int32")
    labels = rng.integers(4, 64, size=(8, 10)).astype("int32")  # no padding: equal tokens

    def batch(rows):
        return {"source_ids": source[rows], "target_ids": target[rows]}, labels[rows]

    def trained(accumulation_steps, batches):
        keras.utils.set_random_seed(3)
        model = Transformer.from_preset("tiny", vocab_size=64, dropout=0.0)
        model.build()
        compile_with_paper_recipe(model, warmup_steps=10, accumulation_steps=accumulation_steps)
        for x, y in batches:
            model.train_on_batch(x, y)
        return model

    accumulated = trained(2, [batch(slice(0, 4)), batch(slice(4, 8))])
    whole = trained(1, [batch(slice(0, 8))])
    half = trained(2, [batch(slice(0, 4))])  # one batch of two: no update yet

    def moments(model):
        return [ops.convert_to_numpy(m) for m in model.optimizer._momentums]

    largest = max(float(np.abs(m).max()) for m in moments(whole))
    assert largest > 1e-4  # the gradient is not nothing
    for a, b in zip(moments(accumulated), moments(whole), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * largest)
    assert all(not m.any() for m in moments(half))
    lr = [float(ops.convert_to_numpy(m.optimizer.learning_rate)) for m in (accumulated, whole)]
    assert lr[0] == lr[1]  # the schedule at update 1 in both
    assert int(ops.convert_to_numpy(accumulated.optimizer.iterations)) == 1


@pytest.mark.multibackend
def test_with_ema_the_model_ends_on_the_moving_average_of_its_weights():
    """`compile_with_paper_recipe(ema_momentum=m)`: after training the weights are the
    exponential moving average of the weights after each step (the first step's
    weights, then `m * average + (1 - m) * weights`), computed here from them."""
    import keras

    from keras_transformer import Transformer, compile_with_paper_recipe

    rng = np.random.default_rng(1)
    x = {
        "source_ids": rng.integers(4, 64, size=(12, 7)).astype("int32"),
        "target_ids": rng.integers(4, 64, size=(12, 8)).astype("int32"),
    }
    y = rng.integers(4, 64, size=(12, 8)).astype("int32")
    keras.utils.set_random_seed(5)
    model = Transformer.from_preset("tiny", vocab_size=64, dropout=0.0)
    model.build()
    compile_with_paper_recipe(model, warmup_steps=2, ema_momentum=0.5)
    after_each_step = []
    for start in range(0, 12, 4):  # train_on_batch: the variables hold each step's weights
        model.train_on_batch({k: v[start : start + 4] for k, v in x.items()}, y[start : start + 4])
        after_each_step.append([ops.convert_to_numpy(w).copy() for w in model.trainable_weights])
    # What `fit` does when it ends, on every backend (keras/src/backend/*/trainer.py).
    model.optimizer.finalize_variable_values(model.trainable_weights)
    assert len(after_each_step) == 3
    average = after_each_step[0]
    for weights in after_each_step[1:]:
        average = [0.5 * a + 0.5 * w for a, w in zip(average, weights, strict=True)]
    final = [ops.convert_to_numpy(w) for w in model.trainable_weights]
    for got, expected in zip(final, average, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(f, last) for f, last in zip(final, after_each_step[-1], strict=True))
