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

- Every reshape whose target shape copies leading dimensions of its input
  (tf.tensordot's reshape back, the split into heads) computes that
  target from the dynamic shape: Shape, Cast, Gather or Slice, Concat,
  Cast. `static_reshape_shapes` writes those targets as constants with
  ONNX's 0 ("copy this dimension of the input"), and drops the reshapes
  that then keep their input's shape.

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

`simplify` runs them and then `prune`, which drops the nodes no one reads
any more. Each rewrite only fires where it provably computes the same
values (same GEMM, same layout); the export's parity tests check the
result against Keras.
"""

import collections

import numpy as np
from onnx import AttributeProto, numpy_helper, shape_inference


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


def _flattens_leading_axes(shape, x, producers, constants, shapes=None):
    """True if `shape` is tf.tensordot's `[prod(x.shape[:-1]), x.shape[-1]]` for `x`.

    Either computed from `Shape(x)`, or (where tf2onnx folded it) the
    constant `[-1, d]` for an `x` of known rank >= 2 and last dimension d.
    """
    if shape in constants:
        rank, last = (shapes or {}).get(x, (None, None))
        value = np.asarray(constants[shape]).reshape(-1).tolist()
        return rank is not None and rank >= 2 and last is not None and value == [-1, last]
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


def _rank(name, producers, constants, shapes=None):
    if name in constants:
        return np.ndim(constants[name])
    node = producers.get(name)
    if node is not None and node.op_type == "Reshape" and node.input[1] in constants:
        return np.size(constants[node.input[1]])
    return (shapes or {}).get(name, (None, None))[0]


def fold_flattening_matmuls(graph, outer_constants=None, shapes=None):
    """`Reshape(MatMul(Reshape(x, [-1, D]), W), s)` -> `Reshape(MatMul(x, W), s)`.

    Only where the first reshape is tf.tensordot's flattening of all but
    the last axis of x, W is a matrix and only Reshapes read the MatMul
    (whose result is the same numbers in the same order either way).
    `shapes` (from `_ranks`) tells the rank of a W that is neither a
    constant nor a constant reshape. Returns the number of MatMuls rewritten.
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
                and _rank(node.input[1], producers, constants, shapes) == 2
                and node.output[0] not in outputs
                and readers[node.output[0]]
                and all(
                    r.op_type == "Reshape" and r.input[0] == node.output[0]
                    for r in readers[node.output[0]]
                )  # fmt: skip
                and _flattens_leading_axes(
                    flatten.input[1], flatten.input[0], producers, constants, shapes
                )
            ):
                node.input[0] = flatten.input[0]
                folded += 1
        for subgraph in _subgraphs(node):
            folded += fold_flattening_matmuls(subgraph, constants, shapes)
    return folded


def _ranks(model):
    """name -> (rank, last dimension or None) of every tensor ONNX shape inference can type."""
    inferred = shape_inference.infer_shapes(model, strict_mode=False)
    shapes = {}
    for g in _all_graphs(inferred.graph):
        for tensor in g.initializer:
            shapes[tensor.name] = (len(tensor.dims), tensor.dims[-1] if tensor.dims else None)
        for value in [*g.value_info, *g.input, *g.output]:
            tensor_type = value.type.tensor_type
            if tensor_type.HasField("shape"):
                dims = tensor_type.shape.dim
                last = dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None
                shapes[value.name] = (len(dims), last)
    return shapes


def _copied_dims(part, producers, constants):
    """(source, dims) if `part` is `Shape(source)[dims]` (by Gather or Slice), else None."""
    node = producers.get(_skip(part, producers, ("Cast",)))
    if node is None or node.op_type not in ("Gather", "Slice"):
        return None
    shape = producers.get(_skip(node.input[0], producers, ("Cast",)))
    if shape is None or shape.op_type != "Shape" or shape.attribute:  # start/end: a sub-shape
        return None
    arguments = [np.asarray(constants[i]).reshape(-1).tolist() if i in constants else None
                 for i in node.input[1:]]  # fmt: skip
    if any(a is None for a in arguments):
        return None
    if node.op_type == "Gather":
        if any(a.name == "axis" and a.i != 0 for a in node.attribute):
            return None
        return shape.input[0], arguments[0]
    starts, ends, *rest = arguments
    axes = rest[0] if rest else [0]
    steps = rest[1] if len(rest) > 1 else [1]
    if len(starts) != 1 or axes != [0] or steps != [1] or not 0 <= starts[0] <= ends[0] < 2**31:
        return None
    return shape.input[0], list(range(starts[0], ends[0]))


def _same_leading_dims(data, producers, constants, shapes):
    """Tensors whose dimensions other than the last equal those of `data`.

    `data` itself, and through `MatMul(x, W)` with a matrix `W` (rank 2:
    ONNX MatMul keeps all but the last dimension of x), `x` (of the same
    rank, at least 2), and so on back.
    """
    same = {data}
    rank = shapes.get(data, (None, None))[0]
    node = producers.get(data)
    while (
        node is not None
        and node.op_type == "MatMul"
        and _rank(node.input[1], producers, constants, shapes) == 2
        and rank is not None
        and rank >= 2
        and shapes.get(node.input[0], (None, None))[0] == rank
    ):
        same.add(node.input[0])
        node = producers.get(node.input[0])
    return same, rank


def static_reshape_shapes(graph, shapes, outer_constants=None):
    """`Reshape(x, Concat(Shape(y)[:k], c))` -> `Reshape(x, [0] * k + c)`, or just `x`.

    Only where dims `0..k-1` of y are provably those of x (y is x, or the
    input of a chain of `MatMul`s by matrices ending in x) and never the
    last dimension of x when y is not x; ONNX's 0 then copies x's own
    dimension. A reshape whose target is then `[0, ..., 0, d]` with x of
    that rank and last dimension d is dropped (readers read x). Returns
    the number of reshapes rewritten.
    """
    rewritten = 0
    constants = _constants(graph, outer_constants)
    producers = {out: node for node in graph.node for out in node.output}
    outputs = {o.name for o in graph.output}
    dropped = []
    for node in graph.node:
        for subgraph in _subgraphs(node):
            rewritten += static_reshape_shapes(subgraph, shapes, constants)
        if node.op_type != "Reshape" or any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        concat = producers.get(_skip(node.input[1], producers, ("Cast",)))
        if concat is None or concat.op_type != "Concat":
            continue
        data = node.input[0]
        same, rank = _same_leading_dims(data, producers, constants, shapes)
        target = []
        for part in concat.input:
            if part in constants:
                values = np.asarray(constants[part]).reshape(-1).tolist()
                if 0 in values:  # a literal 0 would turn into "copy": leave it
                    break
                target += values
                continue
            copied = _copied_dims(part, producers, constants)
            if copied is None:
                break
            source, dims = copied
            if rank is None or source not in same:
                break
            copyable = rank if source == data else rank - 1  # a MatMul changes the last dim
            if (
                dims != list(range(len(target), len(target) + len(dims)))
                or max(dims, default=-1) >= copyable
            ):
                break
            target += [0] * len(dims)
        else:
            if target.count(-1) > 1:
                continue
            rewritten += 1
            keeps_shape = (
                len(target) == rank
                and target[:-1] == [0] * (rank - 1)
                and target[-1] == shapes[data][1]
                and node.output[0] not in outputs
            )
            if keeps_shape:
                dropped.append(node)
                continue
            name = f"{node.output[0]}__static_shape"
            graph.initializer.append(numpy_helper.from_array(np.array(target, np.int64), name))
            node.input[1] = name
    for node in dropped:
        graph.node.remove(node)
        _rename_uses(graph, node.output[0], node.input[0])
    return rewritten


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
