"""The export's fusions compute what tf2onnx's nodes computed, and fire only where they
provably do.

Hand-built graphs with the patterns tf2onnx writes (TensorFlow's layer norm,
a transpose pushed through a cache's append), run with onnxruntime before
and after `onnx_fusions`; and the variants that must be left alone.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_transformer.export import onnx_fusions


def _run(model, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return session.run(None, feeds)


def _layer_norm_model(axes=(-1,), square_input="d", gamma_shape=(1, 1, 8), extra_read=False):
    """TensorFlow's `tf.nn.moments` + `batch_normalization` as tf2onnx writes them."""
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(np.array(axes, np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "epsilon"),
        numpy_helper.from_array(rng.normal(size=gamma_shape).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "beta"),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
        helper.make_node("Neg", ["mean"], ["neg"]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Mul", ["d", square_input], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1),
        helper.make_node("Add", ["var", "epsilon"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["r", "gamma"], ["g"]),
        helper.make_node("Mul", ["x", "g"], ["xg"]),
        helper.make_node("Mul", ["neg", "g"], ["ng"]),
        helper.make_node("Add", ["ng", "beta"], ["b"]),
        helper.make_node("Add", ["xg", "b"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])]
    if extra_read:  # an intermediate that something else reads: not a plain layer norm
        outputs.append(helper.make_tensor_value_info("var", TensorProto.FLOAT, [2, 3, 1]))
    graph = helper.make_graph(
        nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
        outputs, initializers,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_tensorflows_layer_norm_becomes_one_node_with_the_same_values():
    model = _layer_norm_model()
    x = np.random.default_rng(1).normal(size=(2, 3, 8)).astype(np.float32) * 3 + 1
    (before,) = _run(model, {"x": x})
    assert onnx_fusions.fuse_layer_norms(model) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["LayerNormalization"]
    (after,) = _run(model, {"x": x})
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    assert onnx_fusions.fuse_layer_norms(model) == 0  # idempotent


@pytest.mark.parametrize(
    "variant",
    [
        {"axes": (1,)},  # a reduction over another axis than the last
        {"square_input": "x"},  # not the variance: (x - mean) * x
        {"gamma_shape": (3, 8)},  # a scale that varies along another axis
        {"extra_read": True},  # the variance is also an output
    ],
)
def test_what_is_not_a_layer_norm_over_the_last_axis_is_left_alone(variant):
    model = _layer_norm_model(**variant)
    nodes = len(model.graph.node)
    assert onnx_fusions.fuse_layer_norms(model) == 0
    assert len(model.graph.node) == nodes


def test_below_opset_17_nothing_is_fused():
    model = _layer_norm_model()
    model.opset_import[0].version = 16
    assert onnx_fusions.fuse_layer_norms(model) == 0


def _append_model(second_perm=(0, 2, 3, 1), read_in_branch=False):
    """cache (B, N, H, T) -> Transpose to (B, T, N, H), Concat a step (B, 1, N, H) on T,
    Transpose back: tf2onnx's form of appending a transposed key to the cache."""
    nodes = [
        helper.make_node("Transpose", ["cache"], ["t1"], perm=[0, 3, 1, 2]),
        helper.make_node("Concat", ["t1", "step"], ["joined"], axis=1),
        helper.make_node("Transpose", ["joined"], ["y"], perm=list(second_perm)),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list("bnht"))]
    if read_in_branch:  # a subgraph reads the untransposed concatenation
        branch = helper.make_graph(
            [helper.make_node("Identity", ["joined"], ["z_branch"])], "branch", [],
            [helper.make_tensor_value_info("z_branch", TensorProto.FLOAT, [2, 6, 3, 4])],
        )  # fmt: skip
        nodes.append(helper.make_node("If", ["flag"], ["z"], then_branch=branch,
                                      else_branch=branch))  # fmt: skip
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 6, 3, 4]))
    inputs = [
        helper.make_tensor_value_info("cache", TensorProto.FLOAT, [2, 3, 4, 5]),
        helper.make_tensor_value_info("step", TensorProto.FLOAT, [2, 1, 3, 4]),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
    ]
    graph = helper.make_graph(nodes, "append", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _append_feeds():
    rng = np.random.default_rng(2)
    return {
        "cache": rng.normal(size=(2, 3, 4, 5)).astype(np.float32),
        "step": rng.normal(size=(2, 1, 3, 4)).astype(np.float32),
        "flag": np.array(True),
    }


def test_appending_to_a_cache_transposes_the_step_not_the_cache():
    model = _append_model()
    before = _run(model, _append_feeds())
    assert onnx_fusions.cancel_concat_transposes(model) == 1
    onnx.checker.check_model(model, full_check=True)
    transposes = [n for n in model.graph.node if n.op_type == "Transpose"]
    assert [n.input[0] for n in transposes] == ["step"]  # the cache is read as it is
    after = _run(model, _append_feeds())
    np.testing.assert_array_equal(after[0], before[0])
    assert after[0].shape == (2, 3, 4, 6)


@pytest.mark.parametrize(
    "variant", [{"second_perm": (0, 1, 2, 3)}, {"read_in_branch": True}],
    ids=["transposes_that_do_not_cancel", "concatenation_read_by_a_subgraph"],
)  # fmt: skip
def test_a_transpose_pair_that_is_not_a_plain_append_is_left_alone(variant):
    model = _append_model(**variant)
    assert onnx_fusions.cancel_concat_transposes(model) == 0
