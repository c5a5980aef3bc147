"""What both searches share: the loop, its state's rows and buffers, the length penalty.

Shapes: B batch, A rows still running, T longest output (the buffer), V vocabulary.
"""

import numbers

import keras
from keras import ops

from keras_transformer.search import NEG_INF


def length_penalty(length, alpha):
    """GNMT length penalty `((5 + length) / 6) ** alpha` (https://arxiv.org/abs/1609.08144).

    Beam search ranks finished hypotheses by `log P(y | x) / length_penalty`;
    `alpha=0` compares raw log-probabilities, larger `alpha` favours longer
    outputs. The Transformer paper uses `alpha=0.6` (Section 6.1).

    Args:
        length: int or int tensor, number of generated tokens (EOS included).
        alpha: float >= 0.

    Returns:
        float32 tensor of the shape of `length`.
    """
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def _positions(buffer):
    """`(N, T)` buffer -> `(1, T)` int32 positions 0..T-1, also for a dynamic T."""
    ones = ops.ones_like(buffer[:1], dtype="int32")  # (1, T)
    return ops.cumsum(ones, axis=1) - 1


def _write(buffer, step, token_ids):
    """Writes `token_ids (N,)` at column `step` of `buffer (N, T)` (no slice_update)."""
    at_step = ops.equal(_positions(buffer), step)  # (1, T)
    return ops.where(at_step, token_ids[:, None], buffer)


def _batch_offsets(reference, stride):
    """`(B, ...)` tensor -> `(B, 1)` int32 `[0, stride, 2 * stride, ...]` for flat indexing."""
    ones = ops.ones_like(reference[:, :1], dtype="int32")  # (B, 1)
    return (ops.cumsum(ones, axis=0) - 1) * stride


def _take(tensor, indices):
    """Rows `indices (...)` of `tensor (N, ...)` along axis 0, flattened to `(M, ...)`."""
    return ops.take(tensor, ops.reshape(indices, (-1,)), axis=0)


def _is_negative(value):
    """True for a negative Python or numpy number; a (maybe symbolic) tensor is not checked."""
    return isinstance(value, numbers.Real) and value < 0


def _check_limits(max_length, max_lengths, start_ids):
    if isinstance(max_length, int) and max_length <= 0:
        raise ValueError(
            f"max_length must be a positive integer. Received: max_length={max_length}"
        )
    if max_lengths is None:
        return ops.zeros_like(ops.cast(start_ids, "int32")) + max_length
    return ops.minimum(ops.cast(max_lengths, "int32"), max_length)


# Tokens an output holds before it may end: 1, so that a non-blank sentence
# never translates to "" (OpenNMT-tf's `minimum_decoding_length`, CTranslate2's
# `min_decoding_length`). Without it the beam let EOS end a hypothesis at its
# first step: 2 of the 159 Ding test sentences came out empty under beam 4.
MIN_LENGTH = 1


def _forbid_early_end(scores, step, eos_id, min_length):
    """`scores (N, V)` float32 with `eos_id`'s column at `NEG_INF` while `step < min_length`."""
    if not min_length:
        return scores
    is_eos = ops.equal(ops.arange(scores.shape[-1], dtype="int32"), eos_id)[None, :]  # (1, V)
    return ops.where(ops.logical_and(is_eos, step < min_length), NEG_INF, scores)


def drops_finished():
    """Whether this backend's search drops finished rows from its loop.

    TensorFlow (`tf.while_loop` with shape invariants, also in the
    SavedModel and, converted, in translate.onnx's ONNX `Loop`) and torch
    (a Python loop) let loop state change its batch size from step to
    step. JAX's compiled `lax.while_loop` cannot: there finished rows keep
    their place (computed, their output ignored), as in a fixed-shape search.
    """
    return keras.backend.backend() != "jax"


def _rows(vector):
    """`(N,)` tensor -> `(N,)` int32 `[0, 1, ..., N-1]`, also for a dynamic (or zero) N."""
    return ops.cumsum(ops.ones_like(vector, dtype="int32")) - 1


def _while_loop(cond, body, loop_vars, drop_finished):
    """`ops.while_loop`, whose state may change its shapes if `drop_finished`."""
    if drop_finished and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        # Any axis may change: the batch as rows finish, a growing cache's positions.
        loop_vars = keras.tree.map_structure(tf.convert_to_tensor, loop_vars)
        invariants = keras.tree.map_structure(lambda x: tf.TensorShape([None] * x.shape.rank),
                                              loop_vars)  # fmt: skip
        return tf.while_loop(cond, body, loop_vars, shape_invariants=invariants)
    return ops.while_loop(cond, body, loop_vars)


def _match(rows, places, mask):
    """Where each of `rows (A,)` goes among `places` `0..B-1`, for those with `mask (A,)`.

    Returns `(hit (B,) bool, source (B,) int32)`: place `b` takes row
    `source[b]` where `hit[b]`. `rows` are distinct. A `(B, A)` comparison:
    gathers and `where` only, which every runtime runs (no scatter op).
    """
    match = ops.logical_and(ops.equal(places[:, None], rows[None, :]), mask[None, :])  # (B, A)
    hit = ops.any(match, axis=1)
    # A last, never-matching column keeps argmax defined when A = 0 (an empty batch).
    match = ops.concatenate([match, ops.zeros_like(places[:, None], dtype="bool")], axis=1)
    source = ops.cast(ops.argmax(ops.cast(match, "int32"), axis=1), "int32")
    return hit, source


def _keep(structure, indices):
    """Rows `indices` of every tensor of `structure` (batch on axis 0)."""
    return keras.tree.map_structure(lambda x: ops.take(x, indices, axis=0), structure)
