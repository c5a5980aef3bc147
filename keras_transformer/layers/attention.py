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
from keras_transformer.layers.head_dense import HeadDense
from keras_transformer.layers.incremental import (  # noqa: F401  (importable from here too)
    _NEG_INF,
    IncrementalAttention,
    padding_bias,
    step_layout,
)
from keras_transformer.layers.keras_attention import FromKerasAttention
from keras_transformer.layers.masks import keras_mask, merge_masks

# Keras's `attention_axes` for a `(B, T, D)` query: the sequence axis, the only one here.
_SEQUENCE_AXES = (None, 1, -2, (1,), (-2,), [1], [-2])


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(FromKerasAttention, IncrementalAttention, keras.layers.Layer):
    """Multi-head attention of "Attention Is All You Need", Section 3.2.

    `MultiHead(Q, K, V) = Concat(head_1, ..., head_N) W^O` with
    `head_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(H)) V W_i^V`
    (https://arxiv.org/abs/1706.03762, Section 3.2.2).

    A drop-in for `keras.layers.MultiHeadAttention` on `(B, T, D)` inputs:
    it takes Keras's constructor and call arguments by keyword, honours the
    Keras masks its inputs carry as Keras's layer does, and its projection
    kernels have Keras's shapes, so `from_keras(layer)` copies a Keras
    layer's weights one to one. The projections run as 2-D matmuls, which
    TensorFlow differentiates faster than Keras's einsums (`HeadDense`).

    Two ways to size it: the short form `MultiHeadAttention(d_model=512,
    num_heads=8)` (heads of `d_model / num_heads`, output of `d_model`), or
    Keras's `MultiHeadAttention(num_heads=8, key_dim=64)` (output of the
    query's size, or `output_shape`). Positionally the order is today's
    `(d_model, num_heads)`; every other argument is keyword-only, so Keras's
    positional `(num_heads, key_dim)` is refused unless it happens to be a
    valid `(d_model, num_heads)`: name Keras's arguments.

    Masks (True = may attend), all combined with a logical AND, as
    `keras.layers.MultiHeadAttention._compute_attention_mask` does:

    - the query's mask `(B, T)`: padded queries attend to nothing (their
      rows are uniform, as in Keras); the value's and the key's `(B, S)`:
      padded keys are never attended. Each is the explicit `query_mask` /
      `value_mask` / `key_mask` argument when given, else the Keras mask
      the tensor carries (from `Embedding(mask_zero=True)`, say). (Keras
      3.15's layer ignores an explicit `query_mask` and reads only the
      query's own mask; here the explicit one replaces it.)
    - `padding_mask` `(B, S)`, this package's name for a key mask: ANDed
      with the value's and key's masks, never replacing them.
    - `attention_mask` `(B, T, S)` and `use_causal_mask`.

    Incremental decoding (`IncrementalAttention`, layers/incremental.py):
    `call_with_cache` (self-attention) appends one query step to a fixed-size
    key/value cache without `ops.slice_update` (which exports as an XLA-only
    op); `call_with_step_cache` appends to a cache of exactly the earlier
    steps; `call_with_key_value` (cross-attention) attends over keys and
    values computed once with `compute_key_value`. `attend` runs attention under
    one mask given as is (no Keras mask read): the encoder and decoder
    layers use it with the masks they combined.

    Args:
        d_model: int or None. Size of the input and output features (D) in
            the short form; the heads are `d_model / num_heads` wide.
        num_heads: int. Number of attention heads (N).
        key_dim: int or None. Size of each query and key head (H);
            defaults to `d_model / num_heads`.
        value_dim: int or None. Size of each value head; defaults to `key_dim`.
        dropout: float in [0, 1). Dropout on the attention probabilities.
        use_bias: bool. Whether the four projections have biases.
        output_shape: int, tuple or None. Feature shape of the output;
            defaults to `d_model`, or without it to the query's last dim.
        attention_axes: None or the sequence axis (1). Keras's argument;
            only attention over the sequence of `(B, T, D)` inputs is built.
        use_fused_attention: bool. Use `keras.ops.dot_product_attention`
            instead of the explicit einsum/softmax. Only taken when no
            attention dropout is active, since the fused op has none, and
            when `value_dim == key_dim` (JAX's op needs it).
        flash_attention: None or bool, passed to
            `keras.ops.dot_product_attention` on the fused path (None: the
            backend decides).
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, kernel_constraint, bias_constraint: of the four
            projections.
        seed: int or None. Seed of the attention dropout.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, T, D)` float tensor.
        value: `(B, S, D_v)` float tensor; defaults to `query` (self-attention).
        key: `(B, S, D_k)` float tensor; defaults to `value`.
        query_mask: `(B, T)` bool; defaults to the Keras mask of `query`.
        value_mask: `(B, S)` bool; defaults to the Keras mask of `value`.
        key_mask: `(B, S)` bool; defaults to the Keras mask of `key`.
        attention_mask: `(B, T, S)` bool, True where attention is allowed.
        return_attention_scores: bool. Also return the attention
            probabilities, as `keras.layers.MultiHeadAttention` does. Runs
            the explicit softmax even with `use_fused_attention`.
        training: bool. Enables attention dropout.
        use_causal_mask: bool. Forbid query t from attending to keys > t.
        padding_mask: `(B, S)` bool, True for real key tokens.

    Returns:
        `(B, T, D_out)` tensor; with `return_attention_scores=True`,
        `(output (B, T, D_out), scores (B, N, T, S))`, each score row summing
        to 1 (0 on masked keys). The output carries the query's Keras mask.

    Examples:

    >>> layer = MultiHeadAttention(d_model=16, num_heads=4)
    >>> x = keras.random.normal((2, 5, 16))
    >>> tuple(layer(x, use_causal_mask=True).shape)
    (2, 5, 16)

    Keras's arguments, and a Keras mask read from the input:

    >>> ids = keras.ops.array([[5, 6, 7, 0, 0]])
    >>> x = keras.layers.Embedding(50, 16, mask_zero=True)(ids)
    >>> layer = MultiHeadAttention(num_heads=4, key_dim=8, output_shape=12)
    >>> tuple(layer(x, x).shape)
    (1, 5, 12)
    """

    def __init__(
        self,
        d_model=None,
        num_heads=None,
        *,
        key_dim=None,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        use_fused_attention=False,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        key_dim = _check_arguments(d_model, num_heads, key_dim, dropout, attention_axes)
        if isinstance(output_shape, int):
            output_shape = (output_shape,)
        self.d_model = d_model
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.head_dim = key_dim  # H, the name the cache shapes use
        self.value_dim = key_dim if value_dim is None else value_dim
        self.dropout = dropout
        self.use_bias = use_bias
        # Not `self.output_shape`: Keras reads that name on layers of a functional model.
        self._output_shape = None if output_shape is None else tuple(output_shape)
        self.attention_axes = attention_axes
        self.use_fused_attention = use_fused_attention
        self.flash_attention = flash_attention
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.seed = seed
        self.supports_masking = True
        self._create_sublayers()

    def _create_sublayers(self):
        """Creates the projections (the output one in `build` where it takes the
        query's size) and the attention dropout: saved weights depend on their
        names and on this order (query, key, value, output)."""
        num_heads, key_dim = self.num_heads, self.key_dim
        # (B, T, D) -> (B, T, N, H)
        self.query_dense = self._projection("query", "btd,dnh->btnh", (None, num_heads, key_dim))
        self.key_dense = self._projection("key", "bsd,dnh->bsnh", (None, num_heads, key_dim))
        self.value_dense = self._projection(
            "value", "bsd,dnh->bsnh", (None, num_heads, self.value_dim)
        )
        # (B, T, N, H_v) -> (B, T, D_out); without d_model or output_shape, D_out is the
        # query's size, known in `build` (as in Keras).
        self.output_dense = None
        d_model = self.d_model
        output_dims = self._output_shape or ((d_model,) if d_model is not None else None)
        if output_dims is not None:
            self.output_dense = self._output_projection(output_dims)
        self.dropout_layer = Dropout(self.dropout, seed=self.seed, dtype=self.dtype_policy)

    def _projection(self, name, equation, output_shape):
        """A `HeadDense` with this layer's initializers, regularizers and constraints."""
        dense = HeadDense(
            merge_heads=equation.startswith("btnh"),
            equation=equation,
            output_shape=output_shape,
            bias_axes=(equation.split("->")[1][2:] if self.use_bias else None),
            kernel_initializer=_clone(self.kernel_initializer),
            bias_initializer=_clone(self.bias_initializer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
            name=name,
        )
        dense.supports_masking = True  # position-wise: a Keras mask passes through
        return dense

    def _output_projection(self, output_dims):
        letters = "defg"[: len(output_dims)]  # "d" for (D,), Keras's bias axes
        return self._projection(
            "attention_output", f"btnh,nh{letters}->bt{letters}", (None, *output_dims)
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        if len(query_shape) != 3:
            raise ValueError(
                f"MultiHeadAttention takes (B, T, D) inputs. Received: query_shape={query_shape}"
            )
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        if self.output_dense is None:
            if query_shape[-1] is None:
                raise ValueError(
                    "Without d_model or output_shape the output takes the query's size, which "
                    f"must be known. Received: query_shape={query_shape}"
                )
            self.output_dense = self._output_projection((query_shape[-1],))
        self.output_dense.build((query_shape[0], query_shape[1], self.num_heads, self.value_dim))
        self.built = True

    def compute_key_value(self, value, key=None):
        """Projects keys and values once, e.g. the encoder output for cross-attention.

        Returns:
            `(key (B, S, N, H), value (B, S, N, H_v))`.
        """
        key = value if key is None else key
        return self.key_dense(key), self.value_dense(value)

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        padding_mask=None,
    ):
        value = query if value is None else value
        mask = self.compute_attention_mask(
            query,
            value,
            key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            padding_mask=padding_mask,
        )  # (B, T, S) or broadcastable, or None
        return self.attend(
            query, value, key, mask, training=training,
            return_attention_scores=return_attention_scores,
        )  # fmt: skip

    def compute_attention_mask(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        padding_mask=None,
    ):
        """The one mask `call` attends under: `(B, T, S)` bool (or broadcastable
        `(B, 1, S)`, `(B, T, 1)`, `(1, T, S)`), or None when nothing is masked.

        As `keras.layers.MultiHeadAttention._compute_attention_mask`: the
        query's mask `(B, T, 1)`, the value's and key's `(B, 1, S)`, the
        causal mask and `attention_mask`, ANDed; `padding_mask` is ANDed
        with the value's and key's masks. A tensor's explicit `*_mask`
        argument replaces the Keras mask it carries.
        """
        value = query if value is None else value
        query_mask = keras_mask(query) if query_mask is None else query_mask
        value_mask = keras_mask(value) if value_mask is None else value_mask
        key_mask = keras_mask(key) if key_mask is None else key_mask
        key_side = None  # (B, S): padding_mask AND the value's AND the key's mask
        for mask in (padding_mask, value_mask, key_mask):
            if mask is not None:
                mask = ops.cast(mask, "bool")
                key_side = mask if key_side is None else ops.logical_and(key_side, mask)
        return merge_masks(
            query,
            value,
            padding_mask=key_side,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            query_mask=query_mask,
        )

    def attend(
        self, query, value, key=None, mask=None, training=None, return_attention_scores=False
    ):
        """Attention under `mask` as given: no Keras mask is read, nothing is added.

        What `call` runs once it has combined the masks, and what
        `EncoderLayer` and `DecoderLayer` call with the masks they combined
        (`merge_masks`), so a mask a block passes is applied once.

        Args:
            query: `(B, T, D)`; value: `(B, S, D_v)`; key: `(B, S, D_k)`,
                defaults to `value`.
            mask: `(B, T, S)` bool or broadcastable (`(B, 1, S)`), or None.
            training: bool. Enables attention dropout.
            return_attention_scores: bool, as in `call`.
        """
        key, value = self.compute_key_value(value, key)  # (B, S, N, H) each
        query = self.query_dense(query)  # (B, T, N, H)
        if return_attention_scores:
            return self._attend_with_scores(query, key, value, mask, training)
        return self._attend(query, key, value, mask, training)

    def _attend(self, query, key, value, mask, training):
        """Scaled dot-product attention (Section 3.2.1) and the output projection.

        query: (B, T, N, H); key: (B, S, N, H); value: (B, S, N, H_v);
        mask: (B, T, S) bool or broadcastable.
        """
        dropout_active = training and self.dropout > 0
        # jax.nn.dot_product_attention needs value heads as wide as key heads.
        if self.use_fused_attention and not dropout_active and self.value_dim == self.key_dim:
            fused_mask = None if mask is None else mask[:, None, :, :]  # (B, 1, T, S)
            context = ops.dot_product_attention(
                query,
                key,
                value,
                mask=fused_mask,
                scale=1.0 / math.sqrt(self.key_dim),
                flash_attention=self.flash_attention,
            )  # (B, T, N, H_v)
            return self.output_dense(context)  # (B, T, D_out)
        return self._attend_with_scores(query, key, value, mask, training)[0]

    def _attend_with_scores(self, query, key, value, mask, training):
        """`_attend` without the fused op: `(output (B, T, D_out), scores (B, N, T, S))`.

        The scores are the attention probabilities before dropout; each row
        sums to 1 and masked keys get 0 (a row with every key masked is
        uniform, as in Keras).
        """
        # Scores, masking and softmax in float32, also under mixed precision.
        logits = ops.einsum("btnh,bsnh->bnts", query, key)  # (B, N, T, S)
        logits = ops.cast(logits, "float32") * (1.0 / math.sqrt(self.key_dim))
        if mask is not None:
            logits = ops.where(mask[:, None, :, :], logits, _NEG_INF)
        if logits.shape[-1] == 1:  # one key (a first decoding step): softmax is 1, Keras warns
            scores = ops.cast(ops.ones_like(logits), query.dtype)  # (B, N, T, 1)
        else:
            scores = ops.cast(ops.softmax(logits, axis=-1), query.dtype)  # (B, N, T, S)
        weights = self.dropout_layer(scores, training=training)
        context = ops.einsum("bnts,bsnh->btnh", weights, value)  # (B, T, N, H_v)
        return self.output_dense(context), scores  # (B, T, D_out), (B, N, T, S)

    def _output_dims(self, query_shape):
        if self._output_shape is not None:
            return self._output_shape
        return (self.d_model,) if self.d_model is not None else (query_shape[-1],)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + tuple(self._output_dims(query_shape))

    def compute_output_spec(self, query, value=None, key=None, **kwargs):
        output = keras.KerasTensor(self.compute_output_shape(query.shape), self.compute_dtype)
        if not kwargs.get("return_attention_scores"):
            return output
        key_length = (query if value is None else value).shape[1]
        scores_shape = (query.shape[0], self.num_heads, query.shape[1], key_length)
        return output, keras.KerasTensor(scores_shape, self.compute_dtype)

    def compute_mask(self, query, previous_mask=None):
        return previous_mask  # the query's Keras mask, as Keras's layer sets on its output

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_shape": self._output_shape,
                "attention_axes": self.attention_axes,
                "use_fused_attention": self.use_fused_attention,
                "flash_attention": self.flash_attention,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
                "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
                "bias_constraint": keras.constraints.serialize(self.bias_constraint),
                "seed": self.seed,
            }
        )
        return config


def _check_arguments(d_model, num_heads, key_dim, dropout, attention_axes):
    """Checks `MultiHeadAttention`'s sizes, dropout and attention axes; returns
    the size of a query head, `key_dim` or else `d_model / num_heads`."""
    if num_heads is None or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int. Received: num_heads={num_heads}")
    if key_dim is None:
        if d_model is None:
            raise ValueError(
                "MultiHeadAttention needs d_model (heads of d_model / num_heads) or key_dim. "
                "Received: d_model=None, key_dim=None"
            )
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} must be divisible by num_heads={num_heads} "
                "(Keras's positional order is (num_heads, key_dim): name them)"
            )
        key_dim = d_model // num_heads
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")
    if attention_axes not in _SEQUENCE_AXES:
        raise ValueError(
            "Only attention over the sequence axis of (B, T, D) inputs is built "
            f"(attention_axes=None or 1). Received: attention_axes={attention_axes}"
        )
    return key_dim


def _clone(initializer):
    """A fresh copy of `initializer`: a shared stateless one would give every
    projection the same initial weights."""
    return keras.initializers.get(keras.initializers.serialize(initializer))
