"""Invariants of the positional encoding, embedding, encoder and decoder layers."""

import math

import keras
import numpy as np
import pytest
from backend_utils import compiled
from keras import ops

from keras_transformer.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    PositionalEncoding,
    TokenEmbedding,
)

ATOL = 1e-5


def _np(x):
    return ops.convert_to_numpy(x)


def _paper_positional_encoding(positions, d_model):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), in float64 loops."""
    table = np.zeros((len(positions), d_model), dtype="float64")
    for row, pos in enumerate(positions):
        for i in range(d_model // 2):
            angle = pos / 10000.0 ** (2 * i / d_model)
            table[row, 2 * i] = math.sin(angle)
            table[row, 2 * i + 1] = math.cos(angle)
    return table


@pytest.mark.multibackend
def test_positional_encoding_golden_values():
    d_model = 512
    x = np.zeros((1, 51, d_model), "float32")
    encoding = _np(PositionalEncoding()(x))[0]  # (51, 512)
    expected = _paper_positional_encoding([0, 1, 50], d_model)
    np.testing.assert_allclose(encoding[[0, 1, 50]], expected, atol=ATOL)
    # Position 0 is sin(0)=0, cos(0)=1 exactly.
    np.testing.assert_array_equal(encoding[0, 0::2], 0.0)
    np.testing.assert_array_equal(encoding[0, 1::2], 1.0)


@pytest.mark.multibackend
def test_positional_encoding_start_index():
    d_model = 512
    layer = PositionalEncoding()
    x = np.random.normal(size=(2, 3, d_model)).astype("float32")
    # A scalar offset: positions 48, 49, 50; the input is added, not replaced.
    shifted = _np(layer(x, start_index=48)) - x
    np.testing.assert_allclose(
        shifted[0], _paper_positional_encoding([48, 49, 50], d_model), atol=ATOL
    )
    # A per-sequence offset, as in cached decoding.
    per_row = _np(layer(x, start_index=np.array([0, 50], "int32"))) - x
    np.testing.assert_allclose(
        per_row[0], _paper_positional_encoding([0, 1, 2], d_model), atol=ATOL
    )
    np.testing.assert_allclose(
        per_row[1], _paper_positional_encoding([50, 51, 52], d_model), atol=ATOL
    )


def test_positional_encoding_rejects_odd_size():
    with pytest.raises(ValueError, match="d_model=7"):
        PositionalEncoding()(np.zeros((1, 2, 7), "float32"))
    with pytest.raises(ValueError, match="max_wavelength=1"):
        PositionalEncoding(max_wavelength=1)


@pytest.mark.multibackend
def test_token_embedding_is_scaled_and_tied():
    vocab_size, d_model = 11, 8
    layer = TokenEmbedding(vocab_size, d_model)
    ids = np.array([[4, 1, 0]], "int32")
    x = _np(layer(ids))
    table = _np(layer.embeddings)
    np.testing.assert_allclose(x[0], table[[4, 1, 0]] * math.sqrt(d_model), rtol=1e-6)
    np.testing.assert_allclose(_np(layer.logits(x)), x @ table.T, rtol=1e-5, atol=ATOL)
    np.testing.assert_array_equal(_np(layer.compute_mask(ids)), [[True, True, False]])
    # Float ids (MirroredStrategy's averaged build batch) are cast, not rejected.
    np.testing.assert_allclose(_np(layer(ids.astype("float32"))), x)


@pytest.mark.multibackend
def test_feed_forward_matches_numpy():
    layer = FeedForward(d_model=4, d_ff=6)
    x = np.random.normal(size=(2, 3, 4)).astype("float32")
    output = _np(layer(x))
    w1, b1, w2, b2 = layer.get_weights()
    expected = np.maximum(0.0, x @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(output, expected, atol=ATOL)


@pytest.mark.multibackend
def test_encoder_layer_after_embedding_mask_zero():
    """The Keras mask of `Embedding(mask_zero=True)` keeps padding out of real outputs."""
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(50, 16, mask_zero=True)(inputs)
    x = EncoderLayer(d_model=16, num_heads=2, d_ff=32, dropout=0.0)(x)
    model = keras.Model(inputs, x)
    padded = np.array([[5, 6, 7, 0, 0]], "int32")
    unpadded = padded[:, :3]
    np.testing.assert_allclose(_np(model(padded))[:, :3], _np(model(unpadded)), atol=ATOL)
    # The same layer without a mask does see the padding (so the check above can fail).
    unmasked_inputs = keras.Input((None,), dtype="int32")
    embedding = keras.layers.Embedding(50, 16)
    encoder = EncoderLayer(d_model=16, num_heads=2, d_ff=32, dropout=0.0)
    unmasked = keras.Model(unmasked_inputs, encoder(embedding(unmasked_inputs)))
    assert np.abs(_np(unmasked(padded))[:, :3] - _np(unmasked(unpadded))).max() > 1e-4


@pytest.mark.multibackend
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_padding_mask(norm_first):
    layer = EncoderLayer(d_model=16, num_heads=4, d_ff=32, dropout=0.0, norm_first=norm_first)
    x = np.random.normal(size=(2, 6, 16)).astype("float32")
    padding = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    noisy = x.copy()
    noisy[0, 4:] = np.random.normal(size=(2, 16))  # padded positions of sequence 0
    base = _np(layer(x, padding_mask=padding))
    changed = _np(layer(noisy, padding_mask=padding))
    np.testing.assert_allclose(changed[0, :4], base[0, :4], atol=ATOL)
    np.testing.assert_allclose(changed[1], base[1], atol=ATOL)


@pytest.mark.multibackend
def test_decoder_layer_cross_attention_with_different_lengths():
    """T=3 target steps attend to S=7 source steps; source padding and future steps are hidden."""
    layer = DecoderLayer(d_model=16, num_heads=4, d_ff=32, dropout=0.0)
    target = np.random.normal(size=(2, 3, 16)).astype("float32")
    source = np.random.normal(size=(2, 7, 16)).astype("float32")
    source_padding = np.array([[1] * 7, [1, 1, 1, 0, 0, 0, 0]], bool)
    base = _np(layer(target, source, encoder_padding_mask=source_padding))
    assert base.shape == (2, 3, 16)

    noisy_source = source.copy()
    noisy_source[1, 3:] = np.random.normal(size=(4, 16))
    changed = _np(layer(target, noisy_source, encoder_padding_mask=source_padding))
    np.testing.assert_allclose(changed, base, atol=ATOL)
    # Without the mask the same change is visible (the check above can fail).
    assert np.abs(_np(layer(target, noisy_source))[1] - _np(layer(target, source))[1]).max() > 1e-4

    # Changing target step 2 leaves steps 0 and 1 unchanged; the source does reach every step.
    future = target.copy()
    future[:, 2] = np.random.normal(size=(2, 16))
    changed = _np(layer(future, source, encoder_padding_mask=source_padding))
    np.testing.assert_allclose(changed[:, :2], base[:, :2], atol=ATOL)
    assert np.abs(changed[:, 2] - base[:, 2]).max() > 1e-4


def test_layers_reject_bad_dropout():
    with pytest.raises(ValueError, match="dropout=1.5"):
        EncoderLayer(d_model=16, num_heads=4, d_ff=32, dropout=1.5)
    with pytest.raises(ValueError, match="dropout=-0.5"):
        DecoderLayer(d_model=16, num_heads=4, d_ff=32, dropout=-0.5)
    with pytest.raises(ValueError, match="dropout=1.0"):
        FeedForward(d_model=16, d_ff=32, dropout=1.0)
    with pytest.raises(ValueError, match="d_model=10 must be divisible by num_heads=4"):
        EncoderLayer(d_model=10, num_heads=4, d_ff=32)


@pytest.mark.multibackend
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_decoder_layer_call_with_cache_equals_call(norm_first):
    """Step by step, with cross keys/values projected once, equals one call (T=4, S=7)."""
    layer = DecoderLayer(d_model=16, num_heads=4, d_ff=32, dropout=0.0, norm_first=norm_first)
    layer.build((None, None, 16), (None, None, 16))
    target = np.random.normal(size=(2, 4, 16)).astype("float32")
    source = np.random.normal(size=(2, 7, 16)).astype("float32")
    source_padding = np.array([[1] * 7, [1, 1, 1, 0, 0, 0, 0]], bool)
    # Compiled under JAX (see `compiled`), eager elsewhere.
    call = compiled(layer, lambda t, s, m: layer(t, s, encoder_padding_mask=m))
    cross_key_value = compiled(layer, layer.compute_cross_key_value)
    call_with_cache = compiled(layer, layer.call_with_cache)
    expected = _np(call(target, source, source_padding))
    cross_key, cross_value = cross_key_value(source)  # (B, S, N, H) each
    self_key = self_value = ops.zeros((2, 4, 4, 4))  # (B, T_max, N, H)
    for t in range(4):
        step, (self_key, self_value) = call_with_cache(
            target[:, t : t + 1],
            self_key,
            self_value,
            np.full((2,), t, "int32"),
            cross_key,
            cross_value,
            source_padding,
        )
        np.testing.assert_allclose(_np(step)[:, 0], expected[:, t], atol=ATOL)


def test_threefry_dropout_under_xla_drops_at_the_rate_and_rescales():
    """`layers.dropout.Dropout` with ThreeFry (what `Transformer.compile(jit_compile=True)`
    selects under TensorFlow): the rate and scaling of `keras.layers.Dropout`."""
    import tensorflow as tf

    from keras_transformer.layers.dropout import Dropout

    layer = Dropout(0.3, seed=1)
    layer.use_threefry = True
    x = tf.ones((64, 32, 64))
    step = tf.function(lambda x: layer(x, training=True), jit_compile=True)
    first, second = step(x).numpy(), step(x).numpy()
    assert set(np.unique(first)) == {0.0, np.float32(1 / 0.7)}
    assert abs((first == 0).mean() - 0.3) < 0.01
    assert (first != second).any()  # a new mask at every call
    np.testing.assert_array_equal(layer(x, training=False), x)


def test_transformer_compiled_with_xla_draws_dropout_with_threefry():
    from keras_transformer import Transformer
    from keras_transformer.layers.dropout import Dropout

    model = Transformer.from_preset("tiny")
    model.build()
    dropouts = [layer for layer in model._flatten_layers() if isinstance(layer, Dropout)]
    # Embeddings; residual, self-attention and feed-forward of 2 encoder layers, and
    # cross-attention besides in 2 decoder layers.
    assert model.embedding_dropout in dropouts and len(dropouts) == 1 + 2 * 3 + 2 * 4
    for jit_compile in (True, False):
        model.compile(optimizer="adam", loss="mse", jit_compile=jit_compile)
        assert all(layer.use_threefry is jit_compile for layer in dropouts)


RBG_DROPOUT = r"""
import jax, keras, numpy as np
from keras_transformer.layers.dropout import Dropout

Dropout.jax_bits = "rbg"
layer = Dropout(0.3, seed=1)
x = np.ones((64, 32, 64), "float32")
first = np.asarray(layer(x, training=True))
second = np.asarray(layer(x, training=True))
assert set(np.unique(first)) == {0.0, np.float32(1 / 0.7)}, np.unique(first)
assert abs((first == 0).mean() - 0.3) < 0.01, (first == 0).mean()
assert (first != second).any()  # a new mask at every call
np.testing.assert_array_equal(layer(x, training=False), x)
again = Dropout(0.3, seed=1)
np.testing.assert_array_equal(np.asarray(again(x, training=True)), first)  # the seed decides
print("ok")
"""


def test_rbg_dropout_under_jax_drops_at_the_rate_and_rescales():
    """`Dropout.jax_bits = "rbg"` (XLA's RngBitGenerator under JAX): the rate and
    scaling of `keras.layers.Dropout`, a new mask per call, one mask per seed."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, KERAS_BACKEND="jax")
    result = subprocess.run(
        [sys.executable, "-c", RBG_DROPOUT], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
