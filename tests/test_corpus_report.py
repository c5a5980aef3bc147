"""The corpus report and the filters, through `train.py --prepare-only` on corpora
made for them: shifted lines are flagged with their numbers; copies, duplicates,
empty sides and length-ratio outliers are counted, and the filters drop exactly
those (never an evaluation pair)."""

import json
import os
import subprocess
import sys

from translation_fixtures import number_pairs, write_splits

from keras_transformer.data.report import CorpusReport, ratio_outlier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _prepare(folder, work, *args):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    command = [
        sys.executable, os.path.join(ROOT, "train.py"), "--preset", "tiny", "--vocab-size", "64",
        "--data-dir", str(folder), "--work-dir", str(work), "--prepare-only", "--workers", "1",
        *args,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((work / "corpus.json").read_text())["report"], result.stderr


def test_a_side_shifted_by_one_line_is_flagged_with_its_correlation(tmp_path):
    pairs = number_pairs(600, seed=1, max_words=12)
    aligned, _ = _prepare(write_splits(tmp_path / "aligned", {"train": pairs}), tmp_path / "a")
    shifted = [(pairs[i][0], pairs[i - 1][1]) for i in range(1, len(pairs))]
    report, log = _prepare(write_splits(tmp_path / "shifted", {"train": shifted}), tmp_path / "s")
    assert aligned["train"]["length_correlation"] > 0.9
    assert aligned["warnings"] == []
    r = report["train"]["length_correlation"]
    assert abs(r) < 0.2, r
    warning = next(w for w in report["warnings"] if "lines may be shifted" in w)
    assert f"r = {r:.2f}" in warning and warning in log


def test_copies_duplicates_empty_sides_and_ratio_outliers_are_counted_and_filtered(tmp_path):
    clean = number_pairs(500, seed=2)
    clean = list(dict.fromkeys(p for p in clean if p[0] != p[1] and not ratio_outlier(*p)))
    copies = [(f"copy {i} Kopie", f"copy {i} Kopie") for i in range(45)]
    duplicates = clean[:40]  # each repeats a pair seen before it
    ratio = [(f"ja {i}", "yes " * 12 + str(i)) for i in range(25)]
    empty = [("", "one"), ("zwei", " ")] * 4
    validation = clean[40:50] + copies[:3]  # in train: counted, never filtered
    train = clean + copies + duplicates + ratio + empty
    folder = write_splits(tmp_path / "corpus", {"train": train, "validation": validation})

    report, log = _prepare(folder, tmp_path / "work")
    counts = report["train"]
    assert counts["pairs"] == len(train) - len(empty)
    assert (counts["empty"], counts["copies"], counts["duplicates"], counts["ratio"]) == (
        len(empty),
        len(copies),
        len(duplicates),
        len(ratio),
    )
    assert report["filtered"] == {
        "filters": ["copies", "duplicates", "ratio"],
        "dropped": len(copies) + len(duplicates) + len(ratio),
        "kept": len(clean),
    }
    assert report["evaluation"]["validation"] == {"pairs": 13, "in_train": 13}
    assert any(
        "13 of the 13 validation pairs are also training pairs" in w for w in report["warnings"]
    )
    assert any("copies" in w and f"({len(copies)} of" in w for w in report["warnings"])
    assert "Corpus report: " in log and f"{len(clean)} kept" in log
    held = json.loads((tmp_path / "work" / "data" / "held_out.json").read_text())["data"]
    assert held["info"]["counts"]["train"] == len(clean)
    assert [tuple(p) for p in held["splits"]["validation"]] == validation  # not filtered
    assert 0 <= report["coverage"]["unknown_share"] < 0.01 and report["coverage"]["tokens"] > 0

    unfiltered, _ = _prepare(folder, tmp_path / "all", "--filters", "none")
    assert unfiltered["filtered"] == {"filters": [], "dropped": 0, "kept": counts["pairs"]}
    only_copies, _ = _prepare(folder, tmp_path / "copies", "--filters", "copies")
    assert only_copies["filtered"]["dropped"] == len(copies)


def test_an_unknown_filter_is_one_line_naming_the_choices(tmp_path):
    folder = write_splits(tmp_path / "corpus", {"train": number_pairs(50)})
    env = dict(os.environ, KERAS_BACKEND="jax")
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--data-dir", str(folder),
         "--filters", "copies,typos", "--prepare-only"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and "typos" in errors[0] and "duplicates" in errors[0], result.stderr


def test_the_report_reads_back_with_its_warnings():
    report = CorpusReport({"validation": [("a", "b")]})
    dropped = report.read_train([("a", "b"), ("a", "b"), ("x y", "x y")], ("duplicates",))
    assert dropped.tolist() == [False, True, False]
    again = CorpusReport.from_dict(report.to_dict())
    assert again.to_dict() == report.to_dict()
    assert any("1 of the 1 validation pairs" in w for w in again.warnings())


def test_early_stopping_on_validation_chrf_stops_and_keeps_the_best_epoch(tmp_path):
    """Through train.py: validation chrF every epoch, patience 2; a learning rate far
    too high makes chrF stop rising. The run stops before its epochs end, and the
    model it saves is the checkpoint of the epoch with the best chrF."""
    import numpy as np

    folder = write_splits(
        tmp_path / "corpus",
        {"train": number_pairs(400), "validation": number_pairs(20, seed=1),
         "test": number_pairs(5, seed=2)},
    )  # fmt: skip
    work = tmp_path / "work"
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1")
    command = [
        sys.executable, os.path.join(ROOT, "train.py"), "--preset", "tiny", "--vocab-size", "64",
        "--data-dir", str(folder), "--work-dir", str(work), "--epochs", "30", "--steps", "5",
        "--batch-tokens", "256", "--warmup-steps", "5", "--learning-rate-scale", "20",
        "--validation-bleu-every", "1", "--validation-bleu-samples", "20",
        "--early-stopping", "2", "--test-samples", "2", "--beam-size", "1", "--no-export",
        "--dtype-policy", "float32", "--workers", "1",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((work / "run.json").read_text())
    chrf = info["history"]["val_chrf"]
    best = int(np.argmax(chrf))  # the first best, as Keras keeps it
    assert len(chrf) < 30 and len(chrf) == best + 3, chrf  # stopped 2 validations after it
    assert "Early stopping at epoch" in result.stderr
    assert "No checkpoint averaging" in result.stderr
    import keras

    from keras_transformer import Transformer

    saved = keras.saving.load_model(work / "model.keras")
    best_checkpoint = Transformer.from_config(saved.get_config())
    best_checkpoint.build()
    best_checkpoint.load_weights(work / "checkpoints" / f"epoch_{best + 1:03d}.weights.h5")
    for a, b in zip(saved.weights, best_checkpoint.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
