"""`DecoderLayer` without encoder outputs: a decoder-only (causal language) model.

`CausalLanguageModel` below is the smallest GPT-style model the layers make:
shared token embedding and pre-softmax matrix, sinusoidal positions, a stack
of decoder-only `DecoderLayer`s, and a key/value cache for decoding.
"""

import keras
import numpy as np
import pytest
from backend_utils import compiled
from keras import ops

from keras_transformer.layers import (
    DecoderLayer,
    PositionalEncoding,
    TokenEmbedding,
    padding_mask_from_ids,
)

ATOL = 1e-5
VOCAB, D_MODEL, NUM_HEADS, D_FF, NUM_LAYERS = 20, 16, 2, 32, 2
TOKENS = np.array([[1, 5, 6, 7, 8, 9], [1, 10, 11, 12, 0, 0]], "int32")  # (B=2, T=6), pad 0


def _np(x):
    return ops.convert_to_numpy(x)


@keras.saving.register_keras_serializable(package="keras_transformer_tests")
class CausalLanguageModel(keras.Model):
    """`(B, T)` token ids -> `(B, T, V)` logits of the next token."""

    def __init__(self, vocab_size, num_layers, d_model, num_heads, d_ff, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.num_layers = num_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.embedding = TokenEmbedding(vocab_size, d_model, name="embedding")
        self.positional_encoding = PositionalEncoding(name="positional_encoding")
        self.decoder_layers = [
            DecoderLayer(d_model, num_heads, d_ff, dropout=0.0, name=f"decoder_layer_{i}")
            for i in range(num_layers)
        ]

    def build(self, inputs_shape=None):
        self.embedding.build()
        for layer in self.decoder_layers:
            layer.build((None, None, self.d_model))  # no encoder_outputs_shape: decoder-only
        self.built = True

    def call(self, token_ids):
        padding_mask = padding_mask_from_ids(ops.cast(token_ids, "int32"))  # (B, T)
        x = self.positional_encoding(self.embedding(token_ids))  # (B, T, D)
        for layer in self.decoder_layers:
            x = layer(x, padding_mask=padding_mask)
        return self.embedding.logits(x)  # (B, T, V)

    def init_cache(self, batch_size, max_length):
        head_dim = self.d_model // self.num_heads
        zeros = ops.zeros((batch_size, self.num_layers, max_length, self.num_heads, head_dim))
        return {"index": ops.zeros((batch_size,), "int32"), "key": zeros, "value": zeros}

    def decode_step(self, token_ids, cache):
        """`(B,)` ids at position `cache["index"]` -> `(B, V)` logits and the new cache."""
        index = cache["index"]
        x = self.embedding(ops.cast(token_ids, "int32")[:, None])  # (B, 1, D)
        x = self.positional_encoding(x, start_index=index)
        keys, values = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, (key, value) = layer.call_with_cache(
                x, cache["key"][:, i], cache["value"][:, i], index
            )
            keys.append(key)
            values.append(value)
        cache = {
            "index": index + 1,
            "key": ops.stack(keys, axis=1),  # (B, L, T_max, N, H)
            "value": ops.stack(values, axis=1),
        }
        return self.embedding.logits(x)[:, 0], cache

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "num_layers": self.num_layers,
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "d_ff": self.d_ff,
        }


def _model():
    model = CausalLanguageModel(VOCAB, NUM_LAYERS, D_MODEL, NUM_HEADS, D_FF)
    model.build()
    model.jit_call = compiled(model, lambda token_ids: model(token_ids))
    return model


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.mark.multibackend
def test_decoder_only_layer_has_no_cross_attention_weights():
    layer = DecoderLayer(d_model=D_MODEL, num_heads=NUM_HEADS, d_ff=D_FF)
    layer.build((None, None, D_MODEL))
    assert layer.has_cross_attention is False
    assert not any("cross_attention" in v.path for v in layer.weights)
    attention = 4 * (D_MODEL * D_MODEL + D_MODEL)
    feed_forward = 2 * D_MODEL * D_FF + D_FF + D_MODEL
    assert layer.count_params() == attention + feed_forward + 2 * 2 * D_MODEL
    encoder_decoder = DecoderLayer(d_model=D_MODEL, num_heads=NUM_HEADS, d_ff=D_FF)
    encoder_decoder.build((None, None, D_MODEL), (None, None, D_MODEL))
    assert encoder_decoder.count_params() == layer.count_params() + attention + 2 * D_MODEL


def test_a_layer_is_called_the_way_it_was_built():
    x = np.zeros((1, 3, D_MODEL), "float32")
    decoder_only = DecoderLayer(d_model=D_MODEL, num_heads=NUM_HEADS, d_ff=D_FF)
    decoder_only(x)
    with pytest.raises(ValueError, match="built without encoder outputs"):
        decoder_only(x, x)
    encoder_decoder = DecoderLayer(d_model=D_MODEL, num_heads=NUM_HEADS, d_ff=D_FF)
    encoder_decoder(x, x)
    with pytest.raises(ValueError, match="needs encoder_outputs"):
        encoder_decoder(x)


@pytest.mark.multibackend
def test_future_tokens_cannot_change_earlier_logits(model):
    logits = _np(model.jit_call(TOKENS))  # (B, T, V)
    assert logits.shape == (2, 6, VOCAB)
    for t in (2, 4):
        changed_tokens = TOKENS.copy()
        changed_tokens[0, t] = 19
        changed = _np(model.jit_call(changed_tokens))
        np.testing.assert_allclose(changed[0, :t], logits[0, :t], atol=ATOL)
        assert np.abs(changed[0, t:] - logits[0, t:]).max() > 1e-4  # the check can fail
        np.testing.assert_allclose(changed[1], logits[1], atol=ATOL)
    # Trailing padding does not change the real positions either.
    np.testing.assert_allclose(_np(model.jit_call(TOKENS[1:, :4])), logits[1:, :4], atol=ATOL)


@pytest.mark.multibackend
def test_cached_decoding_equals_full_pass(model):
    logits = _np(model.jit_call(TOKENS))
    max_length = TOKENS.shape[1] + 2  # a cache longer than the decoded prefix
    cache = model.init_cache(2, max_length)
    step = compiled(model, model.decode_step)
    steps = []
    for t in range(TOKENS.shape[1]):
        step_logits, cache = step(TOKENS[:, t], cache)
        steps.append(_np(step_logits))
    steps = np.stack(steps, axis=1)  # (B, T, V)
    np.testing.assert_allclose(steps[0], logits[0], atol=ATOL)
    np.testing.assert_allclose(steps[1, :4], logits[1, :4], atol=ATOL)  # before its padding


@pytest.mark.multibackend
def test_trains_saves_and_reloads(tmp_path):
    """Learns a fixed sequence (the loss falls), and a `.keras` file gives the same logits."""
    model = _model()
    sequence = np.array([[1, 4, 7, 2, 9, 5, 3, 8, 6]] * 8, "int32")
    inputs, targets = sequence[:, :-1], sequence[:, 1:]
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(inputs, targets, epochs=30, batch_size=8, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.2 * losses[0], losses
    expected = _np(model.jit_call(inputs))
    assert (expected.argmax(-1) == targets).all()

    path = str(tmp_path / "causal_lm.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored, CausalLanguageModel)
    assert [layer.has_cross_attention for layer in restored.decoder_layers] == [False, False]
    np.testing.assert_allclose(
        _np(compiled(restored, lambda ids: restored(ids))(inputs)), expected, atol=ATOL
    )
