"""Boolean attention masks, combined in one place.

padding_mask:   (B, S)     True = real key token
attention_mask: (B, T, S)  True = query t may attend to key s
Keras mask:     (B, L)     True = real token; the mask a tensor carries once a
                           layer such as `Embedding(mask_zero=True)` set it
"""

from keras import ops

try:  # Keras 3 keeps a tensor's mask beside it where the tensor takes no attribute
    from keras.src.backend import get_keras_mask as _get_keras_mask
except ImportError:  # pragma: no cover - older Keras 3

    def _get_keras_mask(x):
        return getattr(x, "_keras_mask", None)


def keras_mask(x):
    """The Keras mask `x` carries (`(B, L)` bool, True = real token), or None."""
    return None if x is None else _get_keras_mask(x)


def padding_mask_from_ids(token_ids, pad_id=0):
    """`(B, L)` ids -> `(B, L)` bool, True for real tokens."""
    return ops.not_equal(token_ids, ops.cast(pad_id, token_ids.dtype))


# Inputs of a batch of packed rows (several sequences per row, as the flax WMT
# example and tensor2tensor train): which sequence a position belongs to (1,
# 2, ... within its row; 0 on padding) and its position within that sequence.
PACKING_KEYS = ("source_segment_ids", "target_segment_ids", "source_positions", "target_positions")


def same_segment_mask(query_segment_ids, key_segment_ids):
    """`(B, T)`, `(B, S)` segment ids -> `(B, T, S)` bool: query t and key s
    belong to the same packed sequence."""
    query_segment_ids = ops.cast(query_segment_ids, "int32")
    key_segment_ids = ops.cast(key_segment_ids, "int32")
    return ops.equal(query_segment_ids[:, :, None], key_segment_ids[:, None, :])


def causal_mask(query_length, key_length):
    """`(T, S)` bool: query t may attend to keys s <= t (lower triangle)."""
    rows = ops.arange(query_length, dtype="int32")[:, None]
    cols = ops.arange(key_length, dtype="int32")[None, :]
    return rows >= cols


def merge_masks(
    query, key, padding_mask=None, attention_mask=None, use_causal_mask=False, query_mask=None
):
    """Combines padding, explicit, causal and query masks into one `(B, T, S)` bool mask.

    Args:
        query: `(B, T, ...)` tensor; only its length is read.
        key: `(B, S, ...)` tensor; only its length is read.
        padding_mask: optional `(B, S)` bool, True for real keys.
        attention_mask: optional `(B, T, S)` bool.
        use_causal_mask: whether query t may only see keys <= t.
        query_mask: optional `(B, T)` bool, True for real queries; a padded
            query attends to nothing (`keras.layers.MultiHeadAttention`'s
            rule for the query's Keras mask).

    Returns:
        `(B, T, S)` (or broadcastable `(B, 1, S)` / `(B, T, 1)` / `(1, T, S)`)
        bool tensor, or None when there is nothing to mask.
    """
    mask = None
    if padding_mask is not None:
        mask = ops.cast(padding_mask, "bool")[:, None, :]  # (B, 1, S)
    if query_mask is not None:
        rows = ops.cast(query_mask, "bool")[:, :, None]  # (B, T, 1)
        mask = rows if mask is None else ops.logical_and(mask, rows)
    if attention_mask is not None:
        attention_mask = ops.cast(attention_mask, "bool")  # (B, T, S)
        mask = attention_mask if mask is None else ops.logical_and(mask, attention_mask)
    if use_causal_mask:
        causal = causal_mask(ops.shape(query)[1], ops.shape(key)[1])[None, :, :]  # (1, T, S)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    return mask
