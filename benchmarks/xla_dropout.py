"""Dropout's random numbers with and without XLA: Keras's (Philox) against ThreeFry.

    python benchmarks/xla_dropout.py

One training step of the `cpu` preset draws `--calls` dropout masks of
`(B, T, D)` (embeddings and every residual: 17 with 3 + 3 layers). This
times that many `keras.layers.Dropout` calls (which draw with
`tf.nn.experimental.stateless_dropout`, Philox on CPU) and as many of this
package's `layers.dropout.Dropout` with ThreeFry (`use_threefry`, what
`Transformer.compile(jit_compile=True)` selects), forward and backward in a
`tf.function`, with and without `jit_compile`. TensorFlow runs ThreeFry
only under XLA. Interleaved rounds, medians, train.py's allocator settings,
TensorFlow's default thread pools. Run alone on the machine.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="16,64,256", help="B,T,D of each mask")
    parser.add_argument("--rate", type=float, default=0.3)
    parser.add_argument("--calls", type=int, default=17, help="dropout calls per step")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    _common.hardware().reexec_with_allocator_env()  # before TensorFlow loads
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import tensorflow as tf

    from keras_transformer.hardware import describe_cpu
    from keras_transformer.layers.dropout import Dropout

    shape = tuple(int(n) for n in args.shape.split(","))
    x = tf.random.normal(shape)

    def step_of(layers, jit_compile):
        @tf.function(jit_compile=jit_compile)
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                h = x
                for layer in layers:  # chained, as residual dropouts are
                    h = layer(h, training=True) + x
                total = tf.reduce_sum(h)
            return tape.gradient(total, x)

        return step

    candidates = {}
    for jit_compile in (False, True):
        keras_layers = [keras.layers.Dropout(args.rate, seed=i) for i in range(args.calls)]
        candidates[("keras.layers.Dropout (Philox)", jit_compile)] = step_of(
            keras_layers, jit_compile
        )
    threefry_layers = [Dropout(args.rate, seed=i) for i in range(args.calls)]
    for layer in threefry_layers:
        layer.use_threefry = True
    candidates[("layers.dropout.Dropout (ThreeFry)", True)] = step_of(threefry_layers, True)

    for step in candidates.values():  # compiles, untimed
        step(x).numpy()
    seconds = {name: [] for name in candidates}
    for _ in range(args.rounds):
        for name, step in candidates.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                out = step(x)
            out.numpy()
            seconds[name].append((time.perf_counter() - start) / args.steps)

    print(
        f"{describe_cpu()['summary']}; {args.calls} masks of {shape}, rate {args.rate}, "
        f"forward + backward, {args.rounds} rounds\n"
    )
    print("| dropout | XLA | ms per step |")
    print("|---|---|---:|")
    for (name, jit_compile), values in seconds.items():
        milliseconds = 1000 * _common.median(values)
        print(f"| {name} | {'yes' if jit_compile else 'no'} | {milliseconds:.1f} |")


if __name__ == "__main__":
    main()
