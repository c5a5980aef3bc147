"""The graph clean-ups of the ONNX export compute what the graphs computed before them.

Small hand-built graphs with the two patterns tf2onnx leaves in the search
loop, run with onnxruntime before and after `onnx_passes`.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_transformer.export import onnx_passes, onnx_reshapes


def _run(model, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return session.run(None, feeds)


def _model(graph):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _loop_model():
    """acc <- acc @ w + bias, 4 times; w and bias ride along as loop state (as tf2onnx does)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["acc_in", "w_in"], ["product"]),
            helper.make_node("Add", ["product", "bias_in"], ["acc_out"]),
            helper.make_node("Identity", ["w_in"], ["w_out"]),
            helper.make_node("Identity", ["bias_in"], ["bias_out"]),
        ],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w_in", TensorProto.FLOAT, [3, 3]),
         helper.make_tensor_value_info("bias_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w_out", TensorProto.FLOAT, [3, 3]),
         helper.make_tensor_value_info("bias_out", TensorProto.FLOAT, [3])],
    )  # fmt: skip
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node(
                "Loop", ["trips", "", "x", "w", "bias"], ["acc", "w_final", "bias_final"], body=body
            ),
            helper.make_node("Add", ["acc", "bias_final"], ["y"]),
        ],
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [
            numpy_helper.from_array(np.array(4, np.int64), "trips"),
            numpy_helper.from_array(rng.normal(size=(3, 3)).astype(np.float32) / 2, "w"),
            numpy_helper.from_array(rng.normal(size=3).astype(np.float32), "bias"),
        ],
    )
    return _model(graph)


def test_loop_invariants_become_outer_references():
    model = _loop_model()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (expected,) = _run(model, {"x": x})
    assert onnx_passes.hoist_loop_invariants(model.graph) == 2
    onnx_passes.prune(model.graph)
    onnx.checker.check_model(model, full_check=True)
    (loop,) = [n for n in model.graph.node if n.op_type == "Loop"]
    assert list(loop.input) == ["trips", "", "x"] and list(loop.output) == ["acc"]
    (got,) = _run(model, {"x": x})
    np.testing.assert_array_equal(got, expected)


def _outer_weights_model():
    """Two loops that each reshape and transpose the outer graph's weight on every iteration:
    acc <- acc @ reshape(w, (3, 3)).T, as the search's greedy and beam loops read a kernel."""

    def body(tag):
        return helper.make_graph(
            [
                helper.make_node("Identity", ["cond_in"], [f"cond_out_{tag}"]),
                helper.make_node("Reshape", ["w_flat", "shape"], [f"w_{tag}"]),
                helper.make_node("Transpose", [f"w_{tag}"], [f"wt_{tag}"], perm=[1, 0]),
                helper.make_node("MatMul", ["acc_in", f"wt_{tag}"], [f"acc_out_{tag}"]),
            ],
            f"body_{tag}",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info(f"cond_out_{tag}", TensorProto.BOOL, []),
             helper.make_tensor_value_info(f"acc_out_{tag}", TensorProto.FLOAT, [2, 3])],
        )  # fmt: skip

    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [
            helper.make_node("Loop", ["trips", "", "x"], ["a"], body=body("a")),
            helper.make_node("Loop", ["trips", "", "x"], ["b"], body=body("b")),
            helper.make_node("Sub", ["a", "b"], ["y"]),
            helper.make_node("Identity", ["a"], ["z"]),
        ],
        "loops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])],
        [
            numpy_helper.from_array(np.array(3, np.int64), "trips"),
            numpy_helper.from_array(rng.normal(size=(3, 3, 1)).astype(np.float32), "w_flat"),
            numpy_helper.from_array(np.array([0, -1], np.int64), "shape"),  # 0: copy dim 0
        ],
    )  # fmt: skip
    return _model(graph)


def test_outer_weights_are_reshaped_once_for_all_loops():
    model = _outer_weights_model()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = _run(model, {"x": x})
    assert onnx_passes.fold_outer_constants(model) == 4  # a Reshape and a Transpose per loop
    onnx_passes.prune(model.graph)
    onnx.checker.check_model(model, full_check=True)
    bodies = [n.attribute[0].g for n in model.graph.node if n.op_type == "Loop"]
    assert [[n.op_type for n in body.node] for body in bodies] == [["Identity", "MatMul"]] * 2
    assert bodies[0].node[1].input[1] == bodies[1].node[1].input[1]  # one folded weight
    names = [t.name for t in model.graph.initializer]
    assert len(names) == 2 and "trips" in names  # w_flat and shape are no longer read
    got = _run(model, {"x": x})
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    w = numpy_helper.to_array(model.graph.initializer[names.index(bodies[0].node[1].input[1])])
    np.testing.assert_array_equal(
        w, numpy_helper.to_array(_outer_weights_model().graph.initializer[1])[..., 0].T
    )


def test_each_loop_multiplies_by_its_own_copy_of_an_outer_weight():
    model = _outer_weights_model()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = _run(model, {"x": x})
    onnx_passes.fold_outer_constants(model)  # the weight is now one main-graph initializer
    assert onnx_passes.localize_matmul_weights(model) == 2  # one copy per loop body
    onnx.checker.check_model(model, full_check=True)
    bodies = [n.attribute[0].g for n in model.graph.node if n.op_type == "Loop"]
    for body in bodies:
        (matmul,) = [n for n in body.node if n.op_type == "MatMul"]
        assert [t.name for t in body.initializer] == [matmul.input[1]]
    assert bodies[0].initializer[0].name != bodies[1].initializer[0].name  # no shadowing
    assert [t.name for t in model.graph.initializer] == ["trips"]  # the outer copy is pruned
    for got, want in zip(_run(model, {"x": x}), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert onnx_passes.localize_matmul_weights(model) == 0  # idempotent


def _tensordot_model(contracted_axis):
    """tf.tensordot(x (2, 5, 4), w (4, 3)) as tf2onnx writes it, flattening around one axis."""
    free = [a for a in range(3) if a != contracted_axis]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "free"], ["free_dims"], axis=0),
        helper.make_node("Gather", ["shape", "axes"], ["axes_dims"], axis=0),
        helper.make_node("ReduceProd", ["free_dims"], ["free_size"], keepdims=0),
        helper.make_node("ReduceProd", ["axes_dims"], ["axes_size"], keepdims=0),
        helper.make_node("Unsqueeze", ["free_size", "zero"], ["free_size_1"]),
        helper.make_node("Unsqueeze", ["axes_size", "zero"], ["axes_size_1"]),
        helper.make_node("Concat", ["free_size_1", "axes_size_1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["product"]),
        helper.make_node("Concat", ["free_dims", "units"], ["out_shape"], axis=0),
        helper.make_node("Reshape", ["product", "out_shape"], ["y"]),
    ]
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        nodes,
        "tensordot",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "T", 3])],
        [
            numpy_helper.from_array(np.array(free, np.int64), "free"),
            numpy_helper.from_array(np.array([contracted_axis], np.int64), "axes"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([3], np.int64), "units"),
            numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w"),
        ],
    )
    return _model(graph)


def test_flattening_matmul_reads_the_unflattened_input():
    model = _tensordot_model(contracted_axis=2)
    x = np.random.default_rng(2).normal(size=(2, 5, 4)).astype(np.float32)
    (expected,) = _run(model, {"x": x})
    assert onnx_reshapes.fold_flattening_matmuls(model.graph) == 1
    assert onnx_passes.prune(model.graph) > 0
    (matmul,) = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert list(matmul.input) == ["x", "w"]
    assert "flat" not in {o for n in model.graph.node for o in n.output}
    assert "axes" not in {t.name for t in model.graph.initializer}  # unused now: removed
    (got,) = _run(model, {"x": x})
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("contracted_axis", [0, 1])
def test_other_flattenings_are_left_alone(contracted_axis):
    """Contracting any axis but the last is not a broadcast MatMul: no rewrite."""
    model = _tensordot_model(contracted_axis)
    assert onnx_reshapes.fold_flattening_matmuls(model.graph) == 0


def _split_heads_model(shape_of):
    """MatMul(x (B, T, 8), w) split to (B, T, 2, 4) and "merged" to (B, T, 8), as tf2onnx writes it.

    The split reads dims 0 and 1 of `Shape(shape_of)` (Slice), the merge
    dims 0 and 1 of `Shape(x)` (Gather), each with Casts around them.
    """
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["projected"]),
        helper.make_node("Shape", [shape_of], ["shape64"]),
        helper.make_node("Cast", ["shape64"], ["shape"], to=TensorProto.INT32),
        helper.make_node("Slice", ["shape", "zero", "two", "zero"], ["leading"]),
        helper.make_node("Concat", ["leading", "heads"], ["split32"], axis=0),
        helper.make_node("Cast", ["split32"], ["split"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["projected", "split"], ["heads_out"]),
        helper.make_node("Shape", ["x"], ["x_shape64"]),
        helper.make_node("Cast", ["x_shape64"], ["x_shape"], to=TensorProto.INT32),
        helper.make_node("Gather", ["x_shape", "free"], ["free_dims"], axis=0),
        helper.make_node("Concat", ["free_dims", "units"], ["merge32"], axis=0),
        helper.make_node("Cast", ["merge32"], ["merge"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["projected", "merge"], ["merged"]),
        helper.make_node("Relu", ["merged"], ["activated"]),
    ]
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        nodes,
        "split_heads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", 8]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["B", "T", 8])],
        [helper.make_tensor_value_info("heads_out", TensorProto.FLOAT, ["B", "T", 2, 4]),
         helper.make_tensor_value_info("activated", TensorProto.FLOAT, ["B", "T", 8])],
        [numpy_helper.from_array(np.array([0], np.int32), "zero"),
         numpy_helper.from_array(np.array([2], np.int32), "two"),
         numpy_helper.from_array(np.array([2, 4], np.int32), "heads"),
         numpy_helper.from_array(np.array([0, 1], np.int32), "free"),
         numpy_helper.from_array(np.array([8], np.int32), "units"),
         numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), "w")],
    )  # fmt: skip
    return _model(graph)


def _reshape_targets(model):
    constants = {t.name: numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    return [constants.get(n.input[1]) for n in model.graph.node if n.op_type == "Reshape"]


def test_reshape_shapes_copied_from_the_input_become_constants():
    model = _split_heads_model(shape_of="x")
    feeds = {
        name: np.random.default_rng(4).normal(size=(3, 5, 8)).astype(np.float32)
        for name in ("x", "z")
    }
    expected = _run(model, feeds)
    shapes = onnx_reshapes._ranks(model)
    assert onnx_reshapes.static_reshape_shapes(model.graph, shapes) == 2
    assert onnx_passes.prune(model.graph) > 0
    onnx.checker.check_model(model, full_check=True)
    # The split copies B and T with 0; the merge to (B, T, 8) of a (B, T, 8) product is gone.
    assert _reshape_targets(model) == [[0, 0, 2, 4]]
    left = {n.op_type for n in model.graph.node}
    assert not {"Shape", "Gather", "Slice", "Concat", "Cast"} & left
    got = _run(model, feeds)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


def test_shapes_of_other_tensors_stay_dynamic():
    """z has x's declared shape, but nothing in the graph proves its dims equal x's."""
    model = _split_heads_model(shape_of="z")
    shapes = onnx_reshapes._ranks(model)
    assert onnx_reshapes.static_reshape_shapes(model.graph, shapes) == 1  # only the merge
    assert _reshape_targets(model)[0] is None  # the split still reads Shape(z)
