"""`export.tf2onnx_fixes`: tf2onnx wires an `If` branch in with consumer sets that hold
only the true readers (without the fix, every node of a branch reads every renamed
tensor: 3.4 GB for translate.onnx's search), and the graph computes the same."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf2onnx = pytest.importorskip("tf2onnx")

from keras_transformer.export import tf2onnx_fixes  # noqa: E402

STEPS = 60  # nodes in the branch: the false entries grow as their square


@tf.function(input_signature=[tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.bool)])
def _branchy(x, flag):
    def long_branch():
        y = x
        for i in range(STEPS):
            y = y * 1.5 + float(i)
        return y

    return tf.cond(flag, long_branch, lambda: x)


def _convert(monkeypatch, *fixes):
    """`(onnx model, largest consumer set of a branch right after tf2onnx wired it in)`."""
    import contextlib

    from tf2onnx.onnx_opset import controlflow

    largest = []
    prefix_graph = controlflow.prefix_graph

    def measured(g, scope):
        prefix_graph(g, scope)
        largest.append(max(len(readers) for readers in g._output_to_consumers.values()))

    monkeypatch.setattr(controlflow, "prefix_graph", measured)
    with contextlib.ExitStack() as stack:
        for fix in fixes:
            stack.enter_context(fix())
        model, _ = tf2onnx.convert.from_function(
            _branchy, input_signature=_branchy.input_signature, opset=17
        )
    return model, max(largest)


def _run(model, x, flag):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return session.run(None, {"x": x, "flag": np.array(flag)})[0]


def test_consumer_sets_hold_true_readers_and_the_graph_computes_the_same(monkeypatch):
    plain, plain_largest = _convert(monkeypatch)
    fixed, fixed_largest = _convert(monkeypatch, tf2onnx_fixes.consumers_only)
    assert plain_largest >= STEPS  # tf2onnx's own bookkeeping: the square of the branch
    assert fixed_largest <= 2  # each tensor of the branch is read by one or two nodes
    x = np.linspace(-2, 2, 7, dtype=np.float32)
    for flag in (True, False):
        expected = _branchy(tf.constant(x), tf.constant(flag)).numpy()
        np.testing.assert_array_equal(_run(plain, x, flag), expected)
        np.testing.assert_array_equal(_run(fixed, x, flag), expected)
    assert len(fixed.graph.node) == len(plain.graph.node)
