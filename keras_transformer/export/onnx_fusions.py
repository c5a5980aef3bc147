"""Fusions of tf2onnx's output into single ONNX operators: fewer nodes per decoding step.

Keras's `LayerNormalization` under TensorFlow is `tf.nn.moments` and
`tf.nn.batch_normalization`, which tf2onnx writes as 13 nodes:

    mean = ReduceMean(x)            neg = Neg(mean)
    var = ReduceMean(Mul(Sub(x, mean), Sub(x, mean)))
    g = Mul(Reciprocal(Sqrt(Add(var, epsilon))), gamma)
    y = Add(Mul(x, g), Add(Mul(neg, g), beta))

ONNX has had `LayerNormalization` since opset 17, and ONNX Runtime runs
it as one kernel (and fuses it with the residual `Add` before it into its
`SkipLayerNormalization` at its default optimization level). ONNX
Runtime's own layer-norm fusion looks for PyTorch's pattern (`Pow`,
`Div`), not this one, so the search graph kept 13 nodes per norm: 3 norms
per decoder layer, in every decoding step. `fuse_layer_norms` writes
`LayerNormalization(x, gamma, beta, axis=-1, epsilon)` where the 13 nodes
provably compute it (the same input everywhere, reductions over the last
axis only, constant scalar epsilon, 1-D gamma and beta, no intermediate
read elsewhere), and leaves anything else as it is.
"""

import numpy as np
from onnx import numpy_helper

from keras_transformer.export.onnx_walk import _all_graphs, _constants, _subgraphs, prune

LAYER_NORM_OPSET = 17


def fuse(model):
    """Runs the fusions on `model` in place (after `onnx_passes.simplify`); returns
    `{fusion name: count}`."""
    return {
        "layer_norms_fused": fuse_layer_norms(model),
        "concat_transposes_cancelled": cancel_concat_transposes(model),
    }


def _consumers(graph):
    consumers = {}
    for node in graph.node:
        for name in dict.fromkeys(node.input):  # a node that reads a name twice, once
            consumers.setdefault(name, []).append(node)
    return consumers


def _only(consumers, name, op_type, outputs):
    """The single `op_type` node that reads `name`, or None (also if a graph output)."""
    readers = consumers.get(name, [])
    if name in outputs or len(readers) != 1 or readers[0].op_type != op_type:
        return None
    return readers[0]


def _other(node, name):
    """The input of a two-input node that is not `name` (None if both are)."""
    a, b = node.input
    if a == name and b != name:
        return b
    if b == name and a != name:
        return a
    return None


def _last_axis_mean(node, constants, rank):
    if node.op_type != "ReduceMean":
        return False
    attributes = {a.name: a for a in node.attribute}
    if "keepdims" in attributes and attributes["keepdims"].i != 1:
        return False
    if len(node.input) < 2 or node.input[1] not in constants:
        return False  # opset 18: axes is an input; absent means every axis
    axes = [int(a) for a in np.ravel(constants[node.input[1]])]
    return axes == [-1] or (rank is not None and axes == [rank - 1])


def _vector(value):
    """True for a constant of shape (D,) or (1, ..., 1, D): a scale over the last axis."""
    return value is not None and np.ndim(value) >= 1 and np.size(value) == np.shape(value)[-1]


def _match(mean, graph, consumers, constants, outputs, ranks):
    """The nodes, input, gamma, beta, epsilon and output of the layer norm that starts at
    `mean`, or None."""
    x = mean.input[0]
    rank = ranks.get(x)
    if not _last_axis_mean(mean, constants, rank):
        return None
    readers = consumers.get(mean.output[0], [])
    if mean.output[0] in outputs or sorted(n.op_type for n in readers) != ["Neg", "Sub"]:
        return None
    neg = next(n for n in readers if n.op_type == "Neg")
    sub = next(n for n in readers if n.op_type == "Sub")
    if list(sub.input) != [x, mean.output[0]]:
        return None
    square = _only(consumers, sub.output[0], "Mul", outputs)
    if square is None or list(square.input) != [sub.output[0]] * 2:
        return None
    variance = _only(consumers, square.output[0], "ReduceMean", outputs)
    if variance is None or not _last_axis_mean(variance, constants, rank):
        return None
    add_epsilon = _only(consumers, variance.output[0], "Add", outputs)
    epsilon = add_epsilon and _other(add_epsilon, variance.output[0])
    if epsilon is None or epsilon not in constants or np.size(constants[epsilon]) != 1:
        return None
    sqrt = _only(consumers, add_epsilon.output[0], "Sqrt", outputs)
    reciprocal = sqrt and _only(consumers, sqrt.output[0], "Reciprocal", outputs)
    scale = reciprocal and _only(consumers, reciprocal.output[0], "Mul", outputs)
    gamma = scale and _other(scale, reciprocal.output[0])
    if gamma is None or not _vector(constants.get(gamma)):
        return None
    scaled = consumers.get(scale.output[0], [])
    if scale.output[0] in outputs or len(scaled) != 2 or any(n.op_type != "Mul" for n in scaled):
        return None
    by_input = {_other(n, scale.output[0]): n for n in scaled}
    if set(by_input) != {x, neg.output[0]}:
        return None
    x_scaled, mean_scaled = by_input[x], by_input[neg.output[0]]
    if consumers.get(neg.output[0], []) != [mean_scaled] or neg.output[0] in outputs:
        return None
    add_beta = _only(consumers, mean_scaled.output[0], "Add", outputs)
    beta = add_beta and _other(add_beta, mean_scaled.output[0])
    if beta is None or not _vector(constants.get(beta)):
        return None
    final = _only(consumers, x_scaled.output[0], "Add", outputs)
    if final is None or sorted(final.input) != sorted([x_scaled.output[0], add_beta.output[0]]):
        return None
    if consumers.get(add_beta.output[0], []) != [final] or add_beta.output[0] in outputs:
        return None
    nodes = [mean, neg, sub, square, variance, add_epsilon, sqrt, reciprocal, scale,
             x_scaled, mean_scaled, add_beta, final]  # fmt: skip
    return nodes, x, gamma, beta, float(np.ravel(constants[epsilon])[0]), final.output[0]


def _rank_of(model):
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model, strict_mode=False)
    ranks = {}
    for g in _all_graphs(inferred.graph):
        for value in [*g.value_info, *g.input, *g.output]:
            if value.type.tensor_type.HasField("shape"):
                ranks[value.name] = len(value.type.tensor_type.shape.dim)
    return ranks


def fuse_layer_norms(model):
    """TensorFlow's layer norm pattern becomes ONNX `LayerNormalization` in every graph.

    Needs the model's default-domain opset at least 17 (returns 0 below it).
    Returns the number of norms fused.
    """
    from onnx import helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < LAYER_NORM_OPSET:
        return 0
    ranks = _rank_of(model)
    count = 0
    main = model.graph
    vectors = {}  # a constant's name -> the name of its 1-D copy in the main graph
    taken = {t.name for t in main.initializer}

    def vector(name, value):
        if name not in vectors:
            copy = f"{name}__vector"
            while copy in taken:
                copy += "_"
            taken.add(copy)
            main.initializer.append(numpy_helper.from_array(np.ravel(value).copy(), copy))
            vectors[name] = copy
        return vectors[name]

    def visit(graph, outer):
        nonlocal count
        constants = _constants(graph, outer)
        for node in graph.node:
            for subgraph in _subgraphs(node):
                visit(subgraph, constants)
        consumers = _consumers(graph)
        outputs = {o.name for o in graph.output}
        for mean in [n for n in graph.node if n.op_type == "ReduceMean"]:
            if mean not in graph.node:
                continue  # fused already, as another norm's variance
            found = _match(mean, graph, consumers, constants, outputs, ranks)
            if found is None:
                continue
            nodes, x, gamma, beta, epsilon, y = found
            gamma, beta = vector(gamma, constants[gamma]), vector(beta, constants[beta])
            position = list(graph.node).index(nodes[-1])
            fused = helper.make_node(
                "LayerNormalization", [x, gamma, beta], [y], name=f"{y}__layer_norm",
                axis=-1, epsilon=epsilon,
            )  # fmt: skip
            graph.node.insert(position, fused)
            for old in nodes:
                graph.node.remove(old)
            count += 1

    visit(model.graph, {})
    if count:
        prune(model.graph)
    return count


def _perm(node):
    from onnx import helper

    return next((list(helper.get_attribute_value(a)) for a in node.attribute
                 if a.name == "perm"), None)  # fmt: skip


def _reads(graph):
    """name -> number of reads in `graph`: node inputs, graph outputs, and names its
    subgraphs read from it (outer-scope references count once per subgraph)."""
    reads = {}
    for node in graph.node:
        names = list(node.input)
        for subgraph in _subgraphs(node):
            names.extend(_outer_reads(subgraph))
        for name in names:
            reads[name] = reads.get(name, 0) + 1
    for output in graph.output:
        reads[output.name] = reads.get(output.name, 0) + 1
    return reads


def _outer_reads(graph):
    """The names `graph` (and its subgraphs) read that it does not define."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined.update(out for node in graph.node for out in node.output)
    read = set()
    for node in graph.node:
        read.update(node.input)
        for subgraph in _subgraphs(node):
            read.update(_outer_reads(subgraph))
    read.update(o.name for o in graph.output)
    return {name for name in read if name and name not in defined}


def cancel_concat_transposes(model):
    """`Transpose(Concat(Transpose(cache, p), x), inverse of p)` becomes
    `Concat(cache, Transpose(x, inverse of p))` on the concatenated axis moved.

    tf2onnx's transpose optimizer pushes the transpose of a decoding step's
    new key (to the step layout `(B, N, H, 1)`) through the `Concat` that
    appends it to the cache, so that every step transposed the whole key
    cache out of its layout and back (two copies of it per layer and step)
    to transpose one position. This puts the transpose back on the one
    position. Returns the number of pairs removed.
    """
    from onnx import helper

    count = 0
    for graph in list(_all_graphs(model.graph)):
        producers = {out: node for node in graph.node for out in node.output}
        reads = _reads(graph)
        for concat in [n for n in graph.node if n.op_type == "Concat" and len(n.input) == 2]:
            first = producers.get(concat.input[0])
            if first is None or first.op_type != "Transpose" or reads.get(first.output[0]) != 1:
                continue
            if reads.get(concat.output[0]) != 1:
                continue
            after = next((n for n in graph.node if concat.output[0] in n.input), None)
            p, q = _perm(first), after is not None and _perm(after)
            if after is None or after.op_type != "Transpose" or not p or not q or len(p) != len(q):
                continue
            if [p[i] for i in q] != list(range(len(p))):
                continue  # the second transpose does not undo the first
            axis = next(helper.get_attribute_value(a) for a in concat.attribute if a.name == "axis")
            axis = axis % len(p)
            moved = helper.make_node("Transpose", [concat.input[1]], [f"{after.output[0]}__step"],
                                     name=f"{after.output[0]}__step", perm=q)  # fmt: skip
            joined = helper.make_node(
                "Concat", [first.input[0], moved.output[0]], list(after.output),
                name=f"{after.output[0]}__concat", axis=q.index(axis),
            )  # fmt: skip
            position = list(graph.node).index(after)
            graph.node.insert(position, joined)
            graph.node.insert(position, moved)
            for old in (first, concat, after):
                graph.node.remove(old)
            count += 1
    return count
