"""Corpora larger than memory: a folder's training pairs streamed from its files,
tokenized in chunks on worker processes into memory-mapped shards (`data.binarize`),
against the in-memory path they replace; and training from the shards alone."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from translation_fixtures import write_parallel_folder

from keras_transformer.data import binarize, text_files
from keras_transformer.data.pipeline import tokenize_split
from keras_transformer.data.sources import load_translation_data
from keras_transformer.data.vocabulary import SentencePieceTokenizer, train_vocabulary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _with_blank_lines(folder):
    """Empty sides on some lines: read_parallel_split skips them, so must the stream."""
    for language in ("de", "en"):
        path = folder / f"train.{language}"
        lines = path.read_text(encoding="utf-8").splitlines()
        lines[3] = "" if language == "de" else lines[3]
        lines[10] = "  " if language == "en" else lines[10]
        path.write_text("\n".join(lines), encoding="utf-8")  # no final line break
    return folder


@pytest.mark.parametrize("validation_files", [True, False])
@pytest.mark.parametrize("direction", ["de-en", "en-de"])
def test_the_streamed_training_pairs_are_the_pairs_read_into_memory(
    tmp_path, validation_files, direction
):
    folder = _with_blank_lines(write_parallel_folder(tmp_path / "corpus", sizes=(700, 20, 20)))
    if not validation_files:  # 1% of the training pairs held out by a hash of their text
        for language in ("de", "en"):
            os.remove(folder / f"validation.{language}")
    memory = load_translation_data(data_dir=str(folder), direction=direction)
    streamed = load_translation_data(data_dir=str(folder), direction=direction, stream_train=True)
    assert isinstance(streamed.splits["train"], text_files.TrainStream)
    assert list(streamed.splits["train"]) == memory.splits["train"]
    assert streamed.splits["validation"] == memory.splits["validation"]
    assert streamed.info["counts"] == memory.info["counts"]
    assert streamed.splits["train"][:5] == memory.splits["train"][:5]
    assert len(memory.splits["train"]) == 700 - 2 - (0 if validation_files else 6)


def test_unequal_line_counts_are_found_before_streaming(tmp_path):
    folder = write_parallel_folder(tmp_path / "corpus", sizes=(50, 5, 5))
    with open(folder / "train.en", "a", encoding="utf-8") as f:
        f.write("one more\n")
    with pytest.raises(ValueError, match="different line counts: .*50 lines.*51 lines"):
        load_translation_data(data_dir=str(folder), stream_train=True)


@pytest.mark.parametrize("workers,chunk_pairs", [(1, 7), (2, 50), (2, 10_000)])
def test_chunked_tokenization_gives_the_in_memory_arrays(tmp_path, workers, chunk_pairs):
    folder = write_parallel_folder(tmp_path / "corpus", sizes=(600, 5, 5))
    data = load_translation_data(data_dir=str(folder), stream_train=True)
    pairs = list(data.splits["train"])
    pairs[17] = (" ".join(["neun"] * 30), "nine")  # longer than max_length: dropped
    vocabulary = str(tmp_path / "vocab.model")
    train_vocabulary(pairs, vocabulary, 64)
    expected = tokenize_split(pairs, SentencePieceTokenizer(vocabulary), max_length=24)
    split = binarize.tokenize_to_files(
        iter(pairs), vocabulary, str(tmp_path / "train"), 24, workers=workers,
        chunk_pairs=chunk_pairs,
    )  # fmt: skip
    assert expected.dropped == split.dropped == 1
    for name in ("source", "source_offsets", "target", "target_offsets", "lengths"):
        np.testing.assert_array_equal(getattr(split, name), getattr(expected, name), err_msg=name)
    assert isinstance(split.source, np.memmap)  # read from disk as batches take it
    binarize.save(expected, str(tmp_path / "saved"))
    saved = binarize.load(str(tmp_path / "saved"))
    np.testing.assert_array_equal(saved.target, expected.target)


def _train(*args):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    command = [
        sys.executable, os.path.join(ROOT, "train.py"), "--preset", "tiny", "--vocab-size", "64",
        "--batch-tokens", "256", "--steps", "5", "--epochs", "1", "--validation-bleu-every",
        "0", "--test-samples", "5", "--beam-size", "1", "--no-export", "--workers", "2",
        "--filters", "none", *args,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_a_prepared_corpus_trains_without_its_text_and_a_changed_one_is_prepared_again(
    tmp_path,
):
    folder = write_parallel_folder(tmp_path / "corpus", sizes=(400, 20, 20))
    work = tmp_path / "work"
    prepared = _train("--data-dir", str(folder), "--work-dir", str(work), "--prepare-only")
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    assert "on 2 process(es)" in prepared.stderr
    manifest = (work / "data" / "manifest.json").read_text()

    # A changed corpus, not yet trained on: detected, and the work directory prepared again.
    with open(folder / "train.de", "a", encoding="utf-8") as f, open(folder / "train.en", "a") as g:
        f.write("neun neun\n")
        g.write("nine nine\n")
    again = _train("--data-dir", str(folder), "--work-dir", str(work), "--prepare-only")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "was prepared for other data (train_pairs_sha256" in again.stderr
    assert "preparing it again" in again.stderr
    assert (work / "data" / "manifest.json").read_text() != manifest
    counts = json.loads((work / "data" / "held_out.json").read_text())["data"]["info"]["counts"]
    assert counts["train"] == 401

    for name in ("train.de", "train.en"):  # the text goes; the shards stay
        os.remove(folder / name)
    trained = _train("--data-dir", str(folder), "--work-dir", str(work))
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "has no train.* files: training from the corpus prepared in" in trained.stderr
    assert "Read the tokenized 401 train pairs" in trained.stderr
    info = json.loads((work / "run.json").read_text())
    assert info["metrics"]["train_steps"] == 5 and np.isfinite(info["metrics"]["train_loss"])
