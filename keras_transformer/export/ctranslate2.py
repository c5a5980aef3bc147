"""CTranslate2 export: the trained Transformer as a `ctranslate2.specs.TransformerSpec`.

CTranslate2 is the C++ inference engine that OpenNMT-tf exports to and
that fairseq and Marian models are converted to. It runs the same
encoder-decoder (post- or pre-LN, ReLU, sinusoidal positions, embeddings
scaled by sqrt(d_model)), so the weights map one to one, as in its own
converters (`ctranslate2/converters/fairseq.py`): each Keras kernel
`(in, heads, head_dim)` becomes a PyTorch-layout `(out, in)` matrix, the
self-attention Q/K/V projections one fused matrix, the cross-attention K/V
another, and the tied embedding serves as both vocabularies and as the
output projection. The position table is the model's own (`PositionalEncoding`
evaluated), so nothing depends on CTranslate2's sinusoid layout.

    python -m keras_transformer.export --work-dir work --formats ctranslate2

writes `MODEL/ctranslate2/VERSION/` (`model.bin`, `shared_vocabulary.json`,
`config.json`, and `vocab.model` beside them), which
`keras_transformer.CTranslate2Translator.load(path)` translates with. The
export is float32; `compute_type="int8"` (or "int8_float32", ...) quantizes
at load time, as CTranslate2 does.
"""

import json
import os

import numpy as np

from keras_transformer.translators.ctranslate2_translator import import_ctranslate2

FORMAT = "ctranslate2"


def _weights(model):
    """`{path without the model's name: numpy array}` of `model`'s weights."""
    import keras

    return {
        w.path.split("/", 1)[1]: np.asarray(keras.ops.convert_to_numpy(w), dtype="float32")
        for w in model.weights
    }


def _linear(spec, kernel, bias):
    """A Keras kernel `(in, ...)` / `(..., out)` and bias -> a `(out, in)` LinearSpec."""
    spec.weight = kernel
    spec.bias = bias


def _attention(spec, weights, prefix, self_attention):
    d_model = weights[f"{prefix}/query/kernel"].shape[0]

    def projection(name):  # (D, H, Dh) -> (H * Dh, D); bias (H, Dh) -> (H * Dh,)
        kernel = weights[f"{prefix}/{name}/kernel"].reshape(d_model, -1).T
        return kernel, weights[f"{prefix}/{name}/bias"].reshape(-1)

    q, k, v = projection("query"), projection("key"), projection("value")
    if self_attention:
        _linear(
            spec.linear[0], np.concatenate([q[0], k[0], v[0]]), np.concatenate([q[1], k[1], v[1]])
        )
    else:
        _linear(spec.linear[0], *q)
        _linear(spec.linear[1], np.concatenate([k[0], v[0]]), np.concatenate([k[1], v[1]]))
    output = weights[f"{prefix}/attention_output/kernel"]  # (H, Dh, D)
    _linear(
        spec.linear[-1], output.reshape(-1, d_model).T, weights[f"{prefix}/attention_output/bias"]
    )


def _layer_norm(spec, weights, prefix):
    spec.gamma = weights[f"{prefix}/gamma"]
    spec.beta = weights[f"{prefix}/beta"]


def _feed_forward(spec, weights, prefix):
    _layer_norm(spec.layer_norm, weights, f"{prefix}_norm")
    _linear(spec.linear_0, weights[f"{prefix}/inner/kernel"].T, weights[f"{prefix}/inner/bias"])
    _linear(spec.linear_1, weights[f"{prefix}/output/kernel"].T, weights[f"{prefix}/output/bias"])


def position_table(model):
    """`(max_length, d_model)` float32: what the model's `PositionalEncoding` adds."""
    import keras

    config = model.config
    zeros = keras.ops.zeros((1, config.max_length, config.d_model), dtype="float32")
    table = model.positional_encoding(zeros)[0]
    return np.asarray(keras.ops.convert_to_numpy(table), dtype="float32")


def transformer_spec(model, pieces):
    """The `ctranslate2.specs.TransformerSpec` of a `Transformer` and its vocabulary.

    Args:
        model: a built `Transformer` (post-LN, as the paper's; pre-LN is refused).
        pieces: list of str, the SentencePiece pieces in id order (the model's
            rows beyond them, if any, get placeholder names).
    """
    import_ctranslate2()  # first, so that this process's CTranslate2 picks its int8 GEMM
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as specs

    config = model.config
    if config.norm_first:
        raise ValueError(
            "The CTranslate2 export maps the paper's post-LN model; this model is pre-LN "
            "(norm_first=True), whose final layer norms it does not map yet."
        )
    weights = _weights(model)
    spec = specs.TransformerSpec.from_config(
        (config.num_encoder_layers, config.num_decoder_layers),
        config.num_heads,
        pre_norm=False,
        activation=common_spec.Activation.RELU,
    )
    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    embeddings = weights["embedding/embeddings"]
    positions = position_table(model)
    for stack in (spec.encoder, spec.decoder):
        table = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
        table.weight = embeddings
        stack.scale_embeddings = True
        stack.position_encodings.encodings = positions
    spec.decoder.projection.weight = embeddings  # tied output projection, no bias
    for i, layer in enumerate(spec.encoder.layer):
        prefix = f"encoder_layer_{i}"
        _attention(layer.self_attention, weights, f"{prefix}/self_attention", True)
        _layer_norm(layer.self_attention.layer_norm, weights, f"{prefix}/self_attention_norm")
        _feed_forward(layer.ffn, weights, f"{prefix}/feed_forward")
    for i, layer in enumerate(spec.decoder.layer):
        prefix = f"decoder_layer_{i}"
        _attention(layer.self_attention, weights, f"{prefix}/self_attention", True)
        _layer_norm(layer.self_attention.layer_norm, weights, f"{prefix}/self_attention_norm")
        _attention(layer.attention, weights, f"{prefix}/cross_attention", False)
        _layer_norm(layer.attention.layer_norm, weights, f"{prefix}/cross_attention_norm")
        _feed_forward(layer.ffn, weights, f"{prefix}/feed_forward")
    vocabulary = list(pieces) + [f"<unused_{i}>" for i in range(len(pieces), config.vocab_size)]
    if len(vocabulary) != config.vocab_size:
        raise ValueError(
            f"The vocabulary has {len(pieces)} pieces, the model {config.vocab_size} rows."
        )
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.config.bos_token = vocabulary[config.bos_id]
    spec.config.eos_token = vocabulary[config.eos_id]
    spec.config.decoder_start_token = vocabulary[config.bos_id]
    spec.config.add_source_eos = False  # the front end appends EOS itself, as for Keras
    spec.validate()
    return spec


def export(model, vocabulary_path, output_dir, search=None):
    """Writes the CTranslate2 model of `model` to `output_dir` (which must not exist).

    Beside CTranslate2's files: `vocab.model` (the SentencePiece model the
    front end tokenizes with) and `keras_transformer.json` (the model's
    special ids and limits, and the run's search settings).
    """
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=vocabulary_path)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    spec = transformer_spec(model, pieces)
    os.makedirs(output_dir, exist_ok=True)
    spec.save(output_dir)
    with (
        open(vocabulary_path, "rb") as source,
        open(os.path.join(output_dir, "vocab.model"), "wb") as target,
    ):
        target.write(source.read())
    config = model.config
    info = {
        "format": FORMAT,
        "max_length": config.max_length,
        "pad_id": config.pad_id,
        "bos_id": config.bos_id,
        "eos_id": config.eos_id,
        "search": dict(search or {}),
    }
    with open(os.path.join(output_dir, "keras_transformer.json"), "w") as f:
        json.dump(info, f, indent=1)
    return output_dir
