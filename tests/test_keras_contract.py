"""The layers under the Keras contract: the masks `Embedding(mask_zero=True)` sets,
Keras's own `MultiHeadAttention` arguments and numbers, the fused attention path,
and weights copied from Keras's and keras-hub's layers."""

import itertools

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    TokenEmbedding,
)
from keras_transformer.layers.masks import keras_mask

VOCAB, D_MODEL, NUM_HEADS, D_FF = 50, 16, 4, 32
ATOL = 1e-5
# bfloat16 has 8 significant bits: outputs near 2 are 2^-6 = 0.016 apart. Fused and
# explicit round the logits, probabilities and context apart: measured up to 0.016
# (JAX, torch; 0 on TensorFlow), so 0.04, under 3 steps.
BF16_ATOL = 0.04

SOURCE = np.array([[5, 6, 7, 0, 0, 0, 0], [8, 9, 10, 11, 12, 13, 14]], "int32")  # (B, S=7)
TARGET = np.array([[3, 4, 5, 0], [6, 7, 8, 9]], "int32")  # (B, T=4)
# Padding on both sides, for layers without positions: a causal layer sees the
# padding before a token, never the padding after it.
BOTH_SIDES = np.array([[0, 0, 5, 6, 7, 0, 0], [8, 9, 10, 11, 12, 13, 14]], "int32")


def _np(x):
    return ops.convert_to_numpy(x)


def _lengths(ids):
    return (ids != 0).sum(axis=1)


def _assert_real_positions_equal(padded_outputs, ids, alone, atol=ATOL):
    """`padded_outputs` `(B, L, ...)` at the real positions of each row of `ids`
    equals `alone(row)`, the outputs of that row's sentence run without padding."""
    for row, real in enumerate(ids != 0):
        expected = _np(alone(row))[0]
        np.testing.assert_allclose(_np(padded_outputs)[row, real], expected, atol=atol)


def _unpadded(ids, row):
    return ids[row : row + 1][:, ids[row] != 0]


# ------------------------------------------------- padding cannot leak, after mask_zero


def _sequence_model(block):
    """`Embedding(mask_zero=True) -> block`, as a Keras user builds it."""
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(ids)
    return keras.Model(ids, block(x))


BLOCKS = {  # name: a function of a fresh layer and the embedded ids
    "attention": lambda x: MultiHeadAttention(d_model=D_MODEL, num_heads=NUM_HEADS)(x, x),
    "attention_keras_args": lambda x: MultiHeadAttention(num_heads=NUM_HEADS, key_dim=8)(x),
    "attention_key": lambda x: MultiHeadAttention(d_model=D_MODEL, num_heads=2)(x, x, x),
    "encoder": lambda x: EncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0)(x),
    "decoder_only": lambda x: DecoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0)(x),
}


@pytest.mark.multibackend
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_padding_after_mask_zero_cannot_change_real_outputs(block):
    """The Keras mask of `Embedding(mask_zero=True)` is honoured: a padded
    sentence's outputs at its real positions equal the sentence's alone."""
    model = _sequence_model(BLOCKS[block])
    _assert_real_positions_equal(
        model(BOTH_SIDES), BOTH_SIDES, lambda row: model(_unpadded(BOTH_SIDES, row))
    )


@pytest.mark.multibackend
def test_padding_leaks_without_the_keras_mask():
    """The check above can fail: without `mask_zero`, the padding is attended."""
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, D_MODEL)(ids)
    model = keras.Model(ids, MultiHeadAttention(d_model=D_MODEL, num_heads=NUM_HEADS)(x, x))
    with pytest.raises(AssertionError):
        _assert_real_positions_equal(
            model(BOTH_SIDES), BOTH_SIDES, lambda row: model(_unpadded(BOTH_SIDES, row))
        )


def _seq2seq(encoder_layers, decoder_layers, cross_with_attention=False):
    """Source and target `Embedding(mask_zero=True)`, then encoder and decoder
    layers; the decoder reads the source mask from the encoder output."""
    source = keras.Input((None,), dtype="int32")
    target = keras.Input((None,), dtype="int32")
    x = PositionalEncoding()(keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(source))
    for _ in range(encoder_layers):
        x = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0)(x)
    y = PositionalEncoding()(keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(target))
    for _ in range(decoder_layers):
        y = DecoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0)(y, x)
    if cross_with_attention:  # Keras-style cross-attention after the stack
        y = MultiHeadAttention(num_heads=2, key_dim=8)(y, x)
    return keras.Model([source, target], FeedForward(D_MODEL, D_FF)(y))


@pytest.mark.multibackend
@pytest.mark.parametrize(
    "encoder_layers, decoder_layers", [(0, 1), (1, 1), (2, 2)], ids=["cross", "one_each", "stack"]
)
def test_padding_cannot_leak_through_encoder_decoder(encoder_layers, decoder_layers):
    """Source and target padded at once (T=4 != S=7): each pair's real target
    outputs equal those of the pair run alone, through cross-attention alone (the
    source embedding's mask), one encoder and decoder layer, and a stack of two
    each followed by a Keras-style cross-attention."""
    model = _seq2seq(encoder_layers, decoder_layers, cross_with_attention=encoder_layers == 2)
    outputs = model([SOURCE, TARGET])

    def alone(row):
        return model([_unpadded(SOURCE, row), _unpadded(TARGET, row)])

    _assert_real_positions_equal(outputs, TARGET, alone)


@pytest.mark.multibackend
def test_the_keras_mask_reaches_the_last_layer():
    """Every layer of the package passes the mask on: the output of a chain of all
    of them carries `ids != 0`, in the functional graph and in an eager call."""
    ids = keras.Input((None,), dtype="int32")
    x = TokenEmbedding(VOCAB, D_MODEL)(ids)  # its own mask: pad_id 0
    x = PositionalEncoding()(x)
    x = MultiHeadAttention(d_model=D_MODEL, num_heads=NUM_HEADS)(x)
    x = FeedForward(D_MODEL, D_FF)(x)
    memory = EncoderLayer(D_MODEL, NUM_HEADS, D_FF)(x)
    x = DecoderLayer(D_MODEL, NUM_HEADS, D_FF)(x, memory)
    assert keras_mask(x) is not None
    model = keras.Model(ids, x)
    np.testing.assert_array_equal(_np(keras_mask(model(SOURCE))), SOURCE != 0)

    # Eagerly, starting from keras.layers.Embedding(mask_zero=True).
    x = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(SOURCE)
    for layer in (
        PositionalEncoding(),
        MultiHeadAttention(num_heads=NUM_HEADS, key_dim=4),
        FeedForward(D_MODEL, D_FF),
        EncoderLayer(D_MODEL, NUM_HEADS, D_FF),
        DecoderLayer(D_MODEL, NUM_HEADS, D_FF),
    ):
        x = layer(x)
        np.testing.assert_array_equal(_np(keras_mask(x)), SOURCE != 0, err_msg=layer.name)


# ------------------------------------------- equal to keras.layers.MultiHeadAttention


SHAPES = {
    # name: (our constructor arguments, Keras's), T=4 queries, S=7 keys
    "d_model": (dict(d_model=D_MODEL, num_heads=NUM_HEADS), dict(num_heads=NUM_HEADS, key_dim=4)),
    "key_dim": (  # key_dim != d_model / num_heads, another output size
        dict(num_heads=2, key_dim=5, output_shape=12),
        dict(num_heads=2, key_dim=5, output_shape=12),
    ),
}


def _random_mask(shape, seed):
    """A random bool mask with at least one True per row (the last axis)."""
    mask = np.random.default_rng(seed).random(shape) > 0.4
    mask[..., 0] = True
    return mask


def _keras_pair(shape_name, use_fused_attention):
    """Keras's layer with random biases, and ours with its weights copied."""
    ours_kwargs, keras_kwargs = SHAPES[shape_name]
    theirs = keras.layers.MultiHeadAttention(**keras_kwargs)
    theirs.build((None, 4, D_MODEL), (None, 7, D_MODEL))
    for dense in (theirs.query_dense, theirs.key_dense, theirs.value_dense, theirs.output_dense):
        dense.bias.assign(np.random.normal(size=dense.bias.shape).astype("float32"))
    ours = MultiHeadAttention(**ours_kwargs, use_fused_attention=use_fused_attention)
    ours.build((None, 4, D_MODEL), (None, 7, D_MODEL))
    ours.copy_weights_from(theirs)
    return ours, theirs


@pytest.mark.multibackend
@pytest.mark.parametrize("use_fused_attention", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_attention_equals_keras_under_every_mask(shape_name, use_fused_attention):
    """Ours (`from_keras`) equals `keras.layers.MultiHeadAttention` under every
    combination of Keras masks on the inputs, explicit masks, the causal mask and
    `return_attention_scores`; cross-attention with T=4 != S=7 (T=S=7 for causal
    self-attention)."""
    ours, theirs = _keras_pair(shape_name, use_fused_attention)
    query_embedding = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)
    value_embedding = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)
    value_ids = SOURCE
    attention = _random_mask((2, 4, 7), seed=1)
    value_mask = _random_mask((2, 7), seed=2)

    def inputs(keras_masks, causal):
        """Fresh tensors each call: Keras's layer strips the masks of its inputs."""
        query_ids = value_ids if causal else TARGET
        query, value = query_embedding(query_ids), value_embedding(value_ids)
        if causal:
            value = query
        if keras_masks == "none":
            query, value = ops.add(query, 0.0), ops.add(value, 0.0)  # no mask attached
        elif keras_masks == "value":
            query = ops.add(query, 0.0)
        return query, value

    combinations = itertools.product(
        ["none", "value", "query_and_value"],
        ["none", "attention_mask", "value_mask", "padding_mask", "query_mask"],
        [False, True],
        [False, True],
    )
    for keras_masks, explicit, causal, scores in combinations:
        if causal and explicit == "attention_mask":
            explicit_mask = _random_mask((2, 7, 7), seed=3)
        else:
            explicit_mask = attention
        query, value = inputs(keras_masks, causal)
        length = query.shape[1]
        common = dict(use_causal_mask=causal, return_attention_scores=scores)
        if explicit == "none":
            mine, keras_kwargs = {}, {}
        elif explicit == "attention_mask":
            mine = keras_kwargs = {"attention_mask": explicit_mask}
        elif explicit == "value_mask":
            mine = keras_kwargs = {"value_mask": value_mask}
        elif explicit == "padding_mask":  # ours; Keras: the same keys, as an attention mask
            mine = {"padding_mask": value_mask}
            keras_kwargs = {
                "attention_mask": np.broadcast_to(value_mask[:, None, :], (2, length, 7))
            }
        else:  # an explicit query mask replaces the query's Keras mask (Keras ignores it)
            rows = _random_mask((2, length), seed=4)
            carried = keras_mask(query)
            rows = rows if carried is None else rows & _np(carried)
            rows[:, 0] = True
            mine = {"query_mask": rows}
            keras_kwargs = {"attention_mask": np.broadcast_to(rows[:, :, None], (2, length, 7))}
        real_rows = _np(keras_mask(query)) if keras_masks == "query_and_value" else None
        if explicit == "query_mask":
            real_rows = mine["query_mask"]
        actual = ours(query, value, **mine, **common)
        query, value = inputs(keras_masks, causal)
        expected = theirs(query, value, **keras_kwargs, **common)
        case = f"keras masks: {keras_masks}, explicit: {explicit}, causal: {causal}"
        if scores:
            (actual, actual_scores), (expected, expected_scores) = actual, expected
            actual, expected = _real_rows(actual, real_rows), _real_rows(expected, real_rows)
            np.testing.assert_allclose(
                _real_rows(actual_scores, real_rows, axis=2),
                _real_rows(expected_scores, real_rows, axis=2),
                atol=ATOL,
                err_msg=case,
            )
        np.testing.assert_allclose(_np(actual), _np(expected), atol=ATOL, err_msg=case)


def _real_rows(x, real_rows, axis=1):
    """`x` with the rows of masked queries (every key hidden) set to 0. Keras's
    explicit softmax (taken with `return_attention_scores`) zeroes those rows;
    `ops.dot_product_attention` (Keras's path otherwise) and this package make
    them uniform. Outputs there mean nothing either way."""
    x = _np(x)
    if real_rows is None:
        return x
    shape = [1] * x.ndim
    shape[0], shape[axis] = real_rows.shape
    return np.where(real_rows.reshape(shape), x, 0.0)


@pytest.mark.multibackend
def test_keras_constructor_arguments():
    """Keras's arguments by keyword; the output is the query's size unless told."""
    query = np.random.normal(size=(2, 3, 10)).astype("float32")
    value = np.random.normal(size=(2, 5, 6)).astype("float32")
    layer = MultiHeadAttention(num_heads=3, key_dim=4, value_dim=2, use_bias=False)
    output, scores = layer(query, value, return_attention_scores=True)
    assert tuple(output.shape) == (2, 3, 10) and tuple(scores.shape) == (2, 3, 3, 5)
    assert [tuple(w.shape) for w in layer.weights] == [(10, 3, 4), (6, 3, 4), (6, 3, 2), (3, 2, 10)]
    two_dims = MultiHeadAttention(num_heads=2, key_dim=4, output_shape=(2, 5))
    assert tuple(two_dims(query, value).shape) == (2, 3, 2, 5)
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, output_shape=(2, 5))
    theirs.build(query.shape, value.shape)
    copied = MultiHeadAttention.from_keras(theirs)
    np.testing.assert_allclose(_np(copied(query, value)), _np(theirs(query, value)), atol=ATOL)


def test_keras_arguments_are_checked():
    with pytest.raises(ValueError, match="needs d_model .* or key_dim"):
        MultiHeadAttention(num_heads=4)
    with pytest.raises(ValueError, match="num_heads=None"):
        MultiHeadAttention(d_model=16)
    # Keras's positional (num_heads, key_dim) is read as (d_model, num_heads): refused here.
    with pytest.raises(ValueError, match=r"d_model=8 must be divisible by num_heads=64"):
        MultiHeadAttention(8, 64)
    with pytest.raises(TypeError):
        MultiHeadAttention(16, 4, 0.1)  # everything after (d_model, num_heads) is keyword-only
    with pytest.raises(ValueError, match=r"attention_axes=\(1, 2\)"):
        MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=(1, 2))
    gated = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, use_gate=True)
    gated.build((None, 3, 8), (None, 3, 8))
    with pytest.raises(ValueError, match="use_gate=True"):
        MultiHeadAttention.from_keras(gated)
    with pytest.raises(ValueError, match="no weights yet"):
        MultiHeadAttention.from_keras(keras.layers.MultiHeadAttention(num_heads=2, key_dim=4))


# --------------------------------------------------------------- fused == explicit


@pytest.mark.multibackend
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_attention_equals_explicit_attention(dtype):
    """`use_fused_attention` (`ops.dot_product_attention`) equals the explicit
    einsum/softmax under padding, causal, both, an attention mask and the Keras
    masks of the inputs, in self- (T=S=7) and cross-attention (T=4, S=7); in
    float32 to 1e-5, in bfloat16 to `BF16_ATOL`."""
    explicit = MultiHeadAttention(d_model=D_MODEL, num_heads=NUM_HEADS, dtype=dtype)
    explicit.build((None, None, D_MODEL), (None, None, D_MODEL))
    fused = MultiHeadAttention(
        d_model=D_MODEL, num_heads=NUM_HEADS, use_fused_attention=True, dtype=dtype
    )
    fused.build((None, None, D_MODEL), (None, None, D_MODEL))
    fused.set_weights(explicit.get_weights())
    atol = ATOL if dtype == "float32" else BF16_ATOL
    source = np.random.normal(size=(2, 7, D_MODEL)).astype("float32")
    target = np.random.normal(size=(2, 4, D_MODEL)).astype("float32")
    padding = SOURCE != 0
    cases = {
        "padding": (target, source, dict(padding_mask=padding)),
        "causal": (source, source, dict(use_causal_mask=True)),
        "padding_and_causal": (source, source, dict(padding_mask=padding, use_causal_mask=True)),
        "attention_mask": (target, source, dict(attention_mask=_random_mask((2, 4, 7), 5))),
        "all": (
            source,
            source,
            dict(
                padding_mask=padding,
                use_causal_mask=True,
                attention_mask=_random_mask((2, 7, 7), 6),
                query_mask=padding,
            ),
        ),
    }
    for name, (query, value, masks) in cases.items():
        np.testing.assert_allclose(
            _np(ops.cast(fused(query, value, **masks), "float32")),
            _np(ops.cast(explicit(query, value, **masks), "float32")),
            atol=atol,
            err_msg=name,
        )
    # With Keras masks on the inputs, as after Embedding(mask_zero=True).
    embedding = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True, dtype=dtype)
    np.testing.assert_allclose(
        _np(ops.cast(fused(embedding(SOURCE), use_causal_mask=True), "float32")),
        _np(ops.cast(explicit(embedding(SOURCE), use_causal_mask=True), "float32")),
        atol=atol,
    )


# ------------------------------------------------------------ weights from keras-hub


def _keras_hub_block(kind, normalize_first, cross):
    keras_hub = pytest.importorskip("keras_hub")
    cls = getattr(keras_hub.layers, kind)
    block = cls(
        intermediate_dim=D_FF,
        num_heads=NUM_HEADS,
        dropout=0.1,
        normalize_first=normalize_first,
        layer_norm_epsilon=1e-5,
    )
    if kind == "TransformerEncoder":
        block.build((None, None, D_MODEL))
    else:
        block.build((None, None, D_MODEL), (None, None, D_MODEL) if cross else None)
    for weight in block.weights:  # random biases and norms too, so a mixed-up weight shows
        weight.assign(weight + np.random.normal(scale=0.1, size=weight.shape).astype("float32"))
    return block


@pytest.mark.multibackend
@pytest.mark.parametrize("normalize_first", [False, True], ids=["post_ln", "pre_ln"])
def test_encoder_layer_from_keras_hub(normalize_first):
    theirs = _keras_hub_block("TransformerEncoder", normalize_first, cross=False)
    ours = EncoderLayer.from_keras(theirs)
    assert (ours.norm_first, ours.layer_norm_epsilon, ours.dropout) == (normalize_first, 1e-5, 0.1)
    x = np.random.normal(size=(2, 7, D_MODEL)).astype("float32")
    padding = SOURCE != 0
    expected = _np(theirs(x, padding_mask=padding))
    actual = _np(ours(x, padding_mask=padding))
    for row, length in enumerate(_lengths(SOURCE)):  # keras-hub also masks padded queries
        np.testing.assert_allclose(actual[row, :length], expected[row, :length], atol=ATOL)


@pytest.mark.multibackend
@pytest.mark.parametrize("cross", [False, True], ids=["decoder_only", "cross"])
@pytest.mark.parametrize("normalize_first", [False, True], ids=["post_ln", "pre_ln"])
def test_decoder_layer_from_keras_hub(normalize_first, cross):
    theirs = _keras_hub_block("TransformerDecoder", normalize_first, cross=cross)
    ours = DecoderLayer.from_keras(theirs)
    assert ours.has_cross_attention is cross
    target = np.random.normal(size=(2, 4, D_MODEL)).astype("float32")
    source = np.random.normal(size=(2, 7, D_MODEL)).astype("float32") if cross else None
    masks = dict(padding_mask=TARGET != 0)
    keras_hub_masks = dict(decoder_padding_mask=TARGET != 0)
    if cross:
        masks["encoder_padding_mask"] = keras_hub_masks["encoder_padding_mask"] = SOURCE != 0
    expected = _np(theirs(target, source, **keras_hub_masks))
    actual = _np(ours(target, source, **masks))
    for row, length in enumerate(_lengths(TARGET)):
        np.testing.assert_allclose(actual[row, :length], expected[row, :length], atol=ATOL)


def test_from_keras_refuses_what_it_cannot_copy():
    keras_hub = pytest.importorskip("keras_hub")
    gelu = keras_hub.layers.TransformerEncoder(intermediate_dim=8, num_heads=2, activation="gelu")
    gelu.build((None, None, 8))
    with pytest.raises(ValueError, match="activation=gelu"):
        EncoderLayer.from_keras(gelu)
    with pytest.raises(TypeError, match="TransformerDecoder"):
        DecoderLayer.from_keras(gelu)
