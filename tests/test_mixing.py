"""Several corpora with weights (`train.py --mix`): each training pass draws the
corpora's pairs in proportion to their weights, whatever their sizes, and the
pairs a corpus loses to the filters and the length limit are its own."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from translation_fixtures import number_pairs, write_splits

from keras_transformer.data import Batches, binarize
from keras_transformer.data.planning import mixture_indices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = os.path.join(ROOT, "tests", "site")  # its sitecustomize.py records training's batches


def test_a_pass_draws_each_corpus_its_weights_share_repeating_the_small_one_evenly():
    parts, weights = (100, 1000), (3.0, 1.0)
    passes = [mixture_indices(parts, weights, np.random.default_rng([7, n])) for n in range(3)]
    for chosen in passes:
        small, large = chosen[chosen < 100], chosen[chosen >= 100]
        assert (len(small), len(large)) == (825, 275)  # 3/4 and 1/4 of the 1,100 pairs
        times = np.bincount(small, minlength=100)
        assert set(times.tolist()) == {8, 9}  # 825 = 8 x 100 + 25: even, not clumped
        assert len(np.unique(large)) == 275  # the large one without repeats
    # A corpus weighted down is sampled afresh every pass.
    assert not np.array_equal(passes[0][passes[0] >= 100], passes[1][passes[1] >= 100])
    # The same seed and pass give the same draw (a resumed run's batches).
    again = mixture_indices(parts, weights, np.random.default_rng([7, 0]))
    np.testing.assert_array_equal(again, passes[0])
    with pytest.raises(ValueError, match="positive weight per corpus"):
        mixture_indices(parts, (1.0, 0.0), np.random.default_rng(0))


def _prepare(work, *args, **environment):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1", **environment)
    env.pop("TF_CONFIG", None)
    command = [
        sys.executable, os.path.join(ROOT, "train.py"), "--preset", "tiny", "--vocab-size", "64",
        "--work-dir", str(work), "--workers", "1", *args,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.parametrize("pack", [True, False])
def test_prepared_mixed_corpora_train_in_proportion_to_their_weights(tmp_path, pack):
    in_domain = list(dict.fromkeys(number_pairs(400, seed=1, max_words=5)))[:300]
    too_long = [(" ".join(["eins"] * 80), " ".join(["one"] * 80))]  # over max_length
    copies = [("acht acht", "acht acht")] * 5  # dropped by the copies filter
    general = [(f"{de} neun", f"{en} nine") for de, en in number_pairs(6000, 2, max_words=8)]
    # Unique, and none a pair of the in-domain corpus (the duplicates filter
    # would drop it there: it filters across the corpora, keeping the first).
    general = [p for p in dict.fromkeys(general) if p not in set(in_domain)][:3000]
    assert (len(in_domain), len(general)) == (300, 3000)
    main = write_splits(
        tmp_path / "in_domain",
        {"train": in_domain + copies, "validation": number_pairs(20, seed=3)},
    )
    other = write_splits(tmp_path / "general", {"train": general + too_long})
    work = tmp_path / "work"
    result = _prepare(work, "--data-dir", str(main), "--mix", f"{other}=0.25", "--prepare-only")
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((work / "data" / "held_out.json").read_text())["data"]["info"]
    assert [(m["pairs"], m["weight"]) for m in info["mixture"]] == [(300, 1.0), (3001, 0.25)]
    assert info["counts"]["train"] == 3301  # validation and test came from --data-dir alone

    train = binarize.load(str(work / "data" / "train"))
    assert train.parts == (300, 3000)  # the long pair was the general corpus's
    # The batches training reads (the same class and arguments `train.py` uses):
    # the in-domain share of pairs is 1 / 1.25 = 80% in every pass.
    batches = Batches(
        train, max_length=64, batch_tokens=512, training=True, seed=5, pack=pack,
        weights=[1.0, 0.25],
    )  # fmt: skip
    for number in range(2):
        plan = batches.training_pass(number)
        pairs = np.concatenate([rows.pairs for _, rows in plan] if pack else plan)
        share = np.mean(pairs < 300)
        # Batches drop at most one incomplete batch per shape; the rest is exact.
        assert abs(share - 0.8) < 0.03, share
        # Every in-domain pair comes back about 8.8 times a pass (3,301 x 0.8 / 300).
        times = np.bincount(pairs[pairs < 300], minlength=300)
        assert times.min() >= 7 and times.max() <= 10, (times.min(), times.max())
    if pack:  # and the run trains from them (the passes planned in the planning process)
        args = ["--data-dir", str(main), "--mix", f"{other}=0.25", "--epochs", "1"]
        read = tmp_path / "batches.jsonl"  # the pairs of each batch training assembled
        path = os.pathsep.join(filter(None, [SITE, os.environ.get("PYTHONPATH")]))
        result = _prepare(work, *args, "--steps", "3", "--no-test", "--no-export",
                          "--validation-bleu-every", "0", "--batch-tokens", "512",
                          PYTHONPATH=path, KT_TEST_RECORD_BATCHES=str(read))  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        record = json.loads((work / "run.json").read_text())
        assert [m["share"] for m in record["data"]["mixture"]] == [0.8, 0.2]
        # What training read: the in-domain share of its pairs is the weights' (without
        # them, 300 of 3,300 pairs: 9%; tests/mutations.py mix_ignores_weights).
        batches = [json.loads(line) for line in read.read_text().splitlines()]
        assert len(batches) >= 3, len(batches)  # the 3 steps' batches at least
        pairs = np.concatenate(batches)
        share = np.mean(pairs < 300)
        assert abs(share - 0.8) < 0.1, (share, len(pairs))


def test_mix_entries_are_checked_before_anything_loads(tmp_path):
    main = write_splits(tmp_path / "a", {"train": number_pairs(50)})
    cases = [
        (["--data-dir", str(main), "--mix", f"{tmp_path / 'missing'}=1"], "is not a directory"),
        (["--data-dir", str(main), "--mix", f"{main}"], "DIR=WEIGHT entries"),
        (["--data-dir", str(main), "--mix", f"{main}=-1"], "positive weight"),
        (["--mix", f"{main}=1"], "give data_dir"),
    ]
    for args, message in cases:
        result = _prepare(tmp_path / "work", *args, "--prepare-only")
        assert result.returncode == 2, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith("train.py: error:") and message in lines[-1], lines[-3:]
        assert "Traceback" not in result.stderr
