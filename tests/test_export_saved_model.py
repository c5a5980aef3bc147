"""The SavedModel export: served outside this project, with only core TF and TF Text ops.

One tiny trained work directory is exported once per session
(`export_fixtures.exported`); a fresh subprocess that imports only
`tensorflow` and `tensorflow_text` loads it (TF2 and TF1-session loaders,
the latter being what TF Serving does) and its translations must equal the
Keras model's.
"""

import base64
import json
import os
import subprocess
import sys
import textwrap

import pytest
from export_fixtures import exported, held_out_sentences, keras_translations, loaded_saved_model

pytestmark = pytest.mark.slow

# Runs in a fresh interpreter: no keras, no keras_transformer.
_FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry

    export_dir, sentences = sys.argv[1], json.loads(sys.argv[2])
    from tensorflow.core.protobuf import saved_model_pb2
    proto = saved_model_pb2.SavedModel()
    with open(export_dir + "/saved_model.pb", "rb") as f:
        proto.ParseFromString(f.read())
    ops, functions = set(), set()
    for meta_graph in proto.meta_graphs:
        ops.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            functions.add(function.signature.name)
            ops.update(node.op for node in function.node_def)
    ops -= functions  # calls of library functions by name
    core_ops = sorted(op for op in ops if op_def_registry.get(op) is not None)

    import tensorflow_text  # noqa: F401  registers the SentencePiece ops
    text_ops = sorted(op for op in ops if op not in core_ops and op_def_registry.get(op))
    unknown_ops = sorted(ops - set(core_ops) - set(text_ops))

    loaded = tf.saved_model.load(export_dir)
    results = {"signatures": sorted(loaded.signatures)}
    for name in ("serving_default", "translate_greedy"):
        out = loaded.signatures[name](sentences=tf.constant(sentences))
        results[name] = [t.decode("utf-8") for t in out["translations"].numpy()]

    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        signature = meta_graph.signature_def["translate_greedy"]
        feed = {signature.inputs["sentences"].name: sentences}
        fetched = session.run(signature.outputs["translations"].name, feed_dict=feed)
        results["tf1_translate_greedy"] = [t.decode("utf-8") for t in fetched]
        results["tf1_method"] = meta_graph.signature_def["serving_default"].method_name

    results.update(
        core_ops=core_ops, text_ops=text_ops, unknown_ops=unknown_ops,
        project_modules=sorted(
            m for m in sys.modules if m.split(".")[0] in ("keras_transformer", "keras_hub")
        ),
    )
    print("RESULTS" + json.dumps(results))
    """
)
_RESULTS = {}


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)


@pytest.fixture(scope="module")
def sentences():
    return held_out_sentences(50)


@pytest.fixture(scope="module")
def fresh(export, sentences):
    """What a fresh `tensorflow` + `tensorflow_text` process gets from the SavedModel."""
    if "fresh" not in _RESULTS:
        _, paths = export
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("KERAS_BACKEND", None)
        completed = subprocess.run(
            [sys.executable, "-c", _FRESH_PROCESS, paths["saved_model"], json.dumps(sentences)],
            capture_output=True, text=True, timeout=300, env=env, cwd="/",
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr[-3000:]
        line = [x for x in completed.stdout.splitlines() if x.startswith("RESULTS")][-1]
        _RESULTS["fresh"] = json.loads(line[len("RESULTS") :])
    return _RESULTS["fresh"]


def test_layout_is_tf_serving_layout(export):
    _, paths = export
    version_dir = paths["saved_model"]
    # saved_models/<name>/<version>, the name from run.json's direction.
    assert version_dir.endswith(os.path.join("transformer_de_en", "1"))
    assert paths["onnx"].endswith(os.path.join("transformer_de_en", "onnx", "1"))
    assert os.path.isfile(os.path.join(version_dir, "saved_model.pb"))
    assert os.path.isdir(os.path.join(version_dir, "variables"))
    siblings = os.listdir(os.path.dirname(version_dir))
    assert not [s for s in siblings if s.startswith(".")], siblings  # no staging leftovers


def test_fresh_process_loads_without_project_code(fresh):
    assert fresh["project_modules"] == []
    assert fresh["signatures"] == sorted(
        ["serving_default", "translate_greedy", "translate_ids", "greedy_ids", "translate_steered"]
    )


def test_serving_default_matches_keras_translator(export, fresh, sentences):
    work_dir, _ = export
    expected = keras_translations(work_dir, sentences, beam_size=4)
    assert fresh["serving_default"] == expected
    assert len(set(expected)) > 10  # the outputs depend on the input


def test_greedy_signature_matches_keras(export, fresh, sentences):
    work_dir, _ = export
    assert fresh["translate_greedy"] == keras_translations(work_dir, sentences, beam_size=1)


def test_tf1_session_loader(fresh):
    """`tf.compat.v1.saved_model.loader.load` in a Graph/Session: what TF Serving runs."""
    assert fresh["tf1_translate_greedy"] == fresh["translate_greedy"]
    assert fresh["tf1_method"] == "tensorflow/serving/predict"


def test_only_core_and_tf_text_ops(fresh):
    """Every op is core TensorFlow or TF Text's SentencePiece; no XLA-only op."""
    all_ops = fresh["core_ops"] + fresh["text_ops"] + fresh["unknown_ops"]
    assert fresh["unknown_ops"] == []
    assert [op for op in all_ops if op.startswith("Xla")] == []
    assert fresh["text_ops"], "the SentencePiece ops should be in the graph"
    assert all(op.startswith("Sentencepiece") for op in fresh["text_ops"]), fresh["text_ops"]
    assert "While" in fresh["core_ops"] or "StatelessWhile" in fresh["core_ops"]


def test_ids_signatures_match_text_signatures(export, sentences):
    import numpy as np
    import sentencepiece
    import tensorflow as tf

    work_dir, paths = export
    loaded = _loaded(paths["saved_model"])
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(work_dir, "vocab.model")
    )
    rows = [processor.encode(s) + [3] for s in sentences[:10]]  # pieces, EOS
    source_ids = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        source_ids[i, : len(row)] = row
    pairs = (("translate_ids", "serving_default"), ("greedy_ids", "translate_greedy"))
    for ids_name, text_name in pairs:
        target_ids = loaded.signatures[ids_name](source_ids=tf.constant(source_ids))["target_ids"]
        texts = loaded.signatures[text_name](sentences=tf.constant(sentences[:10]))["translations"]
        decoded = [processor.decode(row[: row.index(3)] if 3 in row else row)
                   for row in np.asarray(target_ids).tolist()]  # fmt: skip
        assert decoded == [t.decode() for t in texts.numpy()]


def test_rest_payloads_give_documented_response_shapes(export, sentences):
    from keras_transformer.export.rest import predict

    _, paths = export
    signature = _loaded(paths["saved_model"]).signatures["translate_greedy"]
    batch = sentences[:3]
    expected = [t.decode() for t in signature(sentences=tf_constant(batch))["translations"].numpy()]
    row = json.loads(json.dumps(predict(signature, {"instances": batch})))
    assert row == {"predictions": expected}
    named_rows = predict(signature, {"instances": [{"sentences": s} for s in batch]})
    assert named_rows == {"predictions": expected}
    assert predict(signature, {"inputs": batch}) == {"outputs": expected}
    assert predict(signature, {"inputs": {"sentences": batch}}) == {"outputs": expected}
    # Bytes that are not UTF-8 travel base64-encoded, as TF Serving's REST API expects.
    encoded = {"b64": base64.b64encode(b"haus katze").decode()}
    assert predict(signature, {"instances": [encoded]}) == predict(
        signature, {"instances": ["haus katze"]}
    )
    assert predict(signature, {"instances": []}) == {"predictions": []}
    with pytest.raises(ValueError, match="exactly one of"):
        predict(signature, {"instances": batch, "inputs": batch})


def tf_constant(values):
    import tensorflow as tf

    return tf.constant(values)


def _loaded(path):
    return loaded_saved_model(path)


# Refusals: the work directory and the target version.


def test_refuses_missing_work_dir(tmp_path):
    from keras_transformer.export import export_all

    with pytest.raises(FileNotFoundError, match="does not exist.*train.py"):
        export_all(str(tmp_path / "nope"), output_dir=str(tmp_path / "out"))


def test_refuses_untrained_work_dir(tmp_path):
    from keras_transformer.export import export_all

    work_dir = tmp_path / "work"
    work_dir.mkdir()
    (work_dir / "vocab.model").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no trained model.*model\.keras"):
        export_all(str(work_dir), output_dir=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_refuses_existing_version_without_overwrite(export, tmp_path):
    from keras_transformer.export import export_all

    work_dir, paths = export
    model_dir = os.path.dirname(paths["saved_model"])
    before = os.path.getmtime(os.path.join(paths["saved_model"], "saved_model.pb"))
    with pytest.raises(FileExistsError, match="--overwrite"):
        export_all(
            work_dir, output_dir=os.path.dirname(model_dir), name=os.path.basename(model_dir),
            version=1,
        )  # fmt: skip
    assert os.path.getmtime(os.path.join(paths["saved_model"], "saved_model.pb")) == before


def test_atomic_directory_leaves_nothing_on_failure(tmp_path):
    from keras_transformer.export.artifacts import atomic_directory

    target = tmp_path / "model" / "3"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_directory(str(target)) as staging:
            open(os.path.join(staging, "half_written"), "w").close()
            raise RuntimeError("boom")
    assert os.listdir(tmp_path / "model") == []
    with atomic_directory(str(target)) as staging:
        open(os.path.join(staging, "done"), "w").close()
    assert os.listdir(target) == ["done"]
    with pytest.raises(FileExistsError):
        with atomic_directory(str(target)):
            pass
    with atomic_directory(str(target), overwrite=True) as staging:
        open(os.path.join(staging, "new"), "w").close()
    assert os.listdir(target) == ["new"]
    assert sorted(os.listdir(tmp_path / "model")) == ["3"]


def _fake_exporters(monkeypatch, failing=None):
    """export_all's three exporters replaced by ones that write a file (or raise)."""
    import keras_transformer.export as export_package
    from keras_transformer.export import ctranslate2, onnx_graphs, saved_model

    def exporter(format_name):
        def write(*args, **kwargs):
            if format_name == failing:
                raise RuntimeError(f"{format_name} failed")
            directory = args[2]
            with open(os.path.join(directory, format_name), "w") as f:
                f.write("new")

        return write

    monkeypatch.setattr(saved_model, "export_saved_model", exporter("saved_model"))
    monkeypatch.setattr(onnx_graphs, "export_onnx", exporter("onnx"))
    monkeypatch.setattr(ctranslate2, "export", exporter("ctranslate2"))
    monkeypatch.setattr(export_package, "check_work_dir", lambda work_dir: {})
    monkeypatch.setattr(export_package, "load_work_dir", lambda work_dir: (None, None, {}))


def _versions(root):
    """relative path -> the files in it, of every version directory under `root`."""
    found = {}
    for directory, _, files in os.walk(root):
        if os.path.basename(directory).isdigit():
            found[os.path.relpath(directory, root)] = sorted(files)
    return found


@pytest.mark.parametrize("failing", ["saved_model", "onnx", "ctranslate2"])
def test_a_failing_format_leaves_no_part_of_the_version(tmp_path, monkeypatch, failing):
    """One version directory holds every format or none: a failure in any exporter leaves
    no new version, and an overwritten version keeps its old files."""
    from keras_transformer.export import FORMATS, export_all

    _fake_exporters(monkeypatch)
    export_all("work", output_dir=str(tmp_path), name="m", formats=FORMATS)
    before = _versions(tmp_path)
    assert before == {
        "m/1": ["saved_model"],
        "m/onnx/1": ["onnx"],
        "m/ctranslate2/1": ["ctranslate2"],
    }

    _fake_exporters(monkeypatch, failing=failing)
    with pytest.raises(RuntimeError, match=f"{failing} failed"):
        export_all("work", output_dir=str(tmp_path), name="m", formats=FORMATS)
    with pytest.raises(RuntimeError, match=f"{failing} failed"):
        export_all("work", output_dir=str(tmp_path), name="m", version=1, overwrite=True)
    assert _versions(tmp_path) == before
    assert not [n for _, dirs, _ in os.walk(tmp_path) for n in dirs if n.startswith(".")]


def test_a_failed_rename_restores_the_replaced_version(tmp_path, monkeypatch):
    from keras_transformer.export import artifacts

    targets = {k: str(tmp_path / k / "1") for k in ("a", "b", "c")}
    with artifacts.atomic_directories(targets) as staging:
        for path in staging.values():
            open(os.path.join(path, "old"), "w").close()
    renames = []

    def rename(source, target):
        renames.append(target)
        if target == targets["c"] and ".tmp-" in source:  # the last one's move into place fails
            raise OSError("disk full")
        os.replace(source, target)

    monkeypatch.setattr(artifacts.os, "rename", rename)
    with pytest.raises(OSError, match="disk full"):
        with artifacts.atomic_directories(targets, overwrite=True) as staging:
            for path in staging.values():
                open(os.path.join(path, "new"), "w").close()
    assert targets["a"] in renames and targets["b"] in renames  # two were moved, then undone
    assert {k: os.listdir(path) for k, path in targets.items()} == {
        "a": ["old"],
        "b": ["old"],
        "c": ["old"],
    }
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]
    assert all(os.listdir(tmp_path / k) == ["1"] for k in targets)


def test_next_version_and_bad_version(tmp_path):
    from keras_transformer.export.artifacts import check_version, next_version

    assert next_version(str(tmp_path / "missing")) == 1
    for name in ("1", "7", "onnx", ".tmp"):
        (tmp_path / name).mkdir()
    assert next_version(str(tmp_path)) == 8
    for bad in (0, -1, "x", 1.5, True):
        with pytest.raises(ValueError, match="version"):
            check_version(bad)
