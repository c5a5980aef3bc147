"""Encoder layer (Section 3.1)."""

import keras

from keras_transformer.layers.block import TransformerBlock
from keras_transformer.layers.masks import keras_mask, merge_masks


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
            `keras.layers.Embedding(mask_zero=True)`; given, it replaces
            that mask (as in keras-hub's `TransformerEncoder`).
        attention_mask: `(B, S, S)` bool, ANDed with the padding mask.
        training: bool.

    Masks hide padded keys: an output at a real position does not depend
    on the padding. Padded positions attend to the real tokens (their rows
    are not masked, so they stay finite on every attention kernel), and
    the output carries the Keras mask of `inputs` to the next layer.
    Weights copy from keras-hub's `TransformerEncoder`: `from_keras`.

    Example:

    >>> inputs = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(100, 16, mask_zero=True)(inputs)
    >>> x = EncoderLayer(d_model=16, num_heads=2, d_ff=32)(x)
    >>> outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x))
    >>> classifier = keras.Model(inputs, outputs)
    """

    KERAS_HUB_CLASS = "TransformerEncoder"

    def _build_like(self, layer):
        self.build((None, None, self.d_model))

    def build(self, inputs_shape):
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm.build(inputs_shape)
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm.build(inputs_shape)
        self.built = True

    def call(self, inputs, padding_mask=None, attention_mask=None, training=None):
        if padding_mask is None:
            padding_mask = keras_mask(inputs)
        mask = merge_masks(inputs, inputs, padding_mask, attention_mask)  # (B, S, S), or None

        h = self._sublayer_input(inputs, self.self_attention_norm)
        h = self.self_attention.attend(h, h, mask=mask, training=training)
        x = self._add_residual(inputs, h, self.self_attention_norm, training)  # (B, S, D)
        h = self.feed_forward(self._sublayer_input(x, self.feed_forward_norm), training=training)
        return self._add_residual(x, h, self.feed_forward_norm, training)  # (B, S, D)

    def compute_mask(self, inputs, previous_mask=None):
        return previous_mask  # the Keras mask of `inputs`, for the next layer

    def compute_output_shape(self, inputs_shape):
        return inputs_shape
