"""Encoder layer (Section 3.1)."""

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import FeedForward


def layer_norm(epsilon, dtype, name):
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)


def sublayer_connection(x, sublayer, norm, dropout, norm_first, training):
    """Post-LN `norm(x + dropout(f(x)))` (the paper) or pre-LN `x + dropout(f(norm(x)))`."""
    if norm_first:
        return x + dropout(sublayer(norm(x)), training=training)
    return norm(x + dropout(sublayer(x), training=training))


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(keras.layers.Layer):
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

    def __init__(
        self,
        d_model,
        num_heads,
        d_ff,
        dropout=0.1,
        attention_dropout=0.0,
        norm_first=False,
        layer_norm_epsilon=1e-6,
        use_fused_attention=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.use_fused_attention = use_fused_attention
        self.supports_masking = True

        dtype = self.dtype_policy
        self.self_attention = MultiHeadAttention(
            d_model,
            num_heads,
            dropout=attention_dropout,
            use_fused_attention=use_fused_attention,
            dtype=dtype,
            name="self_attention",
        )
        self.self_attention_norm = layer_norm(layer_norm_epsilon, dtype, "self_attention_norm")
        self.feed_forward = FeedForward(d_model, d_ff, dtype=dtype, name="feed_forward")
        self.feed_forward_norm = layer_norm(layer_norm_epsilon, dtype, "feed_forward_norm")
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=dtype)

    def build(self, inputs_shape):
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm.build(inputs_shape)
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm.build(inputs_shape)
        self.built = True

    def call(self, inputs, padding_mask=None, attention_mask=None, training=None):
        if padding_mask is None:
            padding_mask = getattr(inputs, "_keras_mask", None)

        def attend(x):
            return self.self_attention(
                x, padding_mask=padding_mask, attention_mask=attention_mask, training=training
            )

        def feed_forward(x):
            return self.feed_forward(x, training=training)

        x = sublayer_connection(
            inputs, attend, self.self_attention_norm, self.dropout_layer, self.norm_first, training
        )  # (B, S, D)
        return sublayer_connection(
            x, feed_forward, self.feed_forward_norm, self.dropout_layer, self.norm_first, training
        )  # (B, S, D)

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "norm_first": self.norm_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "use_fused_attention": self.use_fused_attention,
            }
        )
        return config
