"""The tools that score a finished run: `benchmarks/checkpoint_curve.py` and `search_sweep.py`.

Each must reproduce the run's own test decode where their settings meet it:
the curve's last checkpoint averaged as the run averaged is the run's final
model, and the sweep's test row for the run's search is the run's score.
"""

import json
import os
import subprocess
import sys

import pytest
from translation_fixtures import write_parallel_folder

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow", PYTHONUNBUFFERED="1")
ENV.pop("TF_CONFIG", None)


def _run(*args):
    result = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=900
    )
    return result.returncode, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("finished")
    corpus = write_parallel_folder(root / "numbers", sizes=(400, 20, 20))
    work_dir = root / "work"
    code, output = _run(
        os.path.join(ROOT, "train.py"), "--preset", "tiny", "--vocab-size", "64",
        "--batch-tokens", "256", "--epochs", "3", "--steps", "15", "--warmup-steps", "30",
        "--average-last", "3", "--test-samples", "10", "--beam-size", "2", "--no-export",
        "--data-dir", str(corpus), "--work-dir", str(work_dir),
    )  # fmt: skip
    assert code == 0, output
    with open(work_dir / "run.json", encoding="utf-8") as f:
        return work_dir, json.load(f)


def test_checkpoint_curve_ends_at_the_runs_own_model(finished):
    work_dir, info = finished
    chosen = info["averaging"]["chosen"]
    code, output = _run(
        os.path.join(ROOT, "benchmarks", "checkpoint_curve.py"), "--work-dir", str(work_dir),
        "--epochs", "1,3", "--average", str(chosen), "--test-samples", "10",
    )  # fmt: skip
    assert code == 0, output
    with open(work_dir / "checkpoint_curve.json", encoding="utf-8") as f:
        rows = json.load(f)
    assert [row["epoch"] for row in rows] == [1, 3, "final"]
    assert [row["step"] for row in rows] == [15, 45, 45]
    assert [row["averaged"] for row in rows] == [1, chosen, chosen]
    # The mean of the last `chosen` checkpoints is the model the run kept and scored.
    assert rows[1]["test"] == rows[2]["test"] == info["metrics"]["test"]


def test_checkpoint_curve_names_a_missing_epoch_before_decoding(finished):
    work_dir, _ = finished
    code, output = _run(
        os.path.join(ROOT, "benchmarks", "checkpoint_curve.py"), "--work-dir", str(work_dir),
        "--epochs", "2,9",
    )  # fmt: skip
    assert code != 0
    assert "No checkpoint of epochs [9]: the run wrote 3." in output


def test_search_sweep_scores_the_runs_search_as_the_run_did(finished):
    work_dir, info = finished
    assert (info["metrics"]["beam_size"], info["metrics"]["alpha"]) == (2, 0.6)
    code, output = _run(
        os.path.join(ROOT, "benchmarks", "search_sweep.py"), "--work-dir", str(work_dir),
        "--beams", "1,2", "--alphas", "0.6,1.0", "--samples", "10",
        "--stoppings", "bound,k_finished", "--patiences", "1,2",
    )  # fmt: skip
    assert code == 0, output
    with open(work_dir / "search_sweep.json", encoding="utf-8") as f:
        sweep = json.load(f)
    assert set(sweep["validation"]) == {
        "1,0.6", "1,1", "2,0.6", "2,1", "2,0.6,k_finished,1", "2,0.6,k_finished,2",
        "2,1,k_finished,1", "2,1,k_finished,2",
    }  # fmt: skip
    best = max(sweep["validation"], key=lambda key: sweep["validation"][key]["test"]["chrf"])
    assert set(sweep["test"]) == {"2,0.6", best}
    assert sweep["test"]["2,0.6"]["test"] == info["metrics"]["test"]
