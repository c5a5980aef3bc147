"""tf.data pipeline: tokenize, add BOS/EOS, bucket into token-budget batches.

Each element is `({"source_ids": (B, S), "target_ids": (B, T)}, labels (B, T))`,
int32, padded with 0 (pad_id):

    source_ids = source pieces + EOS
    target_ids = BOS + target pieces      (decoder input, teacher forcing)
    labels     = target pieces + EOS      (target_ids shifted left by one)

as in fairseq and OpenNMT-tf. Pairs whose source or target would exceed
`max_length` are dropped. Sequences of similar length are batched together
(`tf.data.Dataset.bucket_by_sequence_length`) so that each batch holds about
`batch_tokens` tokens on its longer side, padding included (Section 5.1 of
the paper: "approximately 25000 source tokens and 25000 target tokens").
"""

import logging

import numpy as np
import tensorflow as tf

logger = logging.getLogger(__name__)

# Dictionary phrases are mostly 2-8 pieces long: fine buckets there keep padding low.
_BOUNDARIES = (
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    12,
    14,
    16,
    20,
    24,
    28,
    32,
    40,
    48,
    64,
    80,
    96,
    128,
    160,
    192,
    256,
    384,
    512,
)


def bucket_sizes(max_length, batch_tokens, num_replicas=1):
    """Bucket boundaries and batch sizes for `bucket_by_sequence_length`.

    A bucket holds lengths in `[boundary[i-1], boundary[i])`; the last holds
    lengths up to `max_length`. Batch sizes are multiples of `num_replicas`
    and `batch_size * longest_length <= batch_tokens` whenever
    `batch_tokens >= num_replicas * max_length`.
    """
    if batch_tokens < num_replicas * max_length:
        raise ValueError(
            f"batch_tokens={batch_tokens} must be at least num_replicas * max_length = "
            f"{num_replicas} * {max_length} so that the longest pair fits in a batch."
        )
    boundaries = [b for b in _BOUNDARIES if b <= max_length]
    longest = [b - 1 for b in boundaries] + [max_length]
    sizes = [
        max(num_replicas, batch_tokens // length // num_replicas * num_replicas)
        for length in longest
    ]
    return boundaries, sizes


def tokenize_pairs(pairs, tokenizer, bos_id=2, eos_id=3):
    """`(source, target)` strings -> `({"source_ids", "target_ids"}, labels)` 1-D int32."""

    def tokenize(sources, targets):
        source = tf.cast(tokenizer(sources), tf.int32)  # (b, None) ragged
        target = tf.cast(tokenizer(targets), tf.int32)
        rows = tf.shape(sources)[:1]
        eos = tf.fill(tf.concat([rows, [1]], 0), eos_id)
        bos = tf.fill(tf.concat([rows, [1]], 0), bos_id)
        # Dense rows plus lengths, so that `unbatch` yields plain 1-D tensors.
        sequences = {
            "source_ids": tf.concat([source, eos], axis=1),
            "target_ids": tf.concat([bos, target], axis=1),
            "labels": tf.concat([target, eos], axis=1),
        }
        dense = {key: value.to_tensor() for key, value in sequences.items()}
        lengths = {key: value.row_lengths() for key, value in sequences.items()}
        return dense, lengths

    def trim(dense, lengths):
        ids = {key: dense[key][: lengths[key]] for key in dense}
        return {"source_ids": ids["source_ids"], "target_ids": ids["target_ids"]}, ids["labels"]

    return (
        pairs.batch(1024)
        .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
        .unbatch()
        .map(trim, num_parallel_calls=tf.data.AUTOTUNE)
    )


def _length(features, labels):
    del labels
    return tf.maximum(tf.size(features["source_ids"]), tf.size(features["target_ids"]))


def make_dataset(
    pairs,
    tokenizer,
    max_length,
    batch_tokens,
    training=True,
    num_replicas=1,
    shuffle_buffer=50_000,
    seed=None,
    bos_id=2,
    eos_id=3,
):
    """Builds the batched dataset of one split.

    Args:
        pairs: `tf.data.Dataset` of `(source, target)` strings.
        tokenizer: a `keras_hub` tokenizer (in-graph).
        max_length: int. Longer pairs (after adding BOS/EOS) are dropped.
        batch_tokens: int. About this many tokens per batch and side.
        training: bool. Shuffles and repeats forever, dropping the remainder.
        num_replicas: int. Batch sizes are multiples of it.
        shuffle_buffer, seed: shuffling of the string pairs.

    Returns:
        `tf.data.Dataset` of `({"source_ids", "target_ids"}, labels)`.
    """
    if training:
        pairs = pairs.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = tokenize_pairs(pairs, tokenizer, bos_id, eos_id)
    ds = ds.filter(lambda features, labels: _length(features, labels) <= max_length)
    boundaries, sizes = bucket_sizes(max_length, batch_tokens, num_replicas)
    ds = ds.bucket_by_sequence_length(
        _length,
        bucket_boundaries=boundaries,
        bucket_batch_sizes=sizes,
        drop_remainder=training,
    )
    options = tf.data.Options()
    # Multi-worker: training batches are dealt out to the workers; every worker
    # evaluates the whole validation split, so all run the same number of steps.
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = policy.DATA if training else policy.OFF
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def batch_statistics(dataset, num_batches=50, pad_id=0):
    """Mean real tokens per batch and padding share over `num_batches` batches.

    Returns:
        dict with `source_tokens`, `target_tokens` (mean non-pad tokens per
        batch), `padding_share` (pad positions / all positions, both sides)
        and `batch_size` (mean sequences per batch).
    """
    source_tokens, target_tokens, positions, sizes = [], [], [], []
    for features, labels in dataset.take(num_batches).as_numpy_iterator():
        source, target = features["source_ids"], labels
        source_tokens.append(int(np.sum(source != pad_id)))
        target_tokens.append(int(np.sum(target != pad_id)))
        positions.append(source.size + target.size)
        sizes.append(source.shape[0])
    if not sizes:
        raise ValueError("The dataset produced no batch; is the split empty?")
    real = sum(source_tokens) + sum(target_tokens)
    return {
        "source_tokens": float(np.mean(source_tokens)),
        "target_tokens": float(np.mean(target_tokens)),
        "padding_share": 1.0 - real / sum(positions),
        "batch_size": float(np.mean(sizes)),
    }
