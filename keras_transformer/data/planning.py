"""Planning batches: which pairs go together, from their lengths alone.

A plan is made from a split's `PlanningLengths` (never its tokens), so that
it can be made in a process of its own (`Planner`) and for corpora whose
tokens stay on disk (`data.binarize`). Two kinds: pairs in length buckets
(`plan_batches`: a batch is an index array) and pairs packed into rows
(`plan_packed_batches`: a batch is `(width, PackedRows)`). `data.pipeline`
assembles the planned batches' arrays.
"""

import dataclasses

import numpy as np


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


# Packed rows (`pack=True`): several pairs share a row, each pair attending only
# to itself (segment ids), positions counting from 0 in every pair, as the flax
# WMT example and tensor2tensor pack. A row is one of these widths, the
# narrowest that holds its longest pair; a batch is `batch_tokens // width`
# rows of one width. Few, fixed shapes let `jit_compile` compile each once.
PACK_WIDTHS = (64, 128, 256, 512)


def pack_widths(max_length, widths=PACK_WIDTHS):
    """The row widths for pairs of up to `max_length` positions."""
    return tuple(w for w in widths if w < max_length) + (max_length,)


@dataclasses.dataclass
class PackedRows:
    """The rows of one packed batch, as two arrays: `pairs` (the pair indices of
    row 0, then of row 1, ...) and `counts` (pairs per row). Iterating gives
    each row's pair indices. Arrays, not lists of lists: a plan of 16M pairs
    in Python lists took about 3 GB (benchmarks/scale.py)."""

    pairs: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, rows):
        """From a list of lists of pair indices."""
        counts = np.array([len(row) for row in rows], dtype=np.int32)
        pairs = np.fromiter((i for row in rows for i in row), np.int32, int(counts.sum()))
        return cls(pairs, counts)

    def __len__(self):
        return len(self.counts)

    def __iter__(self):
        return iter(np.split(self.pairs, np.cumsum(self.counts)[:-1]))

    def tolist(self):
        return [row.tolist() for row in self]


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
        `(rows, row_widths)`: `PackedRows` of all rows (in the order they were
        opened, each row's pairs in the order they went in), and each row's width.
    """
    widths = pack_widths(max_length, widths)
    width_of = np.array([next(w for w in widths if w >= n) for n in range(max_length + 1)])
    lengths = np.maximum(source_lengths, target_lengths)
    order = np.arange(len(lengths)) if rng is None else rng.permutation(len(lengths))
    order = order[np.argsort(-lengths[order], kind="stable")]
    counts = np.zeros((max_length + 1, max_length + 1), dtype=np.int32)  # open rows by free (s, t)
    open_rows = {}
    row_of = np.empty(len(order), dtype=np.int32)  # the row of the k-th pair of `order`
    row_widths = []
    k = 0
    for block in range(0, len(order), 1 << 16):  # Python ints for a block at a time
        part = order[block : block + (1 << 16)]
        for s, t in zip(source_lengths[part].tolist(), target_lengths[part].tolist(), strict=True):
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
                row = len(row_widths)
                row_widths.append(width)
            row_of[k] = row
            k += 1
            free = (free[0] - s, free[1] - t)
            if min(free) > 0:
                open_rows.setdefault(free, []).append(row)
                counts[free] += 1
    by_row = np.argsort(row_of, kind="stable")  # rows in order, pairs in insertion order
    rows = PackedRows(
        order[by_row].astype(np.int32), np.bincount(row_of, minlength=len(row_widths))
    )
    return rows, np.array(row_widths, dtype=np.int64)


def plan_packed_batches(split, batch_tokens, num_replicas=1, rng=None, drop_remainder=False):
    """One epoch of packed batches: `(width, rows)` with `batch_tokens // width` rows
    (a multiple of `num_replicas`) of one width each.

    Args: as `plan_batches`; the widest row is the split's longest pair.
        drop_remainder: drop each width's last, smaller batch (training); without
            it, that batch's rows are split until they divide over the replicas.

    Returns:
        list of `(width, rows)`, `rows` a `PackedRows`.
    """
    max_length = int(split.lengths.max()) if len(split) else 1
    sides = split.planning()
    rows, row_widths = pack_rows(sides.source_lengths, sides.target_lengths, max_length, rng)
    starts = np.cumsum(rows.counts) - rows.counts
    batches = []
    for width in np.unique(row_widths):
        members = np.flatnonzero(row_widths == width)
        if rng is not None:
            members = rng.permutation(members)
        size = max(batch_tokens // int(width) // num_replicas, 1) * num_replicas
        for start in range(0, len(members), size):
            chosen = members[start : start + size]
            if len(chosen) < size and drop_remainder:
                # Training: every batch of a width has one shape (one XLA compile);
                # the rows left out are fewer than a batch per width, new ones each epoch.
                continue
            counts = rows.counts[chosen]
            batch = PackedRows(rows.pairs[concatenated_ranges(starts[chosen], counts)], counts)
            if len(batch) % num_replicas:
                batch = PackedRows.of(_rows_for_replicas(batch.tolist(), num_replicas))
            batches.append((int(width), batch))
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def concatenated_ranges(starts, counts):
    """`concatenate([arange(s, s + n) for s, n in zip(starts, counts)])`, vectorized."""
    ends = np.cumsum(counts)
    return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - counts - starts, counts)


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


def mixture_indices(parts, weights, rng):
    """The pairs one training pass draws from corpora laid one after another.

    A pass holds as many pairs as all corpora together; corpus `c` (`parts[c]`
    pairs) gets `weights[c] / sum(weights)` of them: each of its pairs
    `k // parts[c]` times and a random `k % parts[c]` of them once more, so
    that a corpus weighted down is sampled afresh every pass and one weighted
    up is repeated evenly (OpenNMT's and Eole's corpus weights; fairseq's
    `ResamplingDataset` draws the same shares with replacement).

    Returns:
        int64 indices into the concatenated pairs, in corpus order.
    """
    parts = np.asarray(parts, dtype=np.int64)
    weights = np.asarray(weights, dtype=float)
    if len(parts) != len(weights) or (weights <= 0).any():
        raise ValueError(f"A positive weight per corpus. Received: weights={weights.tolist()}")
    wanted = np.round(weights / weights.sum() * parts.sum()).astype(np.int64)
    starts = np.cumsum(parts) - parts
    chosen = []
    for start, size, count in zip(starts.tolist(), parts.tolist(), wanted.tolist(), strict=True):
        if not size:
            continue
        repeats, rest = divmod(count, size)
        chosen.append(np.tile(np.arange(start, start + size), repeats))
        chosen.append(start + rng.choice(size, rest, replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)


def plan_mixed(split, plan, parts, weights, rng=None, drop_remainder=False):
    """`plan` (`plan_batches` or `plan_packed_batches`) over the pairs a pass draws
    from several corpora (`mixture_indices`); evaluation (`rng` None) plans all
    pairs once. The batches index `split`'s pairs, as `plan`'s do."""
    if rng is None:
        return plan(split, rng=None, drop_remainder=drop_remainder)
    lengths = split.planning()
    chosen = mixture_indices(parts, weights, rng)
    drawn = PlanningLengths(
        lengths.lengths[chosen], lengths.source_lengths[chosen], lengths.target_lengths[chosen]
    )
    batches = plan(drawn, rng=rng, drop_remainder=drop_remainder)
    if batches and isinstance(batches[0], tuple):  # packed: (width, PackedRows)
        return [
            (width, PackedRows(chosen[rows.pairs].astype(np.int32), rows.counts))
            for width, rows in batches
        ]
    return [chosen[batch] for batch in batches]


def plan_pass(plan, split, seed, number):
    """Training pass `number`'s plan: `plan(split, rng=...)` shuffled from `(seed, number)`."""
    return plan(split, rng=np.random.default_rng([seed, number]), drop_remainder=True)


def _planning_process(connection, plans, splits):
    """The planning process's loop: `(seed, number)` in, the pass's plan (or the error) out;
    ends when the training process closes its end or goes. Pass `number` is planned
    with the `number % len(splits)`-th of `plans` and `splits`."""
    try:
        while True:
            seed, number = connection.recv()
            k = number % len(splits)
            try:
                answer = (plan_pass(plans[k], splits[k], seed, number), None)
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
            without its split (picklable); or a tuple of them, one per entry of `lengths`.
        lengths: `PlanningLengths` of the split; or a tuple of them, read by the
            passes in turn (pass p: the `p % len(lengths)`-th, BPE-dropout's copies).
        seed: of the shuffling.
    """

    def __init__(self, plan, lengths, seed):
        import multiprocessing

        if not isinstance(lengths, tuple):
            plan, lengths = (plan,), (lengths,)
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
        pairs = [rows.pairs for _, rows in plan]
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
