"""`export_after_training` under every backend: after JAX or torch training the
exporters run in a TensorFlow subprocess, whose paths are known without its output."""

import os

import pytest
from export_fixtures import make_work_dir

from keras_transformer import workdir

pytestmark = [pytest.mark.multibackend, pytest.mark.slow]


def test_exports_without_reading_the_exporters_output(tmp_path, monkeypatch):

    from keras_transformer.export import export_after_training

    work_dir = make_work_dir(str(tmp_path / "work"), steps=16)
    run_info = workdir.check(work_dir)
    output_dir = str(tmp_path / "saved_models")
    os.makedirs(os.path.join(output_dir, "transformer_de_en", "3"))  # an older version
    # Stray output in every Python process started from here on (the TensorFlow
    # subprocess included): the paths must not come from what it prints.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('stray words on stdout', flush=True)\n")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    )
    paths = export_after_training(work_dir, run_info, output_dir, formats=("saved_model",))
    assert paths == {"saved_model": os.path.join(output_dir, "transformer_de_en", "4")}
    assert os.path.isfile(os.path.join(paths["saved_model"], "saved_model.pb"))


def test_the_default_formats_are_the_installed_ones(monkeypatch, caplog):
    """CTranslate2 is an optional extra: without it a training run still exports the
    SavedModel and ONNX, and says why the third format is missing."""
    import importlib.util

    from keras_transformer import export

    assert export.installed_formats() == export.FORMATS  # `make` installs [all]
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "ctranslate2" else find_spec(name, *a),
    )
    with caplog.at_level("INFO", logger=export.logger.name):
        assert export.installed_formats() == ("saved_model", "onnx")
    assert "pip install -e '.[ctranslate2]'" in caplog.text


def test_the_export_runs_in_a_child_process_under_every_backend(tmp_path, monkeypatch):
    """TensorFlow training too exports in a `python -m keras_transformer.export` child:
    tf2onnx's conversion then does not add its memory to what training holds (`make
    train` peaked at 6.9 GB with the export in the training process)."""
    import subprocess

    from keras_transformer import export

    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs))
        return subprocess.CompletedProcess(command, 0)

    def in_process(*args, **kwargs):
        pytest.fail("export_all ran in the training process")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(export, "export_all", in_process)
    monkeypatch.setattr(export, "check_work_dir", lambda work_dir: {})
    output_dir = str(tmp_path / "saved_models")
    paths = export.export_after_training(
        str(tmp_path / "work"), {"data": {"direction": "de-en"}}, output_dir,
        formats=("saved_model", "onnx"),
    )  # fmt: skip
    ((command, kwargs),) = calls
    assert command[1:3] == ["-m", "keras_transformer.export"]
    assert kwargs["env"]["KERAS_BACKEND"] == "tensorflow"
    model_dir = os.path.join(output_dir, "transformer_de_en")
    assert paths == {"saved_model": os.path.join(model_dir, "1"),
                     "onnx": os.path.join(model_dir, "onnx", "1")}  # fmt: skip
