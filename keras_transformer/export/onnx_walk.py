"""Walking tf2onnx's graphs and their subgraphs (`Loop` bodies, `If` branches): the
constants each sees, renaming a tensor's reads, and `prune`, which the passes
(`onnx_passes`, `onnx_reshapes`, `onnx_fusions`, `onnx_int8`) run after a rewrite."""

from onnx import AttributeProto, numpy_helper


def _subgraphs(node):
    return [a.g for a in node.attribute if a.type == AttributeProto.GRAPH]


def _all_graphs(graph):
    yield graph
    for node in graph.node:
        for subgraph in _subgraphs(node):
            yield from _all_graphs(subgraph)


def _rename_uses(graph, old, new):
    """Replaces every read of `old` in `graph` and its subgraphs by `new`."""
    for g in _all_graphs(graph):
        for node in g.node:
            for i, name in enumerate(node.input):
                if name == old:
                    node.input[i] = new
        for output in g.output:
            if output.name == old:  # a graph output must be produced: keep it with an Identity
                raise ValueError(f"Cannot rename {old!r}: it is an output of {g.name!r}")


def _constants(graph, outer=None):
    """name -> numpy value of the initializers and Constant nodes visible in `graph`."""
    values = dict(outer or {})
    for tensor in graph.initializer:
        values[tensor.name] = numpy_helper.to_array(tensor)
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attribute.t)
    return values


def _needed(graph):
    needed = set()
    for g in _all_graphs(graph):
        needed.update(o.name for o in g.output)
        for node in g.node:
            needed.update(node.input)
    return needed


def prune(graph):
    """Removes the nodes and initializers nothing reads; returns the number of nodes removed.

    Read means: a node input in this graph or a subgraph, or a graph
    output. Initializers that are also graph inputs (defaults of optional
    inputs) stay. Without this, ONNX Runtime logs a warning for every
    unused initializer when it loads the model.
    """
    removed = 0
    while True:
        needed = _needed(graph)
        dead = []
        for g in _all_graphs(graph):
            for node in g.node:
                if not any(out in needed for out in node.output if out):
                    dead.append((g, node))
        if not dead:
            break
        for g, node in dead:
            g.node.remove(node)
        removed += len(dead)
    for g in _all_graphs(graph):
        inputs = {i.name for i in g.input}
        for tensor in list(g.initializer):
            if tensor.name not in needed and tensor.name not in inputs:
                g.initializer.remove(tensor)
    return removed
