"""`MultiHeadAttention` against `keras.layers.MultiHeadAttention`, and the mask helpers."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import (
    MultiHeadAttention,
    causal_mask,
    merge_masks,
    padding_mask_from_ids,
)

D_MODEL, NUM_HEADS = 16, 4
ATOL = 1e-5


def _np(x):
    return ops.convert_to_numpy(x)


def _pair(query_length, key_length, use_fused_attention=False):
    """Our layer and Keras' layer, built, with our weights copied into Keras'."""
    ours = MultiHeadAttention(D_MODEL, NUM_HEADS, use_fused_attention=use_fused_attention)
    ours.build((None, query_length, D_MODEL), (None, key_length, D_MODEL))
    theirs = keras.layers.MultiHeadAttention(num_heads=NUM_HEADS, key_dim=D_MODEL // NUM_HEADS)
    theirs.build((None, query_length, D_MODEL), (None, key_length, D_MODEL))
    # Random biases too, so a mixed-up bias would show.
    for dense in (ours.query_dense, ours.key_dense, ours.value_dense, ours.output_dense):
        dense.bias.assign(np.random.normal(size=dense.bias.shape).astype("float32"))
    pairs = [
        (ours.query_dense, theirs.query_dense),
        (ours.key_dense, theirs.key_dense),
        (ours.value_dense, theirs.value_dense),
        (ours.output_dense, theirs.output_dense),
    ]
    for mine, keras_dense in pairs:
        assert mine.kernel.shape == keras_dense.kernel.shape
        keras_dense.set_weights(mine.get_weights())
    return ours, theirs


def _padding(lengths, length):
    return np.arange(length)[None, :] < np.array(lengths)[:, None]  # (B, L) True = real


@pytest.mark.multibackend
@pytest.mark.parametrize("use_causal_mask", [False, True])
def test_self_attention_matches_keras(use_causal_mask):
    batch, length = 3, 6
    ours, theirs = _pair(length, length)
    x = np.random.normal(size=(batch, length, D_MODEL)).astype("float32")
    padding = _padding([6, 4, 1], length)
    expected = theirs(
        x,
        x,
        attention_mask=np.broadcast_to(padding[:, None, :], (batch, length, length)),
        use_causal_mask=use_causal_mask,
    )
    actual = ours(x, padding_mask=padding, use_causal_mask=use_causal_mask)
    np.testing.assert_allclose(_np(actual), _np(expected), atol=ATOL)
    # Without a mask too, and the mask must have made a difference.
    unmasked = ours(x)
    np.testing.assert_allclose(_np(unmasked), _np(theirs(x, x)), atol=ATOL)
    assert np.abs(_np(unmasked) - _np(actual)).max() > 1e-3


@pytest.mark.multibackend
def test_cross_attention_matches_keras_with_different_lengths():
    batch, query_length, key_length = 2, 3, 7
    ours, theirs = _pair(query_length, key_length)
    query = np.random.normal(size=(batch, query_length, D_MODEL)).astype("float32")
    value = np.random.normal(size=(batch, key_length, D_MODEL)).astype("float32")
    key = np.random.normal(size=(batch, key_length, D_MODEL)).astype("float32")
    padding = _padding([7, 2], key_length)
    attention_mask = np.broadcast_to(padding[:, None, :], (batch, query_length, key_length))
    expected = theirs(query, value, key, attention_mask=attention_mask)
    actual = ours(query, value, key, padding_mask=padding)
    assert tuple(actual.shape) == (batch, query_length, D_MODEL)
    np.testing.assert_allclose(_np(actual), _np(expected), atol=ATOL)
    # An explicit (B, T, S) attention mask is the same as the padding mask.
    explicit = ours(query, value, key, attention_mask=attention_mask)
    np.testing.assert_allclose(_np(explicit), _np(expected), atol=ATOL)


@pytest.mark.multibackend
@pytest.mark.parametrize("query_length, key_length", [(5, 5), (3, 6)])
def test_fused_attention_equals_plain_attention(query_length, key_length):
    batch = 2
    plain, _ = _pair(query_length, key_length)
    fused = MultiHeadAttention(D_MODEL, NUM_HEADS, use_fused_attention=True)
    fused.build((None, query_length, D_MODEL), (None, key_length, D_MODEL))
    fused.set_weights(plain.get_weights())
    query = np.random.normal(size=(batch, query_length, D_MODEL)).astype("float32")
    value = np.random.normal(size=(batch, key_length, D_MODEL)).astype("float32")
    padding = _padding([key_length, 2], key_length)
    causal = query_length == key_length
    for kwargs in ({}, {"padding_mask": padding, "use_causal_mask": causal}):
        np.testing.assert_allclose(
            _np(fused(query, value, **kwargs)), _np(plain(query, value, **kwargs)), atol=ATOL
        )


@pytest.mark.multibackend
def test_causal_mask_is_lower_triangle():
    expected = np.array(
        [
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 1, 1, 0],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(_np(causal_mask(3, 4)), expected)


@pytest.mark.multibackend
def test_padding_mask_from_ids():
    ids = np.array([[5, 6, 0, 0], [0, 7, 8, 9]], dtype="int32")
    expected = np.array([[1, 1, 0, 0], [0, 1, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(_np(padding_mask_from_ids(ids)), expected)
    expected_pad_7 = np.array([[1, 1, 1, 1], [1, 0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(_np(padding_mask_from_ids(ids, pad_id=7)), expected_pad_7)


@pytest.mark.multibackend
def test_merge_masks_literal():
    query = np.zeros((2, 3, 1), "float32")  # T = 3
    key = np.zeros((2, 3, 1), "float32")  # S = 3
    padding = np.array([[1, 1, 0], [1, 0, 0]], dtype=bool)
    attention = np.array(
        [
            [[1, 1, 1], [0, 1, 1], [1, 1, 1]],
            [[1, 1, 1], [1, 1, 1], [1, 1, 0]],
        ],
        dtype=bool,
    )
    assert merge_masks(query, key) is None
    merged = merge_masks(
        query, key, padding_mask=padding, attention_mask=attention, use_causal_mask=True
    )
    expected = np.array(
        [
            [[1, 0, 0], [0, 1, 0], [1, 1, 0]],
            [[1, 0, 0], [1, 0, 0], [1, 0, 0]],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(np.broadcast_to(_np(merged), (2, 3, 3)), expected)
    padding_only = np.broadcast_to(_np(merge_masks(query, key, padding_mask=padding)), (2, 3, 3))
    np.testing.assert_array_equal(padding_only, np.repeat(padding[:, None, :], 3, axis=1))
    causal_only = _np(merge_masks(query, key, use_causal_mask=True))
    np.testing.assert_array_equal(causal_only[0], np.tril(np.ones((3, 3), bool)))


@pytest.mark.multibackend
def test_call_with_cache_matches_causal_call():
    """Writing one step at a time into the key/value cache equals one causal call."""
    batch, length = 2, 5
    layer = MultiHeadAttention(D_MODEL, NUM_HEADS)
    x = np.random.normal(size=(batch, length, D_MODEL)).astype("float32")
    expected = _np(layer(x, use_causal_mask=True))
    head_dim = D_MODEL // NUM_HEADS
    cache_key = ops.zeros((batch, length, NUM_HEADS, head_dim))
    cache_value = ops.zeros((batch, length, NUM_HEADS, head_dim))
    for t in range(length):
        index = np.full((batch,), t, dtype="int32")
        step, (cache_key, cache_value) = layer.call_with_cache(
            x[:, t : t + 1], cache_key, cache_value, index
        )
        np.testing.assert_allclose(_np(step)[:, 0], expected[:, t], atol=ATOL)
    # The cache now holds every step's projected key and value.
    key, value = layer.compute_key_value(x)
    np.testing.assert_allclose(_np(cache_key), _np(key), atol=ATOL)
    np.testing.assert_allclose(_np(cache_value), _np(value), atol=ATOL)


@pytest.mark.multibackend
def test_call_with_key_value_matches_cross_attention_call():
    """Keys and values projected once (T=3 queries, S=7 keys) give the same result as `call`."""
    batch, query_length, key_length = 2, 3, 7
    layer = MultiHeadAttention(D_MODEL, NUM_HEADS)
    query = np.random.normal(size=(batch, query_length, D_MODEL)).astype("float32")
    memory = np.random.normal(size=(batch, key_length, D_MODEL)).astype("float32")
    padding = _padding([7, 2], key_length)
    expected = _np(layer(query, memory, padding_mask=padding))
    key, value = layer.compute_key_value(memory)  # (B, S, N, H) each
    actual = layer.call_with_key_value(query, key, value, padding_mask=padding)
    np.testing.assert_allclose(_np(actual), expected, atol=ATOL)
    # One query step at a time, as decoding runs it.
    step = layer.call_with_key_value(query[:, 1:2], key, value, padding_mask=padding)
    np.testing.assert_allclose(_np(step)[:, 0], expected[:, 1], atol=ATOL)


@pytest.mark.multibackend
@pytest.mark.parametrize("use_fused_attention", [False, True], ids=["plain", "fused"])
def test_attention_scores_match_keras(use_fused_attention):
    """The returned probabilities equal Keras', rows sum to 1, masked keys get exactly 0."""
    batch, query_length, key_length = 2, 3, 6
    ours, theirs = _pair(query_length, key_length, use_fused_attention=use_fused_attention)
    query = np.random.normal(size=(batch, query_length, D_MODEL)).astype("float32")
    value = np.random.normal(size=(batch, key_length, D_MODEL)).astype("float32")
    padding = _padding([6, 2], key_length)
    output, scores = ours(query, value, padding_mask=padding, return_attention_scores=True)
    scores = _np(scores)
    assert scores.shape == (batch, NUM_HEADS, query_length, key_length)  # (B, N, T, S)
    np.testing.assert_allclose(
        _np(output), _np(ours(query, value, padding_mask=padding)), atol=ATOL
    )
    attention_mask = np.broadcast_to(padding[:, None, :], (batch, query_length, key_length))
    _, expected = theirs(query, value, attention_mask=attention_mask, return_attention_scores=True)
    np.testing.assert_allclose(scores, _np(expected), atol=ATOL)
    np.testing.assert_allclose(scores.sum(axis=-1), 1.0, atol=ATOL)
    np.testing.assert_array_equal(scores[1, :, :, 2:], 0.0)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="d_model=10 must be divisible by num_heads=4"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="dropout=1.0"):
        MultiHeadAttention(16, 4, dropout=1.0)
    with pytest.raises(ValueError, match="dropout=-0.1"):
        MultiHeadAttention(16, 4, dropout=-0.1)
