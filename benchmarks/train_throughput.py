"""Training throughput of this package against keras-hub and keras.layers.MultiHeadAttention builds.

    python benchmarks/train_throughput.py                       # small preset, 64 x 32 tokens
    python benchmarks/train_throughput.py --backends tensorflow,jax --rounds 7
    python benchmarks/train_throughput.py --dtype mixed_bfloat16

    # One GPU, the paper's batches (384 x 64 = 24,576 tokens a side), bf16, and the
    # PyTorch reference (benchmarks/torch_reference.py) in the same table:
    python benchmarks/train_throughput.py --backends jax --preset base --batch-size 384 \
        --length 64 --no-padding --dtype mixed_bfloat16 --matmul-size 8192 \
        --candidates keras_transformer,keras_transformer_fused,keras_hub \
        --peak-tflops 989 --also torch_reference.json

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
divided by the measured matmul rate of the same framework in the compute
dtype, and with `--peak-tflops` also by a data-sheet peak (model FLOPs
utilisation, MFU).
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
    _common.add_batch_arguments(parser)
    parser.add_argument(
        "--peak-tflops", type=float, help="data-sheet peak of the compute dtype, for MFU"
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="JSON",
        help="a result of benchmarks/torch_reference.py --json to show in the same table",
    )
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
        "--dropout-bits",
        choices=("threefry", "rbg"),
        default="threefry",
        help="under JAX, the package's dropout masks from ThreeFry (Keras's) or XLA's "
        "RngBitGenerator (`layers.dropout.Dropout.jax_bits`)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="compute threads per process; default 0: the framework's defaults, as train.py "
        "runs (no strategy on one device, TensorFlow's default pools); 1: the stable "
        "one-thread comparison of earlier tables",
    )
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument(
        "--table",
        nargs="+",
        metavar="JSON",
        help="only print the table of these results (--json files of this script, "
        "benchmarks/torch_reference.py's); missing files are skipped",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--jit", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def config_from(args):
    from keras_transformer.config import get_preset

    overrides = {}
    if args.fused_attention:
        overrides["use_fused_attention"] = True
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
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
    from keras_transformer.layers.dropout import Dropout

    Dropout.jax_bits = args.dropout_bits
    config = config_from(args)
    x, y = _common.make_batch(
        config, args.batch_size, args.length, args.length, padding=not args.no_padding
    )
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
    size = args.matmul_size
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
        "device": _device_name(),
        "jit_compile": args.jit,
        "dropout_bits": args.dropout_bits,
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
    if "keras_transformer_fused" in names:
        try:
            result["fused_attention_kernel"] = _fused_kernel(config, args.batch_size, args.length)
        except Exception as error:  # noqa: BLE001 - the timings above still count
            result["fused_attention_kernel"] = f"unknown ({type(error).__name__}: {error})"
    print(json.dumps(result))


def _device_name():
    """The accelerator the worker's backend computes on, else "cpu"."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        device = jax.devices()[0]
        return device.device_kind if device.platform == "gpu" else "cpu"
    if keras.backend.backend() == "torch":
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name") if gpus else "cpu"


def _fused_kernel(config, batch_size, length):
    """Which kernel `keras.ops.dot_product_attention` lowers to for the model's shapes
    (masked, as the package calls it): "cudnn" (flash) or the backend's plain ops."""
    import keras
    from keras import ops

    if keras.backend.backend() != "jax":
        return keras.backend.backend()
    import jax

    dtype = keras.config.dtype_policy().compute_dtype
    shape = (batch_size, length, config.num_heads, config.d_model // config.num_heads)
    q = jax.ShapeDtypeStruct(shape, dtype)
    mask = jax.ShapeDtypeStruct((batch_size, 1, length, length), "bool")
    text = (
        jax.jit(lambda q, k, v, m: ops.dot_product_attention(q, k, v, mask=m))
        .lower(q, q, q, mask)
        .as_text()
    )
    return "cudnn" if "cudnn" in text else "xla"


REFERENCES = ("keras_hub", "keras_mha", "torch_reference")


def table(results, peak_tflops=None):
    """One row per (backend, build); ratios against each reference build found in any
    backend's results (its first occurrence), MFU against `peak_tflops` if given."""
    references = {}
    for result in results.values():
        for name in REFERENCES:
            if name in result["candidates"] and name not in references:
                references[name] = result["candidates"][name]["tokens_per_s"]
    header = ["backend", "build", "params", "step (ms)", "tokens/s"]
    header += [f"vs {name}" for name in references]
    header += ["model TFLOP/s", "matmul TFLOP/s", "of matmul"]
    if peak_tflops:
        header.append(f"MFU (of {peak_tflops:g})")
    rows = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for label, result in results.items():
        # Mixed precision: against the matmul peak of the compute dtype.
        peaks = result["matmul_flops_per_s"]
        peak = peaks.get(result["dtype"].replace("mixed_", ""), peaks["float32"])
        for name, c in result["candidates"].items():
            cells = [label, name, f"{c['params']:,}", f"{1000 * c['median_step_s']:.1f}"]
            cells.append(f"{c['tokens_per_s']:,.0f}")
            cells += [f"{c['tokens_per_s'] / tokens:.2f}x" for tokens in references.values()]
            cells += [f"{c['flops_per_s'] / 1e12:.2f}", f"{peak / 1e12:.1f}"]
            cells.append(f"{c['flops_per_s'] / peak:.0%}")
            if peak_tflops:
                cells.append(f"{c['flops_per_s'] / (peak_tflops * 1e12):.1%}")
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    if args.table:
        results = {}
        for path in args.table:
            if os.path.exists(path):
                with open(path) as f:
                    loaded = json.load(f)
                # This script's --json holds {label: result}; torch_reference.py's one result.
                results.update({loaded["backend"]: loaded} if "candidates" in loaded else loaded)
        print(table(results, args.peak_tflops))
        return None
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
    for path in args.also:
        with open(path) as f:
            result = json.load(f)
        results[result["backend"]] = result
    load = ", ".join(f"{value:.2f}" for value in _common.load_average())
    devices = sorted({result.get("device", "cpu") for result in results.values()})
    print(
        f"preset={args.preset} batch={args.batch_size}x{args.length} (source and target"
        f"{', no padding' if args.no_padding else ', 1/8 padding'}) dtype={args.dtype} "
        f"threads={args.threads} rounds={args.rounds} steps/round={args.steps} "
        f"device={', '.join(devices)}; load average after: {load}\n"
    )
    print(table(results, args.peak_tflops))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
