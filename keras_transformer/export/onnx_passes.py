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
  `fold_flattening_matmuls` (`onnx_reshapes`) feeds the MatMul the
  unflattened input; the reshape after it (to the same shape, or further to
  (B, T, N, H)) stays.

- Every reshape whose target shape copies leading dimensions of its input
  (tf.tensordot's reshape back, the split into heads) computes that
  target from the dynamic shape: Shape, Cast, Gather or Slice, Concat,
  Cast. `static_reshape_shapes` (`onnx_reshapes`) writes those targets as
  constants with ONNX's 0 ("copy this dimension of the input"), and drops
  the reshapes that then keep their input's shape.

- After hoisting, the body still reshapes or transposes those weights on
  every iteration (a kernel of shape (D, N, H) to (D, N * H), the tied
  embedding to (D, V) for the logits), because tf2onnx folds constants
  only within one graph and these read the outer graph's initializers.
  `fold_outer_constants` computes them once, as initializers of the
  outermost graph, so they cost nothing per step and are initializers
  that a quantizer can find.

- ONNX Runtime prepacks a constant matrix for its GEMM (reorders it once
  into the kernel's panel layout) only when the matrix is an initializer of
  the graph of the product that reads it. After `fold_outer_constants` the
  decoder's weights are initializers of the main graph, read from inside
  the loops, so every `MatMul` of every step packed its weight again.
  `localize_matmul_weights` copies each such weight into the loop body that
  multiplies by it (one copy per body: the greedy and the beam loop each
  hold the decoder's), which took the `cpu` preset's beam 4, batch 1 CPU
  time from 0.169 s to 0.068 s on Zen 4 for 46 -> 67 MB of file
  (docs/performance.md, "A decoder step without copies").

`simplify` runs them and then `prune` (`onnx_walk`), which drops the nodes
no one reads any more. Each rewrite only fires where it provably computes the same
values (same GEMM, same layout); the export's parity tests check the
result against Keras.
"""

import numpy as np
from onnx import numpy_helper

from keras_transformer.export.onnx_reshapes import (
    _ranks,
    fold_flattening_matmuls,
    static_reshape_shapes,
)
from keras_transformer.export.onnx_walk import (
    _all_graphs,
    _constants,
    _rename_uses,
    _subgraphs,
    prune,
)


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


_FOLDABLE = ("Reshape", "Transpose", "Cast", "Identity")


def _fold(node, values):
    """The numpy output of a `_FOLDABLE` node on constant `values`, with ONNX's semantics."""
    from onnx import helper

    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x = values[0]
    if node.op_type == "Identity":
        return x
    if node.op_type == "Transpose":
        return np.transpose(x, attributes.get("perm"))
    if node.op_type == "Cast":
        return x.astype(helper.tensor_dtype_to_np_dtype(attributes["to"]))
    shape = [int(d) for d in values[1]]  # Reshape: 0 copies the input's dimension
    if not attributes.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return np.reshape(x, shape)


def fold_outer_constants(model):
    """Reshapes, transposes and casts of constants inside subgraphs become initializers.

    A node of a subgraph (an `If` branch, a `Loop` body) whose inputs are all
    constants (initializers or `Constant`s of its own graph or of any graph
    around it) is computed once and stored as an initializer of the main
    graph (named after the node's output); the same computation in several
    subgraphs (the greedy and the beam loop) is stored once. Nodes of the
    main graph are left to tf2onnx and ONNX Runtime, which fold them.

    Returns the number of nodes folded.
    """
    main = model.graph
    main_names = {t.name for t in main.initializer}
    folded = {}  # (op, inputs, attributes) -> the initializer's name
    folded_values = {}  # the initializer's name -> its value
    count = 0

    def visit(graph, outer):
        nonlocal count
        constants = _constants(graph, outer)
        outputs = {o.name for o in graph.output}
        for node in list(graph.node):
            for subgraph in _subgraphs(node):
                visit(subgraph, constants)
            if graph is main or node.op_type not in _FOLDABLE:
                continue
            if not node.input or not all(name in constants for name in node.input):
                continue
            if node.output[0] in outputs:
                continue
            attributes = tuple(a.SerializeToString(deterministic=True) for a in node.attribute)
            key = (node.op_type, tuple(node.input), attributes)
            output = node.output[0]
            if key not in folded:
                value = _fold(node, [constants[name] for name in node.input])
                name = f"{output}__folded"
                while name in main_names:
                    name += "_"
                main.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
                main_names.add(name)
                folded[key] = name
                folded_values[name] = value
            _rename_uses(graph, output, folded[key])
            constants[output] = constants[folded[key]] = folded_values[folded[key]]
            graph.node.remove(node)
            count += 1

    visit(main, {})
    return count


_PREPACKED = {"MatMul": 1, "Gemm": 1}  # op -> the input ONNX Runtime prepacks when constant


def localize_matmul_weights(model):
    """Each constant matrix a subgraph multiplies by becomes an initializer of that subgraph.

    For every `MatMul`/`Gemm` of a subgraph (a `Loop` body, an `If`
    branch) whose weight is an initializer of a graph around it, the
    weight is copied into the subgraph (once per subgraph, under a new
    name: ONNX forbids shadowing) and the subgraph's nodes read the copy,
    so that ONNX Runtime prepacks it once per session instead of once per
    call. The outer initializer stays while anything else reads it
    (`prune` drops it otherwise). Returns the number of weights copied.
    """
    taken = {t.name for g in _all_graphs(model.graph) for t in g.initializer}
    for g in _all_graphs(model.graph):
        taken.update(out for node in g.node for out in node.output)
    count = 0

    def visit(graph, outer):
        nonlocal count
        own = {t.name for t in graph.initializer}
        copies = {}  # outer name -> its copy's name in this graph
        for node in graph.node:
            for subgraph in _subgraphs(node):
                visit(subgraph, {**outer, **{t.name: t for t in graph.initializer}})
            index = _PREPACKED.get(node.op_type)
            if graph is model.graph or node.domain or index is None:
                continue
            name = node.input[index]
            if name in own or name not in outer or len(outer[name].dims) != 2:
                continue
            if name not in copies:
                local = f"{name}__local"
                while local in taken:
                    local += "_"
                taken.add(local)
                tensor = type(outer[name])()
                tensor.CopyFrom(outer[name])
                tensor.name = local
                graph.initializer.append(tensor)
                copies[name] = local
                count += 1
            node.input[index] = copies[name]

    visit(model.graph, {})
    prune(model.graph)
    return count


def simplify(model):
    """Runs the passes on `model` in place; returns `{pass name: count}`."""
    counts = {
        "loop_invariants_hoisted": hoist_loop_invariants(model.graph),
        "matmuls_unflattened": fold_flattening_matmuls(model.graph, shapes=_ranks(model)),
    }
    # Shapes inferred again: an unflattened MatMul's output has the rank of its input now.
    counts["reshapes_made_static"] = static_reshape_shapes(model.graph, _ranks(model))
    counts["outer_constants_folded"] = fold_outer_constants(model)
    counts["nodes_pruned"] = prune(model.graph)
    counts["matmul_weights_localized"] = localize_matmul_weights(model)
    return counts
