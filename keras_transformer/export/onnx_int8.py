"""`translate_int8.onnx`: translate.onnx with int8 matrix products, quantized row by row.

Every `MatMul` whose second input is a constant float matrix (the attention
projections, the feed-forward layers and the tied output embedding, inside
the search's `If` and `Loop` bodies, where every matrix product of the
model is) becomes standard ONNX ops that quantize each row of its input on
its own, as CTranslate2's int8 does: five that quantize the input (once
for the products that read the same one: Q, K and V) and four per product.

    x (..., K) float32, W (K, N) float32
    m  = max(max |x| over K, tiny)                 (..., 1)  each row's own range
    xq = QuantizeLinear(x / m, 1/127, 128)         (..., K)  uint8: 128 + round(127 x / m)
    y  = MatMulInteger(xq, Wq, 128) * m * s        (..., N)  int32 products, exact

    Wq (K, N) int8 = round(W / c), c (N,) = max |W| of each column / 63;  s = c / 127

A row's numbers depend on that row alone, and its integer products are
exact on every CPU, so a sentence translates the same alone and in any
batch. ONNX Runtime runs `MatMulInteger`
(uint8 x int8) on its integer GEMM: with AVX512-VNNI or AVX-VNNI each
product is added in 32 bits, but on x86 CPUs with AVX2 and no VNNI (Intel
before Ice Lake, AMD before Zen 4) `vpmaddubsw` adds two neighbouring
products in 16 bits and saturates at 32,767. Weight codes of 7 bits
(|Wq| <= 63, ONNX Runtime's "reduce_range") keep every pair under it:
2 x 255 x 63 = 32,130. With 8-bit codes, translations on a Zen 3 drifted
(beam chrF 36.9 against float32's 40.3 on the test fixture), and
`x @ -W` was not `-(x @ W)`.

What it replaced, and why (docs/performance.md, "int8 that does not depend
on the batch"):
ONNX Runtime's dynamic quantization (`quantize_dynamic`:
`DynamicQuantizeLinear`, one scale for the whole batch's activations per
call) made a sentence's translation depend on its neighbours, and logged
about 90 INFO lines through the root logger per export; ONNX Runtime's
weight-only `MatMulNBits` (bits 8, activations quantized per row and block
at `accuracy_level` 4) is row-local too, but took 1.08x to 1.23x this
graph's CPU time on Zen 4 at every point but greedy batch 1 (0.96x). This
pass is numpy on the graph and logs nothing; its graph costs what the
dynamic quantization's did.

The embedding `Gather`, the attention's products of activations and the
element-wise ops stay float32.

Each weight's int8 form is stored in the graph of the products that read
it (the greedy and the beam loop each hold a copy of the decoder's): ONNX
Runtime prepacks a constant weight for its integer GEMM only when it is an
initializer of the consumer's own graph; read from an outer graph (where
`onnx_passes.fold_outer_constants` leaves them), it is packed again at
every call: 23.5 µs a product against 8.5 µs at greedy batch 1, up to
1.27x the graph's CPU time (docs/performance.md, "int8 that does not
depend on the batch").
"""

import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from keras_transformer.export.onnx_walk import _all_graphs as _graphs
from keras_transformer.export.onnx_walk import _subgraphs, prune

_INT8_MAX = 127  # activations: 128 + round(127 x / m), in [1, 255]
_ZERO_POINT = 128
# Weight codes of 7 bits: a pair of uint8 x int8 products, which AVX2's vpmaddubsw
# adds in 16 bits, stays under 32,767 (2 x 255 x 63 = 32,130) on CPUs without VNNI.
WEIGHT_MAX = 63
# Shared inputs of every quantized product, initializers of the main graph.
_CONSTANTS = {
    "int8_rows__axes": np.array([-1], np.int64),  # ReduceMax over K, each row
    "int8_rows__tiny": np.array(np.finfo(np.float32).tiny, np.float32),  # an all-zero row
    "int8_rows__scale": np.array(1 / _INT8_MAX, np.float32),
    "int8_rows__zero_point": np.array(_ZERO_POINT, np.uint8),
}


def quantize_columns(weight):
    """A float (K, N) matrix -> `(Wq, s)`: int8 codes in [-63, 63] (K, N), one symmetric
    scale per column.

    `Wq * c` with `c = 127 * s` (max |W| of the column / 63) is the matrix again
    to half a step of `c`; `s` (float32, (N,)) is what the product's output is
    multiplied by (`c / 127`: the activations' 1/127 folded in).
    """
    weight = np.asarray(weight, np.float32)
    if weight.ndim != 2:
        raise ValueError(f"Expected a (K, N) weight matrix. Received: shape={weight.shape}")
    columns = np.abs(weight).max(axis=0) / WEIGHT_MAX  # (N,): one step of each column
    columns = np.where(columns > 0, columns, 1.0).astype(np.float32)
    codes = np.clip(np.rint(weight / columns), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8)
    return codes, (columns / _INT8_MAX).astype(np.float32)


def _quantize_rows(x, prefix):
    """The five nodes that turn `x` into uint8 rows; returns `(nodes, rows, ranges)`."""
    name = {step: f"{prefix}__int8_{step}" for step in ("abs", "max", "range", "unit", "rows")}
    nodes = [
        helper.make_node("Abs", [x], [name["abs"]]),
        helper.make_node("ReduceMax", [name["abs"], "int8_rows__axes"], [name["max"]], keepdims=1),
        helper.make_node("Max", [name["max"], "int8_rows__tiny"], [name["range"]]),  # (..., 1)
        helper.make_node("Div", [x, name["range"]], [name["unit"]]),  # in [-1, 1]
        helper.make_node(
            "QuantizeLinear",
            [name["unit"], "int8_rows__scale", "int8_rows__zero_point"],
            [name["rows"]],
        ),
    ]
    return nodes, name["rows"], name["range"]


def _integer_product(rows, ranges, codes, scales, y):
    """The four nodes that compute `y` from `_quantize_rows` and `quantize_columns`."""
    name = {step: f"{y}__int8_{step}" for step in ("product", "float", "rows")}
    return [
        helper.make_node(
            "MatMulInteger", [rows, codes, "int8_rows__zero_point"], [name["product"]]
        ),
        helper.make_node("Cast", [name["product"]], [name["float"]], to=TensorProto.FLOAT),
        # ONNX Runtime fuses Mul(Cast(MatMulInteger), Mul(...)) into MatMulIntegerToFloat,
        # whose activation scale is one number: the row scale comes first, from Max.
        helper.make_node("Mul", [name["float"], ranges], [name["rows"]]),
        helper.make_node("Mul", [name["rows"], scales], [y]),
    ]


def _float_matrix(node, scope):
    """(the graph holding it, its initializer, its value) of the constant float32 matrix
    that `node` multiplies by, if it is a `MatMul` by one in `scope`; else Nones."""
    if node.op_type != "MatMul" or node.domain or node.input[1] not in scope:
        return None, None, None
    holder, tensor = scope[node.input[1]]
    weight = numpy_helper.to_array(tensor)
    if weight.ndim != 2 or weight.dtype != np.float32:
        return None, None, None
    return holder, tensor, weight


def quantize_matmul_weights(model):
    """Every `MatMul` by a constant float matrix -> its row-quantized int8 form, in place.

    A weight is an initializer of the node's graph or of a graph around it;
    its int8 form goes to the graph of the products that read it, once per
    graph (the module docstring says why). An input is quantized once
    however many weights it multiplies. Initializers nothing reads any more
    are removed. Returns the number of products quantized.
    """
    columns = {}  # (id of the graph holding W, W's name) -> quantize_columns(W)
    stored = {}  # (id of the consumer's graph, id of W's graph, W's name) -> initializer names
    taken = {t.name for g in _graphs(model.graph) for t in g.initializer}
    count = 0

    def store(graph, key, name):
        """The names of W's int8 codes and scales in `graph`, stored there once."""
        if (id(graph), *key) not in stored:
            while name in taken:
                name += "_"
            taken.add(name)
            arrays = dict(zip((name, f"{name}_scales"), columns[key], strict=True))
            graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in arrays.items())
            stored[(id(graph), *key)] = tuple(arrays)
        return stored[(id(graph), *key)]

    def visit(graph, scope):
        nonlocal count
        scope = dict(scope)
        rows = {}  # x -> (its uint8 rows, their ranges): Q, K and V read one x
        for tensor in graph.initializer:
            scope[tensor.name] = (graph, tensor)
        nodes = []
        for node in graph.node:
            for subgraph in _subgraphs(node):
                visit(subgraph, scope)
            holder, tensor, weight = _float_matrix(node, scope)
            if weight is None:
                nodes.append(node)
                continue
            key = (id(holder), tensor.name)
            if key not in columns:
                columns[key] = quantize_columns(weight)
            codes, scales = store(graph, key, f"{tensor.name}__int8")
            x = node.input[0]
            if x not in rows:  # quantized where it is first read, before every reader
                quantize, *rows[x] = _quantize_rows(x, prefix=f"{node.output[0]}__x")
                nodes += quantize
            nodes += _integer_product(*rows[x], codes, scales, node.output[0])
            count += 1
        graph.ClearField("node")
        graph.node.extend(nodes)

    visit(model.graph, {})
    if count:
        model.graph.initializer.extend(
            numpy_helper.from_array(value, name) for name, value in _CONSTANTS.items()
        )
    prune(model.graph)
    return count


def quantize_translate(path, int8_path):
    """Writes `translate.onnx` at `path` with int8 matrix products (`quantize_matmul_weights`)
    to `int8_path`.

    Returns:
        dict of what config.json records: the file and the scheme.
    """
    import onnx

    model = onnx.load(path)
    count = quantize_matmul_weights(model)
    onnx.checker.check_model(model)
    onnx.save(model, int8_path)
    return {
        "graph": os.path.basename(int8_path),
        "weights": "int8 codes in [-63, 63], one symmetric scale per output column",
        "activations": "int8, one symmetric scale per row (each token of each sentence)",
        "matmuls": count,
    }
