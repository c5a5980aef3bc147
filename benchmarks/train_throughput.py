"""Training throughput of this package against keras-hub and keras.layers.MultiHeadAttention builds.

    python benchmarks/train_throughput.py                       # small preset, 64 x 32 tokens
    python benchmarks/train_throughput.py --backends tensorflow,jax --rounds 7
    python benchmarks/train_throughput.py --dtype mixed_bfloat16

One full training step = forward, backward and Adam update with the
project's `LabelSmoothedCrossEntropy`, through `model.train_on_batch` on
one fixed in-memory batch. Every backend runs in its own process (this
script re-runs itself with `KERAS_BACKEND` set); "tensorflow-xla" is
TensorFlow with `jit_compile=True`. Inside a process the candidates are
interleaved: each round times `--steps` steps of every build in turn,
plus one float32 matmul, and the table reports medians over rounds, so
load from other processes hits all candidates alike.

Tokens per second count source plus target positions, padding included
(B * (S + T) per step). Achieved FLOP/s use `_common.training_flops`
(about 6 * matmul-params * tokens plus the attention terms) and are
divided by the measured float32 matmul rate of the same framework.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # noqa: E402

BACKENDS = {  # name -> (KERAS_BACKEND, jit_compile)
    "tensorflow": ("tensorflow", False),
    "tensorflow-xla": ("tensorflow", True),
    "jax": ("jax", True),  # JAX always compiles with XLA
    "torch": ("torch", False),  # torch.compile (jit_compile=True) is not what users get by default
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=32, help="source and target length")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per candidate per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per candidate")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="tensorflow,tensorflow-xla,jax,torch")
    parser.add_argument("--candidates", default=",".join(_common.CANDIDATES))
    parser.add_argument("--dtype", default="float32", help="dtype policy, e.g. mixed_bfloat16")
    parser.add_argument(
        "--attention-dropout",
        type=float,
        default=None,
        help="defaults to the preset's dropout, since keras-hub applies it to attention weights",
    )
    parser.add_argument("--fused-attention", action="store_true", help="use_fused_attention=True")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="compute threads per process; default 0: the framework's defaults, as train.py "
        "runs (no strategy on one device, TensorFlow's default pools); 1: the stable "
        "one-thread comparison of earlier tables",
    )
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--jit", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def config_from(args):
    from keras_transformer.config import get_preset

    overrides = {}
    if args.fused_attention:
        overrides["use_fused_attention"] = True
    config = get_preset(args.preset, **overrides)
    dropout = config.dropout if args.attention_dropout is None else args.attention_dropout
    import dataclasses

    return dataclasses.replace(config, attention_dropout=dropout)


def worker(args):
    """Runs in a process with one backend; prints one JSON line."""
    import keras
    from keras import ops

    _common.set_threads(args.threads)
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(args.dtype)
    config = config_from(args)
    x, y = _common.make_batch(config, args.batch_size, args.length, args.length)
    x = {key: ops.convert_to_tensor(value) for key, value in x.items()}
    y = ops.convert_to_tensor(y)
    names = args.candidates.split(",")
    models, params = {}, {}
    for name in names:
        model = _common.build_model(name, config)
        model(x)  # builds the weights
        params[name] = _common.count_params(model)
        models[name] = _common.compile_for_training(model, config, jit_compile=args.jit)
        for _ in range(args.warmup):
            model.train_on_batch(x, y)

    compute_dtype = keras.config.dtype_policy().compute_dtype
    size = 2048
    times = {name: [] for name in names}
    matmul = {"float32": []}
    if compute_dtype != "float32":
        matmul[compute_dtype] = []
    for _ in range(args.rounds):
        for dtype in matmul:
            matmul[dtype].append(_common.matmul_seconds(size, dtype))
        for name in names:
            start = time.perf_counter()
            for _ in range(args.steps):
                logs = models[name].train_on_batch(x, y, return_dict=True)
            float(logs["loss"])  # synchronizes
            times[name].append((time.perf_counter() - start) / args.steps)
    flops = _common.training_flops(config, args.batch_size, args.length, args.length)
    tokens = args.batch_size * 2 * args.length
    result = {
        "backend": keras.backend.backend(),
        "jit_compile": args.jit,
        "dtype": args.dtype,
        "threads": args.threads,
        "tokens_per_step": tokens,
        "flops_per_step": flops,
        "matmul_flops_per_s": {
            dtype: 2 * size**3 / _common.median(values) for dtype, values in matmul.items()
        },
        "candidates": {
            name: {
                "params": params[name],
                "step_s": times[name],
                "median_step_s": _common.median(times[name]),
                "tokens_per_s": tokens / _common.median(times[name]),
                "flops_per_s": flops / _common.median(times[name]),
            }
            for name in names
        },
        "peak_rss_mib": _common.peak_rss_mib(),
    }
    print(json.dumps(result))


def table(results, names):
    rows = [
        "| backend | build | params | step (ms) | tokens/s | vs keras_hub | vs keras_mha | "
        "model GFLOP/s | matmul GFLOP/s | fraction of matmul |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, result in results.items():
        candidates = result["candidates"]
        # Mixed precision: against the matmul peak of the compute dtype.
        peaks = result["matmul_flops_per_s"]
        peak = peaks.get(result["dtype"].replace("mixed_", ""), peaks["float32"])
        for name in names:
            c = candidates[name]
            ratios = {
                other: f"{c['tokens_per_s'] / candidates[other]['tokens_per_s']:.2f}x"
                if other in candidates
                else "-"
                for other in ("keras_hub", "keras_mha")
            }
            rows.append(
                f"| {label} | {name} | {c['params']:,} | {1000 * c['median_step_s']:.0f} | "
                f"{c['tokens_per_s']:,.0f} | {ratios['keras_hub']} | {ratios['keras_mha']} | "
                f"{c['flops_per_s'] / 1e9:.1f} | {peak / 1e9:.1f} | {c['flops_per_s'] / peak:.0%} |"
            )
    return "\n".join(rows)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    names = args.candidates.split(",")
    passthrough = list(argv if argv is not None else sys.argv[1:])  # the worker ignores --json
    results = {}
    for label in args.backends.split(","):
        if label not in BACKENDS:
            raise ValueError(f"Unknown backend {label!r}. Available: {sorted(BACKENDS)}")
        backend, jit = BACKENDS[label]
        worker_args = list(passthrough) + (["--jit"] if jit else [])
        start = time.perf_counter()
        results[label] = _common.spawn(
            os.path.abspath(__file__), backend, worker_args, threads=args.threads
        )
        print(f"{label}: done in {time.perf_counter() - start:.0f}s", file=sys.stderr)
    load = ", ".join(f"{value:.2f}" for value in _common.load_average())
    print(
        f"preset={args.preset} batch={args.batch_size}x{args.length} (source and target) "
        f"dtype={args.dtype} threads={args.threads} rounds={args.rounds} steps/round={args.steps}; "
        f"load average after: {load}\n"
    )
    print(table(results, names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
