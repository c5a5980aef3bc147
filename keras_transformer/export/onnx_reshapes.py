"""The reshapes of tf.tensordot and of the split into heads, computed from dynamic shapes
in tf2onnx's search graph, rewritten with fewer nodes per step (`onnx_passes.simplify`
runs them; the module docstring of `onnx_passes` says why).

- `fold_flattening_matmuls`: Keras's `ops.matmul` of a (B, T, D) tensor and
  a (D, E) matrix is a `tf.tensordot` under TensorFlow: a reshape to (B*T, D)
  computed from the dynamic shape, the MatMul, and a reshape back. ONNX
  `MatMul` broadcasts, so the MatMul reads the unflattened input.
- `static_reshape_shapes`: a reshape whose target copies leading dimensions
  of its input gets that target as a constant with ONNX's 0 ("copy this
  dimension"), or is dropped where it then keeps its input's shape.
"""

import collections

import numpy as np
from onnx import numpy_helper, shape_inference

from keras_transformer.export.onnx_walk import _all_graphs, _constants, _rename_uses, _subgraphs


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


def _static_target(concat, data, producers, constants, shapes):
    """The constant target (ONNX's 0 for a copied dimension) of a reshape of `data` to
    `concat`'s output, or None where a part of it is not provably constant or copied."""
    same, rank = _same_leading_dims(data, producers, constants, shapes)
    target = []
    for part in concat.input:
        if part in constants:
            values = np.asarray(constants[part]).reshape(-1).tolist()
            if 0 in values:  # a literal 0 would turn into "copy": leave it
                return None
            target += values
            continue
        copied = _copied_dims(part, producers, constants)
        if copied is None or rank is None or copied[0] not in same:
            return None
        source, dims = copied
        copyable = rank if source == data else rank - 1  # a MatMul changes the last dim
        if (
            dims != list(range(len(target), len(target) + len(dims)))
            or max(dims, default=-1) >= copyable
        ):
            return None
        target += [0] * len(dims)
    return None if target.count(-1) > 1 else target


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
        target = _static_target(concat, data, producers, constants, shapes)
        if target is None:
            continue
        rewritten += 1
        rank, last = shapes.get(data, (None, None))
        keeps_shape = (
            len(target) == rank
            and target[:-1] == [0] * (rank - 1)
            and target[-1] == last
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
