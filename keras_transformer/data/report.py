"""A corpus report before training, and the filters it counts.

The toolkits' trackers show what goes wrong silently with one's own data:
the two sides lose their line alignment, half the corpus is copies or
duplicates, the evaluation pairs are in the training pairs (OpenNMT-py
issue 2262, eole issue 128). `CorpusReport` reads the pairs once (a
`text_files.TrainStream` too: memory holds one hash per training pair, 8
bytes) and measures what would show it: lengths per side and the
correlation of the two sides' lengths (shifted lines make it fall to about
0), copies, exact duplicates, pairs far outside the corpus's length ratio,
control characters, overlap with the evaluation splits; after tokenization
`coverage` adds unknown and byte-fallback pieces. `warnings` says what
looks wrong, with numbers, and `suggestions` what `docs/data.md` advises
for a corpus of this size.

Filters (`FILTERS`, train.py's `--filters`) drop training pairs that are
copies, later duplicates or length-ratio outliers, as OpenNMT's `clean` and
Marian's OpusCleaner rules do; evaluation splits are never filtered.
"""

import array
import bisect
import math
import re

import numpy as np

FILTERS = ("copies", "duplicates", "ratio")
RATIO_BOUND = 3.0  # characters: a side this many times the other's length is an outlier
RATIO_MIN_CHARACTERS = 20  # ... where the longer side has at least this many
LENGTH_BINS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)  # words: histogram edges (last: and more)

# Thresholds of the warnings (shares of the training pairs unless said).
WARN_CORRELATION = 0.3  # of the two sides' character lengths, below: lines shifted?
WARN_COPIES = 0.05
WARN_DUPLICATES = 0.10
WARN_RATIO = 0.05
WARN_CONTROL = 0.001
WARN_EMPTY = 0.01
WARN_UNKNOWN = 0.001  # of the training tokens
WARN_BYTES = 0.02  # of the training tokens


# Unicode's control characters (category Cc) but the tab.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def ratio_outlier(source, target):
    longer, shorter = max(len(source), len(target)), min(len(source), len(target))
    return longer >= RATIO_MIN_CHARACTERS and longer > RATIO_BOUND * max(shorter, 1)


class CorpusReport:
    """Measures a corpus's pairs in one pass each; `to_dict()` is `corpus.json`'s "report".

    Args:
        evaluation: dict split name -> list of pairs (validation, test): the
            overlap of each with the training pairs is counted.
    """

    def __init__(self, evaluation=None):
        self.splits = {}
        self._evaluation = {
            name: {hash(tuple(pair)) for pair in pairs}
            for name, pairs in (evaluation or {}).items()
        }
        self._seen_evaluation = {name: set() for name in self._evaluation}
        for name, pairs in (evaluation or {}).items():
            self.splits[name] = {"pairs": len(pairs)}
        self.train = None
        self.filtered = {}
        self.coverage = None

    def read_train(self, pairs, filters=FILTERS, empty=0):
        """One pass over the training pairs; returns the boolean mask of those the
        `filters` drop (a numpy array, one entry per pair, in order).

        Args:
            empty: line pairs with an empty side, skipped before (`text_files`).
        """
        _check_filters(filters)
        hashes, flags, words, sums, counts = self._measure_pairs(pairs)
        duplicates = _later_duplicates(hashes)
        drop = _filter_mask(filters, flags, duplicates)
        n = len(hashes)
        self.train = {
            "pairs": n,
            "empty": int(empty),
            **{name: int(value) for name, value in counts.items()},
            "duplicates": int(duplicates.sum()),
            "length_correlation": _correlation(sums, n),
            "words_histogram": {
                side: {_bin_name(i): int(c) for i, c in enumerate(values) if c}
                for side, values in words.items()
            },
            "mean_characters": {"source": sums[0] / max(n, 1), "target": sums[1] / max(n, 1)},
        }
        self.filtered = {
            "filters": list(filters),
            "dropped": int(drop.sum()),
            "kept": int(n - drop.sum()),
        }
        for name in self._evaluation:
            self.splits[name]["in_train"] = len(self._seen_evaluation[name])
        return drop

    def _measure_pairs(self, pairs):
        """The one pass of `read_train`: `(hashes, flags, words, sums, counts)`.

        `hashes` (int64) and `flags` (int8: 1 a copy, 2 a ratio outlier) are numpy
        arrays, one entry per pair; `words` the words histograms per side; `sums`
        the sums of x, y, xx, yy, xy of the character lengths; `counts` the copies,
        ratio outliers and pairs with control characters. Notes the evaluation
        pairs seen in `self._seen_evaluation`.
        """
        hashes, flags = array.array("q"), array.array("b")  # 9 bytes a pair, not ~80
        # Plain Python locals and C-speed calls per pair (bisect, a regex, str methods):
        # 16M pairs in about a minute, where numpy calls per pair took minutes.
        words = {"source": [0] * len(LENGTH_BINS), "target": [0] * len(LENGTH_BINS)}
        sx = sy = sxx = syy = sxy = 0
        copies = ratios = controls = 0
        evaluation = list(self._evaluation.items())
        control = _CONTROL.search
        for source, target in pairs:
            key = hash((source, target))
            hashes.append(key)
            for name, members in evaluation:
                if key in members:
                    self._seen_evaluation[name].add(key)
            copy = source == target
            ratio = ratio_outlier(source, target)
            copies += copy
            ratios += ratio
            controls += bool(control(source) or control(target))
            flags.append(copy | (ratio << 1))
            words["source"][bisect.bisect_right(LENGTH_BINS, len(source.split())) - 1] += 1
            words["target"][bisect.bisect_right(LENGTH_BINS, len(target.split())) - 1] += 1
            x, y = len(source), len(target)
            sx += x
            sy += y
            sxx += x * x
            syy += y * y
            sxy += x * y
        sums = np.array([sx, sy, sxx, syy, sxy], dtype=np.float64)
        counts = {"copies": copies, "ratio": ratios, "control_characters": controls}
        hashes = np.frombuffer(hashes, dtype=np.int64)
        flags = np.frombuffer(flags, dtype=np.int8)
        return hashes, flags, words, sums, counts

    def read_coverage(self, tokens_per_id, unknown_id, byte_ids):
        """Unknown and byte-fallback pieces among the training tokens (`tokens_per_id`:
        a count per vocabulary id)."""
        total = int(tokens_per_id.sum())
        self.coverage = {
            "tokens": total,
            "unknown_share": float(tokens_per_id[unknown_id]) / max(total, 1),
            "byte_share": float(tokens_per_id[list(byte_ids)].sum()) / max(total, 1)
            if len(byte_ids)
            else 0.0,
        }

    def warnings(self):
        """What looks wrong, each with its numbers (an empty list when nothing does)."""
        out = []
        train = self.train or {}
        n = max(train.get("pairs", 0), 1)
        r = train.get("length_correlation")
        if r is not None and train["pairs"] >= 50 and r < WARN_CORRELATION:
            out.append(
                f"the two sides' lengths hardly correlate (r = {r:.2f}; aligned corpora "
                "measure 0.6 to 0.95): lines may be shifted between the files"
            )
        for name, bound, what in (
            ("copies", WARN_COPIES, "pairs whose two sides are identical (copies)"),
            ("duplicates", WARN_DUPLICATES, "pairs that repeat an earlier pair exactly"),
            ("ratio", WARN_RATIO, f"pairs with one side over {RATIO_BOUND:g}x the other's length"),
            ("control_characters", WARN_CONTROL, "pairs with control characters"),
            ("empty", WARN_EMPTY, "line pairs with an empty side (skipped)"),
        ):
            share = train.get(name, 0) / n
            if share > bound:
                out.append(f"{100 * share:.1f}% {what} ({train[name]:,} of {n:,})")
        for name, split in self.splits.items():
            if split.get("in_train"):
                out.append(
                    f"{split['in_train']:,} of the {split['pairs']:,} {name} pairs are also "
                    "training pairs: scores on them overstate"
                )
        if self.coverage:
            for key, bound, what in (
                ("unknown_share", WARN_UNKNOWN, "unknown pieces (<unk>)"),
                ("byte_share", WARN_BYTES, "byte-fallback pieces (characters the vocabulary "
                 "lacks)"),
            ):  # fmt: skip
                if self.coverage[key] > bound:
                    out.append(f"{100 * self.coverage[key]:.2f}% of the training tokens are {what}")
        return out

    def suggestions(self, pairs):
        """What docs/data.md advises for a corpus of `pairs` training pairs."""
        cpu = "on 2 CPU cores: the default (`cpu` preset, 4k BPE, 22 minutes)"
        if pairs <= 200_000:
            return [cpu, "on one GPU: --preset small --batch-tokens 8192"]
        if pairs <= 5_000_000:
            return [cpu, "on one GPU: --preset base --batch-tokens 12000 --vocab-size 16000"]
        return ["on several GPUs: --preset base --batch-tokens 25000 (the paper; big for its best)"]

    @classmethod
    def from_dict(cls, record):
        """The report `to_dict` wrote (its warnings and suggestions made again)."""
        report = cls()
        report.train = record["train"]
        report.filtered = record["filtered"]
        report.splits = record["evaluation"]
        report.coverage = record.get("coverage")
        return report

    def read_tokens(self, split, tokenizer):
        """`read_coverage` of a tokenized training split (`pipeline.TokenizedSplit`,
        its tokens memory-mapped or not), counted a million tokens at a time."""
        size = tokenizer.vocabulary_size()
        counts = np.zeros(size, dtype=np.int64)
        for side in (split.source, split.target):
            for chunk in _chunks(side, 1 << 22):
                counts += np.bincount(chunk, minlength=size)
        processor = tokenizer.processor
        byte_ids = [i for i in range(size) if processor.is_byte(i)]
        self.read_coverage(counts, processor.unk_id(), byte_ids)

    def to_dict(self):
        pairs = self.filtered.get("kept", (self.train or {}).get("pairs", 0))
        return {
            "train": self.train,
            "filtered": self.filtered,
            "evaluation": self.splits,
            "coverage": self.coverage,
            "warnings": self.warnings(),
            "suggestions": self.suggestions(pairs),
        }

    def summary(self):
        """A few readable lines for the log."""
        t = self.train
        r = t["length_correlation"]
        lines = [
            f"{t['pairs']:,} training pairs ({t['empty']:,} with an empty side skipped "
            f"before): {t['copies']:,} copies, {t['duplicates']:,} "
            f"duplicates, {t['ratio']:,} length-ratio outliers, {t['control_characters']:,} with "
            f"control characters; length correlation {'-' if r is None else f'{r:.2f}'}; mean "
            f"{t['mean_characters']['source']:.0f} / {t['mean_characters']['target']:.0f} "
            "characters a side",
            f"filters {','.join(self.filtered['filters']) or 'none'}: "
            f"{self.filtered['dropped']:,} dropped, {self.filtered['kept']:,} kept",
        ]
        if self.coverage:
            lines.append(
                f"vocabulary: {100 * self.coverage['unknown_share']:.2f}% unknown, "
                f"{100 * self.coverage['byte_share']:.2f}% byte-fallback pieces"
            )
        return lines


def _check_filters(filters):
    """Raises ValueError for a filter not in `FILTERS`."""
    unknown = set(filters) - set(FILTERS)
    if unknown:
        raise ValueError(f"Unknown filter(s) {sorted(unknown)}; choose from {FILTERS}.")


def _filter_mask(filters, flags, duplicates):
    """Whether the `filters` drop each pair, from `read_train`'s flags and duplicates."""
    drop = np.zeros(len(flags), dtype=bool)
    if "copies" in filters:
        drop |= (flags & 1).astype(bool)
    if "ratio" in filters:
        drop |= (flags & 2).astype(bool)
    if "duplicates" in filters:
        drop |= duplicates
    return drop


def _chunks(tokens, size):
    """`tokens` in arrays of `size`; a memory-mapped file is read with plain reads, so
    that the process does not keep the file's pages mapped (they would count in its
    RSS: 3 GB of them at 16M pairs, measured with benchmarks/scale.py)."""
    if isinstance(tokens, np.memmap) and tokens.filename:
        with open(tokens.filename, "rb") as f:
            f.seek(tokens.offset)
            for start in range(0, len(tokens), size):
                yield np.fromfile(f, dtype=tokens.dtype, count=min(size, len(tokens) - start))
        return
    for start in range(0, len(tokens), size):
        yield np.asarray(tokens[start : start + size])


def _later_duplicates(hashes):
    """Whether each entry repeats an earlier one (the first of equal values is not)."""
    order = np.argsort(hashes, kind="stable")  # equal hashes: in corpus order
    ordered = hashes[order]
    repeat = np.zeros(len(hashes), dtype=bool)
    repeat[1:] = ordered[1:] == ordered[:-1]
    duplicates = np.zeros(len(hashes), dtype=bool)
    duplicates[order] = repeat
    return duplicates


def _correlation(sums, n):
    if n < 2:
        return None
    x, y, xx, yy, xy = sums / n
    variance = (xx - x * x) * (yy - y * y)
    return float((xy - x * y) / math.sqrt(variance)) if variance > 0 else None


def _bin_name(i):
    low = LENGTH_BINS[i]
    if i + 1 == len(LENGTH_BINS):
        return f"{low}+"
    high = LENGTH_BINS[i + 1] - 1
    return str(low) if high == low else f"{low}-{high}"
