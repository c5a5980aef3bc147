"""Graph clean-ups for tf2onnx's output of the search: fewer nodes per decoding step.

A search `Loop` runs its body once per output token, so at batch 1 the
cost of a step is mostly ONNX Runtime's per-node overhead, and every node
tf2onnx leaves in the body is paid for T times. Two patterns dominate:

- TensorFlow passes every variable a while loop reads through the loop
  as loop-carried state; tf2onnx keeps that, so the weights (and other
  constants) are inputs of every iteration, and nothing computed from
  them inside the body (kernel reshapes) is folded. `hoist_loop_invariants`
  turns each state variable that the body passes through unchanged into
  a plain outer-scope reference.
- Keras's `ops.matmul` of a (B, T, D) tensor and a (D, E) matrix is a
  `tf.tensordot` under TensorFlow: a reshape to (B*T, D) computed from
  the dynamic shape (Shape, Gather, ReduceProd, Unsqueeze, Concat, Cast,
  Reshape), the MatMul, and a reshape back. ONNX `MatMul` broadcasts, so
  `fold_flattening_matmuls` feeds the MatMul the unflattened input; the
  reshape after it (to the same shape, or further to (B, T, N, H)) stays.

`simplify` runs both and then `prune`, which drops the nodes no one reads
any more. Each rewrite only fires where it provably computes the same
values (same GEMM, same layout); the export's parity tests check the
result against Keras.
"""

import collections

import numpy as np
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


def hoist_loop_invariants(graph):
    """Loop state that every iteration passes through unchanged becomes an outer reference.

    Returns the number of state variables removed.
    """
    removed = 0
    for g in list(_all_graphs(graph)):
        for loop in [n for n in g.node if n.op_type == "Loop"]:
            (body,) = _subgraphs(loop)
            producers = {out: node for node in body.node for out in node.output}
            state_count = len(loop.input) - 2
            keep = []
            for k in range(state_count):
                body_input = body.input[2 + k].name
                body_output = body.output[1 + k].name
                producer = producers.get(body_output)
                invariant = body_output == body_input or (
                    producer is not None
                    and producer.op_type == "Identity"
                    and producer.input[0] == body_input
                    and body_output not in [i for n in body.node for i in n.input]
                )
                keep.append(not invariant)
            if all(keep):
                continue
            outer_inputs = list(loop.input)
            outer_outputs = list(loop.output)
            body_inputs = list(body.input)
            body_outputs = list(body.output)
            renames = []
            for k in reversed(range(state_count)):
                if keep[k]:
                    continue
                producer = producers.get(body_outputs[1 + k].name)
                if producer is not None and producer.op_type == "Identity":
                    body.node.remove(producer)
                # The body reads the outer value directly (ONNX subgraphs see outer scope).
                renames.append((body, body_inputs[2 + k].name, outer_inputs[2 + k]))
                if outer_outputs[k]:
                    renames.append((g, outer_outputs[k], outer_inputs[2 + k]))
                del outer_inputs[2 + k], outer_outputs[k], body_inputs[2 + k], body_outputs[1 + k]
                removed += 1
            loop.ClearField("input")
            loop.input.extend(outer_inputs)
            loop.ClearField("output")
            loop.output.extend(outer_outputs)
            body.ClearField("input")
            body.input.extend(body_inputs)
            body.ClearField("output")
            body.output.extend(body_outputs)
            for where, old, new in renames:
                _rename_uses(where, old, new)
    return removed


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


def _skip(name, producers, op_types):
    """Follows `name` back through nodes of `op_types` (one input each); returns the name."""
    node = producers.get(name)
    while node is not None and node.op_type in op_types:
        name = node.input[0]
        node = producers.get(name)
    return name


def _flattens_leading_axes(shape, x, producers, constants):
    """True if `shape` is tf.tensordot's `[prod(x.shape[:-1]), x.shape[-1]]` for `x`."""
    concat = producers.get(_skip(shape, producers, ("Cast",)))
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
        return False
    gathered = []
    for part in concat.input:
        prod = producers.get(_skip(part, producers, ("Unsqueeze",)))
        if prod is None or prod.op_type != "ReduceProd":
            return False
        gather = producers.get(prod.input[0])
        if gather is None or gather.op_type != "Gather" or gather.input[1] not in constants:
            return False
        source = producers.get(_skip(gather.input[0], producers, ("Cast",)))
        if source is None or source.op_type != "Shape" or source.input[0] != x:
            return False
        gathered.append(np.asarray(constants[gather.input[1]]).reshape(-1).tolist())
    free, axes = gathered
    return free == list(range(len(free))) and axes in ([len(free)], [-1])


def _rank(name, producers, constants):
    if name in constants:
        return np.ndim(constants[name])
    node = producers.get(name)
    if node is not None and node.op_type == "Reshape" and node.input[1] in constants:
        return np.size(constants[node.input[1]])
    return None


def fold_flattening_matmuls(graph, outer_constants=None):
    """`Reshape(MatMul(Reshape(x, [-1, D]), W), s)` -> `Reshape(MatMul(x, W), s)`.

    Only where the first reshape is tf.tensordot's flattening of all but
    the last axis of x, W is a matrix and only Reshapes read the MatMul
    (whose result is the same numbers in the same order either way).
    Returns the number of MatMuls rewritten.
    """
    folded = 0
    constants = _constants(graph, outer_constants)
    producers = {out: node for node in graph.node for out in node.output}
    readers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type == "MatMul":
            flatten = producers.get(node.input[0])
            if (
                flatten is not None
                and flatten.op_type == "Reshape"
                and _rank(node.input[1], producers, constants) == 2
                and node.output[0] not in outputs
                and readers[node.output[0]]
                and all(
                    r.op_type == "Reshape" and r.input[0] == node.output[0]
                    for r in readers[node.output[0]]
                )  # fmt: skip
                and _flattens_leading_axes(flatten.input[1], flatten.input[0], producers, constants)
            ):
                node.input[0] = flatten.input[0]
                folded += 1
        for subgraph in _subgraphs(node):
            folded += fold_flattening_matmuls(subgraph, constants)
    return folded


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


def simplify(model):
    """Runs the passes on `model` in place; returns `{pass name: count}`."""
    counts = {
        "loop_invariants_hoisted": hoist_loop_invariants(model.graph),
        "matmuls_unflattened": fold_flattening_matmuls(model.graph),
    }
    counts["nodes_pruned"] = prune(model.graph)
    return counts
