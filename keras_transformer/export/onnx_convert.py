"""tf2onnx's conversion of a traced `tf.function`, its second half in a child process.

`tf2onnx.convert.from_function` freezes the function (its variables made
constants, then TensorFlow's grappler) and converts the frozen graph
(`_convert_common`: TensorFlow ops to ONNX nodes, then tf2onnx's optimizers).
The conversion of translate.onnx's search is the export's peak: about 1.3 GB
over the process it runs in, mostly graph copies that tf2onnx's optimizers
make and leave to the garbage collector. Run in the exporting process, that
sits on top of what the process already holds (Keras, the model, the traced
search: 0.9 GB, more after each graph); run here in a child, on top of
TensorFlow's import alone, while the exporting process waits on the frozen
graph. `convert` is `from_function` with the same arguments: the same graph
comes out (tests/test_export_onnx.py), minus four optimizers that act only on
ops these graphs never hold (`UNUSED_OPTIMIZERS`: each pass of each copies
the graph), with a full garbage collection before each optimizer.

    python -m keras_transformer.export.onnx_convert IN OUT

(what `convert` runs: IN holds the frozen graph and the conversion's
settings, OUT gets the ONNX model).
"""

import gc
import logging
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np

logger = logging.getLogger(__name__)

# tf2onnx's optimizers for ops that the exported graphs never hold (Upsample and
# Resize, DequantizeLinear and QuantizeLinear, Einsum): nothing to do but copy the
# graph, 3 passes each. (The global-pool one does act: the layer norms' means.)
UNUSED_OPTIMIZERS = (
    "remove_redundant_upsample", "const_dequantize_optimizer", "q_dq_optimizer",
    "einsum_optimizer",
)  # fmt: skip


def sign_bit_bitcast(ctx, node, name, args):
    """tf2onnx handler: `tf.bitcast(float32 -> int32)` as `keras.ops.signbit` uses it.

    Keras's float `argmax` (greedy search) tells -0.0 from 0.0 with
    `bitwise_and(bitcast(x, int32), INT32_MIN) < 0`. ONNX has no bitcast;
    this emits `INT32_MIN` where the sign bit of x is set and 0 elsewhere,
    which is exact for that use and refused for any other.
    """
    from onnx import TensorProto
    from tf2onnx import utils

    int32_min = np.iinfo(np.int32).min
    for consumer in ctx.find_output_consumers(node.output[0]):
        others = [i for i in consumer.input if i != node.output[0]]
        if not (
            consumer.type == "BitwiseAnd"
            and len(others) == 1
            and ctx.is_const(others[0])
            and np.all(ctx.get_tensor_value(others[0], as_list=False) == int32_min)
        ):
            raise ValueError(
                f"Only the sign-bit Bitcast of keras.ops.signbit converts to ONNX. "
                f"Received: {node.name} feeding {consumer.type} {consumer.name}"
            )
    x, outputs = node.input[0], list(node.output)
    ctx.remove_node(node.name)

    def const(value, dtype):
        return ctx.make_const(utils.make_name("sign_bit"), np.array(value, dtype)).output[0]

    def op(op_type, *inputs):
        return ctx.make_node(op_type, list(inputs)).output[0]

    zero = const(0.0, np.float32)
    # Negative, or -0.0 (the only zero whose reciprocal is negative: -inf).
    negative_zero = op("And", op("Equal", x, zero), op("Less", op("Reciprocal", x), zero))
    sign = op("Or", op("Less", x, zero), negative_zero)
    ctx.make_node(
        "Where", [sign, const(int32_min, np.int32), const(0, np.int32)],
        outputs=outputs, name=name, dtypes=[TensorProto.INT32],
    )  # fmt: skip


def select_as_where(ctx, node, name, args):
    """tf2onnx handler: `tf.where` (SelectV2) as one ONNX `Where`.

    tf2onnx's own handler writes `cond * x + (1 - cond) * y` (5 nodes, and
    NaN where the unselected side is infinite); `Where` broadcasts exactly
    as SelectV2 does.
    """
    node.type = "Where"


HANDLERS = {"Bitcast": (sign_bit_bitcast, []), "SelectV2": (select_as_where, [])}


def freeze(function):
    """`(frozen GraphDef, settings)` of a `tf.function` with an input signature: the
    first half of `tf2onnx.convert.from_function`, with its names."""
    import tensorflow as tf
    from tf2onnx import tf_loader
    from tf2onnx.convert import tensor_names_from_structed

    concrete = function.get_concrete_function(*function.input_signature)
    inputs = [t.name for t in concrete.inputs if t.dtype != tf.dtypes.resource]
    outputs = [t.name for t in concrete.outputs if t.dtype != tf.dtypes.resource]
    with tf.device("/cpu:0"):
        graph_def = tf_loader.from_function(concrete, inputs, outputs)
    settings = {
        "name": concrete.name,
        "input_names": inputs,
        "output_names": outputs,
        "tensors_to_rename": tensor_names_from_structed(concrete, inputs, outputs),
    }
    return graph_def, settings


def _optimizers():
    """tf2onnx's optimizers less `UNUSED_OPTIMIZERS`, each after a full collection."""
    from tf2onnx import optimizer

    def collected(factory):
        def make():
            gc.collect()  # the previous optimizer's copy of the graph (reference cycles)
            return factory()

        return make

    return {
        name: collected(factory)
        for name, factory in optimizer._get_optimizers().items()
        if name not in UNUSED_OPTIMIZERS
    }


def convert_frozen(graph_def, opset, settings):
    """`onnx.ModelProto` of a frozen graph: `from_function`'s second half, as it calls it."""
    import tensorflow as tf
    from tf2onnx.convert import _convert_common

    from keras_transformer.export.tf2onnx_fixes import consumers_only

    with tf.device("/cpu:0"), consumers_only():  # consumers_only: tf2onnx_fixes
        model_proto, _ = _convert_common(
            graph_def, continue_on_error=True, opset=opset, custom_op_handlers=HANDLERS,
            optimizers=_optimizers(), **settings,
        )  # fmt: skip
    return model_proto


def convert(function, opset):
    """`tf2onnx.convert.from_function(function, ...)`'s `onnx.ModelProto`, converted in a
    child process (see the module docstring)."""
    import onnx

    graph_def, settings = freeze(function)
    with tempfile.TemporaryDirectory(prefix="keras_transformer_onnx_") as folder:
        request, answer = os.path.join(folder, "in.pickle"), os.path.join(folder, "out.onnx")
        with open(request, "wb") as f:
            pickle.dump({"graph_def": graph_def.SerializeToString(), "opset": opset,
                         "settings": settings}, f)  # fmt: skip
        del graph_def
        gc.collect()
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        command = [sys.executable, "-m", "keras_transformer.export.onnx_convert", request, answer]
        result = subprocess.run(command, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(
                f"tf2onnx's conversion of {settings['name']} failed in its child process "
                f"(exit {result.returncode}):\n{result.stderr[-3000:]}"
            )
        if result.stderr.strip():  # tf2onnx's own log lines, TensorFlow's
            logger.debug("tf2onnx's child process: %s", result.stderr[-3000:])
        return onnx.load(answer)


def main(argv=None):
    request, answer = argv if argv is not None else sys.argv[1:]
    import tensorflow as tf

    with open(request, "rb") as f:
        job = pickle.load(f)
    graph_def = tf.compat.v1.GraphDef.FromString(job["graph_def"])
    model_proto = convert_frozen(graph_def, job["opset"], job["settings"])
    with open(answer, "wb") as f:
        f.write(model_proto.SerializeToString())


if __name__ == "__main__":
    main()
