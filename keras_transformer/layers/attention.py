"""Multi-head scaled dot-product attention, written with `keras.ops`.

Shapes used throughout this module:

    B: batch size, T: query length, S: key/value length,
    N: number of heads, H: size of one head (d_model / N), D: d_model.

Masks are boolean and True means "may attend":

    padding_mask:   (B, S)     True = real key token
    attention_mask: (B, T, S)  True = query t may attend to key s
"""

import math

import keras
from keras import ops

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.masks import merge_masks

_NEG_INF = -1e9


class HeadDense(keras.layers.EinsumDense):
    """`EinsumDense` that splits `(B, T, D) -> (B, T, N, H)` or merges heads back.

    Same weights (kernel `(D, N, H)` or `(N, H, D)`) and math as
    `EinsumDense("btd,dnh->btnh")` / `("btnh,nhd->btd")`, computed as one
    matmul over flattened head axes. Under TensorFlow with static shapes,
    Keras runs those einsums as a `BatchMatMulV2` that broadcasts the kernel
    over the batch, whose kernel gradient builds a `(B, D, N * H)` tensor and
    sums it; `ops.matmul` of a 3-D input and a 2-D kernel is one `MatMul`
    forward and backward: 1.75x to 2.07x faster forward + backward
    (`benchmarks/README.md`, "Components").
    """

    def __init__(self, merge_heads, **kwargs):
        super().__init__(**kwargs)
        self.merge_heads = merge_heads

    def call(self, inputs, training=None):
        kernel = self.kernel
        if self.merge_heads:  # (B, T, N, H) @ (N, H, D)
            num_heads, head_dim, units = kernel.shape
            inputs = ops.reshape(inputs, (*ops.shape(inputs)[:-2], num_heads * head_dim))
            outputs = ops.matmul(inputs, ops.reshape(kernel, (num_heads * head_dim, units)))
        else:  # (B, T, D) @ (D, N, H)
            units, num_heads, head_dim = kernel.shape
            outputs = ops.matmul(inputs, ops.reshape(kernel, (units, num_heads * head_dim)))
            # The shape comes from `inputs`: read from `outputs` (a tf.tensordot), tf2onnx
            # folds the two reshapes into one with the wrong target shape.
            outputs = ops.reshape(outputs, (*ops.shape(inputs)[:-1], num_heads, head_dim))
        if self.bias is not None:
            outputs = ops.add(outputs, self.bias)
        return outputs

    def get_config(self):
        return {**super().get_config(), "merge_heads": self.merge_heads}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention of "Attention Is All You Need", Section 3.2.

    `MultiHead(Q, K, V) = Concat(head_1, ..., head_N) W^O` with
    `head_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(H)) V W_i^V`
    (https://arxiv.org/abs/1706.03762, Section 3.2.2).

    The projections produce `(B, T, N, H)` directly with kernels shaped as
    those of `keras.layers.MultiHeadAttention` (`EinsumDense`), so weights
    copy between the two one to one; they run as 2-D matmuls, which
    TensorFlow differentiates faster. Padding and causal masks are combined in one place,
    `merge_masks`. Incremental decoding has two methods: `call_with_cache`
    (self-attention) appends one query step to a fixed-size key/value cache
    without `ops.slice_update` (which exports as an XLA-only op);
    `call_with_key_value` (cross-attention) attends over keys and values
    computed once with `compute_key_value`.

    Args:
        d_model: int. Size of the input and output features (D).
        num_heads: int. Number of attention heads (N); must divide `d_model`.
        dropout: float in [0, 1). Dropout on the attention probabilities.
        use_fused_attention: bool. Use `keras.ops.dot_product_attention`
            instead of the explicit einsum/softmax. Only taken when no
            attention dropout is active, since the fused op has none.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, T, D)` float tensor.
        value: `(B, S, D)` float tensor; defaults to `query` (self-attention).
        key: `(B, S, D)` float tensor; defaults to `value`.
        padding_mask: `(B, S)` bool, True for real key tokens.
        attention_mask: `(B, T, S)` bool, True where attention is allowed.
        use_causal_mask: bool. Forbid query t from attending to keys > t.
        training: bool. Enables attention dropout.
        return_attention_scores: bool. Also return the attention
            probabilities, as `keras.layers.MultiHeadAttention` does. Runs
            the explicit softmax even with `use_fused_attention`.

    Returns:
        `(B, T, D)` tensor; with `return_attention_scores=True`,
        `(output (B, T, D), scores (B, N, T, S))`, each score row summing
        to 1 with 0 on masked keys.

    Example:

    >>> layer = MultiHeadAttention(d_model=16, num_heads=4)
    >>> x = keras.random.normal((2, 5, 16))
    >>> tuple(layer(x, use_causal_mask=True).shape)
    (2, 5, 16)
    """

    def __init__(
        self,
        d_model,
        num_heads,
        dropout=0.0,
        use_fused_attention=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if num_heads <= 0 or d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.use_fused_attention = use_fused_attention
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

        def projection(name, equation, output_shape, bias_axes):
            dense = HeadDense(
                merge_heads=equation.startswith("btnh"),
                equation=equation,
                output_shape=output_shape,
                bias_axes=bias_axes,
                kernel_initializer=keras.initializers.get(
                    keras.initializers.serialize(self.kernel_initializer)
                ),
                bias_initializer=keras.initializers.get(
                    keras.initializers.serialize(self.bias_initializer)
                ),
                dtype=self.dtype_policy,
                name=name,
            )
            dense.supports_masking = True  # position-wise: a Keras mask passes through
            return dense

        heads = (None, num_heads, self.head_dim)
        # (B, T, D) -> (B, T, N, H)
        self.query_dense = projection("query", "btd,dnh->btnh", heads, "nh")
        self.key_dense = projection("key", "bsd,dnh->bsnh", heads, "nh")
        self.value_dense = projection("value", "bsd,dnh->bsnh", heads, "nh")
        # (B, T, N, H) -> (B, T, D)
        self.output_dense = projection("attention_output", "btnh,nhd->btd", (None, d_model), "d")
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build((query_shape[0], query_shape[1], self.num_heads, self.head_dim))
        self.built = True

    def compute_key_value(self, value, key=None):
        """Projects keys and values once, e.g. the encoder output for cross-attention.

        Returns:
            `(key, value)`, each `(B, S, N, H)`.
        """
        key = value if key is None else key
        return self.key_dense(key), self.value_dense(value)

    def call(
        self,
        query,
        value=None,
        key=None,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        training=None,
        return_attention_scores=False,
    ):
        value = query if value is None else value
        key, value = self.compute_key_value(value, key)  # (B, S, N, H) each
        query = self.query_dense(query)  # (B, T, N, H)
        mask = merge_masks(
            query,
            key,
            padding_mask=padding_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
        )  # (B, T, S) or None
        if return_attention_scores:
            return self._attend_with_scores(query, key, value, mask, training)
        return self._attend(query, key, value, mask, training)

    def call_with_cache(self, query, cache_key, cache_value, cache_index, padding_mask=None):
        """Self-attention for one decoding step, against a growing key/value cache.

        The query is the newest step, `(B, 1, D)`. Its key and value are
        written at position `cache_index` of the fixed-size cache
        `(B, T_max, N, H)`, and it attends to positions `<= cache_index`
        (the causal mask of `call`, one row at a time). The write is a
        one-hot blend, which keeps shapes static and exports to plain
        TensorFlow/ONNX ops. Inference only: no attention dropout.

        Args:
            query: `(B, 1, D)`.
            cache_key, cache_value: `(B, T_max, N, H)`; positions
                `< cache_index` hold the earlier steps.
            cache_index: `(B,)` int, the position of `query`.
            padding_mask: optional `(B, T_max)` bool, True for real steps.

        Returns:
            `(output (B, 1, D), (cache_key, cache_value))`, the cache with
            this step written in.
        """
        query_heads = self.query_dense(query)  # (B, 1, N, H)
        cache_length = ops.shape(cache_key)[1]
        cache_index = ops.cast(cache_index, "int32")
        key, value = self.compute_key_value(query)  # (B, 1, N, H) each
        write = ops.one_hot(cache_index, cache_length, dtype=cache_key.dtype)  # (B, T_max)
        write = write[:, :, None, None]  # (B, T_max, 1, 1)
        cache_key = cache_key * (1 - write) + key * write  # (B, T_max, N, H)
        cache_value = cache_value * (1 - write) + value * write
        positions = ops.arange(cache_length, dtype="int32")  # (T_max,)
        mask = positions[None, None, :] <= cache_index[:, None, None]  # (B, 1, T_max)
        if padding_mask is not None:
            mask = ops.logical_and(mask, ops.cast(padding_mask, "bool")[:, None, :])
        output = self._attend(query_heads, cache_key, cache_value, mask, training=False)
        return output, (cache_key, cache_value)

    def call_with_key_value(self, query, key, value, padding_mask=None, training=None):
        """Attention over keys and values projected beforehand by `compute_key_value`.

        For cross-attention while decoding: the encoder output is projected
        once, and every step's query attends to it. Equals
        `call(query, encoder_outputs, padding_mask=padding_mask)`.

        Args:
            query: `(B, T, D)`.
            key, value: `(B, S, N, H)`, from `compute_key_value`.
            padding_mask: optional `(B, S)` bool, True for real keys.
            training: bool. Enables attention dropout.

        Returns:
            `(B, T, D)` tensor.
        """
        query = self.query_dense(query)  # (B, T, N, H)
        mask = merge_masks(query, key, padding_mask=padding_mask)  # (B, 1, S) or None
        return self._attend(query, key, value, mask, training)

    def _attend(self, query, key, value, mask, training):
        """Scaled dot-product attention (Section 3.2.1) and the output projection.

        query: (B, T, N, H); key, value: (B, S, N, H); mask: (B, T, S) bool.
        """
        dropout_active = training and self.dropout > 0
        if self.use_fused_attention and not dropout_active:
            fused_mask = None if mask is None else mask[:, None, :, :]  # (B, 1, T, S)
            context = ops.dot_product_attention(
                query, key, value, mask=fused_mask, scale=1.0 / math.sqrt(self.head_dim)
            )  # (B, T, N, H)
            return self.output_dense(context)  # (B, T, D)
        return self._attend_with_scores(query, key, value, mask, training)[0]

    def _attend_with_scores(self, query, key, value, mask, training):
        """`_attend` without the fused op: `(output (B, T, D), scores (B, N, T, S))`.

        The scores are the attention probabilities before dropout; each row
        sums to 1 and masked keys get 0.
        """
        # Scores, masking and softmax in float32, also under mixed precision.
        logits = ops.einsum("btnh,bsnh->bnts", query, key)  # (B, N, T, S)
        logits = ops.cast(logits, "float32") * (1.0 / math.sqrt(self.head_dim))
        if mask is not None:
            logits = ops.where(mask[:, None, :, :], logits, _NEG_INF)
        if logits.shape[-1] == 1:  # one key (a first decoding step): softmax is 1, Keras warns
            scores = ops.cast(ops.ones_like(logits), query.dtype)  # (B, N, T, 1)
        else:
            scores = ops.cast(ops.softmax(logits, axis=-1), query.dtype)  # (B, N, T, S)
        weights = self.dropout_layer(scores, training=training)
        context = ops.einsum("bnts,bsnh->btnh", weights, value)  # (B, T, N, H)
        return self.output_dense(context), scores  # (B, T, D), (B, N, T, S)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.d_model,)

    def compute_mask(self, query, value=None, key=None, **kwargs):
        return getattr(query, "_keras_mask", None)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "dropout": self.dropout,
                "use_fused_attention": self.use_fused_attention,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
