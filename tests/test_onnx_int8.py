"""`export.onnx_int8`: int8 matrix products with one activation scale per row.

On small graphs made here (no export fixture): a row's output is the same
bits alone and inside any batch, close to the float product; weights read
from a subgraph are quantized once; nothing is logged. translate_int8.onnx
itself is tested in test_onnx_translate.py (200 sentences alone and in
batches of 64).
"""

import logging

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from keras_transformer.export.onnx_int8 import (  # noqa: E402
    quantize_columns,
    quantize_matmul_weights,
)

K, N = 64, 48


def _model(weight):
    """y = x @ W and y2 = x @ -W in the main graph, z = x @ W inside an If branch (as the
    search reads its weights from its loop bodies); x is (B, T, K)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", K])
    branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["inner"])], "branch", [],
        [helper.make_tensor_value_info("inner", TensorProto.FLOAT, ["B", "T", N])],
    )  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("MatMul", ["x", "minus_w"], ["y2"]),
        helper.make_node("If", ["flag"], ["z"], then_branch=branch, else_branch=branch),
    ]
    graph = helper.make_graph(
        nodes, "g", [x],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "T", N]) for n in ("y", "y2", "z")],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(-weight, "minus_w"),
         numpy_helper.from_array(np.array(True), "flag")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _session(model):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@pytest.fixture(scope="module")
def quantized():
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((K, N)) * 0.1).astype(np.float32)
    weight[:, 3] = 0.0  # a column of zeros
    model = _model(weight)
    count = quantize_matmul_weights(model)
    onnx.checker.check_model(model, full_check=True)
    return weight, model, count


def test_columns_round_trip_to_half_a_step():
    weight = np.random.default_rng(1).standard_normal((K, N)).astype(np.float32)
    codes, scales = quantize_columns(weight)
    assert codes.dtype == np.int8 and codes.shape == (K, N) and scales.shape == (N,)
    step = 127 * scales  # one int8 step of each column
    assert np.all(np.abs(codes.astype(np.float32) * step - weight) <= step / 2 + 1e-7)
    assert np.all(np.abs(codes).max(axis=0) == 63)  # every column uses its 7 bits
    with pytest.raises(ValueError, match="Received: shape=\\(2, 3, 4\\)"):
        quantize_columns(np.zeros((2, 3, 4)))


def test_int8_weights_are_stored_where_they_are_read_and_inputs_quantized_once(quantized):
    """ONNX Runtime prepacks a weight for its integer GEMM only when the weight is an
    initializer of its consumer's own graph: each graph that reads W holds its codes."""
    _, model, count = quantized
    assert count == 4  # the main graph's two and each branch's
    main = [n.op_type for n in model.graph.node]
    assert "MatMul" not in main and main.count("MatMulInteger") == 2
    assert main.count("QuantizeLinear") == 1  # x, for both products
    names = [t.name for t in model.graph.initializer]
    assert "w" not in names and "minus_w" not in names
    assert {"w__int8", "minus_w__int8"} <= set(names)
    for branch in (a.g for a in model.graph.node[-1].attribute):
        assert [n.op_type for n in branch.node].count("MatMulInteger") == 1
        (weight,) = [n.input[1] for n in branch.node if n.op_type == "MatMulInteger"]
        assert weight in {t.name for t in branch.initializer}


def test_a_row_gives_the_same_bits_alone_and_in_any_batch(quantized):
    """Rows of very different ranges (one all zeros): each row's output alone equals its
    output inside the batch exactly, and is close to the float product."""
    weight, model, _ = quantized
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 3, K)).astype(np.float32)
    x[1] *= 1000.0  # a batch-wide scale would crush the other rows
    x[2, 1] = 0.0
    session = _session(model)
    y, y2, z = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, z)
    np.testing.assert_array_equal(y2, -y)
    for b in range(len(x)):
        for t in range(x.shape[1]):
            alone = session.run(["y"], {"x": x[b : b + 1, t : t + 1]})[0]
            np.testing.assert_array_equal(alone[0, 0], y[b, t])
    expected = x @ weight
    size = np.abs(x).max(axis=-1, keepdims=True) * np.abs(weight).sum(axis=0)  # |x| |W| bound
    assert np.all(np.abs(y - expected) <= 0.02 * size + 1e-6)
    np.testing.assert_array_equal(y[2, 1], 0.0)
    np.testing.assert_array_equal(y[..., 3], 0.0)


def test_products_are_exact_where_avx2_would_saturate():
    """The largest pairs there are (uint8 255 times weight code 63, every column at its
    maximum) sum exactly: with 8-bit codes (255 x 127 x 2 = 64,770) AVX2 without VNNI
    saturated each pair at 32,767 (this test failed on a Zen 3); 7-bit codes cannot."""
    weight = np.full((K, N), 0.5, np.float32)
    weight[:, 1] = -0.5
    model = _model(weight)
    quantize_matmul_weights(model)
    x = np.ones((2, 3, K), np.float32)
    x[1] = -1.0
    y, y2, _ = _session(model).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ weight, rtol=1e-6)
    np.testing.assert_allclose(y2, -(x @ weight), rtol=1e-6)


def test_quantizing_logs_nothing(caplog):
    """ONNX Runtime's quantizer logged about 90 INFO lines per export through the root
    logger; this pass logs none."""
    model = _model(np.ones((K, N), np.float32))
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, "keras_transformer"):
        quantize_matmul_weights(model)
    assert caplog.records == []
