"""Where translate.onnx spends its time: ONNX Runtime's profile, summed by operator type.

Runs `translate.onnx` (or `translate_int8.onnx`) on Ding phrases in batches,
with ONNX Runtime's profiler on, and prints the share of node time per
operator type and the number of node runs per batch (ONNX Runtime pays a
fixed overhead per node run; CTranslate2 runs a few fused kernels per layer
and step). No TensorFlow in this process (onnxruntime-extensions' ops
crash beside it).

    python benchmarks/onnx_profile.py --export-dir saved_models/transformer_de_en/onnx/1 \
        --batch-size 64 --beam-size 4
"""

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Nodes whose time is that of the nodes of their subgraphs (the search's loops and branches).
CONTAINERS = ("If", "Loop", "Scan")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export-dir", required=True, help="an ONNX export (onnx/<version>)")
    parser.add_argument("--graph", default="translate.onnx")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--corpus", default="/usr/share/trans/de-en")
    parser.add_argument("--top", type=int, default=12, help="operator types listed")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import numpy as np
    import onnxruntime as ort
    import onnxruntime_extensions
    from serving import ding_pairs

    sentences = [s for s, _ in ding_pairs(args.corpus, args.sentences, seed=0)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.log_severity_level = 3
    options.register_custom_ops_library(onnxruntime_extensions.get_library_path())
    path = os.path.join(args.export_dir, args.graph)
    warm = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    beam = np.array(args.beam_size, np.int32)
    batches = [
        sentences[i : i + args.batch_size] for i in range(0, len(sentences), args.batch_size)
    ]

    def feeds(batch):
        return {"sentences": np.array(batch, dtype=object), "beam_size": beam}

    warm.run(None, feeds(batches[0]))
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join("/tmp", "translate_profile")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    session.run(None, feeds(batches[0]))  # warm-up of the profiled session
    start = time.perf_counter()
    for batch in batches:
        session.run(None, feeds(batch))
    wall = time.perf_counter() - start
    profile = session.end_profiling()
    with open(profile) as f:
        events = json.load(f)
    os.remove(profile)
    by_type, runs = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event.get("args", {}).get("op_name", "?")
            if op in CONTAINERS:  # their time is their body's nodes, counted below
                continue
            by_type[op] += event["dur"]
            runs[op] += 1
    total = sum(by_type.values())
    warm_batches = len(batches) + 1
    per_batch = sum(runs.values()) // warm_batches
    print(
        f"{args.graph}, beam {args.beam_size}, batch {args.batch_size}, "
        f"{args.threads} thread(s): {len(batches)} timed batches in {wall:.2f} s "
        f"(profiler on); node time {total / 1e6:.2f} s, {per_batch} node runs per batch"
    )
    print("| operator | share of node time | runs per batch | mean us per run |")
    print("|---|---:|---:|---:|")
    for op, micros in by_type.most_common(args.top):
        print(f"| {op} | {100 * micros / total:.1f}% | {runs[op] // warm_batches} | "
              f"{micros / runs[op]:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
