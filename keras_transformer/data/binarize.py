"""Tokenizing a corpus larger than memory: chunks of pairs on worker processes,
token arrays written as they come, read back memory-mapped.

As `fairseq-preprocess --workers N` binarizes and nanoGPT's `prepare.py`
writes `train.bin`: the pairs are read in chunks (`CHUNK_PAIRS`), each
chunk is tokenized by one of `workers` processes with the `sentencepiece`
package, and the parent appends the chunks' arrays, in corpus order, to
four raw files of a split's folder (`source.bin`, `target.bin`: int32
pieces; `source_lengths.bin`, `target_lengths.bin`: int32 per pair), so
that memory holds a few chunks, whatever the corpus's size. `load` maps
the files (`np.memmap`): training reads the tokens of the pairs a batch
takes, and only the lengths (and offsets computed from them) are in memory.

The tokens are those `pipeline.tokenize_split` gives (tests/test_binarize.py:
the same arrays, chunk sizes and worker counts whatever they are).
"""

import collections
import json
import logging
import os
import shutil
import time

import numpy as np

from keras_transformer.data.pipeline import TokenizedSplit

logger = logging.getLogger(__name__)

CHUNK_PAIRS = 20_000
FILES = ("source", "target", "source_lengths", "target_lengths")
META = "meta.json"


def default_workers():
    """Tokenizing processes when none are asked for: one per core this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


_processor = None  # the worker process's SentencePieceProcessor


def _load(path):
    global _processor
    import sentencepiece

    _processor = sentencepiece.SentencePieceProcessor(model_file=path)


def _tokenize_chunk(pairs, max_length, eos_id, sampling=None):
    """One chunk's arrays: what `pipeline.tokenize_split` keeps of it, flat.

    One thread per process (SentencePiece's batch `encode` would start one per
    core in each): the processes are the parallelism, `--workers` of them.
    `sampling`: BPE-dropout's probability alpha: each merge is dropped with it
    (SentencePiece's `enable_sampling`), drawn from SentencePiece's generator.
    """
    options = {"num_threads": 1}
    if sampling:
        options.update(enable_sampling=True, alpha=sampling)
    sources = _processor.encode([s for s, _ in pairs], **options)
    targets = _processor.encode([t for _, t in pairs], **options)
    keep = [
        i
        for i, (s, t) in enumerate(zip(sources, targets, strict=True))
        if len(s) + 1 <= max_length and len(t) + 1 <= max_length
    ]
    source_lengths = np.fromiter((len(sources[i]) + 1 for i in keep), np.int32, len(keep))
    target_lengths = np.fromiter((len(targets[i]) for i in keep), np.int32, len(keep))
    source = np.fromiter(
        (token for i in keep for token in (*sources[i], eos_id)), np.int32,
        int(source_lengths.sum()),
    )  # fmt: skip
    target = np.fromiter(
        (token for i in keep for token in targets[i]), np.int32, int(target_lengths.sum())
    )
    dropped = np.setdiff1d(np.arange(len(pairs), dtype=np.int64), keep, assume_unique=True)
    return source, target, source_lengths, target_lengths, dropped


def _chunks(pairs, size):
    chunk = []
    for pair in pairs:
        chunk.append(pair)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def tokenize_to_files(pairs, tokenizer_path, folder, max_length, eos_id=3, workers=None,
                      chunk_pairs=CHUNK_PAIRS, sampling=None):  # fmt: skip
    """Tokenizes an iterable of `(source, target)` strings into the split folder `folder`.

    Args:
        pairs: any iterable of pairs (e.g. a `text_files.TrainStream`), read once.
        tokenizer_path: the SentencePiece model file.
        workers: tokenizing processes (None: `default_workers()`; 1: this process).
        sampling: BPE-dropout's probability (`_tokenize_chunk`; None: none). No seed
            makes a sample again: SentencePiece 0.2 salts its generator per process.

    The split remembers how many pairs of each corpus it kept (`parts`) where
    `pairs` mixes corpora (a `text_files.MixedTrainStream`: `sizes`).

    Returns:
        `load(folder)`: the split, memory-mapped.
    """
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1. Received: workers={workers}")
    start = time.time()
    temporary = f"{folder}.tmp{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    files = {name: open(os.path.join(temporary, f"{name}.bin"), "wb") for name in FILES}
    counts = collections.Counter()
    sizes = getattr(pairs, "sizes", None)
    bounds = None if sizes is None else np.cumsum(sizes)
    kept = None if sizes is None else np.array(sizes, dtype=np.int64)
    try:
        for arrays in _tokenized_chunks(pairs, tokenizer_path, max_length, eos_id, workers,
                                        chunk_pairs, sampling):  # fmt: skip
            *arrays, dropped = arrays
            for name, array in zip(FILES, arrays, strict=True):
                array.tofile(files[name])
            if kept is not None:  # the dropped pairs' corpora, from their positions
                corpus = np.searchsorted(bounds, counts["read"] + dropped, side="right")
                kept -= np.bincount(corpus, minlength=len(kept))
            counts["read"] += len(arrays[2]) + len(dropped)
            counts["pairs"] += len(arrays[2])
            counts["dropped"] += len(dropped)
            counts["chunks"] += 1
    finally:
        for f in files.values():
            f.close()
    with open(os.path.join(temporary, META), "w", encoding="utf-8") as f:
        meta = {"pairs": counts["pairs"], "dropped": counts["dropped"], "dtype": "int32"}
        if kept is not None:
            meta["parts"] = kept.tolist()
        json.dump(meta, f)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(temporary, folder)
    seconds = time.time() - start
    total = counts["pairs"] + counts["dropped"]
    logger.info(
        "Tokenized %d pairs in %d chunks on %d process(es) in %.0fs (%.0f pairs/s): %s",
        total, counts["chunks"], workers, seconds, total / max(seconds, 1e-9), folder,
    )  # fmt: skip
    return load(folder)


def _tokenized_chunks(pairs, tokenizer_path, max_length, eos_id, workers, chunk_pairs,
                      sampling=None):  # fmt: skip
    """The arrays of each chunk, in order; at most `2 * workers` chunks in flight."""
    chunks = _chunks(pairs, chunk_pairs)
    if workers == 1:
        _load(tokenizer_path)
        for chunk in chunks:
            yield _tokenize_chunk(chunk, max_length, eos_id, sampling)
        return
    import multiprocessing

    # `spawn`: the caller may run JAX's, TensorFlow's or torch's threads, which `fork` copies badly.
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_load, initargs=(tokenizer_path,)) as pool:
        pending = collections.deque()
        for chunk in chunks:
            arguments = (chunk, max_length, eos_id, sampling)
            pending.append(pool.apply_async(_tokenize_chunk, arguments))
            if len(pending) >= 2 * workers:  # back-pressure: the reader waits for the workers
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def load(folder):
    """The `TokenizedSplit` of a split folder written by `tokenize_to_files` or `save`,
    its token arrays memory-mapped (read from disk as batches take them)."""
    with open(os.path.join(folder, META), encoding="utf-8") as f:
        meta = json.load(f)
    arrays = {}
    for name in FILES:
        path = os.path.join(folder, f"{name}.bin")
        size = os.path.getsize(path)
        # np.memmap cannot map an empty file; an empty split has nothing to map.
        arrays[name] = (
            np.memmap(path, dtype=meta["dtype"], mode="r") if size else np.zeros(0, np.int32)
        )
    if len(arrays["source_lengths"]) != meta["pairs"]:
        raise ValueError(f"{folder} is incomplete: {META} and the files disagree; remove it.")
    source_lengths = np.asarray(arrays["source_lengths"])
    target_lengths = np.asarray(arrays["target_lengths"])
    return TokenizedSplit(
        source=arrays["source"],
        source_offsets=_offsets(source_lengths),
        target=arrays["target"],
        target_offsets=_offsets(target_lengths),
        lengths=np.maximum(source_lengths, target_lengths + 1),  # int32
        dropped=meta["dropped"],
        parts=tuple(meta["parts"]) if "parts" in meta else None,
    )


def save(split, folder):
    """Writes an in-memory `TokenizedSplit` as a split folder (`load` reads it back)."""
    temporary = f"{folder}.tmp{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    arrays = {
        "source": split.source,
        "target": split.target,
        "source_lengths": np.diff(split.source_offsets),
        "target_lengths": np.diff(split.target_offsets),
    }
    for name, array in arrays.items():
        np.asarray(array, dtype=np.int32).tofile(os.path.join(temporary, f"{name}.bin"))
    with open(os.path.join(temporary, META), "w", encoding="utf-8") as f:
        meta = {"pairs": len(split), "dropped": int(split.dropped), "dtype": "int32"}
        if split.parts is not None:
            meta["parts"] = list(split.parts)
        json.dump(meta, f)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(temporary, folder)


def _offsets(lengths):
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets
