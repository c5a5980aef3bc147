"""Tokenized splits written once per work directory, as numpy arrays.

In the spirit of `fairseq-preprocess` and nanoGPT's `train.bin`: the first
run of a work directory tokenizes its training and validation pairs with
the `sentencepiece` package and writes each split's flat token arrays to
`<work_dir>/data/<split>.npz`; later runs (a resumed or continued run) read
them back instead of tokenizing again. `manifest.json` beside them names
what they were made from (a digest of the vocabulary file, of the pairs,
and the settings), and a difference in any of them makes new ones.
"""

import hashlib
import json
import logging
import os

import numpy as np

from keras_transformer.data.pipeline import TokenizedSplit, tokenize_split

logger = logging.getLogger(__name__)

FORMAT = 1
_ARRAYS = ("source", "source_offsets", "target", "target_offsets", "lengths")


def digest_pairs(pairs):
    """SHA-256 of a list of `(source, target)` strings, in order (hex)."""
    digest = hashlib.sha256()
    for source, target in pairs:
        digest.update(source.encode("utf-8"))
        digest.update(b"\t")
        digest.update(target.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def digest_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def save_split(split, path):
    """Writes a `TokenizedSplit` to `path` (.npz), atomically."""
    temporary = f"{path}.tmp{os.getpid()}.npz"
    arrays = {name: getattr(split, name) for name in _ARRAYS}
    np.savez(temporary, dropped=np.int64(split.dropped), **arrays)
    os.replace(temporary, path)


def load_split(path):
    """The `TokenizedSplit` written by `save_split`."""
    with np.load(path) as arrays:
        return TokenizedSplit(
            **{name: arrays[name] for name in _ARRAYS}, dropped=int(arrays["dropped"])
        )


def tokenized_splits(folder, splits, tokenizer, max_length, eos_id):
    """The `TokenizedSplit` of each of `splits`, read from `folder` when it was
    made from the same pairs, vocabulary and settings, else tokenized and written there.

    Args:
        folder: usually `<work_dir>/data`.
        splits: dict name -> list of `(source, target)` strings.
        tokenizer: a `SentencePieceTokenizer` (its `path` is digested).

    Returns:
        `(tokenized, reused)`: dict name -> `TokenizedSplit`, and whether all were read back.
    """
    os.makedirs(folder, exist_ok=True)
    manifest_path = os.path.join(folder, "manifest.json")
    expected = {
        "format": FORMAT,
        "vocabulary_sha256": digest_file(tokenizer.path),
        "max_length": max_length,
        "eos_id": eos_id,
        "splits": {name: digest_pairs(pairs) for name, pairs in splits.items()},
    }
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = None
    if manifest == expected:
        tokenized = {name: load_split(os.path.join(folder, f"{name}.npz")) for name in splits}
        return tokenized, True
    tokenized = {}
    for name, pairs in splits.items():
        tokenized[name] = tokenize_split(pairs, tokenizer, max_length, eos_id=eos_id)
        save_split(tokenized[name], os.path.join(folder, f"{name}.npz"))
    temporary = f"{manifest_path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1)
    os.replace(temporary, manifest_path)
    return tokenized, False
