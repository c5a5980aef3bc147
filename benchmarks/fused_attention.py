"""Fused against explicit attention: `MultiHeadAttention` forward + backward, per backend.

    python benchmarks/fused_attention.py                    # every backend, both presets
    python benchmarks/fused_attention.py --backends jax --rounds 9 --out results/dir

`use_fused_attention=True` runs `keras.ops.dot_product_attention` (the flash
or cuDNN kernel on a GPU); the explicit path is the einsum, softmax and
einsum of `MultiHeadAttention._attend_with_scores`. One layer's forward and
backward (gradients of the input and of the four projections, of
`sum(y ** 2)`) at the shapes the `cpu` and `small` presets train with:
d_model 256, 4 heads, batches of 1,024 and 2,048 tokens as 32 and 64
sentences of 32 tokens, the last quarter of every other sentence padding.
Two masks: the encoder's (padding) and the decoder's self-attention
(padding and causal).

Each backend runs in its own process with one compute thread (`--threads`;
a 2-thread pool on a shared 2-core machine waits at every barrier for a
descheduled thread), compiled as training runs it: a `tf.function`
(TensorFlow, no XLA), `jax.jit` (JAX), eager (torch). Inside a process the
two paths are interleaved: each round times `--steps` calls of
each in turn; the table reports the median over rounds. Both paths are
checked equal (forward, 1e-4) before timing.

The rule the default follows (`RULE` below): fused becomes a backend's
default when it is at least 5% faster at every shape and mask measured
there; otherwise explicit stays the default.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # noqa: E402

RULE = "fused where it is >= 5% faster (median forward + backward) at every shape and mask"
SPEEDUP_NEEDED = 1.05
SHAPES = {  # preset: (batch, length); d_model 256 and 4 heads in both
    "cpu": (32, 32),  # batch_tokens 1024
    "small": (64, 32),  # batch_tokens 2048
}
D_MODEL, NUM_HEADS = 256, 4
MASKS = {"encoder": False, "decoder": True}  # name: use_causal_mask (padding in both)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed calls per path per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="per process; 0: the framework's own pools"
    )
    parser.add_argument("--out", help="folder for one JSON per backend and summary.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def gradient_step(layer, x, padding, causal):
    """A no-argument function running forward + backward once and waiting for it."""
    import keras

    backend = keras.backend.backend()
    kwargs = dict(padding_mask=padding, use_causal_mask=causal)
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(tf.square(layer(x, **kwargs)))
            return loss, tape.gradient(loss, [x, *layer.trainable_variables])

        return lambda: float(step(x)[0])
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        weights = [v.value for v in layer.trainable_variables]

        def loss(weights, x):
            y, _ = layer.stateless_call(weights, [], x, **kwargs)
            return jnp.sum(jnp.square(y))

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        return lambda: jax.block_until_ready(step(weights, x))
    import torch

    x = x.detach().requires_grad_(True)
    weights = [v.value for v in layer.trainable_variables]

    def step():
        loss = torch.sum(torch.square(layer(x, **kwargs)))
        torch.autograd.grad(loss, [x, *weights])
        return float(loss)

    return step


def worker(args):
    """Runs in a process with one backend; prints one JSON line."""
    import keras
    import numpy as np
    from keras import ops

    from keras_transformer.layers import MultiHeadAttention

    _common.set_threads(args.threads)
    keras.utils.set_random_seed(0)
    results = {}
    for preset, (batch, length) in SHAPES.items():
        x = ops.convert_to_tensor(np.random.default_rng(0).normal(size=(batch, length, D_MODEL)))
        x = ops.cast(x, "float32")
        padding = np.ones((batch, length), bool)
        padding[::2, length - length // 4 :] = False  # as _common.make_batch pads
        padding = ops.convert_to_tensor(padding)
        layers = {
            path: MultiHeadAttention(
                d_model=D_MODEL, num_heads=NUM_HEADS, use_fused_attention=path == "fused"
            )
            for path in ("explicit", "fused")
        }
        for layer in layers.values():
            layer.build((None, None, D_MODEL))
        layers["fused"].set_weights(layers["explicit"].get_weights())
        for mask, causal in MASKS.items():
            outputs = [
                ops.convert_to_numpy(layer(x, padding_mask=padding, use_causal_mask=causal))
                for layer in layers.values()
            ]
            np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-4)
            steps = {path: gradient_step(lay, x, padding, causal) for path, lay in layers.items()}
            for step in steps.values():
                for _ in range(args.warmup):
                    step()
            times = {path: [] for path in steps}
            for _ in range(args.rounds):
                for path, step in steps.items():
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        step()
                    times[path].append((time.perf_counter() - start) / args.steps)
            median = {path: _common.median(values) for path, values in times.items()}
            results[f"{preset}/{mask}"] = {
                "batch": batch,
                "length": length,
                "causal": causal,
                "step_s": times,
                "median_step_s": median,
                "fused_speedup": median["explicit"] / median["fused"],
            }
    print(
        json.dumps(
            {
                "backend": keras.backend.backend(),
                "compiled": {"tensorflow": "tf.function", "jax": "jax.jit", "torch": "eager"}[
                    keras.backend.backend()
                ],
                "threads": args.threads,
                "d_model": D_MODEL,
                "num_heads": NUM_HEADS,
                "cases": results,
            }
        )
    )


def cpu_family_and_model():
    """`"family 25 model 17"` from /proc/cpuinfo (as `lscpu` prints them), or ""."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return ""
    return f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    cpu = _common.hardware().describe_cpu()
    cpu["summary"] += f", {cpu_family_and_model()}"
    started = time.strftime("%Y-%m-%d %H:%M")
    load_before = _common.load_average()
    argv = ["--rounds", str(args.rounds), "--steps", str(args.steps)]
    argv += ["--warmup", str(args.warmup), "--threads", str(args.threads)]
    runs = {}
    for backend in args.backends.split(","):
        runs[backend] = _common.spawn(os.path.abspath(__file__), backend, argv, args.threads)
    defaults = {
        backend: "fused"
        if all(case["fused_speedup"] >= SPEEDUP_NEEDED for case in run["cases"].values())
        else "explicit"
        for backend, run in runs.items()
    }
    summary = {
        "cpu": cpu["summary"],
        "started": started,
        "load_average_before": load_before,
        "load_average_after": _common.load_average(),
        "rule": RULE,
        "default": defaults,
        "fused_speedup": {
            backend: {name: round(case["fused_speedup"], 3) for name, case in run["cases"].items()}
            for backend, run in runs.items()
        },
    }
    print(f"{cpu['summary']}; {started}; load before {load_before[0]:.2f}")
    print(f"{'backend':<11} {'case':<14} {'explicit ms':>12} {'fused ms':>9} {'fused x':>8}")
    for backend, run in runs.items():
        for name, case in run["cases"].items():
            median = case["median_step_s"]
            print(
                f"{backend:<11} {name:<14} {median['explicit'] * 1e3:>12.2f} "
                f"{median['fused'] * 1e3:>9.2f} {case['fused_speedup']:>8.2f}"
            )
    print(f"rule: {RULE}; default: {defaults}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for backend, run in runs.items():
            with open(os.path.join(args.out, f"{backend}.json"), "w") as f:
                json.dump(run, f, indent=1)
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
