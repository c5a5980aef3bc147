"""Sinusoidal positional encoding ("Attention Is All You Need", Section 3.5)."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(keras.layers.Layer):
    """Adds the paper's fixed sinusoids to a sequence of embeddings.

    `PE(pos, 2i) = sin(pos / 10000^(2i / D))`,
    `PE(pos, 2i + 1) = cos(pos / 10000^(2i / D))`
    (https://arxiv.org/abs/1706.03762, Section 3.5).

    Positions are a cumulative sum of ones over the time axis plus
    `start_index`, not `ops.arange(ops.shape(x)[1])`, so the layer traces
    with dynamic lengths on every backend and exports from torch.

    Args:
        max_wavelength: float. The base of the geometric progression of
            wavelengths, 10000 in the paper.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, D)` embeddings; D must be even.
        start_index: int or `(B,)` int tensor. Position of the first step,
            e.g. the current step of cached decoding. Defaults to 0.
        positions: optional `(B, T)` int tensor, every step's position
            (e.g. counting from 0 again for each sequence packed in a
            row); replaces `start_index`.

    Returns:
        `inputs + PE`, `(B, T, D)`.

    Example:

    >>> x = keras.ops.zeros((1, 3, 4))
    >>> keras.ops.convert_to_numpy(PositionalEncoding()(x))[0, 1].round(4)
    array([0.8415, 0.5403, 0.01  , 1.    ], dtype=float32)
    """

    def __init__(self, max_wavelength=10000.0, **kwargs):
        super().__init__(**kwargs)
        if max_wavelength <= 1:
            raise ValueError(
                f"max_wavelength must be > 1. Received: max_wavelength={max_wavelength}"
            )
        self.max_wavelength = max_wavelength
        self.supports_masking = True

    def build(self, inputs_shape):
        d_model = inputs_shape[-1]
        if d_model is None or d_model % 2:
            raise ValueError(
                f"PositionalEncoding needs an even feature size. Received: d_model={d_model}"
            )
        self.built = True

    def encoding(self, positions, d_model):
        """`(B, T)` positions -> `(B, T, D)` sinusoids, in float32."""
        dims = ops.arange(d_model, dtype="float32")  # (D,)
        pair = ops.floor(dims / 2.0) * 2.0  # 2i for dims 2i and 2i + 1
        inverse_frequency = ops.exp(-math.log(self.max_wavelength) * pair / d_model)  # (D,)
        angles = ops.cast(positions, "float32")[:, :, None] * inverse_frequency  # (B, T, D)
        is_even = ops.equal(ops.mod(ops.arange(d_model, dtype="int32"), 2), 0)  # (D,)
        return ops.where(is_even, ops.sin(angles), ops.cos(angles))

    def call(self, inputs, start_index=0, positions=None):
        if positions is None:
            ones = ops.ones_like(inputs[:, :, 0], dtype="int32")  # (B, T)
            positions = ops.cumsum(ones, axis=1) - 1  # (B, T): 0, 1, ..., T - 1
            start_index = ops.cast(start_index, "int32")
            if len(ops.shape(start_index)) == 1:
                start_index = start_index[:, None]  # (B, 1)
            positions = positions + start_index
        encoding = self.encoding(positions, inputs.shape[-1])
        return inputs + ops.cast(encoding, inputs.dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength})
        return config
