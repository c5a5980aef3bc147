"""ONNX export: graph checks, and the encoder / decoder-step graphs equal Keras to 1e-4.

translate.onnx's translations are tested in test_onnx_translate.py (in a
process without TensorFlow); the two step graphs run here with plain
onnxruntime, which needs no onnxruntime-extensions ops.
"""

import os

import numpy as np
import pytest
from export_fixtures import exported, loaded_work_dir

pytestmark = pytest.mark.slow
TOLERANCE = 1e-4
FILES = ["config.json", "decoder_step.onnx", "encoder.onnx", "translate.onnx", "translate_int8.onnx",
         "translate_steered.onnx", "vocab.model"]  # fmt: skip


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)


@pytest.fixture(scope="module")
def sessions(export):
    import onnxruntime as ort

    def session(name):
        path = os.path.join(export[1]["onnx"], name)
        return ort.InferenceSession(path, providers=["CPUExecutionProvider"])

    return session("encoder.onnx"), session("decoder_step.onnx")


def test_graphs_pass_checker_with_dynamic_axes_and_opset(export):
    import onnx

    onnx_dir = export[1]["onnx"]
    assert sorted(os.listdir(onnx_dir)) == FILES
    for name in ("encoder.onnx", "decoder_step.onnx"):
        model = onnx.load(os.path.join(onnx_dir, name))
        onnx.checker.check_model(model, full_check=True)
        opsets = {o.domain: o.version for o in model.opset_import}
        assert opsets[""] <= 18, opsets
        for value in model.graph.input:
            dims = value.type.tensor_type.shape.dim
            # Axis 0 (batch) and every length axis are symbolic, not fixed sizes.
            assert dims[0].dim_param and not dims[0].dim_value, (name, value.name)
            if value.name in ("source_ids", "source_mask"):
                assert dims[1].dim_param, (name, value.name)
            if value.name.startswith(("self_", "cross_")):
                assert dims[2].dim_param, (name, value.name)


def _all_nodes(graph):
    import onnx

    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attribute.g)


def test_translate_graph_is_text_to_text_with_standard_and_extensions_ops(export):
    """sentences string [batch] -> translations string [batch]; ONNX and ai.onnx.contrib only."""
    import onnx

    model = onnx.load(os.path.join(export[1]["onnx"], "translate.onnx"))
    onnx.checker.check_model(model)
    (sentences,) = [i for i in model.graph.input if i.name == "sentences"]
    assert sentences.type.tensor_type.elem_type == onnx.TensorProto.STRING
    assert [d.dim_param for d in sentences.type.tensor_type.shape.dim] == ["batch"]
    (translations,) = model.graph.output
    assert translations.name == "translations"
    assert translations.type.tensor_type.elem_type == onnx.TensorProto.STRING
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets[""] <= 18 and set(opsets) <= {"", "ai.onnx.contrib"}  # tf2onnx's highest
    nodes = list(_all_nodes(model.graph))
    # The only custom ops are onnxruntime-extensions' (their ops are what makes it text in,
    # text out); that ONNX Runtime runs them is what test_onnx_translate.py shows.
    assert {n.domain for n in nodes} <= {"", "ai.onnx.contrib"}
    contrib = {n.op_type for n in nodes if n.domain == "ai.onnx.contrib"}
    assert {"SentencepieceTokenizer", "SentencepieceDecoder"} <= contrib
    # Optional inputs are initializers of the same name: their defaults.
    defaults = {t.name for t in model.graph.initializer}
    assert {"beam_size", "alpha", "max_extra_length"} <= defaults


def _source_batch(export):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(export[1]["onnx"], "vocab.model")
    )
    # Different lengths, so the batch has padding; one sentence longer than any in training.
    rows = [processor.encode(s) + [3] for s in
            ["haus", "katze hund baum", "brot milch kind frau mann schule tisch"]]  # fmt: skip
    source_ids = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        source_ids[i, : len(row)] = row
    return source_ids


def test_encoder_matches_keras(export, sessions):
    model, _, _ = loaded_work_dir(export[0])
    source_ids = _source_batch(export)
    encoder, _ = sessions
    cross_key, cross_value, source_mask = encoder.run(None, {"source_ids": source_ids})
    cache = model.init_cache(source_ids, 4)
    np.testing.assert_allclose(cross_key, np.asarray(cache["cross_key"]), atol=TOLERANCE)
    np.testing.assert_allclose(cross_value, np.asarray(cache["cross_value"]), atol=TOLERANCE)
    np.testing.assert_array_equal(source_mask, np.asarray(cache["source_mask"]))


def test_decoder_steps_match_keras(export, sessions):
    """Five steps fed the same tokens: logits and caches agree at every step."""
    model, _, _ = loaded_work_dir(export[0])
    source_ids = _source_batch(export)
    _, decoder_step = sessions
    cache = model.init_cache(source_ids, 6)
    onnx_cache = {k: np.asarray(v) for k, v in cache.items()}
    tokens = np.full(len(source_ids), 2, np.int32)
    for _ in range(5):
        logits, cache = model.decode_step(tokens, cache)
        feeds = {
            k: onnx_cache[k]
            for k in ("index", "self_key", "self_value", "cross_key", "cross_value", "source_mask")
        }
        feeds["token_ids"] = tokens
        onnx_logits, self_key, self_value = decoder_step.run(None, feeds)  # fmt: skip
        onnx_cache = dict(onnx_cache, index=onnx_cache["index"] + 1, self_key=self_key,
                          self_value=self_value)  # fmt: skip
        np.testing.assert_allclose(onnx_logits, np.asarray(logits), atol=TOLERANCE)
        np.testing.assert_allclose(self_key, np.asarray(cache["self_key"]), atol=TOLERANCE)
        np.testing.assert_allclose(self_value, np.asarray(cache["self_value"]), atol=TOLERANCE)
        tokens = np.asarray(logits).argmax(axis=-1).astype(np.int32)


def test_a_simplified_search_graph_that_translates_differently_is_not_exported(
    export, monkeypatch, caplog
):
    """The export runs the simplified search graph against tf2onnx's raw one on a few
    inputs; a pass that changed the outputs (here: one that adds 1 to every id) leaves
    the raw graph in the export, with a warning."""
    from onnx import helper, numpy_helper

    from keras_transformer.export import onnx_graphs

    model, _, _ = loaded_work_dir(export[0])
    simplify = onnx_graphs.simplify

    def breaking(proto):
        simplify(proto)
        name = proto.graph.output[0].name
        for node in proto.graph.node:
            node.output[:] = [f"{name}_raw" if out == name else out for out in node.output]
        proto.graph.initializer.append(numpy_helper.from_array(np.array(1, np.int32), "one"))
        proto.graph.node.append(helper.make_node("Add", [f"{name}_raw", "one"], [name]))

    monkeypatch.setattr(onnx_graphs, "simplify", breaking)
    defaults = {"alpha": np.array(0.6, np.float32)}
    feeds = onnx_graphs._check_feeds(model.config, (1,), defaults)
    with caplog.at_level("WARNING"):
        proto = onnx_graphs._convert(
            onnx_graphs.search_function(model, (1,)), onnx_graphs.TRANSLATE_OPSET, feeds
        )
    assert "unsimplified graph" in caplog.text
    assert "one" not in {i.name for i in proto.graph.initializer}
    # The package's own passes agree with the raw graph: no warning, the simplified graph.
    monkeypatch.setattr(onnx_graphs, "simplify", simplify)
    caplog.clear()
    with caplog.at_level("WARNING"):
        onnx_graphs._convert(
            onnx_graphs.search_function(model, (1,)), onnx_graphs.TRANSLATE_OPSET, feeds
        )
    assert "unsimplified graph" not in caplog.text


def _op_counts(model):
    import collections

    return collections.Counter(node.op_type for node in _all_nodes(model.graph))


def test_the_child_process_converts_to_tf2onnx_s_own_graph(export):
    """`onnx_convert.convert` (tf2onnx's second half in a child process, less the
    optimizers for ops these graphs never hold) writes the graph that
    `tf2onnx.convert.from_function` writes in this process: the same nodes per op type
    and the same outputs, on the greedy search (a Loop, its If, the sign-bit Bitcast and
    SelectV2 handlers)."""
    import onnxruntime as ort
    import tf2onnx
    from tf2onnx import optimizer

    from keras_transformer.export import onnx_convert, onnx_graphs

    assert set(onnx_convert.UNUSED_OPTIMIZERS) < set(optimizer._get_optimizers())
    model, _, _ = loaded_work_dir(export[0])
    function = onnx_graphs.search_function(model, (1,))
    child = onnx_convert.convert(function, onnx_graphs.TRANSLATE_OPSET)
    here, _ = tf2onnx.convert.from_function(
        function, input_signature=function.input_signature, opset=onnx_graphs.TRANSLATE_OPSET,
        custom_op_handlers=onnx_convert.HANDLERS,
    )  # fmt: skip
    assert _op_counts(child) == _op_counts(here)
    assert {"Loop", "If", "Where"} <= set(_op_counts(child))
    feeds = onnx_graphs._check_feeds(model.config, (1,), {"alpha": np.array(0.6, np.float32)})
    outputs = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feed
        )
        for m in (child, here)
        for feed in feeds
    ]
    half = len(outputs) // 2
    for a, b in zip(outputs[:half], outputs[half:], strict=True):
        np.testing.assert_array_equal(a[0], b[0])


def test_a_failed_conversion_names_the_function_and_its_child_error(export):
    from keras_transformer.export import onnx_convert, onnx_graphs

    model, _, _ = loaded_work_dir(export[0])
    with pytest.raises(RuntimeError, match="conversion of .*failed in its child process"):
        onnx_convert.convert(onnx_graphs.encoder_function(model), 99)
