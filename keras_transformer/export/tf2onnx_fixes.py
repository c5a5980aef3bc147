"""A fix to tf2onnx's graph bookkeeping that takes the conversion of translate.onnx's
search from 3.9 GB to 1.7-2.3 GB of memory, with the same graph.

tf2onnx's `Graph` keeps, for every tensor name, the set of nodes that read
it (`_output_to_consumers`). `Graph.replace_all_inputs(old, new, ops=...)`
registers every node of `ops` as a reader of `new`, whether or not it
reads `old`. tf2onnx calls it with `ops=graph.get_nodes()` for each output
of each node where it renames a graph's tensors (`onnx_opset/controlflow.
prefix_graph`, run on every branch of every `If`), so a branch of N nodes
holds about N x N entries until the graph is next sorted (`reset_nodes`
rebuilds the sets). translate.onnx's search selects its beam size with
nested `tf.cond`s whose branches hold the decoding loops: thousands of
nodes each. Building those sets took the process from 1.2 to 2.9 GB (3.4 GB
at the peak) and most of the conversion's time, and the freed memory was
not given back before the optimizers ran on top of it.

`consumers_only` passes `replace_all_inputs` only the nodes of `ops` that do
read `old`: the inputs rewritten are the same (a node that does not read
`old` has nothing to rewrite) and the sets hold the true readers. tf2onnx
filters those sets by `node.input` wherever it reads them, so the graph
written does not change (tests/test_tf2onnx_fixes.py).
"""

import contextlib


@contextlib.contextmanager
def consumers_only():
    """Within the block, tf2onnx's `Graph.replace_all_inputs` registers only the
    nodes that read the renamed tensor (see the module docstring)."""
    from tf2onnx.graph import Graph

    original = Graph.replace_all_inputs

    def replace_all_inputs(self, old_input, new_input, ops=None):
        if ops is not None:
            ops = [op for op in ops if old_input in op.input]
        return original(self, old_input, new_input, ops=ops)

    Graph.replace_all_inputs = replace_all_inputs
    try:
        yield
    finally:
        Graph.replace_all_inputs = original
