"""What encoder and decoder layers share: arguments, residual wiring, config."""

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.feed_forward import FeedForward


class TransformerBlock(keras.layers.Layer):
    """Base of `EncoderLayer` and `DecoderLayer`; not used on its own.

    Creates the sub-layers both have (self-attention, feed-forward, their
    LayerNorms, residual dropout) and wraps each sub-layer as in Section 5.4
    of the paper: post-LN `LayerNorm(x + Dropout(Sublayer(x)))`, or pre-LN
    `x + Dropout(Sublayer(LayerNorm(x)))` with `norm_first=True`.
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

        self.self_attention = self._attention("self_attention")
        self.self_attention_norm = self._layer_norm("self_attention_norm")
        self.feed_forward = FeedForward(d_model, d_ff, dtype=self.dtype_policy, name="feed_forward")
        self.feed_forward_norm = self._layer_norm("feed_forward_norm")
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def _attention(self, name):
        return MultiHeadAttention(
            self.d_model,
            self.num_heads,
            dropout=self.attention_dropout,
            use_fused_attention=self.use_fused_attention,
            dtype=self.dtype_policy,
            name=name,
        )

    def _layer_norm(self, name):
        return layer_norm(self.layer_norm_epsilon, self.dtype_policy, name)

    def _sublayer_input(self, x, norm):
        """What a sub-layer reads: `x` (post-LN, the paper) or `norm(x)` (pre-LN)."""
        return norm(x) if self.norm_first else x

    def _add_residual(self, x, sublayer_output, norm, training):
        """Post-LN `norm(x + dropout(y))` (the paper) or pre-LN `x + dropout(y)`.

        With `y = sublayer(self._sublayer_input(x, norm))`, one sub-layer reads
        as in Section 5.4: `LayerNorm(x + Dropout(Sublayer(x)))`.
        """
        x = x + self.dropout_layer(sublayer_output, training=training)
        return x if self.norm_first else norm(x)

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


def layer_norm(epsilon, dtype, name):
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)
