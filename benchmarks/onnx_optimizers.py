"""Which of `onnx_passes` a maintained ONNX optimizer already does: the search graph of a
trained model, raw from tf2onnx, through onnxoptimizer, onnxsim and ONNX Runtime's own
offline optimizer (ORT_ENABLE_ALL), against the package's passes.

    pip install onnxsim onnxoptimizer   # not dependencies of the package
    python benchmarks/onnx_optimizers.py --work-dir runs/default_cpu

Per graph: the nodes, loop-carried state, Shape and Reshape nodes of the greedy
and the beam `Loop` bodies (paid once per output token), and the CPU seconds
of one run (1 thread, best of 3) of random source ids at batch 1 and 16,
greedy and beam 4, with whether the output ids equal the raw graph's. ONNX
Runtime applies its own ORT_ENABLE_ALL optimizations when it loads every one
of them, so the timings show what each adds to that.
"""

import argparse
import collections
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def loop_stats(model):
    import onnx

    rows = []

    def walk(graph):
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type != onnx.AttributeProto.GRAPH:
                    continue
                if node.op_type == "Loop":
                    counts = collections.Counter(n.op_type for n in attribute.g.node)
                    rows.append({
                        "nodes": len(attribute.g.node), "state": len(node.input) - 2,
                        "Shape": counts["Shape"], "Reshape": counts["Reshape"],
                    })  # fmt: skip
                walk(attribute.g)

    walk(model.graph)
    return sorted(rows, key=lambda row: row["nodes"])  # greedy's body is the smaller


def cpu_seconds(path, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, ["CPUExecutionProvider"])
    output = session.run(None, feeds)[0]  # warm-up
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        session.run(None, feeds)
        best = min(best, time.process_time() - start)
    return best, output


def export_graphs(model, root):
    """`{"package passes", "raw"}` paths: the search graph with the package's passes, and
    tf2onnx's output as it is."""
    import onnx

    from keras_transformer.export import onnx_graphs

    search = onnx_graphs.search_function(model, (1, 4))
    paths = {
        "package passes": os.path.join(root, "ours.onnx"),
        "raw": os.path.join(root, "raw.onnx"),
    }
    onnx.save(onnx_graphs._convert(search, onnx_graphs.TRANSLATE_OPSET), paths["package passes"])
    simplify = onnx_graphs.simplify
    onnx_graphs.simplify = lambda proto: {}  # tf2onnx's output as it is
    try:
        onnx.save(onnx_graphs._convert(search, onnx_graphs.TRANSLATE_OPSET), paths["raw"])
    finally:
        onnx_graphs.simplify = simplify
    return paths


def optimize_graphs(paths, root):
    """Adds to `paths` the raw graph through onnxoptimizer and onnxsim (where installed)
    and through ONNX Runtime's offline optimizer."""
    import onnx
    import onnxruntime as ort

    raw = onnx.load(paths["raw"])
    try:
        import onnxoptimizer

        paths["onnxoptimizer"] = os.path.join(root, "onnxoptimizer.onnx")
        onnx.save(onnxoptimizer.optimize(raw), paths["onnxoptimizer"])
    except ImportError:
        print("onnxoptimizer is not installed: skipped", file=sys.stderr)
    try:
        import onnxsim

        paths["onnxsim"] = os.path.join(root, "onnxsim.onnx")
        onnx.save(onnxsim.simplify(raw)[0], paths["onnxsim"])
    except ImportError:
        print("onnxsim is not installed: skipped", file=sys.stderr)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = paths["onnxruntime offline"] = os.path.join(root, "ort.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(paths["raw"], options, ["CPUExecutionProvider"])


def make_points(config):
    """`{"batch B, beam K": feeds}`: random source ids at batch 1 and 16, greedy and beam 4."""
    import numpy as np

    rng = np.random.default_rng(0)
    points = {}
    for batch in (1, 16):
        ids = rng.integers(4, config.vocab_size, (batch, 12)).astype(np.int32)
        ids[:, -1] = config.eos_id
        for beam in (1, 4):
            points[f"batch {batch}, beam {beam}"] = {
                "source_ids": ids, "beam_size": np.array(beam, np.int32),
                "alpha": np.array(1.0, np.float32), "max_extra_length": np.array(50, np.int32),
            }  # fmt: skip
    return points


def measure(paths, points):
    """`{graph: row}`: each graph's loop stats and, per point, CPU seconds and whether its
    output ids equal the first graph's (the raw one); prints each row as it comes."""
    import numpy as np
    import onnx

    results, reference = {}, {}
    for name in ("raw", "onnxoptimizer", "onnxsim", "onnxruntime offline", "package passes"):
        if name not in paths:
            continue
        row = {"loops (greedy, beam)": loop_stats(onnx.load(paths[name]))}
        for point, feeds in points.items():
            seconds, output = cpu_seconds(paths[name], feeds)
            reference.setdefault(point, output)
            row[point] = {
                "cpu_s": round(seconds, 4),
                "same": bool(np.array_equal(output, reference[point])),
            }
        results[name] = row
        print(name, json.dumps(row), flush=True)
    return results


def print_table(results, points):
    """The Markdown table of `results`."""
    print("\n| graph | greedy body nodes / state / Shape / Reshape | beam body | "
          + " | ".join(f"{p} CPU s" for p in points) + " |")  # fmt: skip
    print("|---|---|---|" + "---:|" * len(points))
    for name, row in results.items():
        greedy, beam = row["loops (greedy, beam)"]
        cells = [name] + [
            "{nodes} / {state} / {Shape} / {Reshape}".format(**b) for b in (greedy, beam)
        ]
        cells += [
            f"{row[p]['cpu_s']:.3f}" + ("" if row[p]["same"] else " (differs)") for p in points
        ]
        print("| " + " | ".join(cells) + " |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", required=True, help="a finished training run")
    args = parser.parse_args(argv)
    # Imported before the model loads, as they always were: a missing one fails at once.
    import numpy  # noqa: F401
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401

    from keras_transformer import workdir
    from keras_transformer.export import onnx_graphs  # noqa: F401

    model = workdir.load_model(args.work_dir)
    root = tempfile.mkdtemp(prefix="onnx_optimizers-")
    paths = export_graphs(model, root)
    optimize_graphs(paths, root)
    points = make_points(model.config)
    results = measure(paths, points)
    print_table(results, points)
    return results


if __name__ == "__main__":
    main()
