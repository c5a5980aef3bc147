"""A user's own corpora and work directories, through the real command line.

A work directory belongs to one corpus: another corpus pointed at it is
refused and nothing there changes. The same command with a larger budget
continues a finished run. The layouts corpus releases use (`valid.*`,
`dev.*`, no `test.*`) train. Expected mistakes end in one line and exit 2.
"""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from translation_fixtures import write_parallel_folder

from keras_transformer.data import load_translation_data, text_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ARGS = [
    "--preset", "tiny", "--vocab-size", "64", "--batch-tokens", "256", "--steps", "15",
    "--validation-bleu-every", "0", "--test-samples", "10", "--beam-size", "1", "--no-export",
    "--dtype-policy", "float32", "--no-jit-compile",
    # The number fixtures repeat short pairs, which the filters would drop; the
    # filters have their own tests (test_corpus_report.py).
    "--filters", "none",
]  # fmt: skip


def _train(*args):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), *TINY_ARGS, *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip


def _hashes(folder):
    return {
        os.path.relpath(os.path.join(root, name), folder): hashlib.sha256(
            open(os.path.join(root, name), "rb").read()
        ).hexdigest()
        for root, _, names in os.walk(folder)
        for name in names
    }


def _one_line_error(result, *words):
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    for word in words:
        assert word in errors[0], errors[0]


@pytest.mark.slow
def test_a_work_directory_belongs_to_its_corpus_and_a_rerun_continues(tmp_path):
    first = write_parallel_folder(tmp_path / "first", sizes=(400, 20, 20))
    second = write_parallel_folder(tmp_path / "second", sizes=(400, 20, 20), seed=7)
    work = tmp_path / "work"
    result = _train("--data-dir", str(first), "--work-dir", str(work), "--epochs", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Run: new" in result.stderr
    before = _hashes(work)
    info = json.loads((work / "run.json").read_text())

    refused = _train("--data-dir", str(second), "--work-dir", str(work), "--epochs", "2")
    _one_line_error(refused, "belongs to another run's data", "--overwrite")
    assert _hashes(work) == before  # nothing written

    again = _train("--data-dir", str(first), "--work-dir", str(work), "--epochs", "2")
    _one_line_error(again, "nothing is left of --epochs 2")
    assert _hashes(work) == before

    longer = _train("--data-dir", str(first), "--work-dir", str(work), "--epochs", "4")
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "Run: continued, after 2 epochs" in longer.stderr
    assert "Epoch 3/4" in longer.stdout and "Epoch 1/4" not in longer.stdout
    continued = json.loads((work / "run.json").read_text())
    assert continued["run"]["kind"] == "continued" and continued["run"]["epochs"] == 2
    # The step counter goes on; the loss goes on from where it was, not from scratch.
    assert continued["metrics"]["train_steps"] == 30
    assert continued["metrics"]["optimizer_steps"] == info["metrics"]["optimizer_steps"] + 30 == 60
    assert continued["history"]["loss"][0] < info["history"]["loss"][0]
    assert continued["history"]["loss"][0] < info["history"]["loss"][-1] * 1.1

    overwritten = _train(
        "--data-dir", str(second), "--work-dir", str(work), "--epochs", "1", "--overwrite"
    )
    assert overwritten.returncode == 0, overwritten.stderr[-3000:]
    assert "Run: new" in overwritten.stderr
    assert json.loads((work / "run.json").read_text())["data"]["name"].endswith("second")


@pytest.mark.slow
def test_a_folder_with_dev_files_and_no_test_files_trains(tmp_path):
    corpus = write_parallel_folder(tmp_path / "corpus", sizes=(400, 20, 20))
    for lang in ("de", "en"):
        os.rename(corpus / f"validation.{lang}", corpus / f"dev.{lang}")
        os.remove(corpus / f"test.{lang}")
    work = tmp_path / "work"
    result = _train("--data-dir", str(corpus), "--work-dir", str(work), "--epochs", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "No test.* files in" in result.stderr and "no test decoding" in result.stderr
    info = json.loads((work / "run.json").read_text())
    assert info["data"]["counts"] == {"train": 400, "validation": 20, "test": 0}
    assert "test" not in info["metrics"]


@pytest.mark.parametrize("name", ["validation", "valid", "dev", None])
def test_folder_layouts(tmp_path, name):
    corpus = write_parallel_folder(tmp_path / "corpus", sizes=(300, 20, 20))
    expected_validation = load_translation_data(data_dir=str(corpus)).pairs("validation")
    for lang in ("de", "en"):
        if name is None:
            os.remove(corpus / f"validation.{lang}")
        elif name != "validation":
            os.rename(corpus / f"validation.{lang}", corpus / f"{name}.{lang}")
    data = load_translation_data(data_dir=str(corpus))
    if name is not None:
        assert data.pairs("validation") == expected_validation
        assert data.info["counts"]["train"] == 300
        return
    # No validation files: a fixed 1% of train, the same pairs every time, out of train.
    held_out = data.pairs("validation")
    assert len(held_out) == int(300 * text_files.HELD_OUT_SHARE) == 3
    assert data.info["counts"]["train"] == 297
    assert not set(held_out) & set(data.pairs("train"))
    assert load_translation_data(data_dir=str(corpus)).pairs("validation") == held_out


def test_expected_mistakes_end_in_one_line(tmp_path):
    corpus = write_parallel_folder(tmp_path / "corpus", sizes=(20, 5, 5))
    _one_line_error(_train("--preset", "huge", "--data-dir", str(corpus)), "Unknown preset 'huge'")
    _one_line_error(_train("--data-dir", str(tmp_path / "missing")), "is not a directory")
    (tmp_path / "unfinished").mkdir()
    _one_line_error(
        _train("--data-dir", str(corpus), "--init-from", str(tmp_path / "unfinished")),
        "holds no trained model",
    )
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    (lonely / "train.de").write_text("eins\n", encoding="utf-8")
    _one_line_error(_train("--data-dir", str(lonely)), "exactly two training files")
    debug = _train("--preset", "huge", "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_with_ema_the_saved_model_is_the_moving_average_or_the_better_candidate(tmp_path):
    """`--ema 0.5` with one step per epoch: each epoch's checkpoint is one step's raw
    weights, so the moving average is computable by hand (Keras: the first step's
    weights, then `m * average + (1 - m) * weights`). model.keras, what the exports
    read, is the candidate with the lower validation loss, both losses computed here
    from the hand-made weights: the average, or (a run too short for it) the last
    checkpoint's raw weights. `tests/mutations.py ema_keeps_the_worse` shows that a
    run keeping the other candidate fails."""
    import keras

    from keras_transformer import workdir

    corpus = write_parallel_folder(tmp_path / "corpus", sizes=(200, 20, 20))
    work = tmp_path / "work"
    result = _train("--data-dir", str(corpus), "--work-dir", str(work), "--epochs", "4",
                    "--steps", "1", "--ema", "0.5", "--average-last", "1",
                    "--no-test")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((work / "run.json").read_text())
    chosen = info["averaging"]["chosen"]
    assert set(info["averaging"]["val_loss"]) == {"1", "last_checkpoint"}
    model = workdir.load_model(str(work))
    steps = []
    for path in sorted((work / "checkpoints").iterdir()):
        model.load_weights(str(path))
        steps.append([np.array(w) for w in model.get_weights()])
    average = steps[0]
    for weights in steps[1:]:
        average = [0.5 * a + 0.5 * w for a, w in zip(average, weights, strict=True)]
    # The moving average is not the last weights (the checks can tell them apart).
    assert any(not np.allclose(a, w) for a, w in zip(average, steps[-1], strict=True))
    # Each candidate's validation loss, from the hand-made weights: the recorded ones.
    from keras_transformer.data import Batches, binarize
    from keras_transformer.evaluation import validation_loss

    split = binarize.load(str(work / "data" / "validation"))
    batches = Batches(split, max_length=model.config.max_length, batch_tokens=256,
                      training=False, pack=True).evaluation()  # fmt: skip
    candidates = {1: average, "last_checkpoint": steps[-1]}
    losses = {}
    for name, weights in candidates.items():
        model.set_weights(weights)
        losses[name] = validation_loss(model, batches, model.config.pad_id)
        assert losses[name] == pytest.approx(info["averaging"]["val_loss"][str(name)], rel=1e-4)
    # The saved model is the candidate with the lower loss, and run.json names it.
    better = min(losses, key=losses.get)
    assert chosen == better, (chosen, losses)
    saved = keras.saving.load_model(str(work / "model.keras")).get_weights()
    for a, b in zip(saved, candidates[better], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
