"""BPE-dropout (`--bpe-dropout`, Provilkov et al. 2020): training passes read sampled
segmentations of the training pairs, copy `pass % K` of K made once per work
directory (`data.shards.sampled_copies`); the validation pairs, the test decode and
translation keep the deterministic one."""

import dataclasses

import numpy as np
import pytest
from translation_fixtures import write_parallel_folder

from keras_transformer.data import binarize
from keras_transformer.data.pipeline import tokenize_split


@pytest.fixture(scope="module")
def corpus_folder(tmp_path_factory):
    return write_parallel_folder(tmp_path_factory.mktemp("corpus") / "numbers", sizes=(300, 30, 30))


def _prepare(folder, work_dir, **options):
    from keras_transformer import workdir
    from keras_transformer.training import inputs
    from keras_transformer.training.machine import Machine
    from keras_transformer.training.options import TrainingConfig

    config = TrainingConfig(
        preset="tiny", data_dir=str(folder), vocab_size=64, batch_tokens=256,
        work_dir=str(work_dir), workers=1, **options,
    ).resolved()  # fmt: skip
    machine = Machine(
        cpu={}, threads={}, has_gpu=False, gpu_name=None, strategy=None,
        strategy_description="", num_replicas=1, is_chief=True, task_name="worker_0",
    )  # fmt: skip
    return inputs.prepare_inputs(config, machine, workdir.WorkDir(config.work_dir))


def _pairs(split, tokenizer):
    """The pairs of a `TokenizedSplit` as text (source without its EOS)."""
    return [
        (
            tokenizer.detokenize([split.source[split.source_offsets[i] : split.source_offsets[i + 1] - 1]])[0],
            tokenizer.detokenize([split.target[split.target_offsets[i] : split.target_offsets[i + 1]]])[0],
        )
        for i in range(len(split))
    ]  # fmt: skip


def _rows(split):
    return [
        tuple(split.source[split.source_offsets[i] : split.source_offsets[i + 1]])
        for i in range(len(split))
    ]


def test_training_passes_read_sampled_segmentations_and_evaluation_never(corpus_folder, tmp_path):
    sampled = _prepare(corpus_folder, tmp_path / "work", bpe_dropout=0.3, bpe_dropout_copies=2)
    train, tokenizer = sampled.train_batches, sampled.tokenizer
    deterministic = train.tokenized
    copies = [train.pass_split(number) for number in range(3)]
    assert copies[2] is copies[0] and copies[1] is not copies[0]  # pass p reads copy p % 2
    # Every copy holds the same pairs as the deterministic split, segmented otherwise.
    assert all(split.dropped == deterministic.dropped == 0 for split in copies)
    text = _pairs(deterministic, tokenizer)
    for split in copies[:2]:
        assert _pairs(split, tokenizer) == text
        different = sum(a != b for a, b in zip(_rows(split), _rows(deterministic), strict=True))
        assert different > len(deterministic) // 4, different
        assert len(split.source) > len(deterministic.source)  # dropped merges: more pieces
    assert sum(a != b for a, b in zip(_rows(copies[0]), _rows(copies[1]), strict=True)) > 30
    # The first batch of pass 1 is planned on and assembled from copy 1.
    planned = train.training_pass(1)[0]
    features, labels = train.batch(len(train.training_pass(0)))
    expected_features, expected_labels = train.assemble(planned, copies[1])
    np.testing.assert_array_equal(labels, expected_labels)
    np.testing.assert_array_equal(features["source_ids"], expected_features["source_ids"])
    # Evaluation: the validation batches hold the deterministic segmentation.
    validation = sampled.val_ds.tokenized
    expected = tokenize_split(sampled.data.splits["validation"], tokenizer, max_length=64)
    np.testing.assert_array_equal(validation.source, expected.source)
    np.testing.assert_array_equal(validation.target, expected.target)
    # Without BPE-dropout every pass reads the deterministic split, as before.
    plain = _prepare(corpus_folder, tmp_path / "plain")
    assert plain.train_batches.pass_split(1) is plain.train_batches.tokenized
    np.testing.assert_array_equal(plain.train_batches.tokenized.source, deterministic.source)
    np.testing.assert_array_equal(plain.val_ds.tokenized.source, validation.source)


def test_copies_are_made_once_and_read_back(corpus_folder, tmp_path):
    first = _prepare(corpus_folder, tmp_path / "a", bpe_dropout=0.2, bpe_dropout_copies=2)
    again = _prepare(corpus_folder, tmp_path / "a", bpe_dropout=0.2, bpe_dropout_copies=3)
    for number in range(2):  # read back (a resumed run trains on the same copies)
        np.testing.assert_array_equal(
            again.train_batches.pass_split(number).source,
            first.train_batches.pass_split(number).source,
        )
    assert len({tuple(again.train_batches.pass_split(n).source) for n in range(3)}) == 3
    # Another probability: other copies.
    changed = _prepare(corpus_folder, tmp_path / "a", bpe_dropout=0.5, bpe_dropout_copies=2)
    assert not np.array_equal(
        changed.train_batches.pass_split(0).source, first.train_batches.pass_split(0).source
    )


def test_sampled_on_several_workers_keeps_the_pairs_and_their_text(corpus_folder, tmp_path):
    from keras_transformer.data import load_translation_data
    from keras_transformer.data.vocabulary import get_tokenizer

    pairs = list(load_translation_data(data_dir=str(corpus_folder)).splits["train"])
    vocabulary = str(tmp_path / "vocab.model")
    tokenizer = get_tokenizer(vocabulary, pairs, 64)
    plain = binarize.tokenize_to_files(pairs, vocabulary, str(tmp_path / "plain"), 64, workers=1)
    sampled = binarize.tokenize_to_files(
        pairs, vocabulary, str(tmp_path / "sampled"), 64, workers=2, chunk_pairs=100,
        sampling=0.3,
    )  # fmt: skip
    assert _pairs(sampled, tokenizer) == _pairs(plain, tokenizer)
    assert len(sampled.source) > len(plain.source)


def test_bpe_dropout_is_off_unless_asked_for_and_checked():
    from keras_transformer.training.options import TrainingConfig

    config = TrainingConfig(bpe_dropout=0.1).resolved()
    assert (config.bpe_dropout, config.bpe_dropout_copies) == (0.1, 8)
    assert TrainingConfig().resolved().bpe_dropout == 0.0  # off unless asked for
    assert dataclasses.replace(config, bpe_dropout=0.0).bpe_dropout == 0.0
    with pytest.raises(ValueError, match=r"bpe_dropout must be in \[0, 1\)"):
        TrainingConfig(bpe_dropout=1.0)


def test_mixed_corpora_are_drawn_by_each_copys_own_parts(corpus_folder, tmp_path):
    """With `--mix`, a copy may drop other pairs than another (a longer segmentation
    exceeds `max_length`), so each pass plans its mixture on the parts of the copy it
    reads."""
    from keras_transformer.data import Batches, load_translation_data
    from keras_transformer.data.vocabulary import get_tokenizer

    pairs = list(load_translation_data(data_dir=str(corpus_folder)).splits["train"])
    tokenizer = get_tokenizer(str(tmp_path / "vocab.model"), pairs, 64)
    first = dataclasses.replace(tokenize_split(pairs, tokenizer, 64), parts=(100, 200))
    second = tokenize_split(pairs[50:], tokenizer, 64)  # as if 50 of the first corpus dropped
    second = dataclasses.replace(second, parts=(50, 200))
    batches = Batches(
        first, max_length=64, batch_tokens=256, seed=3, weights=[1.0, 0.5],
        passes=(first, second),
    )  # fmt: skip
    for number, split in ((0, first), (1, second)):
        planned = np.concatenate(batches.training_pass(number))
        share = np.mean(planned < split.parts[0])  # 1 / 1.5 of the pairs: the first corpus
        assert abs(share - 2 / 3) < 0.05, (number, share)
        assert planned.max() < len(split)
