"""Training where TensorFlow, TensorFlow Text and TFDS cannot be imported.

As on a GPU machine with JAX or torch and no TensorFlow: `train.py` runs
in a subprocess whose path finder hides them (`without_tensorflow/
sitecustomize.py`), under JAX and under torch, on a folder of text files
and on a Ding-format dictionary; the loss falls, the test split is decoded,
the tokenized splits are written once (`--prepare-only` alone) and read back
by a later run, and
the export is skipped with a line that says how to run it elsewhere.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from translation_fixtures import number_pairs, write_parallel_folder

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDE_TENSORFLOW = os.path.join(ROOT, "tests", "without_tensorflow")
TINY_ARGS = [
    "--preset", "tiny", "--vocab-size", "64", "--batch-tokens", "256", "--epochs", "2",
    "--steps", "20", "--validation-bleu-every", "0", "--test-samples", "10", "--beam-size", "2",
    "--filters", "none",  # the number fixtures repeat pairs; test_corpus_report.py tests filters
]  # fmt: skip


def _run(args, backend, cwd=ROOT):
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=HIDE_TENSORFLOW, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


def test_the_hidden_modules_cannot_be_imported():
    for name in ("tensorflow", "tensorflow_text", "tensorflow_datasets"):
        result = _run(
            [
                "-c",
                f"import importlib.util as u; assert u.find_spec({name!r}) is None; import {name}",
            ],
            "jax",
        )  # noqa: E501
        assert result.returncode == 1 and "ModuleNotFoundError" in result.stderr, name


def _check_run(result, work_dir):
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    info = json.loads((work_dir / "run.json").read_text())
    losses = info["history"]["loss"]
    assert losses[-1] < losses[0], losses
    assert info["metrics"]["test"]["segments"] == 10  # --test-samples, decoded and scored
    assert "No export: the SavedModel and ONNX exporters trace the model with TensorFlow" in output
    assert (work_dir / "data" / "train" / "source.bin").exists()
    return info, output


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_train_py_on_a_folder_without_tensorflow(backend, tmp_path):
    """Prepared with --prepare-only in one folder, trained from a copy of it (as on
    another machine): the vocabulary and the tokenized splits are read back."""
    corpus = write_parallel_folder(tmp_path / "numbers", sizes=(400, 20, 20))
    prepared, work_dir = tmp_path / "prepared", tmp_path / "work"
    args = ["train.py", *TINY_ARGS, "--data-dir", str(corpus)]
    result = _run([*args, "--work-dir", str(prepared), "--prepare-only"], backend)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "Tokenized 400 train pairs" in result.stderr
    assert "--prepare-only: the vocabulary and the tokenized splits are in" in result.stderr
    assert sorted(os.listdir(prepared)) == ["corpus.json", "data", "vocab.model"]
    shutil.copytree(prepared, work_dir)
    info, output = _check_run(_run([*args, "--work-dir", str(work_dir)], backend), work_dir)
    assert info["training"]["backend"] == backend
    assert "Read the tokenized 400 train pairs" in output


def test_the_ding_default_without_tensorflow_reuses_its_tokenized_splits(tmp_path):
    dictionary = tmp_path / "de-en"
    dictionary.write_text(
        "".join(f"{g} :: {e}\n" for g, e in number_pairs(3000, seed=5)), encoding="utf-8"
    )
    run = (
        "import logging, sys; from keras_transformer.training import run; "
        "logging.basicConfig(level=logging.INFO); "
        "run(preset='tiny', vocab_size=64, batch_tokens=256, epochs=2, steps=20, "
        "validation_bleu_every=0, test_samples=10, beam_size=1, ding_path=sys.argv[1], "
        "work_dir=sys.argv[2])"
    )
    first = tmp_path / "first"
    info, output = _check_run(_run(["-c", run, str(dictionary), str(first)], "jax"), first)
    assert info["data"]["name"] == "ding"
    assert "Tokenized" in output
    # A second run of the same corpus and vocabulary reads the splits back.
    second = tmp_path / "second"
    second.mkdir()
    for name in ("vocab.model", "corpus.json"):
        (second / name).write_bytes((first / name).read_bytes())
    shutil.copytree(first / "data", second / "data")
    _, output = _check_run(_run(["-c", run, str(dictionary), str(second)], "jax"), second)
    assert "Read the tokenized" in output
