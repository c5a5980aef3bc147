"""Input pipeline: tokenize a split once, then batch by length on the host.

Numpy only, on every backend: `Batches` plans and assembles the batches of
one split; `keras_transformer.data.datasets` hands the same batches to
`model.fit` as a `keras.utils.PyDataset` (JAX, torch) or a thin `tf.data`
wrapper (TensorFlow, where `MirroredStrategy` distributes a dataset).

Each element is `({"source_ids": (B, S), "target_ids": (B, T)}, labels (B, T))`,
int32, padded with 0 (pad_id):

    source_ids = source pieces + EOS
    target_ids = BOS + target pieces      (decoder input, teacher forcing)
    labels     = target pieces + EOS      (target_ids shifted left by one)

as in fairseq and OpenNMT-tf. Pairs whose source or target would exceed
`max_length` are dropped. As in fairseq's `batch_by_size`, every split is
tokenized once per run (`tokenize_split`), and each epoch groups pairs of
similar length (the longer side's, in the ranges of `BUCKET_BOUNDARIES`)
into batches of about `batch_tokens` tokens per side, padding included
(Section 5.1 of the paper: "approximately 25000 source tokens and 25000
target tokens"), in a fresh random order.

Measured (benchmarks/README.md, "Settled questions"; the per-step figures are in
its git history): the
previous `tf.data` pipeline shuffled and re-tokenized the strings on every
pass, which cost CPU time on the training step's 2 cores; batches of one
exact length each padded less (10.7% against 12.1%) but learned less per
step than batches of a length range.
"""

import dataclasses
import functools
import logging
import time

import numpy as np

from keras_transformer.data.planning import (
    BUCKET_BOUNDARIES,
    PackedRows,
    Planner,
    PlanningLengths,
    bucket_sizes,
    concatenated_ranges,
    plan_batches,
    plan_mixed,
    plan_packed_batches,
    plan_pass,
    statistics_of_plan,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TokenizedSplit:
    """The pairs of one split as token ids, flat: pair i's source is
    `source[source_offsets[i]:source_offsets[i + 1]]` (pieces + EOS), its target
    `target[target_offsets[i]:target_offsets[i + 1]]` (pieces only).

    Attributes:
        lengths: (N,) the batch width a pair needs: max(len(source) + 1, len(target) + 1).
        dropped: pairs left out for exceeding `max_length`.
        parts: where the pairs are several corpora one after another (`--mix`), the
            number of each's pairs, in order; None: one corpus.
    """

    source: np.ndarray
    source_offsets: np.ndarray
    target: np.ndarray
    target_offsets: np.ndarray
    lengths: np.ndarray
    dropped: int
    parts: tuple | None = None

    def __len__(self):
        return len(self.lengths)

    def planning(self):
        """What planning batches reads (`PlanningLengths`): the lengths, not the tokens."""
        return PlanningLengths(  # int32: a third of int64's memory at 16M pairs
            self.lengths.astype(np.int32),
            np.diff(self.source_offsets).astype(np.int32),
            (np.diff(self.target_offsets) + 1).astype(np.int32),
        )


def _flat(rows):
    lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(
        (token for row in rows for token in row), dtype=np.int32, count=int(lengths.sum())
    )
    return flat, offsets, lengths


def tokenize_split(pairs, tokenizer, max_length, eos_id=3, batch_size=4096):
    """Tokenizes a split of `(source, target)` strings once, in batches.

    Args:
        pairs: list of `(source, target)` strings.
        tokenizer: a `keras_transformer.data.SentencePieceTokenizer` (or any
            tokenizer whose `tokenize(list of str)` returns lists of ids).
        max_length: int. Pairs whose source + EOS or BOS + target is longer are dropped.
        eos_id: appended to every source.

    Returns:
        `TokenizedSplit`.
    """
    sources, targets = [], []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        sources.extend(tokenizer.tokenize([s for s, _ in chunk]))
        targets.extend(tokenizer.tokenize([t for _, t in chunk]))
    total = len(sources)
    keep = [
        i
        for i, (s, t) in enumerate(zip(sources, targets, strict=True))
        if len(s) + 1 <= max_length and len(t) + 1 <= max_length
    ]
    source, source_offsets, source_lengths = _flat([sources[i] + [eos_id] for i in keep])
    target, target_offsets, target_lengths = _flat([targets[i] for i in keep])
    lengths = np.maximum(source_lengths, target_lengths + 1)
    return TokenizedSplit(
        source, source_offsets, target, target_offsets, lengths, dropped=total - len(keep)
    )


def _spans(flat, offsets, indices):
    """The tokens of pairs `indices`, concatenated, and each token's pair (0..len-1)
    and position in its pair: one gather, no loop over pairs."""
    starts = offsets[indices]
    counts = offsets[indices + 1] - starts
    pair = np.repeat(np.arange(len(indices)), counts)
    ends = np.cumsum(counts)
    position = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - counts, counts)
    return flat[starts[pair] + position], pair, position, counts


def _pad(flat, offsets, indices, prefix=None, suffix=None):
    tokens, pair, position, counts = _spans(flat, offsets, np.asarray(indices))
    extra = (prefix is not None) + (suffix is not None)
    out = np.zeros((len(counts), int(counts.max()) + extra), dtype=np.int32)
    shift = int(prefix is not None)
    out[pair, position + shift] = tokens
    rows = np.arange(len(counts))
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[rows, counts + shift] = suffix
    return out


def assemble(split, indices, bos_id=2, eos_id=3):
    """The padded arrays of the pairs `indices`: `({"source_ids", "target_ids"}, labels)`."""
    source = _pad(split.source, split.source_offsets, indices)
    target_ids = _pad(split.target, split.target_offsets, indices, prefix=bos_id)
    labels = _pad(split.target, split.target_offsets, indices, suffix=eos_id)
    return {"source_ids": source, "target_ids": target_ids}, labels


def assemble_packed(split, width, rows, bos_id=2, eos_id=3):
    """The `(B, width)` arrays of packed rows: `(features, labels)`, the features
    with the model's `PACKING_KEYS` besides `source_ids` and `target_ids`.

    Vectorized: one gather and one scatter per array, whatever the number of
    pairs (a loop over pairs took 1.3 ms for the `small` preset's batch on a
    Zen 5 core; benchmarks/host_overhead.py).
    """
    shape = (len(rows), width)
    rows = rows if isinstance(rows, PackedRows) else PackedRows.of(rows)
    counts, pairs = rows.counts.astype(np.int64), rows.pairs.astype(np.int64)
    row_of = np.repeat(np.arange(len(rows)), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)  # each pair's row's first pair
    segment = (np.arange(len(pairs)) - first + 1).astype(np.int32)
    features, labels = {}, np.zeros(shape, dtype=np.int32)
    for side in ("source", "target"):
        flat, offsets = getattr(split, side), getattr(split, f"{side}_offsets")
        tokens, pair, position, lengths = _spans(flat, offsets, pairs)
        extra = int(side == "target")  # BOS + pieces, pieces + EOS
        # Where each pair starts in its row: the lengths of the pairs before it in the row.
        ends = np.cumsum(lengths + extra)
        start = ends - (lengths + extra) - (ends - (lengths + extra))[first]
        ids, segments, positions = (np.zeros(shape, dtype=np.int32) for _ in range(3))
        if extra:
            at = start + lengths  # one past the last piece: EOS in the labels
            ids[row_of, start] = bos_id
            labels[row_of, at] = eos_id
            labels[row_of[pair], start[pair] + position] = tokens
            taken = np.repeat(row_of, lengths + 1), concatenated_ranges(start, lengths + 1)
        else:
            taken = np.repeat(row_of, lengths), concatenated_ranges(start, lengths)
        ids[row_of[pair], start[pair] + position + extra] = tokens
        segments[taken] = np.repeat(segment, lengths + extra)
        positions[taken] = concatenated_ranges(np.zeros_like(start), lengths + extra)
        features[f"{side}_ids"] = ids
        features[f"{side}_segment_ids"] = segments
        features[f"{side}_positions"] = positions
    order = ("source_ids", "target_ids", "source_segment_ids", "target_segment_ids",
             "source_positions", "target_positions")  # fmt: skip
    return {name: features[name] for name in order}, labels


class InputTimer:
    """Thread CPU seconds the host spent assembling batches (for `run.json`)."""

    def __init__(self):
        self.seconds = 0.0
        self.batches = 0


class Batches:
    """The batches of one split, planned and assembled on the host as numpy arrays.

    A batch is `({"source_ids", "target_ids"} (+ PACKING_KEYS), labels)`, int32.
    Training batches come in an endless stream of passes over the data
    (`batch(i)` is the i-th of it), each pass planned afresh from
    `(seed, pass)`, so any batch can be rebuilt from its index alone and
    every input wrapper gives the same batches in the same order.
    Evaluation batches are one fixed pass in corpus order (`evaluation`).

    Args:
        split: `TokenizedSplit`.
        max_length: int, of the model; checks that `batch_tokens` holds the longest pair.
        batch_tokens: int. About this many tokens per batch and side.
        training: bool.
        num_replicas: int. Batch sizes (rows) are multiples of it.
        seed: of the shuffling (training).
        bos_id, eos_id: the model's special ids.
        pack: bool. Packed rows (`plan_packed_batches`, the model's
            `PACKING_KEYS` in the features) instead of length buckets.
        timer: an `InputTimer` that accumulates the host time of assembling batches.
        boundaries: of the length buckets (`bucket_sizes`); unused when packing.
        weights: a weight per corpus of a split that lays several one after
            another (`split.parts`): each training pass draws their pairs in
            proportion (`planning.plan_mixed`); None: every pair once per pass.
        passes: `TokenizedSplit`s of the same pairs that training passes read in
            turn, pass p the `p % len(passes)`-th (BPE-dropout's sampled
            segmentations, `shards.sampled_copies`); None: `split` every pass.
            `split` stays the one `tokenized` names (what the run's search limits
            are fitted on: the segmentation translation sees).
    """

    def __init__(
        self,
        split,
        max_length,
        batch_tokens,
        training=True,
        num_replicas=1,
        seed=None,
        bos_id=2,
        eos_id=3,
        pack=False,
        timer=None,
        boundaries=BUCKET_BOUNDARIES,
        weights=None,
        passes=None,
    ):
        if not len(split):
            raise ValueError(f"No pair of the split fits in max_length={max_length}.")
        bucket_sizes(max_length, batch_tokens, num_replicas)  # validates the budget
        self.tokenized = split
        self.training = training
        self.seed = 0 if seed is None else seed
        self.pack = pack
        self.timer = timer
        self._ids = (bos_id, eos_id)
        # Without the split, so that it pickles for the `Planner` as it is.
        if pack:
            self._plan = functools.partial(
                plan_packed_batches, batch_tokens=batch_tokens, num_replicas=num_replicas
            )
        else:
            self._plan = functools.partial(
                plan_batches, batch_tokens=batch_tokens, num_replicas=num_replicas,
                boundaries=boundaries,
            )  # fmt: skip
        self._pass_splits = tuple(passes) if passes and training else (split,)
        # One plan per split read by the passes: a mixture's parts are each's own.
        weights = weights if training else None
        self._plans = tuple(self._mixed(self._plan, s, weights) for s in self._pass_splits)
        self._plan = self._plans[0]
        self._passes = {}  # pass number -> its plan (training; the last two kept)
        self._ahead = {}  # pass number -> its plan to come, made by `_planner`
        self._planner = None
        self._starts = [0]  # index of the first batch of each planned pass
        self._evaluation = None if training else self._plan(split)

    @staticmethod
    def _mixed(plan, split, weights):
        """`plan` drawing the corpora of `split` in proportion to `weights` (None: `plan`)."""
        if weights is None:
            return plan
        if split.parts is None or len(split.parts) != len(weights):
            raise ValueError(
                f"{len(weights)} corpus weights for a split of "
                f"{'one corpus' if split.parts is None else f'{len(split.parts)} corpora'}."
            )
        return functools.partial(
            plan_mixed, plan=plan, parts=tuple(split.parts), weights=tuple(weights)
        )

    def pass_split(self, number):
        """The `TokenizedSplit` training pass `number` reads."""
        return self._pass_splits[number % len(self._pass_splits)]

    @property
    def feature_names(self):
        from keras_transformer.layers.masks import PACKING_KEYS

        return ("source_ids", "target_ids") + (PACKING_KEYS if self.pack else ())

    @property
    def num_batches(self):
        """Batches of one evaluation pass; None for training (endless)."""
        return None if self.training else len(self._evaluation)

    def assemble(self, planned, split=None):
        """The arrays of one planned batch (as `plan_batches` / `plan_packed_batches` give
        it) of `split` (None: `tokenized`)."""
        start = time.thread_time()
        bos_id, eos_id = self._ids
        split = self.tokenized if split is None else split
        if self.pack:
            batch = assemble_packed(split, *planned, bos_id=bos_id, eos_id=eos_id)
        else:
            batch = assemble(split, planned, bos_id, eos_id)
        if self.timer is not None:
            self.timer.seconds += time.thread_time() - start
            self.timer.batches += 1
        return batch

    def training_pass(self, number):
        """The plan of training pass `number` (0, 1, ...): shuffled from `(seed, number)`.

        Planning a pass of Ding's 377k packed pairs takes about 5 s of Python
        (`pack_rows`); the next pass is planned in a process of its own
        (`Planner`) while this one trains, so neither the step that crosses
        into it nor, on a GPU, the steps before it (a planning thread would
        hold the GIL they need) wait for it. The plan is the one made inline:
        it depends on `(seed, number)` alone.
        """
        if number not in self._passes:
            ahead = self._ahead.pop(number, None)
            self._passes[number] = ahead.result() if ahead else self._plan_pass(number)
            for old in [n for n in self._passes if n < number - 1]:
                del self._passes[old]
        if number + 1 not in self._passes and number + 1 not in self._ahead:
            if self._planner is None:
                lengths = tuple(split.planning() for split in self._pass_splits)
                self._planner = Planner(self._plans, lengths, self.seed)
            self._ahead[number + 1] = self._planner.submit(number + 1)
        return self._passes[number]

    def _plan_pass(self, number):
        k = number % len(self._pass_splits)
        return plan_pass(self._plans[k], self._pass_splits[k], self.seed, number)

    def batch(self, index):
        """Training batch `index` of the endless stream (0, 1, ...)."""
        if not self.training:
            return self.assemble(self._evaluation[index % len(self._evaluation)])
        while index >= self._starts[-1]:  # plan passes up to the one holding `index`
            number = len(self._starts) - 1
            count = len(self.training_pass(number))
            if not count:
                raise ValueError(
                    f"{len(self.tokenized)} training pairs make no whole batch; lower "
                    "batch_tokens or bring more data."
                )
            self._starts.append(self._starts[-1] + count)
        number = int(np.searchsorted(self._starts, index, side="right")) - 1
        planned = self.training_pass(number)[index - self._starts[number]]
        return self.assemble(planned, self.pass_split(number))

    def __iter__(self):
        """Training: the endless stream of batches. Evaluation: one pass."""
        if not self.training:
            for planned in self._evaluation:
                yield self.assemble(planned)
            return
        index = 0
        while True:
            yield self.batch(index)
            index += 1

    def statistics(self):
        """`plan_statistics` of the first training pass, from its plan (made once)."""
        if not self.training:
            raise ValueError("statistics() is for batches made with training=True.")
        return statistics_of_plan(self.pass_split(0), self.training_pass(0), self.pack)

    def evaluation(self):
        """One evaluation pass as a list of batches."""
        if self.training:
            raise ValueError("evaluation() is for batches made with training=False.")
        return list(self)
