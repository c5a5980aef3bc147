"""One training step on two `MirroredStrategy` replicas equals the same step on one device.

conftest.py splits the CPU into two logical devices under TensorFlow.
"""

import contextlib

import keras
import numpy as np
import pytest

from keras_transformer import LabelSmoothedCrossEntropy, Transformer, TransformerSchedule
from keras_transformer.distribution import make_strategy

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="tf.distribute.MirroredStrategy"
)

VOCAB_SIZE = 60
SOURCE = np.array(
    [[5, 6, 7, 3, 0], [8, 9, 10, 11, 3], [12, 13, 3, 0, 0], [14, 15, 16, 17, 3]], "int32"
)  # (B=4, S=5)
TARGET_IN = np.array(
    [[2, 20, 21, 22], [2, 23, 24, 25], [2, 26, 27, 28], [2, 29, 30, 31]], "int32"
)  # (B=4, T=4), BOS first
# Every sequence has 3 real labels: each replica (2 rows) holds 6 real tokens.
LABELS_EQUAL = np.array([[20, 21, 3, 0], [23, 24, 3, 0], [26, 27, 3, 0], [29, 30, 3, 0]], "int32")
# Replica 0 (rows 0-1) holds 2 real tokens, replica 1 (rows 2-3) holds 8.
LABELS_UNEQUAL = np.array([[20, 0, 0, 0], [3, 0, 0, 0], [26, 27, 28, 3], [29, 30, 31, 3]], "int32")
STEPS = 1
# Adam's first step is lr * g / (|g| + epsilon): with the usual tiny epsilon, a gradient that is
# zero in exact arithmetic but float noise in practice (the key biases: softmax ignores a
# constant shift of the scores) becomes a full step of either sign. A larger epsilon keeps
# such noise at noise level; every gradient of real size still moves its weight by ~lr.
EPSILON = 1e-4


def _strategy():
    """The strategy `train.py --logical-devices 2` trains under."""
    import tensorflow as tf

    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs the two logical CPU devices set up by conftest.py")
    strategy, _ = make_strategy(logical_devices=2)
    assert strategy.num_replicas_in_sync == 2
    return strategy


def _train(
    initial_weights, labels, strategy=None, reduction="mean_with_sample_weight", sample_weight=None
):
    """Builds the tiny model with `initial_weights`, runs `STEPS` steps on one batch of 4."""
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = Transformer.from_preset("tiny", vocab_size=VOCAB_SIZE, dropout=0.0)
        model.build()
        model.set_weights(initial_weights)
        schedule = TransformerSchedule(d_model=model.config.d_model, warmup_steps=10)
        model.compile(
            optimizer=keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=EPSILON),
            loss=LabelSmoothedCrossEntropy(label_smoothing=0.1, reduction=reduction),
            jit_compile=False,  # XLA fails on logical CPU devices under MirroredStrategy
            # Eager steps: tracing the train function (twice under the strategy) costs a
            # minute on 2 cores; the replica split, all-reduce and loss scaling are the same.
            run_eagerly=True,
        )
    inputs = {"source_ids": SOURCE, "target_ids": TARGET_IN}
    model.fit(
        inputs,
        labels,
        sample_weight=sample_weight,
        batch_size=len(SOURCE),
        epochs=STEPS,
        shuffle=False,
        verbose=0,
    )
    return [np.array(weight) for weight in model.get_weights()]


@pytest.fixture(scope="module")
def initial_weights():
    model = Transformer.from_preset("tiny", vocab_size=VOCAB_SIZE, dropout=0.0)
    model.build()
    return model.get_weights()


def _max_difference(weights_a, weights_b):
    return max(float(np.abs(a - b).max()) for a, b in zip(weights_a, weights_b, strict=True))


def _max_update(initial, weights):
    return _max_difference(initial, weights)


def test_two_replicas_equal_one_device(initial_weights):
    """Default loss (mean over each replica's real tokens), equal real tokens per replica."""
    single = _train(initial_weights, LABELS_EQUAL)
    mirrored = _train(initial_weights, LABELS_EQUAL, strategy=_strategy())
    assert _max_update(initial_weights, single) > 1e-3  # the step did move the weights
    np.testing.assert_allclose(
        np.concatenate([w.ravel() for w in mirrored]),
        np.concatenate([w.ravel() for w in single]),
        atol=1e-5,
    )


def test_global_token_mean_with_unequal_padding(initial_weights):
    """Fairseq-style global token mean: `reduction="sum"`, weights `1 / real tokens in batch`.

    The weights are computed on the global batch, before the strategy splits
    it, so every replica divides by the same count and the summed replica
    gradients equal the one-device gradient whatever the padding. The default
    per-replica mean is shown to differ in that case, so this test can fail.
    """
    real = (LABELS_UNEQUAL != 0).astype("float32")
    global_weights = real / real.sum()  # (B, T): sums to 1 over the global batch
    single = _train(initial_weights, LABELS_UNEQUAL, reduction="sum", sample_weight=global_weights)
    mirrored = _train(
        initial_weights,
        LABELS_UNEQUAL,
        strategy=_strategy(),
        reduction="sum",
        sample_weight=global_weights,
    )
    np.testing.assert_allclose(
        np.concatenate([w.ravel() for w in mirrored]),
        np.concatenate([w.ravel() for w in single]),
        atol=1e-5,
    )
    # Per-replica token means weight replica 0's 2 tokens like replica 1's 8: different.
    mirrored_default = _train(initial_weights, LABELS_UNEQUAL, strategy=_strategy())
    assert _max_difference(mirrored_default, single) > 1e-4


def _paper_recipe_steps(initial_weights, strategy=None, steps=3):
    """`steps` compiled steps (tf.function, as `fit` runs them in training) with the paper's
    recipe (`compile_with_paper_recipe`: Adam beta_2 0.98, epsilon 1e-9, label smoothing
    0.1); returns the model."""
    from keras_transformer import compile_with_paper_recipe

    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = Transformer.from_preset("tiny", vocab_size=VOCAB_SIZE, dropout=0.0)
        model.build()
        model.set_weights(initial_weights)
        compile_with_paper_recipe(model, warmup_steps=10, jit_compile=False)
    assert model.optimizer.epsilon == 1e-9 and not model.run_eagerly
    inputs = {"source_ids": SOURCE, "target_ids": TARGET_IN}
    model.fit(inputs, LABELS_EQUAL, batch_size=len(SOURCE), epochs=steps, shuffle=False,
              verbose=0)  # fmt: skip
    return model


def test_two_replicas_equal_one_device_compiled_with_the_papers_epsilon(initial_weights):
    """What training runs: compiled steps, epsilon 1e-9, three steps.

    With epsilon 1e-9, Adam turns a gradient that is zero in exact arithmetic
    into a full step of either sign. The attention's key biases have one (a
    softmax ignores a constant shift of its scores), so they move by float
    noise, differently on one device and on two; the function does not. So the
    outputs are compared, and every weight but the key biases. Any other weight
    whose gradient happens to be near zero in one step (a ReLU unit off for
    every token of the batch but barely) can do the same: a handful of such
    elements is allowed, a real difference moves thousands.
    """
    single = _paper_recipe_steps(initial_weights)
    mirrored = _paper_recipe_steps(initial_weights, strategy=_strategy())
    untrained = Transformer.from_preset("tiny", vocab_size=VOCAB_SIZE, dropout=0.0)
    untrained.build()
    untrained.set_weights(initial_weights)
    inputs = {"source_ids": SOURCE, "target_ids": TARGET_IN}
    logits = [np.asarray(m.predict(inputs, verbose=0)) for m in (untrained, single, mirrored)]
    # Measured with three initialisations: the steps move the logits by 4.4-7.2; one device
    # and two differ by 3e-6, or by 4.9e-4 (a CI run) when a noise-level element took a full
    # step of the other sign; a replica that trained on its half of the batch alone differs
    # from one device by 4.8-8.0.
    trained = float(np.abs(logits[1] - logits[0]).max())
    differing = float(np.abs(logits[2] - logits[1]).max())
    assert trained > 1.0, trained
    assert differing < 1e-3 * trained, (differing, trained)
    moved, elements, differing, where = 0.0, 0, 0, []
    for w_single, w_mirrored, w_initial in zip(
        single.weights, mirrored.weights, initial_weights, strict=True
    ):
        if w_single.path.endswith("key/bias"):
            continue
        a, b = np.asarray(w_single), np.asarray(w_mirrored)
        # A step moves a weight by about the learning rate (4e-3 here); the rounding
        # of two all-reduced halves moves one with a real gradient by 1e-5.
        count = int(np.count_nonzero(np.abs(b - a) > 1e-4))
        if count:
            where.append(f"{w_single.path}: {count} of {a.size}")
        differing += count
        elements += a.size
        moved = max(moved, float(np.abs(a - w_initial).max()))
    assert differing <= 1e-3 * elements, where
    assert moved > 1e-3  # the steps moved the weights
    steps = [int(keras.ops.convert_to_numpy(m.optimizer.iterations)) for m in (single, mirrored)]
    assert steps == [3, 3]
