"""Forward + backward time of components: a reference against a candidate.

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
    fused_qkv    the same four `HeadDense` projections against one matmul with
                 the Q, K and V kernels concatenated (not in the package).

Both sides of every pair compute the same values; the script checks that
before timing.
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
    parser.add_argument(
        "--dynamic-shapes",
        action="store_true",
        help="trace with unknown dims, as `model.fit` does on length-bucketed batches",
    )
    return parser.parse_args(argv)


def projection_pair(batch, length, d_model, num_heads):
    """(EinsumDense layers, HeadDense layers with the same weights, input)."""
    import keras

    from keras_transformer.layers.head_dense import HeadDense

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


def project_fused_qkv(layers, x):
    """`project` with Q, K and V from one matmul on the concatenated kernels."""
    from keras import ops

    query, key, value, output = layers
    units, num_heads, head_dim = query.kernel.shape
    kernel = ops.concatenate([ops.reshape(d.kernel, (units, -1)) for d in layers[:3]], axis=-1)
    bias = ops.concatenate([ops.reshape(d.bias, (-1,)) for d in layers[:3]], axis=-1)
    heads = ops.split(ops.matmul(x, kernel) + bias, 3, axis=-1)
    query, key, value = (ops.reshape(h, (*ops.shape(x)[:-1], num_heads, head_dim)) for h in heads)
    return output(query + key * value)


def log_softmax_gather_loss(labels, logits, eps=0.1):
    """The package's label-smoothed cross-entropy before (per token)."""
    from keras import ops

    log_probs = ops.log_softmax(logits, axis=-1)
    nll = -ops.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    return (1.0 - eps) * nll - eps * ops.mean(log_probs, axis=-1)


def timed_gradients(fn, inputs, variables, dynamic_shapes=False):
    """A function returning `fn(*inputs)` and the gradients of its sum.

    Gradients are taken with respect to the float `inputs` and `variables`.

    It runs a `tf.function`, traced with every dim unknown if `dynamic_shapes`.
    """
    import tensorflow as tf

    signature = None
    if dynamic_shapes:
        signature = [tf.TensorSpec([None] * len(x.shape), x.dtype) for x in inputs]

    @tf.function(input_signature=signature)
    def step(*inputs):
        float_inputs = [x for x in inputs if x.dtype.is_floating]
        with tf.GradientTape() as tape:
            tape.watch(float_inputs)
            value = fn(*inputs)
            total = tf.reduce_sum(tf.cast(value, "float32"))
        return value, tape.gradient(total, float_inputs + list(variables))

    return lambda: step(*inputs)


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
    reference_weights = [w for layer in reference for w in layer.weights]
    weights = [w for layer in ours for w in layer.weights]
    dynamic = args.dynamic_shapes
    pairs = {  # name -> (reference, candidate)
        "projections": (
            timed_gradients(lambda x: project(reference, x), [x], reference_weights, dynamic),
            timed_gradients(lambda x: project(ours, x), [x], weights, dynamic),
        ),
        "loss": (
            timed_gradients(
                lambda y, z: log_softmax_gather_loss(y, z), [labels, logits], [], dynamic
            ),
            timed_gradients(lambda y, z: package_loss.call(y, z), [labels, logits], [], dynamic),
        ),
        "fused_qkv": (
            timed_gradients(lambda x: project(ours, x), [x], weights, dynamic),
            timed_gradients(lambda x: project_fused_qkv(ours, x), [x], weights, dynamic),
        ),
    }
    for name, (reference_fn, candidate_fn) in pairs.items():
        (expected, expected_grads), (actual, actual_grads) = reference_fn(), candidate_fn()
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4, err_msg=name)
        for actual_grad, expected_grad in zip(actual_grads, expected_grads, strict=True):
            np.testing.assert_allclose(
                actual_grad, expected_grad, rtol=1e-3, atol=1e-3, err_msg=name
            )
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
        f"threads={args.threads} rounds={args.rounds} steps/round={args.steps} "
        f"dynamic_shapes={dynamic}; "
        f"load average after: {load}\n"
    )
    print("| component | reference (ms) | candidate (ms) | candidate speed-up |")
    print("|---|---:|---:|---:|")
    for name, (reference_times, candidate_times) in times.items():
        reference_s, candidate_s = map(_common.median, (reference_times, candidate_times))
        print(
            f"| {name} | {1000 * reference_s:.1f} | {1000 * candidate_s:.1f} | "
            f"{reference_s / candidate_s:.2f}x |"
        )


if __name__ == "__main__":
    main()
