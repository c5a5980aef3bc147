"""Incremental decoding of `MultiHeadAttention`: one query step at a time against
keys and values computed before (a cache of the earlier steps, or the encoder's).

Shapes as in attention.py (B, T, S, N, H, D). Two cache layouts:

    call_with_cache:       key, value (B, T_max, N, H), a fixed-size cache
                           written with a one-hot blend (static shapes).
    call_with_step_cache:  key (B, N, H, t), value (B, N, t, H_v), the
                           "step layout": exactly the t steps decoded so far,
                           heads first and keys transposed, appended per step.

Inference only: no attention dropout on these paths.
"""

import math

from keras import ops

from keras_transformer.layers.masks import merge_masks

_NEG_INF = -1e9


def step_layout(key, value):
    """`(key (B, S, N, H), value (B, S, N, H_v))` -> the step layout of
    `MultiHeadAttention.call_with_step_cache`: `(key (B, N, H, S), value (B, N, S, H_v))`."""
    return ops.transpose(key, (0, 2, 3, 1)), ops.transpose(value, (0, 2, 1, 3))


def padding_bias(padding_mask):
    """`(B, S)` bool padding mask -> `(B, 1, 1, S)` float32 logit bias of
    `MultiHeadAttention.call_with_step_key_value`: 0 where True, `-1e9` where False."""
    mask = ops.cast(padding_mask, "bool")[:, None, None, :]
    return ops.cast(ops.where(mask, 0.0, _NEG_INF), "float32")


class IncrementalAttention:
    """The decoding methods of `MultiHeadAttention` (which inherits them): they read
    its projections (`query_dense`, `key_dense`, `value_dense`, `output_dense`),
    `num_heads`, `key_dim`, `value_dim` and its `_attend`."""

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

    # Incremental decoding in the step layout: heads first and keys already
    # transposed, `key (B, N, H, S)` and `value (B, N, S, H_v)`, so that a step
    # multiplies its query by the cache as stored (two batched matrix products
    # per attention, no copy of the cache: `call_with_cache`'s einsums
    # transpose it at every step) and appends to it along an axis of its own.

    def compute_step_key_value(self, value, key=None):
        """`compute_key_value` in the step layout of `call_with_step_cache`.

        Returns:
            `(key (B, N, H, S), value (B, N, S, H_v))`.
        """
        return step_layout(*self.compute_key_value(value, key))

    def call_with_step_cache(self, query, cache_key, cache_value):
        """Self-attention for one decoding step against a cache of the earlier steps.

        The cache holds exactly the `t` steps decoded so far (`t` may be 0),
        in the step layout; the new step's key and value are appended and the
        query attends to all `t + 1` (no mask: nothing later is in the cache).
        Equals `call_with_cache` at `cache_index = t`. Inference only.

        Args:
            query: `(B, 1, D)`, the newest step.
            cache_key: `(B, N, H, t)`; cache_value: `(B, N, t, H_v)`.

        Returns:
            `(output (B, 1, D_out), (cache_key (B, N, H, t + 1), cache_value (B, N, t + 1, H_v)))`.
        """
        key, value = self.compute_key_value(query)  # (B, 1, N, H), (B, 1, N, H_v)
        # One position: the step layout's transposes are reshapes, which copy nothing
        # and leave tf2onnx's transpose optimizer nothing to push through the append
        # (it turned the key's transpose into two of the whole cache per step).
        key = ops.reshape(key, (-1, self.num_heads, self.key_dim, 1))  # (B, N, H, 1)
        value = ops.reshape(value, (-1, self.num_heads, 1, self.value_dim))  # (B, N, 1, H_v)
        cache_key = ops.concatenate([cache_key, key], axis=3)
        cache_value = ops.concatenate([cache_value, value], axis=2)
        output = self.call_with_step_key_value(query, cache_key, cache_value)
        return output, (cache_key, cache_value)

    def call_with_step_key_value(self, query, key, value, bias=None):
        """`query (B, T, D)` attends to keys and values from `compute_step_key_value`.

        Args:
            query: `(B, T, D)`.
            key: `(B, N, H, S)`; value: `(B, N, S, H_v)`.
            bias: optional `(B, 1, 1, S)` float32 added to the attention
                logits: `padding_bias(padding_mask)`, 0 for a real key and
                a large negative number for padding (the softmax then gives
                padding exactly 0, as the mask of `call` does).

        Returns:
            `(B, T, D_out)`. Inference only: no attention dropout.
        """
        heads = ops.transpose(self.query_dense(query), (0, 2, 1, 3))  # (B, N, T, H)
        heads = heads * ops.cast(1.0 / math.sqrt(self.key_dim), heads.dtype)  # T*H, not T*S
        logits = ops.cast(ops.matmul(heads, key), "float32")  # (B, N, T, S)
        if bias is not None:
            logits = logits + bias
        if logits.shape[-1] == 1:  # one key (eager, the first step): softmax is 1, Keras warns
            scores = ops.cast(ops.ones_like(logits), value.dtype)
        else:
            scores = ops.cast(ops.softmax(logits, axis=-1), value.dtype)  # (B, N, T, S)
        context = ops.matmul(scores, value)  # (B, N, T, H_v)
        return self.output_dense(ops.transpose(context, (0, 2, 1, 3)))  # (B, T, D_out)

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
