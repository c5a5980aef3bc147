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

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TokenizedSplit:
    """The pairs of one split as token ids, flat: pair i's source is
    `source[source_offsets[i]:source_offsets[i + 1]]` (pieces + EOS), its target
    `target[target_offsets[i]:target_offsets[i + 1]]` (pieces only).

    Attributes:
        lengths: (N,) the batch width a pair needs: max(len(source) + 1, len(target) + 1).
        dropped: pairs left out for exceeding `max_length`.
    """

    source: np.ndarray
    source_offsets: np.ndarray
    target: np.ndarray
    target_offsets: np.ndarray
    lengths: np.ndarray
    dropped: int

    def __len__(self):
        return len(self.lengths)

    def planning(self):
        """What planning batches reads (`PlanningLengths`): the lengths, not the tokens."""
        return PlanningLengths(
            self.lengths, np.diff(self.source_offsets), np.diff(self.target_offsets) + 1
        )


@dataclasses.dataclass
class PlanningLengths:
    """The lengths of a split's pairs, all that `plan_batches` and
    `plan_packed_batches` read: small enough to hand to the planning process.

    Attributes:
        lengths: (N,) the batch width each pair needs.
        source_lengths: (N,) source positions (pieces + EOS).
        target_lengths: (N,) target positions (BOS + pieces, pieces + EOS).
    """

    lengths: np.ndarray
    source_lengths: np.ndarray
    target_lengths: np.ndarray

    def __len__(self):
        return len(self.lengths)

    def planning(self):
        return self


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


# A bucket holds the pairs whose longer side's length is in [b[i - 1], b[i]):
# one length per bucket up to 16 pieces, where most dictionary phrases are,
# then ranges about an eighth as wide as their lengths. Against ranges a
# quarter as wide, padding fell from 12.5% to 11.0% on Ding (13.9% to 10.2% on
# its full sentences) with no loss of learning per step (validation loss after
# 600 steps 5.26 against 5.33, mean of 3 seeds); one bucket per exact length
# had learned less per step (measured in benchmarks/README.md's git history, "Learning per step").
# `boundaries=range(2, max_length + 1)` gives exact lengths.
BUCKET_BOUNDARIES = (
    3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 27, 30, 33, 36, 40, 44, 48,
    53, 58, 64, 72, 80, 88, 96, 112, 128, 144, 160, 192, 224, 256, 320, 384, 448, 512,
)  # fmt: skip


def bucket_sizes(max_length, batch_tokens, num_replicas=1, boundaries=BUCKET_BOUNDARIES):
    """The bucket of each length 0..max_length and the batch size of its pairs.

    A bucket's batch size is a multiple of `num_replicas` with `size * longest
    <= batch_tokens`, `longest` being the longest length the bucket can hold.

    Returns:
        `(buckets, sizes)`: int arrays indexed by length.
    """
    if batch_tokens < num_replicas * max_length:
        raise ValueError(
            f"batch_tokens={batch_tokens} must be at least num_replicas * max_length = "
            f"{num_replicas} * {max_length} so that the longest pair fits in a batch."
        )
    bounds = np.array([b for b in boundaries if b <= max_length], dtype=np.int64)
    buckets = np.searchsorted(bounds, np.arange(max_length + 1), side="right")
    longest = np.append(bounds - 1, max_length)[buckets]
    sizes = batch_tokens // np.maximum(longest, 1) // num_replicas * num_replicas
    return buckets, sizes


def plan_batches(
    split,
    batch_tokens,
    num_replicas=1,
    rng=None,
    drop_remainder=False,
    boundaries=BUCKET_BOUNDARIES,
):
    """One epoch of batches: lists of pair indices from one length bucket, `batch_tokens` each.

    Args:
        split: `TokenizedSplit`.
        rng: `np.random.Generator`: shuffles pairs within each bucket and the
            order of batches; None keeps corpus order (evaluation).
        drop_remainder: drop each bucket's last batch when it holds fewer
            pairs than a multiple of `num_replicas` (training under a strategy).
        boundaries: of the length buckets (`bucket_sizes`).

    Returns:
        list of int64 index arrays.
    """
    max_length = int(split.lengths.max()) if len(split) else 1
    buckets, sizes = bucket_sizes(max_length, batch_tokens, num_replicas, boundaries)
    order = np.arange(len(split)) if rng is None else rng.permutation(len(split))
    pair_buckets = buckets[split.lengths]
    order = order[np.argsort(pair_buckets[order], kind="stable")]
    sorted_buckets = pair_buckets[order]
    batches = []
    for bucket in np.unique(sorted_buckets):
        members = order[
            np.searchsorted(sorted_buckets, bucket) : np.searchsorted(
                sorted_buckets, bucket, side="right"
            )
        ]
        size = int(sizes[split.lengths[members[0]]])  # one size per bucket
        for start in range(0, len(members), size):
            batch = members[start : start + size]
            if len(batch) % num_replicas:
                if drop_remainder:
                    batch = batch[: len(batch) // num_replicas * num_replicas]
                if not len(batch):
                    continue
            batches.append(batch)
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


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


# Packed rows (`pack=True`): several pairs share a row, each pair attending only
# to itself (segment ids), positions counting from 0 in every pair, as the flax
# WMT example and tensor2tensor pack. A row is one of these widths, the
# narrowest that holds its longest pair; a batch is `batch_tokens // width`
# rows of one width. Few, fixed shapes let `jit_compile` compile each once.
PACK_WIDTHS = (64, 128, 256, 512)


def pack_widths(max_length, widths=PACK_WIDTHS):
    """The row widths for pairs of up to `max_length` positions."""
    return tuple(w for w in widths if w < max_length) + (max_length,)


def pack_rows(source_lengths, target_lengths, max_length, rng=None, widths=PACK_WIDTHS, window=64):
    """Packs pairs into rows: best fit, longest pairs first (pairs of equal
    length in random order).

    Each pair goes into the open row whose free source and target positions
    it fills best (the fewest left over, searched among rows with at most
    `window - 1` more free positions than it needs on either side), or opens
    a row of the narrowest width that holds it.

    Args:
        source_lengths, target_lengths: `(N,)` positions each pair takes per side.
        max_length: the widest row.
        rng: `np.random.Generator` or None (corpus order).

    Returns:
        `(rows, row_widths)`: a list of lists of pair indices, and each row's width.
    """
    widths = pack_widths(max_length, widths)
    width_of = np.array([next(w for w in widths if w >= n) for n in range(max_length + 1)])
    lengths = np.maximum(source_lengths, target_lengths)
    order = np.arange(len(lengths)) if rng is None else rng.permutation(len(lengths))
    order = order[np.argsort(-lengths[order], kind="stable")]
    counts = np.zeros((max_length + 1, max_length + 1), dtype=np.int32)  # open rows by free (s, t)
    open_rows = {}
    rows, row_widths = [], []
    for index, s, t in zip(
        order.tolist(), source_lengths[order].tolist(), target_lengths[order].tolist(), strict=True
    ):
        near = counts[s : s + window, t : t + window]
        fits = np.nonzero(near)
        if len(fits[0]):
            best = int(np.argmin(fits[0] + fits[1]))
            free = (s + int(fits[0][best]), t + int(fits[1][best]))
            row = open_rows[free].pop()
            counts[free] -= 1
        else:
            width = int(width_of[max(s, t)])
            free = (width, width)
            row = len(rows)
            rows.append([])
            row_widths.append(width)
        rows[row].append(index)
        free = (free[0] - s, free[1] - t)
        if min(free) > 0:
            open_rows.setdefault(free, []).append(row)
            counts[free] += 1
    return rows, np.array(row_widths, dtype=np.int64)


def plan_packed_batches(split, batch_tokens, num_replicas=1, rng=None, drop_remainder=False):
    """One epoch of packed batches: `(width, rows)` with `batch_tokens // width` rows
    (a multiple of `num_replicas`) of one width each.

    Args: as `plan_batches`; the widest row is the split's longest pair.
        drop_remainder: drop each width's last, smaller batch (training); without
            it, that batch's rows are split until they divide over the replicas.

    Returns:
        list of `(width, rows)`, `rows` a list of lists of pair indices.
    """
    max_length = int(split.lengths.max()) if len(split) else 1
    sides = split.planning()
    rows, row_widths = pack_rows(sides.source_lengths, sides.target_lengths, max_length, rng)
    batches = []
    for width in np.unique(row_widths):
        members = np.flatnonzero(row_widths == width)
        if rng is not None:
            members = rng.permutation(members)
        size = max(batch_tokens // int(width) // num_replicas, 1) * num_replicas
        for start in range(0, len(members), size):
            batch = [rows[i] for i in members[start : start + size]]
            if len(batch) < size and drop_remainder:
                # Training: every batch of a width has one shape (one XLA compile);
                # the rows left out are fewer than a batch per width, new ones each epoch.
                continue
            batches.append((int(width), _rows_for_replicas(batch, num_replicas)))
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def _rows_for_replicas(rows, num_replicas):
    """`rows`, with rows of several pairs split until their number is a multiple
    of `num_replicas` (`MirroredStrategy` needs even shares; empty rows would
    skew Keras's per-batch validation mean)."""
    rows = [list(row) for row in rows]
    while len(rows) % num_replicas:
        longest = max(range(len(rows)), key=lambda i: len(rows[i]))
        if len(rows[longest]) < 2:
            raise ValueError(
                f"Cannot split {len(rows)} rows of one pair each over {num_replicas} "
                "replicas; use more evaluation pairs or fewer replicas."
            )
        rows.append([rows[longest].pop()])
    return rows


def assemble_packed(split, width, rows, bos_id=2, eos_id=3):
    """The `(B, width)` arrays of packed rows: `(features, labels)`, the features
    with the model's `PACKING_KEYS` besides `source_ids` and `target_ids`.

    Vectorized: one gather and one scatter per array, whatever the number of
    pairs (a loop over pairs took 1.3 ms for the `small` preset's batch on a
    Zen 5 core; benchmarks/host_overhead.py).
    """
    shape = (len(rows), width)
    counts = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    pairs = np.fromiter((i for row in rows for i in row), dtype=np.int64, count=int(counts.sum()))
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
            taken = np.repeat(row_of, lengths + 1), _ranges(start, lengths + 1)
        else:
            taken = np.repeat(row_of, lengths), _ranges(start, lengths)
        ids[row_of[pair], start[pair] + position + extra] = tokens
        segments[taken] = np.repeat(segment, lengths + extra)
        positions[taken] = _ranges(np.zeros_like(start), lengths + extra)
        features[f"{side}_ids"] = ids
        features[f"{side}_segment_ids"] = segments
        features[f"{side}_positions"] = positions
    order = ("source_ids", "target_ids", "source_segment_ids", "target_segment_ids",
             "source_positions", "target_positions")  # fmt: skip
    return {name: features[name] for name in order}, labels


def _ranges(starts, counts):
    """`concatenate([arange(s, s + n) for s, n in zip(starts, counts)])`, vectorized."""
    ends = np.cumsum(counts)
    return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - counts - starts, counts)


def _plan_pass(plan, split, seed, number):
    """Training pass `number`'s plan: `plan(split, rng=...)` shuffled from `(seed, number)`."""
    return plan(split, rng=np.random.default_rng([seed, number]), drop_remainder=True)


def _planning_process(connection, plan, split):
    """The planning process's loop: `(seed, number)` in, the pass's plan (or the error) out;
    ends when the training process closes its end or goes."""
    try:
        while True:
            seed, number = connection.recv()
            try:
                answer = (_plan_pass(plan, split, seed, number), None)
            except Exception as error:  # noqa: BLE001 - sent back, raised there
                answer = (None, error)
            connection.send(answer)
    except (EOFError, OSError):  # BrokenPipeError included: nobody waits for the plan
        return


class Planner:
    """Plans training passes in a process of its own, one request at a time.

    A daemon process started with `spawn` (never `fork`: the training process
    runs JAX's, TensorFlow's or torch's threads), which imports numpy and
    this module alone and holds only the split's lengths (`PlanningLengths`),
    not its tokens. It ends with the training process, or when its `Batches`
    is collected (`close`).

    Args:
        plan: `functools.partial` of `plan_batches` or `plan_packed_batches`,
            without its split (picklable).
        lengths: `PlanningLengths` of the split.
        seed: of the shuffling.
    """

    def __init__(self, plan, lengths, seed):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(
            target=_planning_process, args=(child, plan, lengths), daemon=True,
            name="plan_passes",
        )  # fmt: skip
        self._process.start()
        child.close()
        self.seed = seed
        self._pending = None

    def close(self):
        """Stops the process (also when the `Batches` that made it is collected)."""
        self._connection.close()
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout=5)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit modules may be gone
            pass

    def submit(self, number):
        """Starts planning pass `number`; returns an object whose `result()` waits for it."""
        if self._pending is not None:
            raise RuntimeError("The planner plans one pass at a time: take the last one first.")
        self._connection.send((self.seed, number))
        self._pending = number
        return _PlannedPass(self, number)

    def _take(self, number):
        if self._pending != number:
            raise RuntimeError(f"Pass {number} was not asked of the planner.")
        try:
            plan, error = self._connection.recv()
        except EOFError:
            raise RuntimeError(
                f"The batch-planning process died while planning pass {number} "
                f"(exit code {self._process.exitcode})."
            ) from None
        self._pending = None
        if error is not None:
            raise error
        return plan


class _PlannedPass:
    def __init__(self, planner, number):
        self._planner, self._number, self._plan = planner, number, None

    def result(self):
        if self._plan is None:
            self._plan = self._planner._take(self._number)
        return self._plan


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
        self._passes = {}  # pass number -> its plan (training; the last two kept)
        self._ahead = {}  # pass number -> its plan to come, made by `_planner`
        self._planner = None
        self._starts = [0]  # index of the first batch of each planned pass
        self._evaluation = None if training else self._plan(split)

    @property
    def feature_names(self):
        from keras_transformer.layers.masks import PACKING_KEYS

        return ("source_ids", "target_ids") + (PACKING_KEYS if self.pack else ())

    @property
    def num_batches(self):
        """Batches of one evaluation pass; None for training (endless)."""
        return None if self.training else len(self._evaluation)

    def assemble(self, planned):
        """The arrays of one planned batch (as `plan_batches` / `plan_packed_batches` give it)."""
        start = time.thread_time()
        bos_id, eos_id = self._ids
        if self.pack:
            batch = assemble_packed(self.tokenized, *planned, bos_id=bos_id, eos_id=eos_id)
        else:
            batch = assemble(self.tokenized, planned, bos_id, eos_id)
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
                self._planner = Planner(self._plan, self.tokenized.planning(), self.seed)
            self._ahead[number + 1] = self._planner.submit(number + 1)
        return self._passes[number]

    def _plan_pass(self, number):
        return _plan_pass(self._plan, self.tokenized, self.seed, number)

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
        return self.assemble(self.training_pass(number)[index - self._starts[number]])

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
        return statistics_of_plan(self.tokenized, self.training_pass(0), self.pack)

    def evaluation(self):
        """One evaluation pass as a list of batches."""
        if self.training:
            raise ValueError("evaluation() is for batches made with training=False.")
        return list(self)


def plan_statistics(
    split, batch_tokens, num_replicas=1, seed=0, boundaries=BUCKET_BOUNDARIES, pack=False
):
    """Exact statistics of one training epoch's batches (no tensor is built).

    Returns:
        dict: `batches` per epoch, mean `batch_size` (pairs), mean real
        `source_tokens` and `target_tokens` per batch (target = BOS/EOS-shifted
        length), and `padding_share` (pad positions / all positions, both sides).
    """
    rng = np.random.default_rng(seed)
    if pack:
        plan = plan_packed_batches(split, batch_tokens, num_replicas, rng, True)
    else:
        plan = plan_batches(split, batch_tokens, num_replicas, rng, True, boundaries)
    return statistics_of_plan(split, plan, pack)


def statistics_of_plan(split, plan, pack=False):
    """`plan_statistics` of a plan already made (`Batches.training_pass`)."""
    sides = split.planning()
    source_lengths, target_lengths = sides.source_lengths, sides.target_lengths
    if pack:
        pairs = [np.concatenate([np.asarray(row) for row in rows]) for _, rows in plan]
        positions = sum(2 * width * len(rows) for width, rows in plan)
    else:
        pairs = plan
        positions = sum(
            len(i) * (int(source_lengths[i].max()) + int(target_lengths[i].max())) for i in pairs
        )
    real_source = sum(int(source_lengths[i].sum()) for i in pairs)
    real_target = sum(int(target_lengths[i].sum()) for i in pairs)
    count = max(len(pairs), 1)
    return {
        "batches": len(pairs),
        "batch_size": sum(len(i) for i in pairs) / count,
        "source_tokens": real_source / count,
        "target_tokens": real_target / count,
        "padding_share": 1.0 - (real_source + real_target) / max(positions, 1),
    }
