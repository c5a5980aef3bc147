"""Data: the Ding parser and builder, splits, parallel folders, vocabulary, batches."""

import dataclasses
import json
import logging

import numpy as np
import pytest
import tensorflow as tf
from translation_fixtures import number_pairs, write_parallel_folder

from keras_transformer.data import (
    Batches,
    PyDataset,
    bucket_sizes,
    ding,
    get_tokenizer,
    load_tokenizer,
    load_translation_data,
    plan_statistics,
    repeat_sentences,
    to_tf_dataset,
    tokenize_split,
)
from keras_transformer.data.ding_builder import DingDeEn

# Ding-format lines covering annotations, `|` alignment, `;` synonyms and placeholders.
DING_FIXTURE = """\
# Version :: test fixture
# License :: written by the test
Abfahrt {f} /Abf./; Abflug {m} [transp.] | Abfahrten {pl} | Er ist vor der Abfahrt angekommen. :: departure /dep./; take-off | departures | He arrived before the departure.
jdm. etw. geben {vt} (ugs.) | jds. Buch | jdn. fragen :: to give sb. sth. [coll.] | sb.'s book | to ask sb.
Aal {m} <Ahl> (auf der Speisekarte) [cook.] :: eel (on a menu)
kaputt {adj}; (völlig) hinüber [ugs.] :: broken; bust [Am.] [coll.]
defekte Zeile | ohne Partner :: line with one sub-entry
keine Trennung hier
"""

DING_EXPECTED = [
    ("Abfahrt", "departure"),
    ("Abfahrten", "departures"),
    ("Er ist vor der Abfahrt angekommen.", "He arrived before the departure."),
    ("jemandem etwas geben", "to give somebody something"),
    ("jemandes Buch", "somebody's book"),
    ("jemanden fragen", "to ask somebody"),
    ("Aal", "eel"),
    ("kaputt", "broken"),
]


def test_parse_line_strips_annotations_aligns_and_expands_placeholders():
    pairs = []
    for line in DING_FIXTURE.splitlines():
        entry = ding.parse_line(line)
        if entry is not None:
            pairs.extend(entry.pairs)
    assert pairs == DING_EXPECTED


def test_parse_line_synonym_product():
    entry = ding.parse_line(
        "kaputt {adj}; hinüber [ugs.] :: broken; bust [Am.]", synonyms="product"
    )
    assert entry.pairs == [
        ("kaputt", "broken"), ("kaputt", "bust"), ("hinüber", "broken"), ("hinüber", "bust")
    ]  # fmt: skip
    assert entry.headword == "kaputt"


def test_builder_turns_fixture_into_expected_pairs(tmp_path):
    corpus, expected = _write_ding_fixture(tmp_path)
    builder = DingDeEn(corpus_path=corpus, data_dir=str(tmp_path / "tfds"))
    builder.download_and_prepare()
    assert set(builder.info.features.languages) == {"de", "en"}
    found = []
    for split in ("train", "validation", "test"):
        for example in builder.as_dataset(split=split).as_numpy_iterator():
            found.append((example["de"].decode(), example["en"].decode()))
    assert sorted(found) == sorted(expected)


def _synthetic_dictionary(count=3000):
    """Entries with shared sub-entries across lines (the leaks a split must avoid)."""
    lines = []
    for i in range(count):
        head = f"Wort{i}"
        # Every third headword has a second sense (another line, same headword), and
        # neighbouring lines share a plural, as dictionary entries often do.
        lines.append(f"{head} {{n}} | Wörter{i // 2} {{pl}} :: word{i} | words{i // 2}")
        if i % 3 == 0:
            lines.append(f"{head} {{n}} [fig.] | Das ist Wort {i}. :: term{i} | This is word {i}.")
    return lines


def test_splits_share_no_phrase_and_keep_headwords_together():
    entries = [ding.parse_line(line) for line in _synthetic_dictionary()]
    splits, stats = ding.split_entries(
        entries, validation_fraction=0.05, test_fraction=0.05, sentence_headword_fraction=0.2
    )
    assert all(stats[name]["pairs"] > 50 for name in splits), stats
    assert stats["validation"]["sentences"] > 0 and stats["test"]["sentences"] > 0
    names = list(splits)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            for side in (0, 1):
                shared = {p[side] for p in splits[first]} & {p[side] for p in splits[second]}
                assert not shared, (first, second, sorted(shared)[:5])
    # Both senses of a headword (two lines) are in the same split.
    where = {}
    for name, pairs in splits.items():
        for german, english in pairs:
            if german.startswith("Wort") and english.startswith(("word", "term")):
                where.setdefault(german, set()).add(name)
    assert all(len(found) == 1 for found in where.values())
    # Duplicates are dropped.
    for pairs in splits.values():
        assert len(pairs) == len(set(pairs))


def test_missing_ding_corpus_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install trans-de-en.*--data-dir"):
        load_translation_data("ding", ding_path=str(tmp_path / "nope"), tfds_data_dir=str(tmp_path))


def test_parallel_folder_and_direction(tmp_path):
    folder = write_parallel_folder(tmp_path / "corpus", sizes=(20, 5, 5))
    data = load_translation_data(data_dir=str(folder))
    assert (data.source_language, data.target_language) == ("de", "en")
    assert data.pairs("test") == number_pairs(5, seed=2)
    flipped = load_translation_data(data_dir=str(folder), direction="en-de")
    assert flipped.pairs("test") == [(e, g) for g, e in number_pairs(5, seed=2)]
    with pytest.raises(ValueError, match="direction='fr-en'"):
        load_translation_data(data_dir=str(folder), direction="fr-en")


def test_unequal_line_counts_name_files_and_counts(tmp_path):
    folder = write_parallel_folder(tmp_path / "corpus", sizes=(20, 5, 5))
    with open(folder / "validation.en", "a", encoding="utf-8") as f:
        f.write("one more\n")
    with pytest.raises(ValueError, match=r"validation\.de has 5 lines.*validation\.en has 6 lines"):
        load_translation_data(data_dir=str(folder))


def test_non_utf8_line_names_file_and_line(tmp_path):
    folder = write_parallel_folder(tmp_path / "corpus", sizes=(20, 5, 5))
    lines = (folder / "train.de").read_bytes().splitlines(keepends=True)
    lines[6] = b"caf\xe9\n"  # Latin-1, not UTF-8
    (folder / "train.de").write_bytes(b"".join(lines))
    with pytest.raises(ValueError, match=r"train\.de, line 7: not valid UTF-8"):
        load_translation_data(data_dir=str(folder))


def test_empty_lines_are_skipped_and_counted(tmp_path, caplog):
    folder = write_parallel_folder(tmp_path / "corpus", sizes=(20, 5, 5))
    lines = (folder / "test.en").read_text(encoding="utf-8").splitlines()
    lines[1] = "  "
    (folder / "test.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        data = load_translation_data(data_dir=str(folder))
    assert len(data.pairs("test")) == 4
    assert "skipped 1 of 5 line pairs" in caplog.text


def _write_ding_fixture(tmp_path):
    """The fixture plus plain filler entries, so that every split is non-empty
    (TFDS refuses empty splits). Returns `(path, expected pairs)`."""
    filler = [(f"Wort{i}", f"word{i}") for i in range(2000)]
    corpus = tmp_path / "de-en"
    corpus.write_text(
        DING_FIXTURE + "".join(f"{g} {{n}} :: {e}\n" for g, e in filler), encoding="utf-8"
    )
    return corpus, DING_EXPECTED + filler


def test_tfds_dataset_by_name_with_a_fake_registry(tmp_path, monkeypatch):
    """The code path of `--dataset wmt14_translate/de-en`, offline: `tfds.builder`
    is faked to return a local translation builder."""
    import tensorflow_datasets as tfds

    corpus, expected = _write_ding_fixture(tmp_path)
    real_builder = tfds.builder

    def fake_builder(name, data_dir=None, **kwargs):
        if name == "fake_translate/de-en":
            return DingDeEn(corpus_path=corpus, data_dir=data_dir)
        return real_builder(name, data_dir=data_dir, **kwargs)

    monkeypatch.setattr(tfds, "builder", fake_builder)
    tfds_dir = str(tmp_path / "tfds")
    data = load_translation_data("fake_translate/de-en", tfds_data_dir=tfds_dir)
    assert (data.source_language, data.target_language) == ("de", "en")
    assert data.info["name"] == "fake_translate/de-en"
    flipped = load_translation_data(
        "fake_translate/de-en", direction="en-de", tfds_data_dir=tfds_dir
    )
    assert (flipped.source_language, flipped.target_language) == ("en", "de")
    assert flipped.pairs("test") == [(e, g) for g, e in data.pairs("test")]
    found = [p for split in ("train", "validation", "test") for p in data.pairs(split)]
    assert sorted(found) == sorted(expected)
    with pytest.raises(ValueError, match="Unknown dataset 'no_such_dataset_xyz'"):
        load_translation_data("no_such_dataset_xyz", tfds_data_dir=tfds_dir)


def test_ding_without_tfds_reads_the_tfds_builders_pairs_in_its_order(tmp_path):
    """`load_translation_data("ding")` parses the dictionary itself (no TFDS):
    its splits, in order, are what the TFDS builder writes, so the held-out
    sets stay the same first pairs across the change."""
    corpus, _ = _write_ding_fixture(tmp_path)
    builder = DingDeEn(corpus_path=corpus, data_dir=str(tmp_path / "tfds"))
    builder.download_and_prepare()
    data = load_translation_data("ding", ding_path=str(corpus))
    for split in ("train", "validation", "test"):
        stored = [
            (x["de"].decode(), x["en"].decode())
            for x in builder.as_dataset(split=split, shuffle_files=False).as_numpy_iterator()
        ]
        assert data.pairs(split) == stored, split
        assert data.info["counts"][split] == len(stored)
    flipped = load_translation_data("ding", ding_path=str(corpus), direction="en-de")
    assert flipped.pairs("test") == [(e, g) for g, e in data.pairs("test")]


@pytest.fixture(scope="module")
def corpus_folder(tmp_path_factory):
    folder = write_parallel_folder(
        tmp_path_factory.mktemp("corpus") / "numbers", sizes=(300, 30, 30)
    )
    data = load_translation_data(data_dir=str(folder))
    get_tokenizer(str(folder / "vocab.model"), data.splits["train"], vocab_size=64)
    return folder


@pytest.fixture
def corpus(corpus_folder):
    data = load_translation_data(data_dir=str(corpus_folder))
    return data, load_tokenizer(str(corpus_folder / "vocab.model")), corpus_folder


def test_vocabulary_round_trips_text_and_reserves_special_ids(corpus):
    data, tokenizer, folder = corpus
    texts = [t for pair in data.pairs("test") for t in pair]
    ids = tokenizer.tokenize(texts)
    assert tokenizer.detokenize(ids) == texts
    pieces = [tokenizer.processor.id_to_piece(i) for i in range(4)]
    assert pieces == ["<pad>", "<unk>", "<s>", "</s>"]
    with pytest.raises(ValueError, match="has 64 pieces but vocab_size=80"):
        get_tokenizer(str(folder / "vocab.model"), data.splits["train"], vocab_size=80)


def test_training_tokenizer_gives_the_exported_graphs_ids(corpus):
    """Training tokenizes with the `sentencepiece` package, the SavedModel and
    translate.onnx with TF Text's op on the same file: the same ids and text."""
    from keras_transformer.data.vocabulary import load_keras_hub_tokenizer

    data, tokenizer, folder = corpus
    graph = load_keras_hub_tokenizer(str(folder / "vocab.model"))
    texts = [t for pair in data.pairs("train")[:100] for t in pair] + ["Ünïcödé ⁇ 🏠 漢字"]
    ids = tokenizer.tokenize(texts)
    assert [[int(i) for i in row] for row in graph.tokenize(texts)] == ids
    graph_texts = [t.decode() if isinstance(t, bytes) else t for t in graph.detokenize(ids)]
    assert tokenizer.detokenize(ids) == graph_texts


def _batches(split, **kwargs):
    return Batches(split, **{"max_length": 12, "batch_tokens": 96, **kwargs})


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_batches_respect_token_budget_and_shift_targets(corpus, num_replicas):
    data, tokenizer, _ = corpus
    batch_tokens, max_length = 96, 12
    split = tokenize_split(data.splits["train"], tokenizer, max_length=max_length)
    ds = to_tf_dataset(_batches(split, num_replicas=num_replicas, seed=0))
    assert ds.element_spec[1].dtype == tf.int32
    for features, labels in ds.take(30).as_numpy_iterator():
        source, target = features["source_ids"], features["target_ids"]
        size, width = source.shape[0], max(source.shape[1], target.shape[1])
        assert size * width <= batch_tokens and size % num_replicas == 0
        assert width <= max_length and target.shape == labels.shape
        source_lengths = (source != 0).sum(axis=1)
        assert (source[np.arange(size), source_lengths - 1] == 3).all()  # ends with EOS
        assert (target[:, 0] == 2).all()  # starts with BOS
        np.testing.assert_array_equal(
            target[:, 1:], np.where(labels[:, :-1] == 3, 0, labels[:, :-1])
        )


def test_evaluation_batches_are_the_plan_in_order_every_pass(corpus):
    from keras_transformer.data.pipeline import assemble
    from keras_transformer.data.planning import plan_batches

    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["validation"], tokenizer, max_length=12)
    ds = to_tf_dataset(_batches(split, training=False))
    plan = plan_batches(split, 96)
    assert ds.num_batches == len(plan)
    passes = list(ds.take(2 * len(plan)).as_numpy_iterator())
    for got, indices in zip(passes, plan + plan, strict=True):
        features, labels = assemble(split, indices)
        np.testing.assert_array_equal(got[0]["source_ids"], features["source_ids"])
        np.testing.assert_array_equal(got[0]["target_ids"], features["target_ids"])
        np.testing.assert_array_equal(got[1], labels)


@pytest.mark.parametrize("pack", [False, True])
def test_tf_dataset_and_py_dataset_give_the_same_batches(corpus, pack):
    """The two wrappers of one `Batches`: the same arrays in the same order, over
    several passes of the data, and `batch(i)` rebuilds the i-th of the stream."""
    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["train"], tokenizer, max_length=12)
    passes = 3 * len(_batches(split, seed=7, pack=pack).training_pass(0))
    tf_batches = list(to_tf_dataset(_batches(split, seed=7, pack=pack)).take(passes))
    py_dataset = PyDataset(_batches(split, seed=7, pack=pack))
    assert py_dataset.num_batches is None  # endless
    fresh = _batches(split, seed=7, pack=pack)
    for index in (passes - 1, 0, passes // 2):  # any order: rebuilt from the index alone
        np.testing.assert_array_equal(fresh.batch(index)[1], tf_batches[index][1].numpy())
    for index, (features, labels) in enumerate(tf_batches):
        py_features, py_labels = py_dataset[index]
        assert set(py_features) == set(features)
        for name in features:
            np.testing.assert_array_equal(py_features[name], features[name].numpy())
        np.testing.assert_array_equal(py_labels, labels.numpy())
    other_seed = to_tf_dataset(_batches(split, seed=8, pack=pack)).take(passes)
    assert any(
        a[1].shape != b[1].shape or (a[1].numpy() != b[1].numpy()).any()
        for a, b in zip(tf_batches, other_seed, strict=True)
    )
    validation = tokenize_split(data.splits["validation"], tokenizer, max_length=12)
    tf_evaluation = to_tf_dataset(_batches(validation, training=False, pack=pack)).evaluation()
    py_evaluation = PyDataset(_batches(validation, training=False, pack=pack))
    assert len(py_evaluation) == len(tf_evaluation)
    for (a, a_labels), (b, b_labels) in zip(tf_evaluation, py_evaluation, strict=True):
        np.testing.assert_array_equal(a_labels, b_labels)
        np.testing.assert_array_equal(a["source_ids"], b["source_ids"])


@pytest.mark.parametrize("pack", [False, True])
def test_the_next_pass_is_planned_ahead_as_inline(corpus, pack):
    """While pass n trains, pass n + 1 is planned in a process of its own: the same
    plan as planned inline, and no pass is planned twice."""
    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["train"], tokenizer, max_length=12)
    batches = _batches(split, seed=7, pack=pack)

    def plain(plan):  # lists of index arrays (buckets) or of (width, rows) (packed)
        return json.dumps(plan, default=lambda array: array.tolist())

    first = batches.training_pass(0)
    ahead = batches._ahead[1]
    assert plain(ahead.result()) == plain(_batches(split, seed=7, pack=pack).training_pass(1))
    assert batches.training_pass(1) is ahead.result() and 1 not in batches._ahead
    assert plain(first) != plain(ahead.result())  # another shuffle
    assert batches._ahead[2] is not None


def test_an_error_in_the_planning_process_is_raised_in_training(corpus):
    import functools

    from keras_transformer.data.planning import Planner, plan_batches

    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["train"], tokenizer, max_length=12)
    planner = Planner(functools.partial(plan_batches, batch_tokens=5), split.planning(), seed=0)
    with pytest.raises(ValueError, match="batch_tokens=5 must be at least"):
        planner.submit(1).result()
    assert planner.submit(2) is not None  # the process lives on after an error


def test_too_few_pairs_for_a_training_batch_is_an_error(corpus):
    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["train"][:2], tokenizer, max_length=12)
    batches = _batches(split, batch_tokens=48 * 12, pack=True)
    with pytest.raises(ValueError, match="2 training pairs make no whole batch"):
        batches.batch(0)


def test_tokenized_splits_are_written_once_and_remade_when_their_pairs_change(corpus, tmp_path):
    from keras_transformer.data.shards import tokenized_splits

    data, tokenizer, _ = corpus
    splits = {"train": data.splits["train"], "validation": data.splits["validation"]}
    made, reused = tokenized_splits(tmp_path, splits, tokenizer, 12, 3)
    assert not reused
    again, reused = tokenized_splits(tmp_path, splits, tokenizer, 12, 3)
    assert reused
    for name in splits:
        for field in ("source", "source_offsets", "target", "target_offsets", "lengths"):
            np.testing.assert_array_equal(getattr(again[name], field), getattr(made[name], field))
        assert again[name].dropped == made[name].dropped
    np.testing.assert_array_equal(
        made["train"].source,
        tokenize_split(splits["train"], tokenizer, 12).source,
    )
    changed = dict(splits, train=splits["train"][:-1])
    remade, reused = tokenized_splits(tmp_path, changed, tokenizer, 12, 3)
    assert not reused and len(remade["train"]) == len(made["train"]) - 1
    _, reused = tokenized_splits(tmp_path, changed, tokenizer, 16, 3)  # another max_length
    assert not reused


def test_bucket_sizes_reject_budget_below_longest_pair():
    with pytest.raises(ValueError, match="batch_tokens=100 must be at least"):
        bucket_sizes(max_length=64, batch_tokens=100, num_replicas=2)


@pytest.mark.parametrize("boundaries", ["default", "exact"])
@pytest.mark.parametrize("num_replicas", [1, 3])
def test_an_epoch_takes_each_pair_at_most_once_and_evaluation_all_once(
    corpus, num_replicas, boundaries
):
    from keras_transformer.data.pipeline import assemble
    from keras_transformer.data.planning import BUCKET_BOUNDARIES, plan_batches

    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["train"], tokenizer, max_length=12)
    assert len(split) + split.dropped == data.info["counts"]["train"]
    bounds = BUCKET_BOUNDARIES if boundaries == "default" else range(2, 13)
    evaluation = np.concatenate(plan_batches(split, 96, num_replicas, boundaries=bounds))
    np.testing.assert_array_equal(np.sort(evaluation), np.arange(len(split)))
    rng = np.random.default_rng(0)
    first = plan_batches(split, 96, num_replicas, rng, drop_remainder=True, boundaries=bounds)
    second = plan_batches(split, 96, num_replicas, rng, drop_remainder=True, boundaries=bounds)
    taken = np.concatenate(first)
    assert len(np.unique(taken)) == len(taken)  # no pair twice in an epoch
    # Only what does not split over the replicas is left out: < num_replicas per bucket.
    buckets = np.searchsorted([b for b in bounds if b <= 12], split.lengths, side="right")
    assert len(split) - len(taken) < num_replicas * len(np.unique(buckets))
    assert [b.tolist() for b in first] != [b.tolist() for b in second]  # reshuffled
    for indices in first:
        features, labels = assemble(split, indices)
        width = max(features["source_ids"].shape[1], features["target_ids"].shape[1])
        assert len(indices) % num_replicas == 0 and len(indices) * width <= 96
        # A batch holds one bucket; the batch is as wide as its longest pair.
        assert len(np.unique(buckets[indices])) == 1
        assert split.lengths[indices].max() == width
    if boundaries == "exact":  # one length per batch: no row is padded on both sides
        for indices in first:
            assert (split.lengths[indices] == split.lengths[indices[0]]).all()
    stats = plan_statistics(split, 96, num_replicas, boundaries=bounds)
    assert stats["batches"] == len(first) and 0.0 <= stats["padding_share"] < 0.5


def test_assembled_batches_are_the_pairs_tokens_written_out_one_by_one(corpus):
    """`assemble` (numpy gathers, no loop over pairs) against the batch written
    pair by pair in Python: source + EOS, BOS + target, target + EOS, zeros after."""
    from keras_transformer.data.pipeline import assemble

    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["train"], tokenizer, max_length=40)
    indices = np.random.default_rng(3).choice(len(split), size=37, replace=False)
    features, labels = assemble(split, indices, bos_id=2, eos_id=3)
    sources = [split.source[split.source_offsets[i] : split.source_offsets[i + 1]] for i in indices]
    targets = [split.target[split.target_offsets[i] : split.target_offsets[i + 1]] for i in indices]
    width = max(len(t) for t in targets) + 1
    assert features["source_ids"].shape == (37, max(len(s) for s in sources))
    assert features["target_ids"].shape == labels.shape == (37, width)
    for r, (source, target) in enumerate(zip(sources, targets, strict=True)):
        source, target = source.tolist(), target.tolist()
        pad = [0] * (features["source_ids"].shape[1] - len(source))
        assert features["source_ids"][r].tolist() == source + pad
        assert source[-1] == 3  # the source's EOS is in the split already
        assert features["target_ids"][r].tolist() == [2] + target + [0] * (width - 1 - len(target))
        assert labels[r].tolist() == target + [3] + [0] * (width - 1 - len(target))


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_packed_rows_hold_each_pair_once_within_their_width(corpus, num_replicas):
    from keras_transformer.data.pipeline import assemble, assemble_packed
    from keras_transformer.data.planning import plan_packed_batches

    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["train"], tokenizer, max_length=40)
    source_lengths = np.diff(split.source_offsets)
    target_lengths = np.diff(split.target_offsets) + 1
    evaluation = plan_packed_batches(split, 128, num_replicas)
    pairs = np.concatenate([rows.pairs for _, rows in evaluation])
    np.testing.assert_array_equal(np.sort(pairs), np.arange(len(split)))  # all, once
    rng = np.random.default_rng(0)
    first = plan_packed_batches(split, 128, num_replicas, rng, drop_remainder=True)
    second = plan_packed_batches(split, 128, num_replicas, rng, drop_remainder=True)
    assert [r.tolist() for _, r in first] != [r.tolist() for _, r in second]  # reshuffled
    assert all(len(rows) % num_replicas == 0 for _, rows in evaluation)
    for width, rows in first:  # whole batches only: one shape per width
        assert len(rows) == 128 // width // num_replicas * num_replicas
        for row in rows:
            assert source_lengths[row].sum() <= width and target_lengths[row].sum() <= width
        features, labels = assemble_packed(split, width, rows)
        assert features["source_ids"].shape == features["target_ids"].shape == (len(rows), width)
        for r, row in enumerate(rows):
            # Each pair, cut out of the row by its segment id, is what `assemble` pads.
            for segment, index in enumerate(row, 1):
                alone, alone_labels = assemble(split, np.array([index]))
                at_source = features["source_segment_ids"][r] == segment
                at_target = features["target_segment_ids"][r] == segment
                np.testing.assert_array_equal(
                    features["source_ids"][r, at_source], alone["source_ids"][0]
                )
                np.testing.assert_array_equal(
                    features["target_ids"][r, at_target], alone["target_ids"][0]
                )
                np.testing.assert_array_equal(labels[r, at_target], alone_labels[0])
                np.testing.assert_array_equal(
                    features["target_positions"][r, at_target], np.arange(at_target.sum())
                )
            padding = features["source_segment_ids"][r] == 0
            assert (features["source_ids"][r, padding] == 0).all()
            assert (labels[r, features["target_segment_ids"][r] == 0] == 0).all()
    stats = plan_statistics(split, 128, num_replicas, pack=True)
    bucketed = plan_statistics(split, 128, num_replicas)
    assert stats["padding_share"] < bucketed["padding_share"]


def test_packed_dataset_has_the_packing_features(corpus):
    from keras_transformer.layers.masks import PACKING_KEYS

    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["validation"], tokenizer, max_length=12)
    for training in (True, False):
        ds = to_tf_dataset(_batches(split, training=training, pack=True))
        features, labels = next(ds.as_numpy_iterator())
        assert set(features) == {"source_ids", "target_ids", *PACKING_KEYS}
        assert labels.shape == features["target_ids"].shape


def test_repeat_sentences_repeats_exactly_the_ding_full_sentences():
    pairs = [
        ("Er ist vor der Abfahrt angekommen.", "He arrived before the departure."),
        ("Über alles in der Welt!", "Above everything in the world!"),
        ("Wie geht es dir?", "How are you doing?"),
        ("er ist angekommen.", "He has arrived."),  # not capitalized
        ("Er kam an.", "He arrived"),  # no final punctuation
        ("Geh weg!", "Go away!"),  # two words
        ("Abfahrt", "departure"),
        ("Ärger mit dem Chef.", "Trouble with the boss."),
    ]
    repeated = repeat_sentences(pairs, 3)
    assert repeated[: len(pairs)] == pairs
    assert repeated[len(pairs) :] == [pairs[i] for i in (0, 1, 2, 7)] * 2
    assert repeat_sentences(pairs, 1) is pairs
    with pytest.raises(ValueError, match="times must be an integer >= 1"):
        repeat_sentences(pairs, 0)


def test_a_parsed_corpus_is_read_back_only_for_the_same_files(corpus, tmp_path):
    from keras_transformer.data import shards
    from keras_transformer.data.shards import source_identity

    _, _, folder = corpus
    copy = tmp_path / "corpus"
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    source = source_identity(data_dir=str(copy))
    cache = tmp_path / "data"
    assert shards.read_corpus(cache, source) is None  # nothing written yet
    parsed = load_translation_data(data_dir=str(copy))
    shards.write_corpus(cache, source, parsed)
    again = shards.read_corpus(cache, source_identity(data_dir=str(copy)))
    # All but the training pairs (the shards hold them): held-out text, languages, info.
    assert again.splits == {name: parsed.splits[name] for name in ("validation", "test")}
    assert again.info == parsed.info and again.source_language == parsed.source_language
    assert again.info["sha256"]["train"] == shards.digest_pairs(parsed.splits["train"])
    assert shards.read_corpus(cache, source_identity(data_dir=str(copy), direction="en-de")) is None
    (copy / "vocab.model").write_bytes(b"not read by the corpus reader")
    assert source_identity(data_dir=str(copy)) == source  # only the split files count
    with open(copy / "test.en", "a", encoding="utf-8") as f:
        f.write("one more\n")
    with open(copy / "test.de", "a", encoding="utf-8") as f:
        f.write("noch eins\n")
    assert shards.read_corpus(cache, source_identity(data_dir=str(copy))) is None


@pytest.mark.parametrize("pack", [False, True])
def test_batch_statistics_describe_the_first_pass_that_training_reads(corpus, pack):
    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["train"], tokenizer, max_length=12)
    batches = _batches(split, pack=pack, seed=3)
    stats = batches.statistics()
    assert stats["batches"] == len(batches.training_pass(0))
    sizes, source, target, positions = [], 0, 0, 0
    for index in range(stats["batches"]):  # the first pass, as assembled
        features, labels = batches.batch(index)
        real_source = int((features["source_ids"] != 0).sum())
        real_target = int((labels != 0).sum())  # the shifted target, EOS included
        rows = features["source_ids"].shape[0]
        sizes.append(int(features["source_segment_ids"].max(axis=1).sum()) if pack else rows)
        source, target = source + real_source, target + real_target
        positions += features["source_ids"].size + features["target_ids"].size
    assert stats["batch_size"] == pytest.approx(np.mean(sizes))
    assert stats["source_tokens"] == pytest.approx(source / stats["batches"])
    assert stats["target_tokens"] == pytest.approx(target / stats["batches"])
    assert stats["padding_share"] == pytest.approx(1 - (source + target) / positions)


def test_a_prepared_work_directory_never_reads_its_corpus_text_again(corpus, tmp_path, monkeypatch):
    from keras_transformer import workdir
    from keras_transformer.training import inputs
    from keras_transformer.training.machine import Machine
    from keras_transformer.training.options import TrainingConfig

    _, _, folder = corpus
    config = TrainingConfig(
        preset="tiny", data_dir=str(folder), vocab_size=64, batch_tokens=256,
        work_dir=str(tmp_path / "work"),
    ).resolved()  # fmt: skip
    machine = Machine(
        cpu={}, threads={}, has_gpu=False, gpu_name=None, strategy=None,
        strategy_description="", num_replicas=1, is_chief=True, task_name="worker_0",
    )  # fmt: skip
    work = workdir.WorkDir(config.work_dir)
    first = inputs.prepare_inputs(config, machine, work)

    def no_parsing(*args, **kwargs):
        raise AssertionError("the corpus text was read again")

    monkeypatch.setattr(inputs, "load_translation_data", no_parsing)
    again = inputs.prepare_inputs(config, machine, work)
    assert again.batch_stats == first.batch_stats
    assert again.data.splits["test"] == first.data.splits["test"]
    np.testing.assert_array_equal(again.train_batches.batch(3)[1], first.train_batches.batch(3)[1])
    # Another --sentence-repeats needs new shards: then, and only then, the text is read.
    with pytest.raises(AssertionError, match="read again"):
        inputs.prepare_inputs(dataclasses.replace(config, sentence_repeats=2), machine, work)


def test_batches_assembled_ahead_are_the_inline_stream_in_one_thread(corpus):
    import threading

    from keras_transformer.data import PyDataset
    from keras_transformer.data.datasets import AheadOfStep

    data, tokenizer, _ = corpus
    split = tokenize_split(data.splits["train"], tokenizer, max_length=12)
    inline = _batches(split, pack=True, seed=5)
    ahead = PyDataset(_batches(split, pack=True, seed=5), ahead=3)
    count = 3 * len(inline.training_pass(0))  # three passes: the plans ahead too
    for index in range(count):
        (features, labels), (expected, expected_labels) = ahead[index], inline.batch(index)
        np.testing.assert_array_equal(labels, expected_labels)
        for name in expected:
            np.testing.assert_array_equal(features[name], expected[name])
    assert ahead.input_wait_seconds >= 0.0
    threads = set()

    def make(index):
        threads.add(threading.get_ident())
        return index * index

    stream = AheadOfStep(make, depth=2)
    assert [stream.get(i) for i in (0, 1, 2, 5, 6)] == [0, 1, 4, 25, 36]  # a skip too
    assert len(threads) == 1 and threading.get_ident() not in threads
