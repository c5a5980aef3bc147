"""ONNX export: `translate.onnx` (text in, text out) and the encoder / decoder-step graphs.

    translate.onnx
        sentences        string (B,)       UTF-8 text
        beam_size        int32 ()          optional: 1 (greedy) or the exported beam size
        alpha            float32 ()        optional: length-penalty exponent (default 0.6)
        max_extra_length int32 ()          optional: output tokens beyond the source length (50)
     -> translations     string (B,)

    translate_steered.onnx
        the same inputs and output, and five more, each optional (a default
        of the same name steers nothing): `Translator.translate`'s steering,
        with its outputs for the same seeds (`OnnxTranslator.translate`'s
        `target_prefix`, `banned`, `sampling_topk`, `sampling_temperature`, `seed`)
        target_prefix    string (B,)       each output's first words ("": none)
        banned           string (B, N)     words no output may hold ("": pads a row)
        seeds            int32 (B,)        each sentence's seed for the sampling (0)
        sampling_topk    int32 ()          1 searches (default); K > 1 or 0 samples
        sampling_temperature float32 ()    of the sampling (1.0)
        A second graph rather than optional inputs of translate.onnx: one
        graph with both sets of searches took tf2onnx about twice the memory
        to convert (the tiny test fixture's export was killed at 6.9 GB),
        and translate.onnx stays as it was (its outputs and speed).

    translate_int8.onnx
        the same graph with int8 matrix products, each row of activations
        quantized on its own, so an output does not depend on its batch
        (`onnx_int8`): `OnnxTranslator(..., precision="int8")`.

    One graph with everything inside: onnxruntime-extensions' SentencePiece
    tokenizer, the SavedModel's source rules (truncation to max_length - 1
    pieces, EOS, padding), `decoding.translate_ids` itself (greedy and beam
    search as ONNX `Loop`s, converted by tf2onnx from the same code the
    Keras `Translator` and the SavedModel run), detokenization up to EOS,
    and "" for blank input (`onnx_text.text_to_text`). It loads with
    `onnxruntime` + `onnxruntime-extensions` and no project code.

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

    The two step graphs are for runtimes without onnxruntime-extensions,
    which then tokenize and search themselves.

B, S and T are dynamic; L (layers), N (heads), H (head size) are fixed.
"""

import dataclasses
import functools
import gc
import json
import logging
import os
import shutil

import numpy as np
import tensorflow as tf

from keras_transformer.decoding import translate_ids
from keras_transformer.export.onnx_fusions import fuse
from keras_transformer.export.onnx_int8 import quantize_translate
from keras_transformer.export.onnx_passes import simplify
from keras_transformer.export.onnx_text import text_to_text
from keras_transformer.search import PAPER, SearchConfig

logger = logging.getLogger(__name__)

# tf2onnx supports opsets up to 18; 17 is the newest every onnxruntime >= 1.13 runs.
DEFAULT_OPSET = 17
# translate.onnx needs 18 (BitwiseAnd, in Keras's float argmax); onnxruntime >= 1.14.
TRANSLATE_OPSET = 18
ENCODER_OUTPUTS = ("cross_key", "cross_value", "source_mask")
DECODER_INPUTS = (
    "token_ids", "index", "self_key", "self_value", "cross_key", "cross_value", "source_mask"
)  # fmt: skip
DECODER_OUTPUTS = ("logits", "new_self_key", "new_self_value")
TRANSLATE_INPUTS = ("sentences", "beam_size", "alpha", "max_extra_length")
# translate_steered.onnx's steering inputs (config.json's `translate.steering`).
STEERING_TEXT_INPUTS = (
    "target_prefix", "banned", "seeds", "sampling_topk", "sampling_temperature"
)  # fmt: skip
# The search graph's steering inputs: onnx_text.text_to_text makes the first three from
# `target_prefix`, `banned` and `seeds`; the last two are translate.onnx's own.
STEERING_INPUTS = ("prefix_ids", "banned_ids", "sentence_seeds", "sampling_topk",
                   "sampling_temperature")  # fmt: skip
STEERING_DEFAULTS = {
    "sampling_topk": np.array(1, np.int32),
    "sampling_temperature": np.array(1.0, np.float32),
}


def _cache_spec(config, name):
    heads, head_size = config.num_heads, config.d_model // config.num_heads
    shape = [None, config.num_decoder_layers, None, heads, head_size]
    return tf.TensorSpec(shape, tf.float32, name=name)


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


def search_function(model, beam_sizes=(1, 4), stopping=PAPER.stopping, patience=PAPER.patience,
                    length_ratio=PAPER.length_ratio, steering=False):  # fmt: skip
    """`tf.function`: `decoding.translate_ids` with the search settings as inputs.

    Inputs: `source_ids` int32 (B, S); `beam_size` int32 scalar, one of
    `beam_sizes` (another value runs the last of them); `alpha` float32
    and `max_extra_length` int32 scalars (negative values count as 0).
    Output: `target_ids` int32 (B, T). Each beam size is its own branch
    (the search's state has the beam size in its shapes); a beam size not
    in `beam_sizes` fails in the graph with a message naming them.
    `stopping`, `patience` and `length_ratio` are baked in (`search.SearchConfig`).

    With `steering` (translate_steered.onnx's search), also `STEERING_INPUTS`:
    `prefix_ids` int32 (B, P) and `banned_ids` int32 (B, N, L) (pad after
    each; all pad: none), `sentence_seeds` int32 (B,), `sampling_topk` int32
    and `sampling_temperature` float32 scalars; sampling (`sampling_topk != 1`)
    and beam size 1 run one greedy loop that also samples, the other beam
    sizes their beam search, each with the prefix and the bans.
    """
    if not beam_sizes or any(not isinstance(k, int) or k < 1 for k in beam_sizes):
        raise ValueError(f"beam_sizes must be positive integers. Received: {beam_sizes}")
    if not model.built:
        model.build()
    signature = [
        tf.TensorSpec([None, None], tf.int32, name="source_ids"),
        tf.TensorSpec([], tf.int32, name="beam_size"),
        tf.TensorSpec([], tf.float32, name="alpha"),
        tf.TensorSpec([], tf.int32, name="max_extra_length"),
    ]
    searches = functools.partial(
        _searches, model, tuple(beam_sizes),
        dict(stopping=stopping, patience=patience, length_ratio=length_ratio),
    )  # fmt: skip
    if steering:
        return _steered_search(searches, signature, beam_sizes)

    @tf.function(input_signature=signature, autograph=False)
    def search(source_ids, beam_size, alpha, max_extra_length):
        select, _ = searches(source_ids, beam_size, alpha, max_extra_length)
        return {"target_ids": select(tuple(beam_sizes))}

    return search


def _searches(model, beam_sizes, rule, source_ids, beam_size, alpha, max_extra_length):
    """`(select, branch)`: `select(sizes, **steering)` runs the search of `beam_size`
    among `sizes` (nested conditionals: only the chosen search runs); `branch(k,
    **steering)` is the search of beam size k."""
    alpha = tf.maximum(alpha, 0.0)
    max_extra_length = tf.maximum(max_extra_length, 0)

    def branch(k, **steering):
        return lambda: translate_ids(
            model, source_ids, k, alpha, max_extra_length, **rule, **steering
        )

    def select(sizes, **steering):
        if not sizes:
            return _refuse(beam_size, beam_sizes)
        return tf.cond(tf.equal(beam_size, sizes[0]), branch(sizes[0], **steering),
                       lambda: select(sizes[1:], **steering))  # fmt: skip

    return select, branch


def _refuse(beam_size, beam_sizes):
    """A beam size not exported: ONNX has no assert, so an out-of-range Gather fails in
    ONNX Runtime with this node's name in its message; TensorFlow fails at the Assert
    first."""
    message = f"beam_size must be one of the exported beam sizes {list(beam_sizes)}"
    assertion = tf.debugging.Assert(False, [message + ". Received:", beam_size])
    with tf.control_dependencies([assertion]):
        index = tf.reshape(beam_size, [1]) + 1_000_000
    name = "beam_size_must_be_one_of_" + "_or_".join(map(str, beam_sizes))
    return tf.gather(tf.zeros([1, 1], tf.int32), index, name=name)  # (1, 1), never


def _steered_search(searches, signature, beam_sizes):
    """translate_steered.onnx's `tf.function`: the search's inputs and the steering's."""
    signature = signature + [
        tf.TensorSpec([None, None], tf.int32, name="prefix_ids"),
        tf.TensorSpec([None, None, None], tf.int32, name="banned_ids"),
        tf.TensorSpec([None], tf.int32, name="sentence_seeds"),
        tf.TensorSpec([], tf.int32, name="sampling_topk"),
        tf.TensorSpec([], tf.float32, name="sampling_temperature"),
    ]

    @tf.function(input_signature=signature, autograph=False)
    def steered_search(source_ids, beam_size, alpha, max_extra_length, prefix_ids, banned_ids,
                       sentence_seeds, sampling_topk, sampling_temperature):  # fmt: skip
        select, branch = searches(source_ids, beam_size, alpha, max_extra_length)
        forces = dict(prefix_ids=prefix_ids, banned_ids=banned_ids)
        draws = dict(sampling=(sampling_temperature, sampling_topk), seeds=sentence_seeds)
        # Sampling and greedy search share one loop (`sampling.sampler`).
        target_ids = tf.cond(
            tf.logical_or(tf.not_equal(sampling_topk, 1), tf.equal(beam_size, 1)),
            branch(1, **forces, **draws),
            lambda: select(tuple(k for k in beam_sizes if k != 1), **forces),
        )
        return {"target_ids": target_ids}

    return steered_search


def _convert(function, opset, check_feeds=()):
    """A `tf.function` with an input signature -> simplified, checked `onnx.ModelProto`.

    With `check_feeds` (a list of feed dicts), the simplified graph must give
    the raw tf2onnx graph's outputs on each, exactly; where it does not, the
    raw graph is kept with a warning (slower, never wrong).
    """
    import copy

    import onnx

    from keras_transformer.export.onnx_convert import convert

    gc.collect()  # what the exports before this one left in reference cycles
    model_proto = convert(function, opset)  # in a child process: the export's peak
    raw = copy.deepcopy(model_proto) if check_feeds else None
    simplify(model_proto)
    fuse(model_proto)
    onnx.checker.check_model(model_proto, full_check=True)
    if check_feeds and not _same_outputs(raw, model_proto, check_feeds):
        logger.warning(
            "The simplified ONNX search graph translated differently from tf2onnx's graph; "
            "exporting the unsimplified graph (slower). Please report this."
        )
        onnx.checker.check_model(raw, full_check=True)
        return raw
    return model_proto


def _same_outputs(first, second, feeds):
    """Whether two graphs give equal outputs on every feed dict (ONNX Runtime, CPU)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    sessions = [
        ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for m in (first, second)
    ]
    for feed in feeds:
        a, b = (session.run(None, feed) for session in sessions)
        if any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True)):
            return False
    return True


def _check_feeds(config, beam_sizes, defaults, count=2, steering=False):
    """Inputs of the search graph to compare its raw and simplified forms on: random
    ids of a few lengths (each row ending with EOS), every exported beam size; with
    `steering`, with and without a prefix and a ban, and sampling."""
    rng = np.random.default_rng(0)
    feeds = []
    for beam_size in beam_sizes:
        for batch, length in ((1, 5), (count, 9))[:count]:
            ids = rng.integers(4, config.vocab_size, size=(batch, length)).astype(np.int32)
            ids[:, -1] = config.eos_id
            ids[1:, length // 2 :] = config.pad_id  # rows of different lengths
            ids[1:, length // 2] = config.eos_id
            feeds.append({
                "source_ids": ids,
                "beam_size": np.array(beam_size, np.int32),
                "alpha": defaults["alpha"],
                "max_extra_length": np.array(4, np.int32),
                **(_steering_feed(batch, config.pad_id) if steering else {}),
            })  # fmt: skip
    if not steering:
        return feeds
    # A prefix and a ban in each search, and sampling.
    for beam_size, topk in [(k, 1) for k in beam_sizes] + [(1, 0), (1, 3)]:
        feed = dict(feeds[-1], beam_size=np.array(beam_size, np.int32))
        batch = len(feed["source_ids"])
        steering = _steering_feed(batch, config.pad_id)
        steering["prefix_ids"][:, 0] = feed["source_ids"][:, 0]
        steering["banned_ids"][:, 0, 0] = feed["source_ids"][:, 1]
        steering["sentence_seeds"][:] = np.arange(batch) + 7
        steering["sampling_topk"] = np.array(topk, np.int32)
        feeds.append({**feed, **steering})
    return feeds


def _steering_feed(batch, pad_id):
    """The search graph's steering inputs that steer nothing, for a batch of `batch`."""
    return {
        "prefix_ids": np.full((batch, 1), pad_id, np.int32),
        "banned_ids": np.full((batch, 1, 1), pad_id, np.int32),
        "sentence_seeds": np.zeros(batch, np.int32),
        **{name: value.copy() for name, value in STEERING_DEFAULTS.items()},
    }


def export_translate(model, vocab_path, path, search, steering=False):
    """Writes `translate.onnx` to `path`: strings in, strings out (see the module docstring).

    Args:
        model: a trained `Transformer` (TensorFlow backend).
        vocab_path: its SentencePiece model file (embedded in the graph).
        path: the file to write.
        search: dict with `beam_size`, `alpha`, `max_extra_length`: the
            defaults of the optional inputs. Beam sizes 1 and `beam_size`
            are in the graph.
        steering: write translate_steered.onnx instead: the same with the
            optional steering inputs (`STEERING_TEXT_INPUTS`).

    Returns:
        dict of what config.json records about the graph.
    """
    import onnx

    beam_sizes = tuple(sorted({1, int(search["beam_size"])}))
    rule = dict(stopping=search.get("stopping", PAPER.stopping),
                patience=search.get("patience", PAPER.patience),
                length_ratio=search.get("length_ratio", PAPER.length_ratio))  # fmt: skip
    defaults = {
        "beam_size": np.array(search["beam_size"], np.int32),
        "alpha": np.array(search["alpha"], np.float32),
        "max_extra_length": np.array(search["max_extra_length"], np.int32),
    }
    config = model.config
    search_graph = _convert(
        search_function(model, beam_sizes, **rule, steering=steering), TRANSLATE_OPSET,
        check_feeds=_check_feeds(config, beam_sizes, defaults, steering=steering),
    )  # fmt: skip
    with open(vocab_path, "rb") as f:
        vocab_model = f.read()
    translate = text_to_text(
        search_graph, vocab_model, config.max_length, config.eos_id, config.pad_id,
        {**defaults, **STEERING_DEFAULTS} if steering else defaults,
    )  # fmt: skip
    onnx.checker.check_model(translate)
    onnx.save(translate, path)
    if steering:
        return {
            "graph": os.path.basename(path),
            "inputs": list(TRANSLATE_INPUTS + STEERING_TEXT_INPUTS),
            "defaults": {name: value.item() for name, value in STEERING_DEFAULTS.items()},
        }
    return {
        "inputs": list(TRANSLATE_INPUTS),
        "outputs": ["translations"],
        "beam_sizes": list(beam_sizes),
        "defaults": {name: value.item() for name, value in defaults.items()},
        "search_rule": rule,  # baked into the graph
        "opset": TRANSLATE_OPSET,
    }


INT8_GRAPH = "translate_int8.onnx"
STEERED_GRAPH = "translate_steered.onnx"


def export_onnx(model, vocab_path, export_dir, opset=DEFAULT_OPSET, search=None):
    """Writes translate.onnx, translate_int8.onnx, encoder.onnx, decoder_step.onnx,
    vocab.model and config.json.

    Args:
        model: a trained `Transformer` (TensorFlow backend).
        vocab_path: its SentencePiece model file, copied next to the graphs.
        export_dir: an existing, empty directory.
        opset: ONNX opset of encoder.onnx and decoder_step.onnx, at most 18
            (tf2onnx's maximum); translate.onnx uses `TRANSLATE_OPSET`.
        search: a `SearchConfig`, or a dict of the settings that replace the
            paper's (`beam_size`, `alpha`, `max_extra_length`): the defaults of
            translate.onnx.
    """
    if not 13 <= opset <= 18:
        raise ValueError(
            f"opset must be in [13, 18] (tf2onnx supports up to 18). Received: opset={opset}"
        )
    import onnx

    search = SearchConfig.from_dict(search).to_dict()
    translate = export_translate(
        model, vocab_path, os.path.join(export_dir, "translate.onnx"), search
    )
    onnx.save(_convert(encoder_function(model), opset), os.path.join(export_dir, "encoder.onnx"))
    onnx.save(
        _convert(decoder_step_function(model), opset),
        os.path.join(export_dir, "decoder_step.onnx"),
    )
    translate["int8"] = quantize_translate(
        os.path.join(export_dir, "translate.onnx"), os.path.join(export_dir, INT8_GRAPH)
    )
    # Last: its conversion's memory is freed when the steered graph's starts.
    translate["steering"] = export_translate(
        model, vocab_path, os.path.join(export_dir, STEERED_GRAPH), search, steering=True
    )
    shutil.copyfile(vocab_path, os.path.join(export_dir, "vocab.model"))
    config = {
        "model": dataclasses.asdict(model.config),
        "search": search,
        "opset": opset,
        "translate": translate,
        "encoder": {"inputs": ["source_ids"], "outputs": list(ENCODER_OUTPUTS)},
        "decoder_step": {"inputs": list(DECODER_INPUTS), "outputs": list(DECODER_OUTPUTS)},
    }
    with open(os.path.join(export_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return export_dir
