"""The corpus and its tokenized splits, written once per work directory.

In the spirit of `fairseq-preprocess` and nanoGPT's `train.bin`: the first
run of a work directory parses its corpus, keeps what a run needs of it
besides the training pairs (`write_corpus`: languages, counts, each
split's digest, the held-out splits' text, to
`<work_dir>/data/held_out.json`) and tokenizes its training and validation
pairs with the `sentencepiece` package (`tokenized_splits`, each split's
flat token arrays to the folder `<work_dir>/data/<split>/`, `data.binarize`; with
BPE-dropout, `sampled_copies` adds sampled segmentations of the training pairs
in `<work_dir>/data/train_sampled/<k>/`); later runs (a resumed
or continued run) read both back and never read the corpus's text. Each names what it
was made from (the corpus's source files and the parser; the vocabulary
file, the pairs and the settings), and a difference in any of them makes
it anew.
"""

import dataclasses
import hashlib
import json
import logging
import os
import shutil

from keras_transformer.data.pipeline import tokenize_split

logger = logging.getLogger(__name__)

FORMAT = 2  # 2: a folder of raw token files per split (`data.binarize`), memory-mapped
CORPUS = "held_out.json"  # a parsed corpus but its training pairs (`write_corpus`)
SAMPLED = "train_sampled"  # BPE-dropout's segmentations of the training pairs (`sampled_copies`)
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
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_identity(dataset="ding", data_dir=None, direction=None, ding_path=None, mix=()):
    """What `load_translation_data` with these arguments reads, as a JSON-able dict:
    the digest of each split file of a folder or of the Ding dictionary (a TFDS
    corpus: its name, prepared once in the work directory), the direction, and the
    digest of the parsers' code. Equal identities parse to equal pairs
    (`read_corpus` reuses a parse on that promise)."""
    from keras_transformer.data import ding, sources, text_files

    if data_dir is not None:
        prefixes = {"train", "test", *text_files.VALIDATION_NAMES}  # the files it reads
        paths = {n: os.path.join(data_dir, n) for n in sorted(os.listdir(data_dir))}
        files = {
            name: digest_file(path)
            for name, path in paths.items()
            if name.split(".", 1)[0] in prefixes and os.path.isfile(path)
        }
    elif dataset == "ding":
        path = ding_path or ding.DEFAULT_CORPUS_PATH
        files = {"ding": digest_file(path)} if os.path.exists(path) else None
    else:
        files = {"dataset": dataset}
    parsers = hashlib.sha256()
    for module in (ding, text_files, sources):
        with open(module.__file__, "rb") as f:
            parsers.update(f.read())
    identity = {"files": files, "direction": direction, "parsers": parsers.hexdigest()}
    if mix:  # the mixed corpora's training files (their weights only weigh the passes)
        identity["mix"] = [
            {
                name: digest_file(os.path.join(folder, name))
                for name in sorted(os.listdir(folder))
                if name.startswith("train.")
            }
            for folder, _ in mix
        ]
    return identity


def read_corpus(folder, source):
    """The `TranslationData` that `write_corpus` left in `folder` for the same
    `source` (a JSON-able identity of what was parsed: `sources.source_identity`;
    None: whatever was parsed, when the corpus's files are gone), without its
    training pairs (no "train" in `splits`), or None."""
    from keras_transformer.data.sources import TranslationData

    try:
        with open(os.path.join(folder, CORPUS), encoding="utf-8") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        return None
    if cached.get("format") != FORMAT or (source is not None and cached.get("source") != source):
        return None
    fields = cached["data"]
    fields["splits"] = {name: [tuple(p) for p in pairs] for name, pairs in fields["splits"].items()}
    return TranslationData(**fields)


def add_digests(data):
    """`data` with each split's `digest_pairs` in `data.info["sha256"]` (once)."""
    if "sha256" not in data.info:
        data.info["sha256"] = {name: digest_pairs(pairs) for name, pairs in data.splits.items()}
    return data


def write_corpus(folder, source, data):
    """Writes what a run needs of a parsed corpus besides its training pairs (the
    tokenized shards hold those) for `read_corpus`: the languages, the info (the
    splits' digests included) and the held-out splits' text."""
    add_digests(data)
    os.makedirs(folder, exist_ok=True)
    held_out = {name: pairs for name, pairs in data.splits.items() if name != "train"}
    record = {
        "format": FORMAT,
        "source": source,
        "data": dataclasses.asdict(dataclasses.replace(data, splits=held_out)),
    }
    _write_json(os.path.join(folder, CORPUS), record)


def _write_json(path, value):
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False)
    os.replace(temporary, path)


def save_split(split, path):
    """Writes a `TokenizedSplit` to the split folder `path` (`binarize.save`), atomically."""
    from keras_transformer.data import binarize

    binarize.save(split, path)


def load_split(path):
    """The `TokenizedSplit` written by `save_split`, its tokens memory-mapped."""
    from keras_transformer.data import binarize

    return binarize.load(path)


def tokenized_splits(
    folder, splits, tokenizer, max_length, eos_id, pairs_identity=None, workers=None
):
    """The `TokenizedSplit` of each of `splits`, read from `folder` when it was
    made from the same pairs, vocabulary and settings, else tokenized and written there.

    Args:
        folder: usually `<work_dir>/data`.
        splits: dict name -> list of `(source, target)` strings, or -> a callable
            that returns it, called only when the split must be tokenized (a
            reused work directory then never reads its corpus's text). A
            split that is not a list (a `text_files.TrainStream`) is tokenized
            in chunks on `workers` processes (`binarize.tokenize_to_files`).
        tokenizer: a `SentencePieceTokenizer` (its `path` is digested).
        pairs_identity: what names the pairs of `splits` (JSON-able; e.g. the
            corpus's digests and how its sentences were repeated); None: the
            `digest_pairs` of each split (lists only).

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
        "splits": pairs_identity or {name: digest_pairs(pairs) for name, pairs in splits.items()},
    }
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = None
    if manifest == expected:
        tokenized = {name: load_split(os.path.join(folder, name)) for name in splits}
        return tokenized, True
    if manifest is not None:
        logger.info(
            "The tokenized splits in %s were made from other pairs, vocabulary or settings "
            "(%s differ): tokenizing again", folder,
            ", ".join(k for k in expected if manifest.get(k) != expected[k]),
        )  # fmt: skip
    from keras_transformer.data import binarize

    tokenized = {}
    for name, pairs in splits.items():
        pairs = pairs() if callable(pairs) else pairs
        path = os.path.join(folder, name)
        if isinstance(pairs, list):
            save_split(tokenize_split(pairs, tokenizer, max_length, eos_id=eos_id), path)
            tokenized[name] = load_split(path)
        else:
            tokenized[name] = binarize.tokenize_to_files(
                pairs, tokenizer.path, path, max_length, eos_id, workers
            )
    _write_json(manifest_path, expected)
    return tokenized, False


def sampled_copies(folder, pairs, tokenizer, max_length, eos_id, alpha, copies, pairs_identity,
                   workers=None):  # fmt: skip
    """BPE-dropout's training data: `copies` segmentations of the training pairs, each
    merge dropped with probability `alpha` (SentencePiece's `enable_sampling`; Provilkov
    et al. 2020), read from `<folder>/train_sampled/<k>` when made there from the same
    pairs, vocabulary and settings, else tokenized and written there.

    Training passes read them in turn (`pipeline.Batches`' `passes`); the validation
    and test pairs, and translation, keep the deterministic segmentation. Each copy
    costs one tokenization of the training pairs and their size on disk.

    Args:
        folder: usually `<work_dir>/data`.
        pairs: a callable that returns the training pairs (any iterable, read once per
            copy made).
        tokenizer: a `SentencePieceTokenizer` (its `path` is digested).
        alpha: the probability with which each merge is dropped, in (0, 1).
        copies: how many. A copy once written is read back (a resumed or continued
            run reads the same ones, and more copies add to them); one made again
            differs, as SentencePiece salts its generator per process
            (`binarize.tokenize_to_files`' `sampling`).
        pairs_identity: what names the pairs (JSON-able), as `tokenized_splits`'s.

    Returns:
        tuple of `TokenizedSplit`, memory-mapped.
    """
    from keras_transformer.data import binarize

    root = os.path.join(folder, SAMPLED)
    expected = {
        "format": FORMAT,
        "vocabulary_sha256": digest_file(tokenizer.path),
        "max_length": max_length,
        "eos_id": eos_id,
        "pairs": pairs_identity,
        "bpe_dropout": alpha,
    }
    manifest_path = os.path.join(root, "manifest.json")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = None
    if manifest != expected:  # copies of other pairs or settings: none is kept
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        _write_json(manifest_path, expected)
    splits = []
    for k in range(copies):
        path = os.path.join(root, str(k))
        if not os.path.exists(os.path.join(path, binarize.META)):  # written last, atomically
            binarize.tokenize_to_files(
                pairs(), tokenizer.path, path, max_length, eos_id, workers, sampling=alpha
            )
        splits.append(binarize.load(path))
    return tuple(splits)
