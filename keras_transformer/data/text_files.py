"""Reader for a folder of the user's own parallel text files.

The folder holds one file per split and language, one sentence per line,
line `i` of `train.de` translating line `i` of `train.en`:

    my_corpus/train.de  my_corpus/train.en
    my_corpus/validation.de  my_corpus/validation.en   (or valid.*, or dev.*)
    my_corpus/test.de  my_corpus/test.en               (optional)

The names fairseq, Marian and most corpus releases use are read as they
are: `valid.*` or `dev.*` for the validation split. Without one, a fixed
share of the training pairs (`HELD_OUT_SHARE`, chosen by a hash of their
text, so the same pairs every run) is held out for validation. Without
`test.*`, there is no test split (and no test decoding).
"""

import hashlib
import logging
import os

import numpy as np

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
VALIDATION_NAMES = ("validation", "valid", "dev")
HELD_OUT_SHARE = 0.01  # of the training pairs, when the folder has no validation files
MAX_HELD_OUT = 5000


def find_languages(folder):
    """The two language suffixes of `folder/train.*`, e.g. `("de", "en")`, sorted."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--data-dir {folder} is not a directory.")
    languages = sorted(
        name.split(".", 1)[1] for name in os.listdir(folder) if name.startswith("train.")
    )
    if len(languages) != 2:
        raise ValueError(
            f"{folder} must hold exactly two training files train.<src> and train.<tgt>, "
            f"one per language. Found: {['train.' + lang for lang in languages]}"
        )
    return tuple(languages)


def iter_lines(path):
    """The lines of `path` without line breaks, one at a time; fails on the first line
    that is not UTF-8, naming the file and the line."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Missing parallel text file {path}")
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: not valid UTF-8 ({error.reason} at byte "
                    f"{error.start}): {raw[:80]!r}"
                ) from None


def read_lines(path):
    """The lines of `path` without line breaks; fails on the first line that is not UTF-8."""
    return list(iter_lines(path))


def count_lines(path):
    """The lines of `path` (a last line without a line break counts), read in blocks."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Missing parallel text file {path}")
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


class TrainStream:
    """The training pairs of a folder, read from its files when iterated, never held
    in memory: what `read_parallel_split` gives, in the same order, less the pairs
    held out for validation (`held_out`: their indices among the kept pairs).

    `len()` is the number of pairs; `stream[:n]` the first n as a list (the
    vocabulary's sample). Used for corpora of any size (`read_parallel_folder`):
    their pairs are tokenized in chunks (`data.binarize`).
    """

    def __init__(self, folder, languages, count, held_out=(), flip=False):
        self.paths = [os.path.join(folder, f"train.{lang}") for lang in languages]
        self._count = count
        self._held_out = frozenset(held_out)
        self.flip = flip
        self._dropped = None  # a boolean mask over the pairs this stream gave (`without`)
        self.empty = 0  # line pairs with an empty side, skipped (`scan_train_split`)

    def without(self, dropped):
        """The same pairs less those where the boolean array `dropped` is set (one
        entry per pair of this stream, in order: `report.CorpusReport`'s filters)."""
        if self._dropped is not None:
            raise ValueError("This TrainStream is filtered already.")
        stream = TrainStream.__new__(TrainStream)
        stream.__dict__.update(self.__dict__)
        stream._dropped = np.asarray(dropped, dtype=bool)
        stream._count = self._count - int(stream._dropped.sum())
        return stream

    def flipped(self):
        """The same pairs, sides swapped."""
        stream = TrainStream.__new__(TrainStream)
        stream.__dict__.update(self.__dict__, flip=not self.flip)
        return stream

    def __len__(self):
        return self._count

    def __iter__(self):
        held_out, flip, dropped = self._held_out, self.flip, self._dropped
        given = 0
        for index, (a, b) in enumerate(_kept_pairs(self.paths)):
            if index in held_out:
                continue
            given += 1
            if dropped is None or not dropped[given - 1]:
                yield (b, a) if flip else (a, b)

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.start not in (None, 0) or key.step not in (None, 1):
            raise TypeError("A TrainStream gives its first pairs only: stream[:n].")
        import itertools

        return list(itertools.islice(self, key.stop))


class MixedTrainStream:
    """The training pairs of several corpora, one after another, each with a weight
    (`--mix`): a `TrainStream` per corpus, the first `--data-dir`'s.

    Iterating gives every corpus's pairs in turn (tokenizing, the report,
    the digests); what a pass over the data trains on is drawn from them in
    proportion to the weights (`planning.plan_mixed`), as OpenNMT's and Eole's
    corpus weights sample. `stream[:n]` (the vocabulary's sample) takes from
    each corpus its weight's share of `n`.

    Args:
        parts: `TrainStream`s, the first the main corpus's.
        weights: a positive number per part.
        names: a name per part (its folder).
    """

    def __init__(self, parts, weights, names):
        if not len(parts) == len(weights) == len(names):
            raise ValueError("A weight and a name per corpus.")
        self.parts, self.weights, self.names = list(parts), tuple(weights), tuple(names)

    @property
    def sizes(self):
        """The pairs of each corpus, in order."""
        return tuple(len(part) for part in self.parts)

    @property
    def empty(self):
        return sum(getattr(part, "empty", 0) for part in self.parts)

    def _with_parts(self, parts):
        return MixedTrainStream(parts, self.weights, self.names)

    def without(self, dropped):
        """`TrainStream.without` of each corpus with its slice of `dropped`."""
        dropped = np.asarray(dropped, dtype=bool)
        if len(dropped) != len(self):
            raise ValueError(f"{len(dropped)} flags for {len(self)} pairs.")
        ends = np.cumsum(self.sizes)
        starts = ends - self.sizes
        parts = zip(self.parts, starts, ends, strict=True)
        return self._with_parts([part.without(dropped[a:b]) for part, a, b in parts])

    def flipped(self):
        return self._with_parts([part.flipped() for part in self.parts])

    def __len__(self):
        return sum(self.sizes)

    def __iter__(self):
        for part in self.parts:
            yield from part

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.start not in (None, 0) or key.step not in (None, 1):
            raise TypeError("A MixedTrainStream gives its first pairs only: stream[:n].")
        shares = np.asarray(self.weights, dtype=float) / sum(self.weights)
        pairs = []
        for part, share in zip(self.parts, shares, strict=True):
            pairs.extend(part[: int(round(key.stop * share))])
        return pairs


def _kept_pairs(paths):
    """The stripped pairs of two parallel files whose sides are both non-empty."""
    for a, b in zip(iter_lines(paths[0]), iter_lines(paths[1]), strict=True):
        a, b = a.strip(), b.strip()
        if a and b:
            yield a, b


def _check_line_counts(paths):
    counts = [count_lines(path) for path in paths]
    if counts[0] != counts[1]:
        raise ValueError(
            f"Parallel files have different line counts: {paths[0]} has {counts[0]} lines, "
            f"{paths[1]} has {counts[1]} lines."
        )
    return counts[0]


def scan_train_split(folder, languages, hold_out):
    """One pass over `train.*`, holding nothing but a heap: `(stream, held_out_pairs)`.

    With `hold_out`, the validation pairs chosen as `read_parallel_folder`
    chooses them (`HELD_OUT_SHARE` of the kept pairs with the smallest hashes
    of their text), in corpus order; else `held_out_pairs` is None.
    """
    import heapq

    paths = [os.path.join(folder, f"train.{lang}") for lang in languages]
    lines = _check_line_counts(paths)
    kept = 0
    if hold_out:
        count = min(max(int(lines * HELD_OUT_SHARE), 1), MAX_HELD_OUT)
        heap = []  # the `count` smallest (hash, index) so far, as (-hash, -index)
        for index, pair in enumerate(_kept_pairs(paths)):
            item = (-_held_out(pair), -index)
            if len(heap) < count:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)
            kept = index + 1
    else:
        kept = sum(1 for _ in _kept_pairs(paths))
    _log_skipped(folder, "train", languages, lines - kept, lines)
    if not kept:
        raise ValueError(f"{paths[0]} and {paths[1]} hold no non-empty line pairs.")
    if not hold_out:
        stream = TrainStream(folder, languages, kept)
        stream.empty = lines - kept
        return stream, None
    count = min(max(int(kept * HELD_OUT_SHARE), 1), MAX_HELD_OUT)
    if kept < 2:
        raise ValueError(f"{folder}: too few training pairs to hold out a validation split.")
    # The heap was sized from the line count; the share is of the kept pairs.
    chosen = sorted((-h, -i) for h, i in heap)[:count]
    held = sorted(i for _, i in chosen)
    wanted = set(held)
    pairs = [pair for i, pair in enumerate(_kept_pairs(paths)) if i in wanted]
    stream = TrainStream(folder, languages, kept - count, held)
    stream.empty = lines - kept
    return stream, pairs


def _log_skipped(folder, split, languages, skipped, total):
    if skipped:
        logger.warning(
            "%s/%s.{%s}: skipped %d of %d line pairs with an empty side.",
            folder, split, ",".join(languages), skipped, total,
        )  # fmt: skip


def read_parallel_split(folder, split, languages):
    """Reads `split.<lang>` for both languages into a list of aligned pairs.

    Pairs where either side is empty (after stripping spaces) are skipped and
    counted in the log.

    Returns:
        list of `(text in languages[0], text in languages[1])`.
    """
    paths = [os.path.join(folder, f"{split}.{lang}") for lang in languages]
    first, second = (read_lines(path) for path in paths)
    if len(first) != len(second):
        raise ValueError(
            f"Parallel files have different line counts: {paths[0]} has {len(first)} lines, "
            f"{paths[1]} has {len(second)} lines."
        )
    pairs = [(a.strip(), b.strip()) for a, b in zip(first, second, strict=True)]
    kept = [(a, b) for a, b in pairs if a and b]
    _log_skipped(folder, split, languages, len(pairs) - len(kept), len(pairs))
    if not kept:
        raise ValueError(f"{paths[0]} and {paths[1]} hold no non-empty line pairs.")
    return kept


def _exists(folder, name, languages):
    return all(os.path.exists(os.path.join(folder, f"{name}.{lang}")) for lang in languages)


def _held_out(pair):
    digest = hashlib.sha1("\t".join(pair).encode("utf-8")).hexdigest()
    return int(digest[:12], 16) / 16.0**12


def read_parallel_folder(folder, stream_train=False):
    """Reads every split of `folder`: `(languages, {split: [(text0, text1), ...]})`.

    The validation split is `validation.*`, `valid.*` or `dev.*` (the first
    found), else `HELD_OUT_SHARE` of the training pairs (at most
    `MAX_HELD_OUT`, at least one); the test split is `test.*`, or empty.
    With `stream_train`, the training split is a `TrainStream` (the same
    pairs, read from the files when iterated) and memory does not grow with it.
    """
    languages = find_languages(folder)
    name = next((n for n in VALIDATION_NAMES if _exists(folder, n, languages)), None)
    if stream_train:
        train, held = scan_train_split(folder, languages, hold_out=name is None)
        splits = {"train": train}
        if held is not None:
            splits["validation"] = held
    else:
        splits = {"train": read_parallel_split(folder, "train", languages)}
    if name is not None:
        splits["validation"] = read_parallel_split(folder, name, languages)
        if name != "validation":
            logger.info("Validation split: %s/%s.{%s}", folder, name, ",".join(languages))
    elif not stream_train:
        train = splits["train"]
        count = min(max(int(len(train) * HELD_OUT_SHARE), 1), MAX_HELD_OUT)
        if len(train) < 2:
            raise ValueError(f"{folder}: too few training pairs to hold out a validation split.")
        held = set(sorted(range(len(train)), key=lambda i: _held_out(train[i]))[:count])
        splits["validation"] = [train[i] for i in sorted(held)]
        splits["train"] = [pair for i, pair in enumerate(train) if i not in held]
    if name is None:
        count = len(splits["validation"])
        logger.info(
            "No validation.*, valid.* or dev.* files in %s: %d training pairs (%.0f%%, chosen "
            "by a hash of their text) held out for validation.",
            folder, count, 100 * count / (count + len(splits["train"])),
        )  # fmt: skip
    if _exists(folder, "test", languages):
        splits["test"] = read_parallel_split(folder, "test", languages)
    else:
        splits["test"] = []
        logger.info("No test.* files in %s: no test decoding.", folder)
    return languages, splits
