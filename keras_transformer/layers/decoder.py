"""Decoder layer (Section 3.1), with or without cross-attention."""

import keras

from keras_transformer.layers.attention import step_layout
from keras_transformer.layers.block import TransformerBlock
from keras_transformer.layers.masks import keras_mask, merge_masks


def decoder_groups(cross_key, rows):
    """`(sentences, K)`: the rows of a decoding step (`rows`, any tensor with them on
    axis 0) are K consecutive hypotheses of each of `cross_key`'s sentences.

    Python ints where the shapes are static (JAX, eager); tensors otherwise,
    without a -1 in the shape they build (it is undefined for an empty batch).
    """
    sentences, count = keras.ops.shape(cross_key)[0], keras.ops.shape(rows)[0]
    if isinstance(sentences, int) and isinstance(count, int):
        return sentences, count // max(sentences, 1)
    return sentences, count // keras.ops.maximum(sentences, 1)


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(TransformerBlock):
    """One decoder block: causal self-attention, cross-attention, feed-forward.

    Each sub-layer is wrapped as `LayerNorm(x + Dropout(Sublayer(x)))`
    (post-LN, https://arxiv.org/abs/1706.03762, Section 3.1), or pre-LN with
    `norm_first=True`. Self-attention is causal: "preventing positions from
    attending to subsequent positions".

    Without `encoder_outputs` the layer is a decoder-only block (causal
    self-attention and feed-forward, as in a GPT-style language model, or
    keras-hub's `TransformerDecoder` called without `encoder_sequence`).
    Which kind a layer is, is fixed when it is built: the cross-attention
    sub-layers get weights only when the layer is built with the shape of
    `encoder_outputs` (called with them, or `build(inputs_shape,
    encoder_outputs_shape)`), and a built layer must then always be called
    the same way.

    Args:
        d_model: int. Model size (D).
        num_heads: int. Attention heads; must divide `d_model`.
        d_ff: int. Inner size of the feed-forward network.
        dropout: float in [0, 1). Residual dropout.
        attention_dropout: float in [0, 1). Dropout on attention weights.
        norm_first: bool. Pre-LN instead of the paper's post-LN.
        layer_norm_epsilon: float.
        use_fused_attention: bool. See `MultiHeadAttention`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, D)` target-side tensor.
        encoder_outputs: `(B, S, D)` encoder output, or None for a
            decoder-only layer.
        padding_mask: `(B, T)` bool, True for real target tokens; defaults
            to the Keras mask of `inputs` (given, it replaces that mask, as
            in keras-hub's `TransformerDecoder`).
        encoder_padding_mask: `(B, S)` bool, True for real source tokens;
            defaults to the Keras mask of `encoder_outputs` (given, it
            replaces that mask).
        attention_mask: `(B, T, T)` bool, ANDed with the causal and padding
            masks, e.g. to keep the sequences packed in one row apart.
        encoder_attention_mask: `(B, T, S)` bool for cross-attention, ANDed
            with the encoder padding mask.
        training: bool.
        return_attention_scores: bool. Also return the attention
            probabilities: `(outputs, scores)` with `scores["self_attention"]`
            `(B, N, T, T)` and, with encoder outputs,
            `scores["cross_attention"]` `(B, N, T, S)`.

    Returns:
        `(B, T, D)` tensor (or `(outputs, scores)`, see above), carrying the
        Keras mask of `inputs`. Masks hide padded and future keys; padded
        positions are not masked as queries (see `EncoderLayer`).

    Weights copy from keras-hub's `TransformerDecoder`: `from_keras`.

    Incremental decoding: `compute_cross_key_value(encoder_outputs)` projects
    the encoder output once; `call_with_cache` runs one step against the
    self-attention cache and those keys and values, and gives the same
    result as `call` at that position.

    Examples:

    >>> layer = DecoderLayer(d_model=16, num_heads=2, d_ff=32)
    >>> y = layer(keras.ops.ones((2, 3, 16)), keras.ops.ones((2, 5, 16)))
    >>> tuple(y.shape)
    (2, 3, 16)

    Decoder-only, as in a causal language model; no cross-attention weights:

    >>> layer = DecoderLayer(d_model=16, num_heads=2, d_ff=32)
    >>> tuple(layer(keras.ops.ones((2, 3, 16))).shape)
    (2, 3, 16)
    >>> layer.has_cross_attention, layer.count_params()
    (False, 2224)
    """

    KERAS_HUB_CLASS = "TransformerDecoder"

    def __init__(self, d_model, num_heads, d_ff, **kwargs):
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        # Created here, given weights in `build` only for encoder-decoder use.
        self.cross_attention = self._attention("cross_attention")
        self.cross_attention_norm = self._layer_norm("cross_attention_norm")
        self.has_cross_attention = None  # known once built

    def _build_like(self, layer):
        cross = getattr(layer, "_cross_attention_layer", None)
        encoder_shape = None if cross is None else (None, None, cross.key_dense.kernel.shape[0])
        self.build((None, None, self.d_model), encoder_shape)

    def build(self, inputs_shape, encoder_outputs_shape=None):
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm.build(inputs_shape)
        self.has_cross_attention = encoder_outputs_shape is not None
        if self.has_cross_attention:
            self.cross_attention.build(inputs_shape, encoder_outputs_shape)
            self.cross_attention_norm.build(inputs_shape)
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm.build(inputs_shape)
        self.built = True

    def _check_encoder_outputs(self, encoder_outputs):
        if self.has_cross_attention and encoder_outputs is None:
            raise ValueError(
                f"DecoderLayer '{self.name}' was built with cross-attention, so it needs "
                "encoder_outputs. Received: encoder_outputs=None"
            )
        if not self.has_cross_attention and encoder_outputs is not None:
            raise ValueError(
                f"DecoderLayer '{self.name}' was built without encoder outputs (decoder-only) "
                "and has no cross-attention weights; call it without encoder_outputs, or "
                "build a new layer with them. Received: encoder_outputs of shape "
                f"{tuple(encoder_outputs.shape)}"
            )

    def call(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        encoder_padding_mask=None,
        attention_mask=None,
        encoder_attention_mask=None,
        training=None,
        return_attention_scores=False,
    ):
        self._check_encoder_outputs(encoder_outputs)
        if padding_mask is None:
            padding_mask = keras_mask(inputs)
        scores = {}

        h = self._sublayer_input(inputs, self.self_attention_norm)
        mask = merge_masks(inputs, inputs, padding_mask, attention_mask, use_causal_mask=True)
        h = self.self_attention.attend(
            h, h, mask=mask, training=training, return_attention_scores=return_attention_scores
        )  # (B, T, D)
        if return_attention_scores:
            h, scores["self_attention"] = h  # (B, N, T, T)
        x = self._add_residual(inputs, h, self.self_attention_norm, training)  # (B, T, D)

        if self.has_cross_attention:
            if encoder_padding_mask is None:
                encoder_padding_mask = keras_mask(encoder_outputs)
            h = self._sublayer_input(x, self.cross_attention_norm)
            mask = merge_masks(x, encoder_outputs, encoder_padding_mask, encoder_attention_mask)
            h = self.cross_attention.attend(
                h,
                encoder_outputs,
                mask=mask,
                training=training,
                return_attention_scores=return_attention_scores,
            )  # (B, T, D)
            if return_attention_scores:
                h, scores["cross_attention"] = h  # (B, N, T, S)
            x = self._add_residual(x, h, self.cross_attention_norm, training)  # (B, T, D)

        h = self.feed_forward(self._sublayer_input(x, self.feed_forward_norm), training=training)
        x = self._add_residual(x, h, self.feed_forward_norm, training)  # (B, T, D)
        return (x, scores) if return_attention_scores else x

    def compute_cross_key_value(self, encoder_outputs):
        """Projects the encoder output once for `call_with_cache`.

        Args:
            encoder_outputs: `(B, S, D)`.

        Returns:
            `(cross_key, cross_value)`, each `(B, S, N, H)`.
        """
        if not self.built:
            raise ValueError(
                f"DecoderLayer '{self.name}' is not built yet; build it with "
                "`build(inputs_shape, encoder_outputs_shape)` before precomputing keys and values"
            )
        self._check_encoder_outputs(encoder_outputs)
        return self.cross_attention.compute_key_value(encoder_outputs)

    def compute_step_cross_key_value(self, encoder_outputs):
        """`compute_cross_key_value` in the step layout of `call_with_step_cache`.

        Returns:
            `(cross_key (B, N, H, S), cross_value (B, N, S, H))`.
        """
        return step_layout(*self.compute_cross_key_value(encoder_outputs))

    def call_with_cache(
        self,
        inputs,
        self_key,
        self_value,
        cache_index,
        cross_key=None,
        cross_value=None,
        encoder_padding_mask=None,
    ):
        """One decoding step at position `cache_index` (inference only).

        Args:
            inputs: `(B, 1, D)` embedding of the newest target token.
            self_key, self_value: `(B, T_max, N, H)` self-attention cache.
            cache_index: `(B,)` int, the position being decoded.
            cross_key, cross_value: `(B / K, S, N, H)` from
                `compute_cross_key_value(encoder_outputs)`, each row shared
                by K consecutive rows of `inputs` (K = 1 but in a beam
                search); None for a decoder-only layer.
            encoder_padding_mask: `(B / K, S)` bool, True for real source tokens.

        Returns:
            `(outputs (B, 1, D), (self_key, self_value))`, the self-attention
            cache with this step written in (the cross-attention keys and
            values never change).
        """
        return self._step(
            inputs,
            lambda h: self.self_attention.call_with_cache(h, self_key, self_value, cache_index),
            cross_key,
            lambda h: self.cross_attention.call_with_key_value(
                h, cross_key, cross_value, padding_mask=encoder_padding_mask
            ),
        )

    def call_with_step_cache(
        self, inputs, self_key, self_value, cross_key=None, cross_value=None, encoder_bias=None,
        groups=None,
    ):  # fmt: skip
        """`call_with_cache` with caches in the step layout (inference only).

        The self-attention cache holds exactly the steps decoded so far and
        grows by one (`MultiHeadAttention.call_with_step_cache`); no step
        copies or transposes a cache, so a loop whose state may change shape
        (the SavedModel's and translate.onnx's) runs this one.

        Args:
            inputs: `(B, 1, D)` embedding of the newest target token.
            self_key: `(B, N, H, t)`; self_value: `(B, N, t, H)`.
            cross_key, cross_value: `(B / K, N, H, S)`, `(B / K, N, S, H)`
                from `compute_step_cross_key_value`, shared as in
                `call_with_cache`; None for a decoder-only layer.
            encoder_bias: `(B / K, 1, 1, S)` float32,
                `attention.padding_bias(encoder_padding_mask)`.
            groups: optional `(B / K, K)` from `decoder_groups(cross_key, inputs)`,
                computed once per step by a caller that runs several layers
                (each layer computes them otherwise: a dozen shape nodes per
                layer and step in an exported graph).

        Returns:
            `(outputs (B, 1, D), (self_key, self_value))`, the cache one step longer.
        """
        return self._step(
            inputs,
            lambda h: self.self_attention.call_with_step_cache(h, self_key, self_value),
            cross_key,
            lambda h: self.cross_attention.call_with_step_key_value(
                h, cross_key, cross_value, bias=encoder_bias
            ),
            groups,
        )

    def _step(self, inputs, attend_self, cross_key, attend_cross, groups=None):
        """The sublayers of one decoding step around the two attention calls given."""
        self._check_encoder_outputs(cross_key)
        inputs = keras.ops.convert_to_tensor(inputs)  # the residual adds it to a tensor
        h = self._sublayer_input(inputs, self.self_attention_norm)
        h, self_cache = attend_self(h)
        x = self._add_residual(inputs, h, self.self_attention_norm, False)  # (B, 1, D)
        if self.has_cross_attention:
            h = self._sublayer_input(x, self.cross_attention_norm)  # (B*K, 1, D)
            # K hypotheses of a sentence share its keys and values (a beam search keeps
            # one row per sentence): they attend as K query positions of that sentence.
            sentences, group = groups or decoder_groups(cross_key, h)
            h = keras.ops.reshape(h, (sentences, group, self.d_model))  # (B, K, D)
            h = attend_cross(h)
            h = keras.ops.reshape(h, (-1, 1, self.d_model))  # (B*K, 1, D)
            x = self._add_residual(x, h, self.cross_attention_norm, False)  # (B*K, 1, D)
        h = self.feed_forward(self._sublayer_input(x, self.feed_forward_norm))
        x = self._add_residual(x, h, self.feed_forward_norm, False)  # (B, 1, D)
        return x, self_cache

    def compute_mask(self, inputs, previous_mask=None):
        return previous_mask  # the Keras mask of `inputs`, for the next layer

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return inputs_shape
