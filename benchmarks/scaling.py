"""Step time and peak memory of this package's `Transformer` vs sequence length and batch tokens.

    python benchmarks/scaling.py                     # TensorFlow, small preset
    python benchmarks/scaling.py --backend jax --lengths 32,128,512

Two sweeps, every point in a fresh process (so peak memory is that point's):

    length sweep: source = target length L in --lengths, batch = --tokens / L
                  sequences, i.e. a constant number of tokens per step;
    batch sweep:  L = --batch-length, tokens per step in --batch-tokens.

Step times come from one process that times all points round-robin
(`--rounds`), so changing load from other processes hits every point alike.

At constant tokens the matmuls cost the same at every L, and attention
(Q K^T and weights @ V, 4 * L^2 * D per sequence and attention layer)
grows linearly in L per token, quadratically per sequence.

Memory is the peak resident set size of the process (`getrusage`
ru_maxrss), with the RSS after building the model and before the first
step alongside: it works for every backend and includes the framework,
the traced graph, the optimizer's slots and the activations kept for the
backward pass. `tracemalloc` cannot see the frameworks' C++ allocations.
Under TensorFlow the table adds the allocator's own peak,
`tf.config.experimental.get_memory_info("CPU:0")["peak"]` (works on CPU
in TF 2.21), reset after the model is built: tensors only, no framework.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--backend", default="tensorflow", help="tensorflow, jax or torch")
    parser.add_argument("--jit", action="store_true", help="jit_compile=True (always on for JAX)")
    parser.add_argument("--lengths", default="32,64,128,256,512")
    parser.add_argument(
        "--tokens", type=int, default=2048, help="tokens per side per step in the length sweep"
    )
    parser.add_argument("--batch-length", type=int, default=64)
    parser.add_argument("--batch-tokens", default="512,1024,2048,4096")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="0: framework default")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--points", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the interleaved timing")
    return parser.parse_args(argv)


def timing_worker(args):
    """Step time of every point in one process, points interleaved, median over rounds.

    On a shared machine the load changes over minutes; timing all points
    round-robin in one process spreads it evenly, so the growth with
    length is the model's, not the neighbours'.
    """
    import dataclasses

    import keras
    from keras import ops

    from keras_transformer.config import get_preset

    _common.set_threads(args.threads)
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(args.dtype)
    points = [tuple(map(int, p.split("x"))) for p in args.points.split(",")]  # (length, batch)
    config = get_preset(args.preset)
    config = dataclasses.replace(
        config, max_length=max([config.max_length] + [p[0] for p in points])
    )
    model = _common.build_model("keras_transformer", config)
    batches = {}
    for length, batch in points:
        x, y = _common.make_batch(config, batch, length, length)
        batches[length, batch] = ({k: ops.convert_to_tensor(v) for k, v in x.items()}, y)
    model(batches[points[0]][0])
    _common.compile_for_training(model, config, jit_compile=args.jit)
    for x, y in batches.values():  # traces one step function per shape
        for _ in range(args.warmup):
            model.train_on_batch(x, y)
    times = {point: [] for point in points}
    for _ in range(args.rounds):
        for point, (x, y) in batches.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                logs = model.train_on_batch(x, y, return_dict=True)
            float(logs["loss"])
            times[point].append((time.perf_counter() - start) / args.steps)
    print(
        json.dumps({f"{length}x{batch}": _common.median(t) for (length, batch), t in times.items()})
    )


def worker(args):
    import dataclasses

    import keras
    import psutil
    from keras import ops

    from keras_transformer.config import get_preset

    _common.set_threads(args.threads)
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(args.dtype)
    config = get_preset(args.preset)
    config = dataclasses.replace(config, max_length=max(config.max_length, args.length))
    x, y = _common.make_batch(config, args.batch_size, args.length, args.length)
    x = {key: ops.convert_to_tensor(value) for key, value in x.items()}
    y = ops.convert_to_tensor(y)
    model = _common.build_model("keras_transformer", config)
    model(x)
    _common.compile_for_training(model, config, jit_compile=args.jit)
    rss_built = psutil.Process().memory_info().rss / 2**20
    tf_allocator = keras.backend.backend() == "tensorflow"
    if tf_allocator:
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("CPU:0")
    for _ in range(args.warmup):
        model.train_on_batch(x, y)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        float(model.train_on_batch(x, y, return_dict=True)["loss"])
        times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "step_s": _common.median(times),
                "rss_built_mib": rss_built,
                "peak_rss_mib": _common.peak_rss_mib(),
                "tf_peak_mib": tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20
                if tf_allocator
                else None,
            }
        )
    )


def sweep_points(args):
    """`[(sweep, length, batch)]`: the length sweep at `--tokens`, then the batch sweep."""
    lengths = map(int, args.lengths.split(","))
    points = [("length", length, max(1, args.tokens // length)) for length in lengths]
    points += [
        ("batch", args.batch_length, max(1, tokens // args.batch_length))
        for tokens in map(int, args.batch_tokens.split(","))
    ]
    return points


def worker_flags(args):
    """The flags every worker process gets: preset, steps, warm-up, threads, dtype, jit."""
    common = ["--preset", args.preset, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    common += ["--threads", str(args.threads), "--dtype", args.dtype]
    common += ["--jit"] if args.jit else []
    return common


def interleaved_times(args, common, points):
    """`{"LxB": step seconds}` of every point, timed round-robin in one process."""
    return _common.spawn(
        os.path.abspath(__file__),
        args.backend,
        common
        + [
            "--rounds",
            str(args.rounds),
            "--points",
            ",".join(f"{length}x{batch}" for _, length, batch in points),
        ],
        threads=args.threads,
        timeout=1800,
    )


def measure_rows(args, config, common, points, interleaved):
    """One row per point: its memory from a fresh process, its interleaved step time,
    tokens and FLOPs."""
    rows = []
    for sweep, length, batch in points:
        result = _common.spawn(
            os.path.abspath(__file__),
            args.backend,
            common + ["--length", str(length), "--batch-size", str(batch)],
            threads=args.threads,
        )
        flops = _common.training_flops(config, batch, length, length)
        no_attention = _common.training_flops(config, batch, length, length, attention=False)
        tokens = 2 * batch * length
        result["isolated_step_s"] = result.pop("step_s")
        rows.append(
            dict(
                result,
                step_s=interleaved[f"{length}x{batch}"],
                sweep=sweep,
                length=length,
                batch=batch,
                tokens=tokens,
                flops=flops,
                attention_share=1 - no_attention / flops,
            )
        )
        print(
            f"{sweep} L={length} B={batch}: peak RSS {result['peak_rss_mib']:.0f} MiB",
            file=sys.stderr,
        )
    return rows


def print_table(args, rows):
    """The settings line and the Markdown table of `rows`."""
    load = ", ".join(f"{value:.2f}" for value in _common.load_average())
    print(
        f"backend={args.backend} jit={args.jit} preset={args.preset} dtype={args.dtype} "
        f"threads={args.threads}; step time: median over {args.rounds} interleaved rounds of "
        f"{args.steps} steps; load average after: {load}\n"
    )
    print(
        "| sweep | length | batch | tokens/step (src+tgt) | step (ms) | tokens/s | "
        "ms per 1k tokens | GFLOP/step | attention share of FLOPs | RSS after build (MiB) | "
        "peak RSS (MiB) | TF allocator peak (MiB) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['sweep']} | {r['length']} | {r['batch']} | {r['tokens']} | "
            f"{1000 * r['step_s']:.0f} | "
            f"{r['tokens'] / r['step_s']:,.0f} | {1e6 * r['step_s'] / r['tokens']:.1f} | "
            f"{r['flops'] / 1e9:.1f} | {r['attention_share']:.0%} | {r['rss_built_mib']:.0f} | "
            f"{r['peak_rss_mib']:.0f} | "
            + ("-" if r.get("tf_peak_mib") is None else f"{r['tf_peak_mib']:.0f}")
            + " |"
        )


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return timing_worker(args) if args.points else worker(args)
    from keras_transformer.config import get_preset

    config = get_preset(args.preset)
    points = sweep_points(args)
    common = worker_flags(args)
    interleaved = interleaved_times(args, common, points)
    rows = measure_rows(args, config, common, points, interleaved)
    print_table(args, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
