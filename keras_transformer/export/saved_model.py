"""SavedModel export for TF Serving: text in, text out, beam search in the graph.

The exported signatures use only core TensorFlow ops and the SentencePiece
ops of TensorFlow Text, so the SavedModel loads with `import tensorflow_text`
and no project code, and runs in the `tensorflow/serving` image:

    serving_default    sentences (string [B])      -> translations (string [B])   beam search
    translate_greedy   sentences (string [B])      -> translations (string [B])   greedy
    translate_ids      source_ids (int32 [B, S])   -> target_ids (int32 [B, T])   beam search
    greedy_ids         source_ids (int32 [B, S])   -> target_ids (int32 [B, T])   greedy
    translate_steered  sentences (string [B]),                 -> translations (string [B])
                       target_prefix (string [B]),  "" for none
                       banned (string [B, N]),      "" for none
                       seeds (int32 [B]),
                       sampling_topk (int32 []),    1: the beam search; K > 1 or 0: sampling
                       sampling_temperature (float32 [])

`source_ids` are SentencePiece ids ending with EOS, padded with 0;
`target_ids` hold the output without BOS, EOS included, 0 after it.
`translate_steered` is `Translator.translate`'s `target_prefix`, `banned`,
`sampling_topk`, `sampling_temperature` and a seed per sentence (`seed=[...]`,
or `translator.steering_seeds(seed, B)` for an int's), with the same outputs;
the prefix and the banned words are tokenized in the graph as `Translator`
tokenizes them (a banned word bans its word-initial pieces). The other
signatures do not change: TF Serving's text-only `serving_default` stays as it is.
"""

import json
import os

import keras
import tensorflow as tf

from keras_transformer.decoding import translate_ids
from keras_transformer.search import PAPER, SearchConfig
from keras_transformer.serving import frontend

SIGNATURES = (
    "serving_default", "translate_greedy", "translate_ids", "greedy_ids", "translate_steered"
)  # fmt: skip


def encode_sentences(tokenizer, sentences, max_source_length, eos_id, pad_id=0):
    """`(B,)` strings -> `(B, S)` int32 source ids ending with EOS, `pad_id`-padded.

    Invalid UTF-8 is replaced by U+FFFD first (as Python's
    `bytes.decode("utf-8", "replace")` does), NUL removed
    (`frontend.clean`), and sentences longer than
    `max_source_length - 1` pieces are truncated, so every input gives a
    defined output.
    """
    sentences = tf.strings.unicode_transcode(
        sentences, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )
    sentences = tf.strings.regex_replace(sentences, r"\x00", "")  # frontend.clean
    pieces = tokenizer(sentences)  # ragged (B, None) int32
    pieces = tf.cast(pieces[:, : frontend.max_source_pieces(max_source_length)], tf.int32)
    eos = tf.fill([pieces.nrows(), 1], tf.constant(eos_id, tf.int32))  # (B, 1)
    source = tf.concat([pieces, tf.RaggedTensor.from_tensor(eos)], axis=1)
    return at_least_one_column(source.to_tensor(default_value=pad_id), pad_id)  # (B, S)


def at_least_one_column(ids, pad_id=0):
    """Pads `(B, 0)` ids (an empty batch densifies to 0 columns) to `(B, 1)`."""
    missing = tf.maximum(1 - tf.shape(ids)[1], 0)
    return tf.pad(ids, [[0, 0], [0, missing]], constant_values=pad_id)


_BLANK = "(?:" + frontend.BLANK_CHARACTERS + r"|\x00)*"  # NUL: removed (`frontend.clean`)


def is_blank(sentences):
    """`(B,)` bool: empty or whitespace-only (`not sentence.strip()` in Python)."""
    valid = tf.strings.unicode_transcode(sentences, "UTF-8", "UTF-8", errors="replace")
    return tf.strings.regex_full_match(valid, _BLANK)


def encode_phrases(tokenizer, phrases, pad_id=0):
    """`(R,)` strings -> `(R, L)` int32 piece ids, `pad_id` after each, L >= 1: prefixes
    and banned words as `Translator` tokenizes them (no EOS, blank -> no pieces)."""
    phrases = tf.strings.unicode_transcode(
        phrases, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )
    phrases = tf.strings.regex_replace(phrases, r"\x00", "")  # frontend.clean
    phrases = tf.where(is_blank(phrases), "", phrases)
    pieces = tf.cast(tokenizer(phrases), tf.int32)  # ragged (R, None)
    return at_least_one_column(pieces.to_tensor(default_value=pad_id), pad_id)


def steered_ids(model, source_ids, beam_size, prefix_ids, banned_ids, seeds, sampling_topk,
                sampling_temperature, **search):  # fmt: skip
    """`translate_ids` with every steering input a tensor: sampling (the greedy loop)
    where `sampling_topk != 1`, else the search of `beam_size`; the prefix and the
    bans in both (all `pad_id`: none)."""

    def greedy_or_sampled():
        return translate_ids(
            model, source_ids, 1, **search, prefix_ids=prefix_ids, banned_ids=banned_ids,
            sampling=(sampling_temperature, sampling_topk), seeds=seeds,
        )  # fmt: skip

    if beam_size == 1:
        return greedy_or_sampled()

    def beam():
        return translate_ids(model, source_ids, beam_size, **search, prefix_ids=prefix_ids,
                             banned_ids=banned_ids)  # fmt: skip

    return tf.cond(tf.equal(sampling_topk, 1), beam, greedy_or_sampled)


def decode_ids(tokenizer, target_ids, eos_id):
    """`(B, T)` output ids -> `(B,)` strings: everything before the first EOS, detokenized."""
    target_ids = tf.cast(target_ids, tf.int32)
    is_eos = tf.cast(tf.equal(target_ids, eos_id), tf.int32)
    before_eos = tf.equal(tf.cumsum(is_eos, axis=1), 0)  # (B, T) True before the first EOS
    lengths = tf.reduce_sum(tf.cast(before_eos, tf.int32), axis=1)
    pieces = tf.RaggedTensor.from_tensor(target_ids, lengths=lengths)
    return tokenizer.detokenize(pieces)  # (B,) string


def export_saved_model(
    model, tokenizer, export_dir, beam_size=PAPER.beam_size, alpha=PAPER.alpha,
    max_extra_length=PAPER.max_extra_length, stopping=PAPER.stopping, patience=PAPER.patience,
    length_ratio=PAPER.length_ratio,
):  # fmt: skip
    """Writes the four signatures of a `Transformer` and its tokenizer to `export_dir`.

    Args:
        model: a trained `Transformer` (TensorFlow backend).
        tokenizer: a keras-hub `SentencePieceTokenizer` with the model's vocabulary.
        export_dir: directory to write (TF Serving's `<name>/<version>`).
        beam_size, alpha, max_extra_length, stopping, patience, length_ratio:
            search settings baked into the signatures (`search.SearchConfig`).
    """
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "SavedModel export needs KERAS_BACKEND=tensorflow. "
            f"Received: backend={keras.backend.backend()!r}"
        )
    settings = SearchConfig(
        beam_size, alpha, max_extra_length, stopping, patience, length_ratio
    ).to_dict()
    search = {key: value for key, value in settings.items() if key != "beam_size"}
    tokenizer.build(None)  # the SentencePiece op must exist before tracking
    signatures = _Signatures(model, tokenizer, search, beam_size)
    text = [tf.TensorSpec([None], tf.string, name="sentences")]
    ids = [tf.TensorSpec([None, None], tf.int32, name="source_ids")]
    steering = text + [
        tf.TensorSpec([None], tf.string, name="target_prefix"),
        tf.TensorSpec([None, None], tf.string, name="banned"),
        tf.TensorSpec([None], tf.int32, name="seeds"),
        tf.TensorSpec([], tf.int32, name="sampling_topk"),
        tf.TensorSpec([], tf.float32, name="sampling_temperature"),
    ]
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(tokenizer)
    archive.add_endpoint("serving_default", signatures.text_to_text(beam_size), text)
    archive.add_endpoint("translate_greedy", signatures.text_to_text(1), text)
    archive.add_endpoint("translate_ids", signatures.ids_to_ids(beam_size), ids)
    archive.add_endpoint("greedy_ids", signatures.ids_to_ids(1), ids)
    archive.add_endpoint("translate_steered", signatures.steered, steering)
    archive.write_out(export_dir, verbose=False)
    # assets.extra/ is TF Serving's place for files next to a SavedModel; it ignores them.
    os.makedirs(os.path.join(export_dir, "assets.extra"), exist_ok=True)
    with open(os.path.join(export_dir, "assets.extra", "export_info.json"), "w") as f:
        json.dump({"search": settings, "signatures": SIGNATURES, "model": model.get_config()},
                  f, indent=2)  # fmt: skip
    return export_dir


class _Signatures:
    """The SavedModel's functions over one model, tokenizer and search."""

    def __init__(self, model, tokenizer, search, beam_size):
        self.model, self.tokenizer, self.search = model, tokenizer, search
        self.config, self.beam_size = model.config, beam_size

    def _source_ids(self, sentences):
        config = self.config
        return encode_sentences(
            self.tokenizer, sentences, config.max_length, config.eos_id, config.pad_id
        )

    def text_to_text(self, beam):
        def translate(sentences):
            # Signatures do not check ranks: refuse [["a", "b"]] instead of translating it.
            sentences = tf.ensure_shape(sentences, [None])
            source_ids = self._source_ids(sentences)
            target_ids = translate_ids(self.model, source_ids, beam, **self.search)
            translations = decode_ids(self.tokenizer, target_ids, self.config.eos_id)
            # As `Translator`: a blank sentence translates to "".
            return {"translations": tf.where(is_blank(sentences), "", translations)}

        return translate

    def ids_to_ids(self, beam):
        config = self.config

        def translate(source_ids):
            source_ids = tf.cast(source_ids[:, : config.max_length], tf.int32)
            source_ids = at_least_one_column(source_ids, config.pad_id)
            return {"target_ids": translate_ids(self.model, source_ids, beam, **self.search)}

        return translate

    def steered(self, sentences, target_prefix, banned, seeds, sampling_topk,
                sampling_temperature):  # fmt: skip
        tokenizer, config = self.tokenizer, self.config
        sentences = tf.ensure_shape(sentences, [None])
        source_ids = self._source_ids(sentences)
        prefix_ids = encode_phrases(tokenizer, target_prefix, config.pad_id)  # (B, P)
        shape = tf.shape(banned)  # (B, N)
        banned_ids = encode_phrases(tokenizer, tf.reshape(banned, [-1]), config.pad_id)
        banned_ids = tf.reshape(banned_ids, [shape[0], shape[1], tf.shape(banned_ids)[1]])
        target_ids = steered_ids(
            self.model, source_ids, self.beam_size, prefix_ids, banned_ids, seeds,
            sampling_topk, sampling_temperature, **self.search,
        )  # fmt: skip
        translations = decode_ids(tokenizer, target_ids, config.eos_id)
        return {"translations": tf.where(is_blank(sentences), "", translations)}
