"""Where tf2onnx's conversion of translate.onnx's search spends its memory.

    python tf2onnx_stages.py WORK_DIR [--no-catch-errors] [--consumers-only]

Wraps tf2onnx's stages and prints, for each, the RSS before and after and the
peak RSS while it ran (Linux VmHWM, reset through /proc/self/clear_refs before
each stage), the size of tf2onnx's consumer sets before its optimizers run,
then a table of the repeated stages (per rewriter, per optimizer,
the optimizer's deepcopy of the graph) aggregated.
"""

import collections
import gc
import os
import sys
import time
import types

T0 = time.time()


def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) // 1024  # MiB
    raise KeyError(key)


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


STACK = []  # [name, peak]
TABLE = collections.defaultdict(lambda: [0, 0.0, 0, 0])  # count, seconds, max peak-before, sum rss growth
LIVE = set()


def wrap(owner, attr, name=None, live=False):
    original = getattr(owner, attr)
    name = name or attr
    if live:
        LIVE.add(name)

    def wrapper(*args, **kwargs):
        hwm = _status("VmHWM")
        for frame in STACK:
            frame[1] = max(frame[1], hwm)
        _reset_peak()
        before = _status("VmRSS")
        frame = [name, before]
        STACK.append(frame)
        if name in LIVE:
            print(f"{'  ' * (len(STACK) - 1)}> {name}: RSS {before} MiB, {time.time() - T0:.0f} s", flush=True)
        start = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            seconds = time.time() - start
            frame[1] = max(frame[1], _status("VmHWM"))
            STACK.pop()
            for parent in STACK:
                parent[1] = max(parent[1], frame[1])
            after = _status("VmRSS")
            _reset_peak()
            row = TABLE[name]
            row[0] += 1
            row[1] += seconds
            row[2] = max(row[2], frame[1] - before)
            row[3] += after - before
            if name in LIVE:
                print(f"{'  ' * len(STACK)}< {name}: RSS {before} -> {after} MiB, peak {frame[1]} MiB, "
                      f"{seconds:.1f} s", flush=True)

    setattr(owner, attr, wrapper)


def _consumer_entries(graph):
    """(nodes, entries of `_output_to_consumers`, true readers) over a graph and its subgraphs."""
    nodes = entries = readers = 0
    for g in [graph]:
        nodes += len(g.get_nodes())
        entries += sum(len(s) for s in g._output_to_consumers.values())
        readers += sum(len(set(n.input)) for n in g.get_nodes())
        for node in g.get_nodes():
            for sub in (node.get_body_graphs() or {}).values():
                n, e, r = _consumer_entries(sub)
                nodes, entries, readers = nodes + n, entries + e, readers + r
    return nodes, entries, readers


def main(work_dir, catch_errors=True, consumers_only=False):
    if not catch_errors:
        os.environ["TF2ONNX_CATCH_ERRORS"] = "FALSE"
    from keras_transformer import workdir
    from keras_transformer.export import load_work_dir
    from keras_transformer.export import onnx_graphs as g

    import tf2onnx
    import tf2onnx.optimizer as _opt
    import collections as _c, gc as _gc
    if "--fewer" in sys.argv:
        _orig = _opt._get_optimizers
        drop = {"remove_redundant_upsample", "const_dequantize_optimizer", "global_pool_optimizer", "q_dq_optimizer", "einsum_optimizer"}
        _opt._get_optimizers = lambda: _c.OrderedDict((k, v) for k, v in _orig().items() if k not in drop)
    if "--collect" in sys.argv:
        import tf2onnx.optimizer.optimizer_base as _ob
        _o = _ob.GraphOptimizerBase.optimize
        def _optimize(self, graph, iteration):
            out = _o(self, graph, iteration); _gc.collect(); return out
        _ob.GraphOptimizerBase.optimize = _optimize
        from tf2onnx.graph import Graph as _G
        _mm = _G.make_model
        def _make_model(self, *a, **k):
            _gc.collect(); return _mm(self, *a, **k)
        _G.make_model = _make_model
    from tf2onnx import convert, optimizer, tf_loader, tfonnx
    from tf2onnx.graph import Graph
    from tf2onnx.optimizer.optimizer_base import GraphOptimizerBase

    wrap(tf_loader, "from_function", "tf_loader.from_function (freeze + grappler)", live=True)
    wrap(tf_loader, "convert_variables_to_constants_v2", "convert_variables_to_constants_v2", live=True)
    wrap(tf_loader, "tf_optimize", "tf_optimize (grappler)", live=True)
    wrap(convert, "process_tf_graph", "process_tf_graph", live=True)
    wrap(tfonnx, "graphs_from_tf", "graphs_from_tf", live=True)
    wrap(tfonnx, "resolve_functions", "resolve_functions", live=True)
    wrap(tfonnx, "compute_const_folding_using_tf", "compute_const_folding_using_tf")
    wrap(tfonnx, "tensorflow_to_onnx", "tensorflow_to_onnx")
    wrap(tfonnx, "fold_constants_using_tf", "fold_constants_using_tf")
    wrap(tfonnx, "process_graphs", "process_graphs", live=True)
    wrap(tfonnx, "process_parsed_graph", "process_parsed_graph")
    wrap(tfonnx, "tensorflow_onnx_mapping", "tensorflow_onnx_mapping")
    for attr in dir(tfonnx):
        if attr.startswith(("rewrite_", "rewriter_")) and callable(getattr(tfonnx, attr)):
            wrap(tfonnx, attr, "rewriter " + attr)
    optimize_graph = optimizer.optimize_graph

    def counted(graph, *args, **kwargs):
        nodes, entries, readers = _consumer_entries(graph)
        print(f"before the optimizers: {nodes} nodes, {entries} consumer-set entries, "
              f"{readers} true (node, input) readers", flush=True)
        return optimize_graph(graph, *args, **kwargs)

    optimizer.optimize_graph = counted
    wrap(optimizer, "optimize_graph", "optimize_graph", live=True)
    deepcopy = types.SimpleNamespace(deepcopy=optimizer.copy.deepcopy)
    wrap(deepcopy, "deepcopy", "optimizer's copy.deepcopy(graph)")
    optimizer.copy = deepcopy
    base_optimize = GraphOptimizerBase.optimize

    def optimize(self, graph, iteration):
        return TABLE_OPT[type(self).__name__](self, graph, iteration)

    TABLE_OPT = collections.defaultdict(lambda: base_optimize)
    for cls in optimizer._optimizers.values():
        holder = types.SimpleNamespace(f=base_optimize)
        wrap(holder, "f", "optimizer " + cls.__name__)
        TABLE_OPT[cls.__name__] = holder.f
    GraphOptimizerBase.optimize = optimize
    wrap(Graph, "make_model", "Graph.make_model", live=True)

    model, _, info = load_work_dir(work_dir)
    search = workdir.search_of(info).to_dict()
    beam_sizes = tuple(sorted({1, int(search["beam_size"])}))
    function = g.search_function(model, beam_sizes, stopping=search["stopping"],
                                 patience=search["patience"], length_ratio=search["length_ratio"])
    print(f"model loaded: RSS {_status('VmRSS')} MiB, peak {_status('VmHWM')} MiB, "
          f"tf2onnx {tf2onnx.__version__}, catch_errors={catch_errors}, "
          f"consumers_only={consumers_only}", flush=True)
    _reset_peak()
    wrap(tf2onnx.convert, "from_function", "tf2onnx.convert.from_function", live=True)
    import contextlib

    from keras_transformer.export import tf2onnx_fixes

    with tf2onnx_fixes.consumers_only() if consumers_only else contextlib.nullcontext():
        model_proto, _ = tf2onnx.convert.from_function(
            function, input_signature=function.input_signature, opset=g.TRANSLATE_OPSET,
            custom_op_handlers={"Bitcast": (g._sign_bit_bitcast, []),
                                "SelectV2": (g._select_as_where, [])},
        )
    print(f"model_proto: {model_proto.ByteSize() / 2**20:.1f} MiB")
    gc.collect()
    print(f"after gc.collect(): RSS {_status('VmRSS')} MiB")
    print("\nrepeated stages: calls, seconds, max(peak - RSS before) MiB, sum(RSS after - before) MiB")
    for name, (count, seconds, peak, growth) in sorted(TABLE.items(), key=lambda kv: -kv[1][2]):
        print(f"{name:60s} {count:5d} {seconds:8.1f} {peak:7d} {growth:7d}")
    with open(os.environ.get("SAVE_ONNX", os.devnull), "wb") as f:
        f.write(model_proto.SerializeToString())


if __name__ == "__main__":
    main(sys.argv[1], catch_errors="--no-catch-errors" not in sys.argv,
         consumers_only="--consumers-only" in sys.argv)
