"""The tools that score a finished run: `benchmarks/checkpoint_curve.py` and `search_sweep.py`.

Each must reproduce the run's own test decode where their settings meet it:
the curve's last checkpoint averaged as the run averaged is the run's final
model, and the sweep's test row for the run's search is the run's score.
"""

import json
import math
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


def test_the_tuned_pytorch_reference_has_the_keras_models_parameters_and_runs():
    """The fair PyTorch build (`benchmarks/torch_reference.py --variant fair`) holds the
    Keras `Transformer`'s parameters one for one (nothing more: no final LayerNorms,
    no feed-forward dropout), and its step with the loss inside runs on CPU."""
    pytest.importorskip("torch")
    import torch

    from benchmarks import torch_reference
    from keras_transformer import Transformer
    from keras_transformer.config import get_preset

    config = get_preset("tiny")
    fair = torch_reference.build_fair(config, padding=True)
    keras_model = Transformer.from_preset("tiny")
    keras_model.build()
    assert sum(p.numel() for p in fair.parameters()) == keras_model.count_params()
    plain = torch_reference.build(config)
    assert sum(p.numel() for p in plain.parameters()) > keras_model.count_params()
    # Padding or none: the masked and the is_causal paths give the same logits
    # on a batch without padding.
    torch.manual_seed(0)
    ids = torch.randint(4, config.vocab_size, (2, 6))
    unmasked = torch_reference.build_fair(config, padding=False)
    unmasked.load_state_dict(fair.state_dict())
    fair.eval(), unmasked.eval()
    torch.testing.assert_close(fair(ids, ids), unmasked(ids, ids), atol=1e-5, rtol=1e-5)
    result = subprocess.run(
        [sys.executable, "benchmarks/torch_reference.py", "--variant", "fair", "--preset",
         "tiny", "--no-compile", "--steps", "3", "--rounds", "2", "--warmup", "2",
         "--batch-size", "8", "--length", "8", "--matmul-size", "64", "--dtype", "float32"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(line["candidates"]) == {"torch_reference_fair"}
    # A few steps into the paper's warm-up: still about an untrained model's loss,
    # ln(vocab) plus the spread of random logits (the Keras build's first-batch loss
    # at the cpu preset is ln(4000) + 0.66, run.json's calibration).
    assert 0.0 < line["final_loss"] - math.log(config.vocab_size) < 1.0, line["final_loss"]


def test_every_recipe_trial_is_a_train_py_command_line_that_changes_one_thing():
    """The study's trials reach train.py as they are written: each trial's flags parse,
    and each sets what it names, apart from the reference's (a misspelt flag is an
    error; one that no option reads would make a trial a second reference)."""
    import train
    from benchmarks import recipe_study

    def options(trial):
        return vars(train.parse_args(recipe_study.train_flags("work", 5, trial)))

    reference = options(recipe_study.TRIALS[0])
    assert recipe_study.TRIALS[0].flags == ()
    for trial in recipe_study.TRIALS[1:] + recipe_study.EXTRA_TRIALS:
        changed = {key for key, value in options(trial).items() if reference[key] != value}
        named = {flag[2:].replace("-", "_") for flag in trial.flags if flag.startswith("--")}
        assert changed == named, (trial.name, changed, named)
    with pytest.raises(ValueError, match="Unknown trials"):
        recipe_study._chosen("cpu_ref_a,no_such_trial")


def test_the_recipe_report_ranks_trials_against_the_two_references():
    from benchmarks import recipe_study

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "results", "recipe_study_xeon_2026-11-28", "five_minutes",
                        "results.jsonl")  # fmt: skip
    with open(path) as f:
        records = [json.loads(line) for line in f]
    table = recipe_study.report(records, minutes=5).splitlines()
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| #")]
    assert len(rows) == len(records) == 14
    assert "cpu_ref_a" in rows[0] and "(reference)" in rows[0]  # the best, greedy
    assert any("difference 0.16" in line for line in table)


def test_the_glossary_test_set_holds_each_term_and_its_one_translation():
    """`benchmarks/glossary.py prepare`'s rules on toy pairs: the training glossary is the
    one-word noun entries (every sense, once); a test item is a pair of 2+ words holding
    a term whose reference holds the translation the test glossary gives that term (the
    one most references hold), as a word."""
    sys.path.insert(0, ROOT)
    from benchmarks import glossary

    train = [("Auftrag", "order"), ("Auftrag", "commission"), ("Auftrag", "order"),
             ("laufen", "run"), ("Haus", "house"), ("Bank", "bank"), ("Bank", "bench"),
             ("ein Haus", "a house")]  # fmt: skip
    entries = glossary.glossary_entries(train)
    assert entries == [("Auftrag", "order"), ("Auftrag", "commission"), ("Haus", "house"),
                       ("Bank", "bank"), ("Bank", "bench")]  # fmt: skip
    test = [("der Auftrag ist da", "the order is here"),
            ("ein neuer Auftrag", "a new order"),
            ("ein Auftrag der Regierung", "a government commission"),  # the other sense
            ("Auftrag", "order"),  # one word: no context to steer
            ("die Bank am Fluss", "the bench by the river"),
            ("die Bankfiliale", "the bank branch"),  # "Bank" only inside a word
            ("ein Hund", "a dog"),  # no glossary term
            ("die Bank", "the banks")]  # "bank" only inside a reference's word  # fmt: skip
    items, chosen = glossary.test_items(test, entries, limit=10)
    assert chosen == [("auftrag", "order"), ("bank", "bench")]
    assert [(i["source"], i["translation"]) for i in items] == [
        ("der Auftrag ist da", "order"), ("ein neuer Auftrag", "order"),
        ("die Bank am Fluss", "bench"),
    ]  # fmt: skip
    assert glossary.holds("Orders and an ORDER.", "order")
    assert not glossary.holds("the orders", "order")


def test_a_ding_pair_sample_is_seeded_and_holds_out_the_fixed_evaluation_pairs(tmp_path):
    """`ding_sentences.py --sample N` (the recipe study's 30k and 100k corpora): N training
    pairs of Ding's training split, the same N every time; the first validation and test
    pairs of Ding's own splits, whatever N; too many pairs is an error naming the most."""
    sys.path.insert(0, ROOT)
    from benchmarks import ding_sentences
    from keras_transformer.data import ding

    corpus = tmp_path / "de-en"
    corpus.write_text("".join(f"Wort{i} {{n}} :: word{i}\n" for i in range(3000)), "utf-8")
    splits, _ = ding.load_ding_splits(str(corpus))

    def read(folder, split):
        de, en = ((folder / f"{split}.{lang}").read_text("utf-8").splitlines()
                  for lang in ("de", "en"))  # fmt: skip
        return list(zip(de, en, strict=True))

    counts = ding_sentences.write_pair_sample(tmp_path / "a", 700, str(corpus))
    ding_sentences.write_pair_sample(tmp_path / "b", 700, str(corpus))
    ding_sentences.write_pair_sample(tmp_path / "c", 300, str(corpus))
    train = read(tmp_path / "a", "train")
    assert len(train) == counts["train"] == 700 == len(set(train))
    assert set(train) <= set(splits["train"]) and train != splits["train"][:700]
    assert read(tmp_path / "b", "train") == train  # seeded
    for split in ("validation", "test"):
        held_out = splits[split][: ding_sentences.SAMPLE_HELD_OUT]
        assert read(tmp_path / "a", split) == read(tmp_path / "c", split) == held_out
    with pytest.raises(ValueError, match=f"1 to {len(splits['train'])} pairs"):
        ding_sentences.write_pair_sample(tmp_path / "d", len(splits["train"]) + 1, str(corpus))
