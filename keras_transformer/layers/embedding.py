"""Shared token embedding and pre-softmax projection (Section 3.4)."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """One weight matrix for source embedding, target embedding and output logits.

    "We share the same weight matrix between the two embedding layers and
    the pre-softmax linear transformation ... In the embedding layers, we
    multiply those weights by sqrt(d_model)"
    (https://arxiv.org/abs/1706.03762, Section 3.4).

    Ids are cast to int32 first: under `MirroredStrategy` Keras builds the
    model from an averaged first batch, which arrives as floats.

    Args:
        vocab_size: int. Size of the shared vocabulary (V).
        d_model: int. Embedding size (D).
        pad_id: int or None. Id whose positions are masked (Keras mask).
        embeddings_initializer: initializer of the `(V, D)` matrix; the
            default normal(0, D^-0.5) makes scaled embeddings unit-variance.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        token_ids: `(B, L)` integer ids.

    Returns:
        `(B, L, D)` embeddings times sqrt(D); `logits(x)` maps `(B, L, D)`
        back to `(B, L, V)` with the same matrix.

    Example:

    >>> embedding = TokenEmbedding(vocab_size=100, d_model=8)
    >>> x = embedding(keras.ops.array([[5, 7, 0]]))
    >>> tuple(x.shape), tuple(embedding.logits(x).shape)
    ((1, 3, 8), (1, 3, 100))
    """

    def __init__(self, vocab_size, d_model, pad_id=0, embeddings_initializer=None, **kwargs):
        super().__init__(**kwargs)
        if vocab_size <= 0 or d_model <= 0:
            raise ValueError(
                "vocab_size and d_model must be positive. "
                f"Received: vocab_size={vocab_size}, d_model={d_model}"
            )
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.pad_id = pad_id
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=d_model**-0.5)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.supports_masking = pad_id is not None

    def build(self, token_ids_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def call(self, token_ids):
        token_ids = ops.cast(token_ids, "int32")
        x = ops.take(self.embeddings, token_ids, axis=0)  # (B, L, D)
        return x * ops.cast(math.sqrt(self.d_model), x.dtype)

    def logits(self, x):
        """`(B, L, D)` -> `(B, L, V)` with the transposed embedding matrix."""
        return ops.matmul(x, ops.transpose(ops.cast(self.embeddings, x.dtype)))

    def compute_mask(self, token_ids, mask=None):
        if self.pad_id is None:
            return None
        return ops.not_equal(ops.cast(token_ids, "int32"), self.pad_id)

    def compute_output_shape(self, token_ids_shape):
        return tuple(token_ids_shape) + (self.d_model,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "d_model": self.d_model,
                "pad_id": self.pad_id,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
