"""ONNX export: an encoder graph and a one-step decoder graph with an explicit cache.

tf2onnx has no SentencePiece mapping, so tokenization stays outside the
graphs (the `sentencepiece` package reads the same `vocab.model` and gives
identical ids) and search runs on the host (`OnnxTranslator`).

    encoder.onnx
        source_ids  int32 (B, S)            ids ending with EOS, 0-padded
     -> cross_key   float32 (B, L, S, N, H)  cross-attention keys of every decoder layer
        cross_value float32 (B, L, S, N, H)
        source_mask bool (B, S)             True for real source tokens

    decoder_step.onnx
        token_ids   int32 (B,)              the token at position `index`
        index       int32 (B,)              its position
        self_key    float32 (B, L, T, N, H)  self-attention cache (zeros at the start)
        self_value  float32 (B, L, T, N, H)
        cross_key, cross_value, source_mask  from encoder.onnx
     -> logits      float32 (B, V)          next-token logits
        new_self_key, new_self_value         the cache with position `index` written

B, S and T are dynamic; L (layers), N (heads), H (head size) are fixed.
"""

import dataclasses
import json
import os
import shutil

import tensorflow as tf

# tf2onnx supports opsets up to 18; 17 is the newest every onnxruntime >= 1.13 runs.
DEFAULT_OPSET = 17
ENCODER_OUTPUTS = ("cross_key", "cross_value", "source_mask")
DECODER_INPUTS = (
    "token_ids", "index", "self_key", "self_value", "cross_key", "cross_value", "source_mask"
)  # fmt: skip
DECODER_OUTPUTS = ("logits", "new_self_key", "new_self_value")


def _cache_spec(config, name):
    heads, head_size = config.num_heads, config.d_model // config.num_heads
    return tf.TensorSpec([None, config.num_layers, None, heads, head_size], tf.float32, name=name)


def encoder_function(model):
    """`tf.function`: source ids -> the cross-attention cache of `model.init_cache`."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")])
    def encoder(source_ids):
        cache = model.init_cache(source_ids, 1)
        return {name: cache[name] for name in ENCODER_OUTPUTS}

    return encoder


def decoder_step_function(model):
    """`tf.function`: one `model.decode_step` with the cache as explicit tensors."""
    config = model.config
    signature = [
        tf.TensorSpec([None], tf.int32, name="token_ids"),
        tf.TensorSpec([None], tf.int32, name="index"),
        _cache_spec(config, "self_key"),
        _cache_spec(config, "self_value"),
        _cache_spec(config, "cross_key"),
        _cache_spec(config, "cross_value"),
        tf.TensorSpec([None, None], tf.bool, name="source_mask"),
    ]

    @tf.function(input_signature=signature)
    def decoder_step(token_ids, index, self_key, self_value, cross_key, cross_value, source_mask):
        cache = dict(
            index=index,
            self_key=self_key,
            self_value=self_value,
            cross_key=cross_key,
            cross_value=cross_value,
            source_mask=source_mask,
        )
        logits, cache = model.decode_step(token_ids, cache)
        return {
            "logits": logits,
            "new_self_key": cache["self_key"],
            "new_self_value": cache["self_value"],
        }

    return decoder_step


def _convert(function, path, opset):
    import onnx
    import tf2onnx  # optional heavy dependency: imported only here

    model_proto, _ = tf2onnx.convert.from_function(
        function, input_signature=function.input_signature, opset=opset
    )
    onnx.checker.check_model(model_proto, full_check=True)
    onnx.save(model_proto, path)


def export_onnx(model, vocab_path, export_dir, opset=DEFAULT_OPSET, search=None):
    """Writes encoder.onnx, decoder_step.onnx, vocab.model and config.json to `export_dir`.

    Args:
        model: a trained `Transformer` (TensorFlow backend).
        vocab_path: its SentencePiece model file, copied next to the graphs.
        export_dir: an existing, empty directory.
        opset: ONNX opset, at most 18 (tf2onnx's maximum).
        search: dict of default search settings for `OnnxTranslator`
            (`beam_size`, `alpha`, `max_extra_length`).
    """
    if not 13 <= opset <= 18:
        raise ValueError(
            f"opset must be in [13, 18] (tf2onnx supports up to 18). Received: opset={opset}"
        )
    _convert(encoder_function(model), os.path.join(export_dir, "encoder.onnx"), opset)
    _convert(decoder_step_function(model), os.path.join(export_dir, "decoder_step.onnx"), opset)
    shutil.copyfile(vocab_path, os.path.join(export_dir, "vocab.model"))
    config = {
        "model": dataclasses.asdict(model.config),
        "search": dict(search or {}),
        "opset": opset,
        "encoder": {"inputs": ["source_ids"], "outputs": list(ENCODER_OUTPUTS)},
        "decoder_step": {"inputs": list(DECODER_INPUTS), "outputs": list(DECODER_OUTPUTS)},
    }
    with open(os.path.join(export_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return export_dir
