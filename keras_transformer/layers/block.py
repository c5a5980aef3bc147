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
            d_model=self.d_model,
            num_heads=self.num_heads,
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

    # keras-hub's block of the same math, which `from_keras` copies.
    KERAS_HUB_CLASS = None

    @classmethod
    def from_keras(cls, layer, **kwargs):
        """This block with the arguments and weights of a built keras-hub block.

        `EncoderLayer.from_keras(keras_hub.layers.TransformerEncoder)`,
        `DecoderLayer.from_keras(keras_hub.layers.TransformerDecoder)` (with
        cross-attention if `layer` was built with an encoder sequence).
        `kwargs` override arguments (`use_fused_attention=True`, ...).

        The same math, post-LN or pre-LN (`normalize_first` becomes
        `norm_first`), with these differences:

        - keras-hub applies one `dropout` to the attention probabilities
          and the residuals: it becomes `dropout` and `attention_dropout`
          (the random streams differ, so training steps do).
        - keras-hub's attention also masks the rows of padded queries (the
          query's Keras mask, through `keras.layers.MultiHeadAttention`):
          outputs at padded positions differ, real positions are equal.
        - keras-hub's decoder can be called with `use_causal_mask=False`;
          `DecoderLayer` is always causal.
        - An `activation` other than "relu" is refused: `FeedForward` in
          these blocks is the paper's ReLU network.
        """
        cls._check_keras_hub_layer(layer)
        block = cls(**(_keras_hub_arguments(layer) | kwargs))
        block._build_like(layer)
        block._copy_keras_hub_weights(layer)
        return block

    @classmethod
    def _check_keras_hub_layer(cls, layer):
        """Refuses what `from_keras` cannot copy: another class, an unbuilt layer,
        an activation other than ReLU."""
        expected = cls.KERAS_HUB_CLASS
        names = {f"{k.__module__.split('.')[0]}.{k.__name__}" for k in type(layer).__mro__}
        if f"keras_hub.{expected}" not in names:
            raise TypeError(
                f"{cls.__name__}.from_keras copies a keras_hub.layers.{expected}. "
                f"Received: {type(layer).__name__}"
            )
        if not layer.built:
            raise ValueError(
                f"keras-hub layer '{layer.name}' has no weights yet: call it once, or build it"
            )
        if keras.activations.get(layer.activation) is not keras.activations.relu:
            raise ValueError(
                f"{cls.__name__} has a ReLU feed-forward network. Received: "
                f"activation={keras.activations.serialize(layer.activation)}"
            )

    def _copy_keras_hub_weights(self, layer):
        """Sets this built block's weights to those of the keras-hub `layer`."""
        self.self_attention.copy_weights_from(layer._self_attention_layer)
        pairs = [
            (self.self_attention_norm, layer._self_attention_layer_norm),
            (self.feed_forward.inner_dense, layer._feedforward_intermediate_dense),
            (self.feed_forward.output_dense, layer._feedforward_output_dense),
            (self.feed_forward_norm, layer._feedforward_layer_norm),
        ]
        if getattr(layer, "_cross_attention_layer", None) is not None:
            self.cross_attention.copy_weights_from(layer._cross_attention_layer)
            pairs.append((self.cross_attention_norm, layer._cross_attention_layer_norm))
        for mine, theirs in pairs:
            mine.set_weights(theirs.get_weights())

    def _build_like(self, layer):
        """Builds this block with the input shapes of the built keras-hub `layer`."""
        raise NotImplementedError

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


def _keras_hub_arguments(layer):
    """The block arguments of a keras-hub block: its one `dropout` for both of ours."""
    return dict(
        d_model=layer._self_attention_layer.query_dense.kernel.shape[0],
        num_heads=layer.num_heads,
        d_ff=layer.intermediate_dim,
        dropout=layer.dropout,
        attention_dropout=layer.dropout,
        norm_first=layer.normalize_first,
        layer_norm_epsilon=layer.layer_norm_epsilon,
        dtype=layer.dtype_policy,
        name=layer.name,
    )


def layer_norm(epsilon, dtype, name):
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)
