"""Where the SavedModel's time goes at 1 and at 2 threads: TensorFlow's own profile.

    python benchmarks/saved_model_threads.py saved_models/transformer_de_en/1 \
        --threads 1 2 --batch-sizes 1 64 --json out.json

For each thread count (a fresh process: TensorFlow fixes its thread pools
when it starts, `intra_op` = `inter_op` = N as `benchmarks/serving.py`
sets them) and each batch size, the text-to-text signature
(`serving_default`: beam search, `translate_greedy` with `--greedy`) is
called on Ding's validation sentences: `--calls` timed calls (wall and the
process's CPU seconds per call), then `--profiled` calls under
`tf.profiler`, whose trace (XSpace) is read back: every op event on the
host's threads, its self time (its duration less its children's, so a
`While` or a function call counts only its own work), summed by op type.
The report gives per call: wall, CPU, the threads that ran ops, the ops'
summed self time (the work; the executor's `Run` and `Process` events,
which wrap ops run on other threads and mostly wait, are listed but left
out of it), and each op type's share of it. Run alone on
the machine; the CPU is named in the output.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRAPPERS = ("Run", "Process")  # the executor's events around ops on other threads


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("saved_model", help="a SavedModel version folder (…/1)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--greedy", action="store_true", help="translate_greedy, not beam")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per batch size")
    parser.add_argument("--profiled", type=int, default=5, help="profiled calls per batch size")
    parser.add_argument("--top", type=int, default=25, help="op types listed per row")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def self_times(xspace_path):
    """`{op type: self seconds}` and the number of host threads that ran ops,
    from one XSpace file."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xspace_path, "rb") as f:
        space.ParseFromString(f.read())
    totals, threads = {}, 0
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            events = sorted(
                ((e.offset_ps, e.duration_ps, names.get(e.metadata_id, "?")) for e in line.events),
                key=lambda e: (e[0], -e[1]),
            )  # fmt: skip
            ops = [e for e in events if ":" in e[2] and not e[2].startswith(("$", "Eager"))]
            if ops:
                threads += 1
            stack = []  # [end, name, self] of the enclosing events
            for start, duration, name in ops:
                while stack and stack[-1][0] <= start:
                    _close(stack.pop(), totals)
                if stack:
                    stack[-1][2] -= duration
                stack.append([start + duration, name, duration])
            while stack:
                _close(stack.pop(), totals)
    return totals, threads


def _close(entry, totals):
    op_type = entry[1].rsplit(":", 1)[-1] or entry[1]
    totals[op_type] = totals.get(op_type, 0.0) + max(entry[2], 0) / 1e12


def child(args):
    threads = args.threads[0]
    import time

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    from keras_transformer.data.sources import load_translation_data

    sentences = [s for s, _ in load_translation_data("ding").splits["validation"]]
    model = tf.saved_model.load(args.saved_model)
    signature = model.signatures["translate_greedy" if args.greedy else "serving_default"]
    rows = []
    for batch_size in args.batch_sizes:
        batches = [
            tf.constant(sentences[i * batch_size : (i + 1) * batch_size])
            for i in range(args.calls + args.profiled)
        ]  # fmt: skip
        signature(sentences=batches[0])  # the first call traces and allocates
        wall, cpu = time.perf_counter(), time.process_time()
        for batch in batches[: args.calls]:
            signature(sentences=batch)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        logdir = tempfile.mkdtemp()
        tf.profiler.experimental.start(logdir)
        for batch in batches[args.calls :]:
            signature(sentences=batch)
        tf.profiler.experimental.stop()
        totals, active = self_times(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0])
        work = sum(v for k, v in totals.items() if k not in WRAPPERS)
        rows.append({
            "threads": threads, "batch": batch_size, "calls": args.calls,
            "wall_s_per_call": wall / args.calls, "cpu_s_per_call": cpu / args.calls,
            "op_threads": active, "op_self_s_per_call": work / args.profiled,
            "ops": {k: v / args.profiled for k, v in sorted(totals.items(), key=lambda x: -x[1])},
        })  # fmt: skip
    print(json.dumps(rows))


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child(args)
    from keras_transformer.hardware import describe_cpu

    rows = []
    for threads in args.threads:
        command = [sys.executable, os.path.abspath(__file__), args.saved_model, "--child",
                   "--threads", str(threads), "--calls", str(args.calls), "--profiled",
                   str(args.profiled), "--batch-sizes", *map(str, args.batch_sizes)]  # fmt: skip
        if args.greedy:
            command.append("--greedy")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if result.returncode:
            sys.exit(f"The {threads}-thread run failed:\n{result.stderr[-3000:]}")
        rows += json.loads(result.stdout.strip().splitlines()[-1])
    print(f"CPU: {describe_cpu()['summary']}; search: {'greedy' if args.greedy else 'beam'}")
    for row in rows:
        print(
            f"\nthreads {row['threads']}, batch {row['batch']}: wall {row['wall_s_per_call']:.4f}"
            f" s/call, CPU {row['cpu_s_per_call']:.4f} s/call, ops on {row['op_threads']} "
            f"threads, op self time {row['op_self_s_per_call']:.4f} s/call"
        )  # fmt: skip
        work = row["op_self_s_per_call"] or 1.0
        for name, seconds in list(row["ops"].items())[: args.top]:
            share = "" if name in WRAPPERS else f"{100 * seconds / work:5.1f}%"
            print(f"  {name:32s} {1e3 * seconds:9.2f} ms  {share}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": describe_cpu()["summary"], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
