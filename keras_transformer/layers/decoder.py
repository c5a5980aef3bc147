"""Decoder layer (Section 3.1)."""

import keras

from keras_transformer.layers.block import TransformerBlock


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(TransformerBlock):
    """One decoder block: causal self-attention, cross-attention, feed-forward.

    Each sub-layer is wrapped as `LayerNorm(x + Dropout(Sublayer(x)))`
    (post-LN, https://arxiv.org/abs/1706.03762, Section 3.1), or pre-LN with
    `norm_first=True`. Self-attention is causal: "preventing positions from
    attending to subsequent positions".

    Args:
        d_model: int. Model size (D).
        num_heads: int. Attention heads; must divide `d_model`.
        d_ff: int. Inner size of the feed-forward network.
        dropout: float in [0, 1). Residual dropout.
        attention_dropout: float in [0, 1). Dropout on attention weights.
        norm_first: bool. Pre-LN instead of the paper's post-LN.
        layer_norm_epsilon: float.
        use_fused_attention: bool. See `MultiHeadAttention`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, D)` target-side tensor.
        encoder_outputs: `(B, S, D)` encoder output.
        padding_mask: `(B, T)` bool, True for real target tokens; defaults
            to the Keras mask of `inputs`.
        encoder_padding_mask: `(B, S)` bool, True for real source tokens;
            defaults to the Keras mask of `encoder_outputs`.
        training: bool.

    `call_with_cache` runs one decoding step against a key/value cache and
    gives the same result as `call` at that position.

    Example:

    >>> layer = DecoderLayer(d_model=16, num_heads=2, d_ff=32)
    >>> y = layer(keras.ops.ones((2, 3, 16)), keras.ops.ones((2, 5, 16)))
    >>> y.shape
    (2, 3, 16)
    """

    def __init__(self, d_model, num_heads, d_ff, **kwargs):
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.cross_attention = self._attention("cross_attention")
        self.cross_attention_norm = self._layer_norm("cross_attention_norm")

    def build(self, inputs_shape, encoder_outputs_shape=None):
        encoder_outputs_shape = encoder_outputs_shape or inputs_shape
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm.build(inputs_shape)
        self.cross_attention.build(inputs_shape, encoder_outputs_shape)
        self.cross_attention_norm.build(inputs_shape)
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm.build(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        encoder_outputs,
        padding_mask=None,
        encoder_padding_mask=None,
        training=None,
    ):
        if padding_mask is None:
            padding_mask = getattr(inputs, "_keras_mask", None)
        if encoder_padding_mask is None:
            encoder_padding_mask = getattr(encoder_outputs, "_keras_mask", None)

        def self_attend(x):
            return self.self_attention(
                x, padding_mask=padding_mask, use_causal_mask=True, training=training
            )

        def cross_attend(x):
            return self.cross_attention(
                x, encoder_outputs, padding_mask=encoder_padding_mask, training=training
            )

        x = self._connect(inputs, self_attend, self.self_attention_norm, training)  # (B, T, D)
        x = self._connect(x, cross_attend, self.cross_attention_norm, training)  # (B, T, D)
        return self._connect(
            x, lambda h: self.feed_forward(h, training=training), self.feed_forward_norm, training
        )  # (B, T, D)

    def call_with_cache(
        self,
        inputs,
        self_key,
        self_value,
        cross_key,
        cross_value,
        cache_index,
        encoder_padding_mask=None,
    ):
        """One decoding step at position `cache_index` (inference only).

        Args:
            inputs: `(B, 1, D)` embedding of the newest target token.
            self_key, self_value: `(B, T_max, N, H)` self-attention cache.
            cross_key, cross_value: `(B, S, N, H)` from
                `cross_attention.compute_key_value(encoder_outputs)`.
            cache_index: `(B,)` int, the position being decoded.
            encoder_padding_mask: `(B, S)` bool.

        Returns:
            `(outputs (B, 1, D), (self_key, self_value))` with the step written
            into the cache.
        """
        new_cache = []

        def self_attend(x):
            output, cache = self.self_attention.call_with_cache(
                x, self_key, self_value, cache_index=cache_index
            )
            new_cache.extend(cache)
            return output

        def cross_attend(x):
            output, _ = self.cross_attention.call_with_cache(
                x, cross_key, cross_value, padding_mask=encoder_padding_mask
            )
            return output

        x = self._connect(inputs, self_attend, self.self_attention_norm, False)
        x = self._connect(x, cross_attend, self.cross_attention_norm, False)
        x = self._connect(x, self.feed_forward, self.feed_forward_norm, False)
        return x, tuple(new_cache)

    def compute_mask(self, inputs, encoder_outputs=None, mask=None, **kwargs):
        return getattr(inputs, "_keras_mask", None)

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return inputs_shape
