"""Forward + backward time of two components against the formulations they replaced.

    python benchmarks/components.py --rounds 5

TensorFlow (no XLA), one thread, interleaved rounds, median; gradients with
respect to inputs and weights through `tf.GradientTape` in a `tf.function`.

    projections  the four projections of one attention layer, (B, T, D) ->
                 (B, T, N, H) and back: `keras.layers.EinsumDense` (what
                 `keras.layers.MultiHeadAttention` and keras-hub use) against
                 this package's `HeadDense` (same kernel shapes, one 2-D matmul).
    loss         label-smoothed cross-entropy on (B, T, V) logits: log_softmax
                 plus `take_along_axis` (this package's loss before) against
                 `LabelSmoothedCrossEntropy` (smoothed one-hot targets through
                 the fused softmax cross-entropy).

Both pairs compute the same values; the script checks that before timing.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["KERAS_BACKEND"] = "tensorflow"

from benchmarks import _common  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed calls per candidate per round")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def projection_pair(batch, length, d_model, num_heads):
    """(EinsumDense layers, HeadDense layers with the same weights, input)."""
    import keras

    from keras_transformer.layers.attention import HeadDense

    head_dim = d_model // num_heads
    split = dict(equation="btd,dnh->btnh", output_shape=(None, num_heads, head_dim), bias_axes="nh")
    merge = dict(equation="btnh,nhd->btd", output_shape=(None, d_model), bias_axes="d")
    reference = [keras.layers.EinsumDense(**split) for _ in range(3)]
    reference.append(keras.layers.EinsumDense(**merge))
    ours = [HeadDense(merge_heads=False, **split) for _ in range(3)]
    ours.append(HeadDense(merge_heads=True, **merge))
    for layer in reference[:3] + ours[:3]:
        layer.build((batch, length, d_model))
    for layer in (reference[3], ours[3]):
        layer.build((batch, length, num_heads, head_dim))
    for theirs, mine in zip(reference, ours, strict=True):
        mine.set_weights(theirs.get_weights())
    x = keras.random.normal((batch, length, d_model), seed=0)
    return reference, ours, x


def project(layers, x):
    query, key, value, output = layers
    return output(query(x) + key(x) * value(x))


def log_softmax_gather_loss(labels, logits, eps=0.1):
    """The package's label-smoothed cross-entropy before (per token)."""
    from keras import ops

    log_probs = ops.log_softmax(logits, axis=-1)
    nll = -ops.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    return (1.0 - eps) * nll - eps * ops.mean(log_probs, axis=-1)


def timed_gradients(fn, inputs, variables):
    """A tf.function returning (value, gradients of its sum w.r.t. inputs and variables)."""
    import tensorflow as tf

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            value = fn()
            total = tf.reduce_sum(tf.cast(value, "float32"))
        return value, tape.gradient(total, list(inputs) + list(variables))

    return step


def main(argv=None):
    args = parse_args(argv)
    for key, value in _common.thread_env(args.threads).items():
        os.environ.setdefault(key, value)
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer import LabelSmoothedCrossEntropy

    _common.set_threads(args.threads)
    keras.utils.set_random_seed(0)
    b, t = args.batch_size, args.length
    reference, ours, x = projection_pair(b, t, args.d_model, args.num_heads)
    logits = tf.random.normal((b, t, args.vocab_size), seed=1)
    labels = tf.random.uniform((b, t), 1, args.vocab_size, dtype="int32", seed=2)
    package_loss = LabelSmoothedCrossEntropy(label_smoothing=0.1, reduction=None)
    pairs = {
        "projections": (
            timed_gradients(
                lambda: project(reference, x),
                [x],
                [w for layer in reference for w in layer.weights],
            ),
            timed_gradients(
                lambda: project(ours, x), [x], [w for layer in ours for w in layer.weights]
            ),
        ),
        "loss": (
            timed_gradients(lambda: log_softmax_gather_loss(labels, logits), [logits], []),
            timed_gradients(lambda: package_loss.call(labels, logits), [logits], []),
        ),
    }
    for name, (before, after) in pairs.items():
        (value_before, grads_before), (value_after, grads_after) = before(), after()
        np.testing.assert_allclose(value_after, value_before, rtol=1e-4, atol=1e-4, err_msg=name)
        for g_after, g_before in zip(grads_after, grads_before, strict=True):
            np.testing.assert_allclose(g_after, g_before, rtol=1e-3, atol=1e-3, err_msg=name)
    times = {name: ([], []) for name in pairs}
    for _ in range(args.rounds):
        for name, functions in pairs.items():
            for fn, samples in zip(functions, times[name], strict=True):
                start = time.perf_counter()
                for _ in range(args.steps):
                    value, _ = fn()
                float(tf.reduce_sum(value))  # synchronizes
                samples.append((time.perf_counter() - start) / args.steps)
    load = ", ".join(f"{value:.2f}" for value in _common.load_average())
    print(
        f"batch={b}x{t} d_model={args.d_model} heads={args.num_heads} vocab={args.vocab_size} "
        f"threads={args.threads} rounds={args.rounds} steps/round={args.steps}; "
        f"load average after: {load}\n"
    )
    print("| component | before (ms) | now (ms) | speed-up |")
    print("|---|---:|---:|---:|")
    for name, (before, after) in times.items():
        before, after = _common.median(before), _common.median(after)
        print(f"| {name} | {1000 * before:.1f} | {1000 * after:.1f} | {before / after:.2f}x |")


if __name__ == "__main__":
    main()
