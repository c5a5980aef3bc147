"""Input pipeline: tokenize a split once, then batch by length on the host.

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

Measured (benchmarks/README.md, "End to end" and "Learning per step"): the
previous `tf.data` pipeline shuffled and re-tokenized the strings on every
pass, which cost CPU time on the training step's 2 cores; batches of one
exact length each padded less (10.7% against 12.1%) but learned less per
step than batches of a length range.
"""

import dataclasses
import logging
import time

import numpy as np
import tensorflow as tf

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


def _flat(rows):
    lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, np.int32)
    return flat, offsets, lengths


def tokenize_split(pairs, tokenizer, max_length, eos_id=3, batch_size=4096):
    """Tokenizes a split of `(source, target)` strings once, in graph, batched.

    Args:
        pairs: `tf.data.Dataset` of `(source, target)` scalar strings.
        tokenizer: a `keras_hub` tokenizer (in-graph, TensorFlow Text ops).
        max_length: int. Pairs whose source + EOS or BOS + target is longer are dropped.
        eos_id: appended to every source.

    Returns:
        `TokenizedSplit`.
    """
    tokenized = pairs.batch(batch_size).map(
        lambda s, t: (tokenizer(s), tokenizer(t)), num_parallel_calls=tf.data.AUTOTUNE
    )
    sources, targets = [], []
    for source, target in tokenized.prefetch(2):
        sources.extend(source.numpy())
        targets.extend(target.numpy())
    total = len(sources)
    keep = [
        i
        for i, (s, t) in enumerate(zip(sources, targets, strict=True))
        if len(s) + 1 <= max_length and len(t) + 1 <= max_length
    ]
    sources = [np.append(sources[i], eos_id) for i in keep]
    source, source_offsets, source_lengths = _flat(sources)
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
# had learned less per step (benchmarks/README.md, "Learning per step").
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


def _pad(flat, offsets, indices, prefix=None, suffix=None):
    starts, ends = offsets[indices], offsets[indices + 1]
    extra = (prefix is not None) + (suffix is not None)
    out = np.zeros((len(indices), int((ends - starts).max()) + extra), dtype=np.int32)
    for row, (start, end) in enumerate(zip(starts, ends, strict=True)):
        column = 0
        if prefix is not None:
            out[row, 0], column = prefix, 1
        out[row, column : column + end - start] = flat[start:end]
        if suffix is not None:
            out[row, column + end - start] = suffix
    return out


def assemble(split, indices, bos_id=2, eos_id=3):
    """The padded arrays of the pairs `indices`: `({"source_ids", "target_ids"}, labels)`."""
    source = _pad(split.source, split.source_offsets, indices)
    target_ids = _pad(split.target, split.target_offsets, indices, prefix=bos_id)
    labels = _pad(split.target, split.target_offsets, indices, suffix=eos_id)
    return {"source_ids": source, "target_ids": target_ids}, labels


_SIGNATURE = (
    {
        "source_ids": tf.TensorSpec((None, None), tf.int32),
        "target_ids": tf.TensorSpec((None, None), tf.int32),
    },
    tf.TensorSpec((None, None), tf.int32),
)


def _from_batches(batches):
    """A dataset of the given `(features, labels)` numpy batches, in order, held in memory."""
    datasets = [tf.data.Dataset.from_tensors(batch) for batch in batches]
    while len(datasets) > 1:  # a balanced tree of concatenations, not a chain
        pairs = [a.concatenate(b) for a, b in zip(datasets[::2], datasets[1::2], strict=False)]
        datasets = pairs + datasets[len(pairs) * 2 :]
    return datasets[0]


class InputTimer:
    """Thread CPU seconds the host spent assembling batches (for `run.json`)."""

    def __init__(self):
        self.seconds = 0.0
        self.batches = 0


def make_dataset(
    pairs,
    tokenizer,
    max_length,
    batch_tokens,
    training=True,
    num_replicas=1,
    seed=None,
    bos_id=2,
    eos_id=3,
    timer=None,
    boundaries=BUCKET_BOUNDARIES,
):
    """Builds the batched dataset of one split.

    Args:
        pairs: `tf.data.Dataset` of `(source, target)` strings, or a
            `TokenizedSplit` already made by `tokenize_split`.
        tokenizer: a `keras_hub` tokenizer (in-graph).
        max_length: int. Longer pairs (after adding BOS/EOS) are dropped.
        batch_tokens: int. About this many tokens per batch and side.
        training: bool. Reshuffles every epoch, dropping remainders that do
            not split evenly over the replicas. Either way the dataset repeats
            forever: evaluation passes are `num_batches` batches each, in the
            same order (pass `validation_steps=num_batches`), held in memory.
        num_replicas: int. Batch sizes are multiples of it.
        seed: of the shuffling.
        bos_id, eos_id: the model's special ids.
        timer: an `InputTimer` that accumulates the host time of assembling batches.
        boundaries: of the length buckets (`bucket_sizes`).

    Returns:
        `tf.data.Dataset` of `({"source_ids", "target_ids"}, labels)`; its
        `tokenized` attribute is the `TokenizedSplit` and, for evaluation,
        `num_batches` the batches of one pass (pass it as `steps`).
    """
    split = pairs
    if not isinstance(split, TokenizedSplit):
        split = tokenize_split(pairs, tokenizer, max_length, eos_id=eos_id)
    if not len(split):
        raise ValueError(f"No pair of the split fits in max_length={max_length}.")
    bucket_sizes(max_length, batch_tokens, num_replicas)  # validates the budget
    rng = np.random.default_rng(seed) if training else None
    plan_args = dict(num_replicas=num_replicas, boundaries=boundaries)
    evaluation_plan = None if training else plan_batches(split, batch_tokens, **plan_args)

    if training:

        def generate():
            while True:
                plan = plan_batches(split, batch_tokens, rng=rng, drop_remainder=True, **plan_args)
                for indices in plan:
                    start = time.thread_time()
                    batch = assemble(split, indices, bos_id, eos_id)
                    if timer is not None:
                        timer.seconds += time.thread_time() - start
                        timer.batches += 1
                    yield batch

        ds = tf.data.Dataset.from_generator(generate, output_signature=_SIGNATURE)
        ds = ds.prefetch(tf.data.AUTOTUNE)
    else:
        # In memory, not a generator: Keras discards the validation iterator
        # before every evaluation (`EpochIterator.reset`), and destroying one
        # whose prefetch thread sat in the Python generator stalled `fit` for
        # about 50 s in most epochs (benchmarks/README.md, "End to end").
        batches = [assemble(split, indices, bos_id, eos_id) for indices in evaluation_plan]
        ds = _from_batches(batches).repeat()
    options = tf.data.Options()
    if not training:
        # No autotuning thread: destroying an iterator joins it, and Keras drops
        # the validation iterator before every evaluation. py-spy found `fit`
        # waiting there (`EpochIterator.reset` -> `~IteratorResource` -> the
        # thread pool's join) about 13 s per epoch, a sixth of a 5-minute run
        # (benchmarks/README.md, "The stall between epochs"). Batches held in
        # memory have nothing to tune.
        options.autotune.enabled = False
    # Multi-worker: training batches are dealt out to the workers; every worker
    # evaluates the whole validation split, so all run the same number of steps.
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = policy.DATA if training else policy.OFF
    ds = ds.with_options(options)
    ds.tokenized = split
    if evaluation_plan is not None:
        ds.num_batches = len(evaluation_plan)
    return ds


def plan_statistics(split, batch_tokens, num_replicas=1, seed=0, boundaries=BUCKET_BOUNDARIES):
    """Exact statistics of one training epoch's batches (no tensor is built).

    Returns:
        dict: `batches` per epoch, mean `batch_size`, mean real `source_tokens`
        and `target_tokens` per batch (target = BOS/EOS-shifted length), and
        `padding_share` (pad positions / all positions, both sides).
    """
    rng = np.random.default_rng(seed)
    plan = plan_batches(split, batch_tokens, num_replicas, rng, True, boundaries)
    source_lengths = np.diff(split.source_offsets)
    target_lengths = np.diff(split.target_offsets) + 1
    real_source = real_target = positions = 0
    for indices in plan:
        s, t = source_lengths[indices], target_lengths[indices]
        real_source += int(s.sum())
        real_target += int(t.sum())
        positions += len(indices) * (int(s.max()) + int(t.max()))
    count = max(len(plan), 1)
    return {
        "batches": len(plan),
        "batch_size": sum(len(b) for b in plan) / count,
        "source_tokens": real_source / count,
        "target_tokens": real_target / count,
        "padding_share": 1.0 - (real_source + real_target) / max(positions, 1),
    }
