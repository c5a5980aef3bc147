"""The encoder-decoder Transformer of "Attention Is All You Need"."""

import dataclasses
import os

import keras
from keras import ops

from keras_transformer import workdir
from keras_transformer.config import PRESETS, TransformerConfig, get_preset
from keras_transformer.layers import (
    DecoderLayer,
    EncoderLayer,
    PositionalEncoding,
    TokenEmbedding,
    padding_mask_from_ids,
)
from keras_transformer.layers.attention import padding_bias
from keras_transformer.layers.block import layer_norm
from keras_transformer.layers.decoder import decoder_groups
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.masks import PACKING_KEYS, same_segment_mask

_CONFIG_FIELDS = tuple(field.name for field in dataclasses.fields(TransformerConfig))


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer for translation (https://arxiv.org/abs/1706.03762).

    Source and target share one vocabulary and one embedding matrix, which
    is also the pre-softmax projection (Section 3.4). Embeddings are scaled
    by sqrt(d_model), summed with sinusoidal positions (Section 3.5) and
    dropped out; then N encoder and N decoder layers (Section 3.1), or
    `encoder_layers` and `decoder_layers` of them where those are given.

    Args: the fields of `TransformerConfig` (`vocab_size`, `num_layers`,
        `encoder_layers`, `decoder_layers`, `d_model`, `num_heads`, `d_ff`,
        `dropout`, `attention_dropout`, `max_length`, `norm_first`, `layer_norm_epsilon`,
        `use_fused_attention`, `pad_id`, `bos_id`, `eos_id`), plus base
        `keras.Model` arguments (`name`, `dtype`).

    Call arguments:
        inputs: dict with `"source_ids"` `(B, S)` and `"target_ids"` `(B, T)`
            integer ids, `pad_id` for padding; `target_ids` starts with
            `bos_id` (teacher forcing). Rows that pack several pairs (as
            `data.pipeline` builds for training) also carry the four
            `PACKING_KEYS`: `"source_segment_ids"` `(B, S)` and
            `"target_segment_ids"` `(B, T)` (1, 2, ... for the pairs of a row,
            0 on padding) and `"source_positions"` / `"target_positions"`, each
            token's position within its pair. A position attends only to its
            own pair, so every pair's logits are those it gets alone.
        training: bool.

    Returns:
        `(B, T, V)` float32 logits of the next target token.

    Incremental decoding: `init_cache(source_ids, max_length)` encodes the
    source once; `decode_step(token_ids, cache)` returns `(B, V)` logits of
    the next token and the updated cache. Every cache entry has the batch
    on axis 0, so beam search can reorder it without knowing what it holds.

    Example:

    >>> model = Transformer.from_preset("tiny")
    >>> inputs = {"source_ids": keras.ops.array([[5, 6, 7, 3, 0]]),
    ...           "target_ids": keras.ops.array([[2, 8, 9]])}
    >>> tuple(model(inputs).shape)
    (1, 3, 1000)
    """

    def __init__(
        self,
        vocab_size,
        num_layers=6,
        encoder_layers=None,
        decoder_layers=None,
        d_model=512,
        num_heads=8,
        d_ff=2048,
        dropout=0.1,
        attention_dropout=0.0,
        max_length=256,
        norm_first=False,
        layer_norm_epsilon=1e-6,
        use_fused_attention=False,
        pad_id=0,
        bos_id=2,
        eos_id=3,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # Validates every value, with errors that name them.
        self.config = TransformerConfig(
            vocab_size=vocab_size,
            num_layers=num_layers,
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            d_model=d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            dropout=dropout,
            attention_dropout=attention_dropout,
            max_length=max_length,
            norm_first=norm_first,
            layer_norm_epsilon=layer_norm_epsilon,
            use_fused_attention=use_fused_attention,
            pad_id=pad_id,
            bos_id=bos_id,
            eos_id=eos_id,
        )
        self._create_layers(self.config)

    def _create_layers(self, config):
        """Creates the sub-layers of `config`: saved weights depend on their names
        and on this order (embedding, encoder and decoder layers, final LayerNorms)."""
        dtype = self.dtype_policy
        block = dict(
            d_model=config.d_model,
            num_heads=config.num_heads,
            d_ff=config.d_ff,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            norm_first=config.norm_first,
            layer_norm_epsilon=config.layer_norm_epsilon,
            use_fused_attention=config.use_fused_attention,
            dtype=dtype,
        )
        self.embedding = TokenEmbedding(
            config.vocab_size, config.d_model, pad_id=config.pad_id, dtype=dtype, name="embedding"
        )
        self.positional_encoding = PositionalEncoding(dtype=dtype, name="positional_encoding")
        self.embedding_dropout = Dropout(config.dropout, dtype=dtype, name="embedding_dropout")
        self.encoder_layers = [
            EncoderLayer(**block, name=f"encoder_layer_{i}")
            for i in range(config.num_encoder_layers)
        ]
        self.decoder_layers = [
            DecoderLayer(**block, name=f"decoder_layer_{i}")
            for i in range(config.num_decoder_layers)
        ]
        # Pre-LN stacks end with a LayerNorm; post-LN outputs are already normalized.
        epsilon, norm_first = config.layer_norm_epsilon, config.norm_first
        self.encoder_norm = layer_norm(epsilon, dtype, "encoder_norm") if norm_first else None
        self.decoder_norm = layer_norm(epsilon, dtype, "decoder_norm") if norm_first else None

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """A `Transformer` from an architecture preset name or a trained work directory.

        - `Transformer.from_preset("base", vocab_size=37000)`: a new model
          with random weights, one of `config.PRESETS`; `kwargs` that are
          `TransformerConfig` fields override the preset, the others
          (`name`, `dtype`) go to `keras.Model`.
        - `Transformer.from_preset("work")`: the trained model of a work
          directory written by `python train.py` (its `model.keras`), as
          keras-hub's `from_preset` loads a preset directory. Its tokenizer:
          `Translator.from_preset("work")`.
        """
        if workdir.is_work_dir(preset):
            if kwargs:
                raise ValueError(
                    f"A trained work directory ({preset!r}) is loaded as it was saved; "
                    f"overrides are for preset names. Received: {sorted(kwargs)}"
                )
            return workdir.load_model(preset)
        if isinstance(preset, str) and preset not in PRESETS and os.sep in preset:
            workdir.check(preset, finished=False)  # a path: say what it lacks
        overrides = {key: value for key, value in kwargs.items() if key in _CONFIG_FIELDS}
        model_kwargs = {key: value for key, value in kwargs.items() if key not in _CONFIG_FIELDS}
        return cls(**dataclasses.asdict(get_preset(preset, **overrides)), **model_kwargs)

    def compile(self, *args, **kwargs):
        """`keras.Model.compile`; with `jit_compile=True` under TensorFlow, the
        dropout layers draw their masks with ThreeFry, which XLA runs fast on CPU
        (`layers.dropout.Dropout`)."""
        super().compile(*args, **kwargs)
        threefry = keras.backend.backend() == "tensorflow" and self.jit_compile is True
        for layer in self._flatten_layers():
            if isinstance(layer, Dropout):
                layer.use_threefry = threefry

    def build(self, inputs_shape=None):
        hidden = (None, None, self.config.d_model)
        self.embedding.build()
        for layer in self.encoder_layers:
            layer.build(hidden)
        for layer in self.decoder_layers:
            layer.build(hidden, hidden)
        for norm in (self.encoder_norm, self.decoder_norm):
            if norm is not None:
                norm.build(hidden)
        self.built = True

    def _embed(self, token_ids, start_index=0, training=None, positions=None):
        x = self.embedding(token_ids)  # (B, L, D), scaled by sqrt(D)
        x = self.positional_encoding(x, start_index=start_index, positions=positions)
        return self.embedding_dropout(x, training=training)

    def encode(self, source_ids, training=None, segment_ids=None, positions=None):
        """`(B, S)` ids -> `(B, S, D)` encoder output; packed rows also pass
        `segment_ids` and `positions` (see `PACKING_KEYS`)."""
        padding_mask = padding_mask_from_ids(ops.cast(source_ids, "int32"), self.config.pad_id)
        attention_mask = (
            None if segment_ids is None else same_segment_mask(segment_ids, segment_ids)
        )
        x = self._embed(source_ids, training=training, positions=positions)
        for layer in self.encoder_layers:
            x = layer(
                x, padding_mask=padding_mask, attention_mask=attention_mask, training=training
            )
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x

    def decode(
        self,
        target_ids,
        encoder_outputs,
        source_ids,
        training=None,
        return_attention_scores=False,
        packing=None,
    ):
        """`(B, T)` target ids and the encoder output -> `(B, T, V)` float32 logits.

        Packed rows pass `packing`, the dict of the four `PACKING_KEYS`.

        With `return_attention_scores=True`, returns `(logits, scores)`:
        `scores["self_attention"]` `(B, L, N, T, T)` and
        `scores["cross_attention"]` `(B, L, N, T, S)`, the attention
        probabilities of every decoder layer and head (no dropout; rows sum
        to 1, padded source positions get 0). The default path is unchanged.
        """
        source_mask = padding_mask_from_ids(ops.cast(source_ids, "int32"), self.config.pad_id)
        target_mask = padding_mask_from_ids(ops.cast(target_ids, "int32"), self.config.pad_id)
        masks = {}
        positions = None
        if packing:
            target_segments = packing["target_segment_ids"]
            masks = {
                "attention_mask": same_segment_mask(target_segments, target_segments),
                "encoder_attention_mask": same_segment_mask(
                    target_segments, packing["source_segment_ids"]
                ),
            }
            positions = packing["target_positions"]
        x = self._embed(target_ids, training=training, positions=positions)
        layer_scores = []
        for layer in self.decoder_layers:
            x = layer(
                x,
                encoder_outputs,
                padding_mask=target_mask,
                encoder_padding_mask=source_mask,
                training=training,
                return_attention_scores=return_attention_scores,
                **masks,
            )
            if return_attention_scores:
                x, scores = x
                layer_scores.append(scores)
        logits = self._logits(x)
        if not return_attention_scores:
            return logits
        scores = {
            name: ops.stack([scores[name] for scores in layer_scores], axis=1)
            for name in ("self_attention", "cross_attention")
        }  # (B, L, N, T, T) and (B, L, N, T, S)
        return logits, scores

    def _logits(self, x):
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return ops.cast(self.embedding.logits(x), "float32")

    def call(self, inputs, training=None):
        packing = None
        if isinstance(inputs, dict):
            source_ids, target_ids = inputs["source_ids"], inputs["target_ids"]
            packing = {key: inputs[key] for key in PACKING_KEYS if key in inputs}
            if packing and len(packing) != len(PACKING_KEYS):
                missing = sorted(set(PACKING_KEYS) - set(packing))
                raise ValueError(
                    f"Packed inputs need all of {PACKING_KEYS}; missing {missing}. "
                    f"Received keys: {sorted(inputs)}"
                )
        else:
            source_ids, target_ids = inputs
        encoder_outputs = self.encode(
            source_ids,
            training=training,
            segment_ids=packing["source_segment_ids"] if packing else None,
            positions=packing["source_positions"] if packing else None,
        )
        return self.decode(
            target_ids, encoder_outputs, source_ids, training=training, packing=packing or None
        )

    # The entries of `init_cache` that belong to the source sentence: one row per
    # sentence, shared by its beam hypotheses (`decoding.beam_search`'s `shared`).
    SOURCE_CACHE = ("cross_key", "cross_value", "source_mask")

    def init_cache(self, source_ids, max_length):
        """Encodes the source and allocates the decoding cache.

        Args:
            source_ids: `(B, S)` integer ids.
            max_length: int. Number of target positions the cache holds.

        Returns:
            dict, every entry batch-first:
            `index` `(B,)` int32, the next position to decode;
            `self_key`, `self_value` `(B, L, max_length, N, H)`, zeros;
            `cross_key`, `cross_value` `(B, L, S, N, H)`, computed once;
            `source_mask` `(B, S)` bool, True for real source tokens.
        """
        source_ids = ops.cast(source_ids, "int32")
        encoder_outputs = self.encode(source_ids, training=False)  # (B, S, D)
        cross = [layer.compute_cross_key_value(encoder_outputs) for layer in self.decoder_layers]
        cross_key = ops.stack([k for k, _ in cross], axis=1)  # (B, L, S, N, H)
        cross_value = ops.stack([v for _, v in cross], axis=1)
        batch_size = ops.shape(source_ids)[0]
        config = self.config
        self_shape = (
            batch_size,
            config.num_decoder_layers,
            max_length,
            config.num_heads,
            config.d_model // config.num_heads,
        )
        zeros = ops.zeros(self_shape, dtype=cross_key.dtype)
        return {
            "index": ops.zeros((batch_size,), dtype="int32"),
            "self_key": zeros,
            "self_value": zeros,
            "cross_key": cross_key,
            "cross_value": cross_value,
            "source_mask": padding_mask_from_ids(source_ids, config.pad_id),
        }

    def decode_step(self, token_ids, cache):
        """Decodes one position for every sequence.

        Args:
            token_ids: `(B,)` ids of the tokens at position `cache["index"]`.
            cache: dict from `init_cache` or a previous `decode_step`. Its
                `SOURCE_CACHE` entries may have `B / K` rows, each shared by
                K consecutive rows of `token_ids` (the hypotheses of one
                sentence in a beam search).

        Returns:
            `(logits (B, V) float32, cache)` with `index` advanced by one.
        """
        index = cache["index"]  # (B,)
        x = self._embed(ops.cast(token_ids, "int32")[:, None], positions=index[:, None])
        self_keys, self_values = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, (key, value) = layer.call_with_cache(
                x,
                cache["self_key"][:, i],
                cache["self_value"][:, i],
                index,
                cross_key=cache["cross_key"][:, i],
                cross_value=cache["cross_value"][:, i],
                encoder_padding_mask=cache["source_mask"],
            )
            self_keys.append(key)
            self_values.append(value)
        logits = self._logits(x)[:, 0, :]  # (B, V)
        cache = dict(
            cache,
            index=index + 1,
            self_key=ops.stack(self_keys, axis=1),  # (B, L, T_max, N, H)
            self_value=ops.stack(self_values, axis=1),
        )
        return logits, cache

    def get_config(self):
        config = super().get_config()
        config.update(dataclasses.asdict(self.config))
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config.pop("trainable", None)
        return cls(**config)


class GrowingCache:
    """A `Transformer` decoding in the step layout: caches that only grow, nothing copied.

    `Transformer.init_cache` allocates keys and values for all T output
    positions up front in one `(B, L, T, N, H)` tensor per kind, and every
    `decode_step` slices each layer's cache out of it, rewrites all T
    positions (a one-hot blend), transposes the keys and values for the
    attention products and stacks the layers back: the shapes a compiled
    loop that cannot change them (JAX) needs. Here each layer's caches are
    their own entries (tuples over the layers), in the step layout of
    `DecoderLayer.call_with_step_cache` (heads first, keys transposed): the
    self-attention cache holds exactly the positions decoded so far and a
    step appends one, the cross-attention keys and values are computed once,
    and the source padding is a logit bias computed once. A step costs
    O(t) arithmetic and copies nothing but its append. It has what
    `decoding.translate_ids` needs (`config`, `built`, `SOURCE_CACHE`,
    `init_cache`, `decode_step`), so the search is the package's own.

    The T axis changes size from step to step, so this only works where the
    loop allows it (`decoding.drops_finished()`): `tf.while_loop` with shape
    invariants (the SavedModel's, translate.onnx's `Loop`) and torch's
    Python loop.
    """

    SOURCE_CACHE = ("cross_key", "cross_value", "source_bias")

    def __init__(self, model):
        self.model = model
        self.config = model.config
        self.built = model.built

    def init_cache(self, source_ids, max_length):
        """Encodes the source; empty self-attention caches (`max_length` unused).

        Returns:
            dict, every entry batch-first: `index` `(B,)` int32; per decoder
            layer (tuples of L tensors) `self_key` `(B, N, H, 0)`,
            `self_value` `(B, N, 0, H)`, `cross_key` `(B, N, H, S)`,
            `cross_value` `(B, N, S, H)`; `source_bias` `(B, 1, 1, S)` float32.
        """
        model, config = self.model, self.config
        source_ids = ops.cast(source_ids, "int32")
        encoder_outputs = model.encode(source_ids, training=False)  # (B, S, D)
        layers = model.decoder_layers
        cross = [layer.compute_step_cross_key_value(encoder_outputs) for layer in layers]
        batch_size = ops.shape(source_ids)[0]
        heads, size = config.num_heads, config.d_model // config.num_heads
        dtype = cross[0][0].dtype
        return {
            "index": ops.zeros((batch_size,), dtype="int32"),
            "self_key": tuple(ops.zeros((batch_size, heads, size, 0), dtype) for _ in layers),
            "self_value": tuple(ops.zeros((batch_size, heads, 0, size), dtype) for _ in layers),
            "cross_key": tuple(key for key, _ in cross),
            "cross_value": tuple(value for _, value in cross),
            "source_bias": padding_bias(padding_mask_from_ids(source_ids, config.pad_id)),
        }

    def decode_step(self, token_ids, cache):
        """`Transformer.decode_step` on this cache: `(logits (B, V) float32, cache)`."""
        model = self.model
        index = cache["index"]  # (B,)
        # The step's position given as is (a `start_index` adds it to a cumulative sum).
        x = model._embed(ops.cast(token_ids, "int32")[:, None], positions=index[:, None])
        keys, values = [], []
        groups = decoder_groups(cache["cross_key"][0], index)  # once per step, not per layer
        for i, layer in enumerate(model.decoder_layers):
            x, (key, value) = layer.call_with_step_cache(
                x,
                cache["self_key"][i],
                cache["self_value"][i],
                cross_key=cache["cross_key"][i],
                cross_value=cache["cross_value"][i],
                encoder_bias=cache["source_bias"],
                groups=groups,
            )
            keys.append(key)
            values.append(value)
        logits = model._logits(x)[:, 0, :]  # (B, V)
        return logits, dict(cache, index=index + 1, self_key=tuple(keys), self_value=tuple(values))
