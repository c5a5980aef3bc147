"""Encoder layer (Section 3.1)."""

import keras

from keras_transformer.layers.block import TransformerBlock


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(TransformerBlock):
    """One encoder block: self-attention and a feed-forward network.

    Each sub-layer is wrapped as `LayerNorm(x + Dropout(Sublayer(x)))`
    (post-LN, https://arxiv.org/abs/1706.03762, Section 3.1 and 5.4), or as
    `x + Dropout(Sublayer(LayerNorm(x)))` with `norm_first=True` (pre-LN).

    Args:
        d_model: int. Model size (D).
        num_heads: int. Attention heads; must divide `d_model`.
        d_ff: int. Inner size of the feed-forward network.
        dropout: float in [0, 1). Residual dropout (P_drop, 0.1 in the paper).
        attention_dropout: float in [0, 1). Dropout on attention weights.
        norm_first: bool. Pre-LN instead of the paper's post-LN.
        layer_norm_epsilon: float.
        use_fused_attention: bool. See `MultiHeadAttention`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, S, D)` tensor.
        padding_mask: `(B, S)` bool, True for real tokens. Defaults to the
            Keras mask of `inputs`, so the layer works after
            `keras.layers.Embedding(mask_zero=True)`.
        attention_mask: `(B, S, S)` bool.
        training: bool.

    Example:

    >>> inputs = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(100, 16, mask_zero=True)(inputs)
    >>> x = EncoderLayer(d_model=16, num_heads=2, d_ff=32)(x)
    >>> outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x))
    >>> classifier = keras.Model(inputs, outputs)
    """

    def build(self, inputs_shape):
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm.build(inputs_shape)
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm.build(inputs_shape)
        self.built = True

    def call(self, inputs, padding_mask=None, attention_mask=None, training=None):
        if padding_mask is None:
            padding_mask = getattr(inputs, "_keras_mask", None)

        h = self._sublayer_input(inputs, self.self_attention_norm)
        h = self.self_attention(
            h, padding_mask=padding_mask, attention_mask=attention_mask, training=training
        )
        x = self._add_residual(inputs, h, self.self_attention_norm, training)  # (B, S, D)
        h = self.feed_forward(self._sublayer_input(x, self.feed_forward_norm), training=training)
        return self._add_residual(x, h, self.feed_forward_norm, training)  # (B, S, D)

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, inputs_shape):
        return inputs_shape
