"""Position-wise feed-forward network (Section 3.3)."""

import keras

from keras_transformer.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2`, applied at every position.

    https://arxiv.org/abs/1706.03762, Section 3.3.

    Args:
        d_model: int. Input and output size (D).
        d_ff: int. Inner size (2048 in the base model).
        activation: activation of the inner layer, "relu" in the paper.
        dropout: float in [0, 1). Dropout on the inner activations (0 in
            the paper; tensor2tensor calls it relu_dropout).
        kernel_initializer: initializer of both kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, L, D)` tensor.
        training: bool.

    Example:

    >>> tuple(FeedForward(d_model=8, d_ff=32)(keras.ops.ones((2, 3, 8))).shape)
    (2, 3, 8)
    """

    def __init__(
        self,
        d_model,
        d_ff,
        activation="relu",
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if d_model <= 0 or d_ff <= 0:
            raise ValueError(
                f"d_model and d_ff must be positive. Received: d_model={d_model}, d_ff={d_ff}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")
        self.d_model = d_model
        self.d_ff = d_ff
        self.activation = keras.activations.get(activation)
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True
        self.inner_dense = keras.layers.Dense(
            d_ff,
            activation=self.activation,
            kernel_initializer=kernel_initializer,
            dtype=self.dtype_policy,
            name="inner",
        )
        self.output_dense = keras.layers.Dense(
            d_model, kernel_initializer=kernel_initializer, dtype=self.dtype_policy, name="output"
        )
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, inputs_shape):
        self.inner_dense.build(inputs_shape)
        self.output_dense.build(tuple(inputs_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, inputs, training=None):
        x = self.inner_dense(inputs)  # (B, L, d_ff)
        x = self.dropout_layer(x, training=training)
        return self.output_dense(x)  # (B, L, D)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.d_model,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_model": self.d_model,
                "d_ff": self.d_ff,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
