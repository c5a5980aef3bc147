"""Smoke test of `benchmarks/quality.py`: train.py and the keras-hub loop, end to end."""

import json
import math
import os
import subprocess
import sys

import pytest
from translation_fixtures import write_parallel_folder

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MINUTES = 0.2


def test_quality_benchmark_trains_validates_and_decodes_both_builds(tmp_path):
    corpus = write_parallel_folder(tmp_path / "numbers", sizes=(400, 20, 20))
    out_dir = tmp_path / "quality"
    command = [
        sys.executable, os.path.join(ROOT, "benchmarks", "quality.py"),
        "--data-dir", str(corpus), "--preset", "tiny", "--vocab-size", "64",
        "--batch-tokens", "256", "--minutes", str(MINUTES), "--sentences", "5", "--out-dir", str(out_dir),
    ]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env.pop("TF_CONFIG", None)
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| real target tokens per second of the budget (end to end) |" in result.stdout

    with open(out_dir / "quality.json", encoding="utf-8") as f:
        report = json.load(f)
    assert set(report["builds"]) == {"keras_transformer", "keras_hub"}
    assert report["heldout"]["count"] == 5
    for name, build in report["builds"].items():
        assert build["steps"] > 0, name
        # Real tokens counted from the batches: no more than the batches could hold, and
        # no less than one short sentence per step (the numbers corpus's are 2-6 tokens).
        assert build["steps"] <= build["target_tokens"] <= build["steps"] * 256, name
        # The budget holds after the first step, whose trace alone can outlast it on
        # a loaded machine (both builds check the clock between steps).
        first_step = build["timing"]["first_step_seconds"]
        assert 0 < first_step <= build["train_seconds"], name
        assert build["train_seconds"] - first_step <= MINUTES * 60 * 1.5, name
        assert math.isfinite(build["final_val_loss"]), name
        assert math.isfinite(build["token_val_loss"]), name  # per real token, both builds
        assert all(math.isfinite(p["val_loss"]) for p in build["curve"]), name
        # A few minutes on a tiny corpus give no score worth a floor (issue 42): the
        # scores' arithmetic is sacrebleu's; that every held-out sentence was decoded is ours.
        assert len(build["hypotheses"]) == 5, name
    # The same architecture in both builds: one vocabulary, one preset, one parameter count.
    ours, hub = report["builds"]["keras_transformer"], report["builds"]["keras_hub"]
    assert ours["params"] == hub["params"] > 0
    assert ours["batch_tokens"] == hub["batch_tokens"] == 256
    assert ours["warmup_steps"] == hub["warmup_steps"]
