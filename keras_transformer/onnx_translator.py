"""Translation with the exported ONNX graphs: onnxruntime + sentencepiece + numpy.

No TensorFlow or Keras at inference time. `OnnxTranslator` tokenizes with
the `sentencepiece` package (the same `vocab.model` as training, hence the
same ids as the in-graph TensorFlow Text tokenizer), runs `encoder.onnx`
once and `decoder_step.onnx` once per output position, and searches on the
host with numpy ports of `decoding.greedy_search` and `decoding.beam_search`
(same stopping rules, length penalty and tie-breaking, so the outputs match
the Keras model's; tests compare them).

Example:

    translator = OnnxTranslator("saved_models/transformer/onnx/1")
    translator.translate(["Das Haus ist klein."])            # beam 4, alpha 0.6
    translator.translate(["Das Haus ist klein."], beam_size=1)  # greedy
"""

import json
import os

import numpy as np

NEG_INF = -1.0e7  # decoding.NEG_INF


def length_penalty(length, alpha):
    """GNMT length penalty, as `decoding.length_penalty`."""
    return ((5.0 + np.asarray(length, np.float32)) / 6.0) ** np.float32(alpha)


def _top_k(values, k):
    """`(values, indices)`: the k largest per row, lower index first on ties (as `top_k`)."""
    indices = np.argsort(-values, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(values, indices, axis=1), indices.astype(np.int32)


def _log_softmax(logits):
    logits = logits.astype(np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def greedy_search(step_fn, cache, start_ids, max_length, max_lengths, eos_id, pad_id=0):
    """Numpy `decoding.greedy_search`: `(B, T)` int32 ids, EOS included, `pad_id` after."""
    batch_size = start_ids.shape[0]
    tokens = np.full((batch_size, max_length), pad_id, np.int32)
    finished = np.zeros(batch_size, bool)
    last_ids = start_ids.astype(np.int32)
    for step in range(max_length):
        if finished.all():
            break
        logits, cache = step_fn(last_ids, cache)  # (B, V)
        next_ids = np.where(finished, pad_id, logits.argmax(axis=-1)).astype(np.int32)
        tokens[:, step] = next_ids
        finished |= (next_ids == eos_id) | (step + 1 >= max_lengths)
        last_ids = next_ids
    return tokens


def beam_search(
    step_fn, cache, start_ids, max_length, max_lengths, eos_id, beam_size=4, alpha=0.6, pad_id=0,
    reorder=None,
):  # fmt: skip
    """Numpy `decoding.beam_search`; returns the `(B, T)` best hypotheses.

    `reorder` names the cache entries that differ between beams (the
    self-attention cache); the others (the source side) are tiled once and
    never reordered, since beams only ever take parents from their own
    sentence. Default: every entry.
    """
    k = beam_size
    batch_size = start_ids.shape[0]
    reorder = list(cache) if reorder is None else list(reorder)
    cache = {name: np.repeat(value, k, axis=0) for name, value in cache.items()}
    last_ids = np.repeat(start_ids.astype(np.int32), k)
    alive_seqs = np.full((batch_size * k, max_length), pad_id, np.int32)
    finished_seqs = alive_seqs.copy()
    alive_log_probs = np.tile(np.array([[0.0] + [NEG_INF] * (k - 1)], np.float32), (batch_size, 1))
    finished_scores = np.full((batch_size, k), NEG_INF, np.float32)
    finished_flags = np.zeros((batch_size, k), bool)
    limit_penalty = length_penalty(max_lengths, alpha)
    beam_offsets = (np.arange(batch_size, dtype=np.int32) * k)[:, None]  # (B, 1)

    for step in range(max_length):
        best_reachable = alive_log_probs.max(axis=1) / limit_penalty
        worst_finished = np.where(finished_flags, finished_scores, 2 * NEG_INF).min(axis=1)
        if np.all((worst_finished > best_reachable) | (step >= max_lengths)):
            break
        logits, cache = step_fn(last_ids, cache)  # (B*K, V)
        vocab_size = logits.shape[-1]
        log_probs = _log_softmax(logits).reshape(batch_size, k, vocab_size)
        candidates = (alive_log_probs[:, :, None] + log_probs).reshape(batch_size, k * vocab_size)
        top_log_probs, top_indices = _top_k(candidates, 2 * k)  # (B, 2K)
        top_beams = top_indices // vocab_size + beam_offsets  # rows of alive_seqs
        top_ids = (top_indices % vocab_size).astype(np.int32)
        top_seqs = alive_seqs[top_beams.reshape(-1)]  # (B*2K, T)
        top_seqs[:, step] = top_ids.reshape(-1)
        ends = (top_ids == eos_id) | (step + 1 >= max_lengths)[:, None]

        alive_log_probs, keep = _top_k(np.where(ends, NEG_INF, top_log_probs), k)
        keep = (keep + 2 * beam_offsets).reshape(-1)  # rows of top_seqs
        alive_seqs = top_seqs[keep]
        last_ids = top_ids.reshape(-1)[keep]
        parents = top_beams.reshape(-1)[keep]
        for name in reorder:
            cache[name] = np.take(cache[name], parents, axis=0)  # faster than fancy indexing

        new_scores = np.where(ends, top_log_probs / length_penalty(step + 1, alpha), NEG_INF)
        scores = np.concatenate([finished_scores, new_scores.astype(np.float32)], axis=1)
        flags = np.concatenate([finished_flags, ends], axis=1)
        finished_scores, pick = _top_k(scores, k)
        finished_flags = np.take_along_axis(flags, pick, axis=1)
        new_rows = batch_size * k + (pick - k) + 2 * beam_offsets  # rows of top_seqs below
        rows = np.where(pick < k, pick + beam_offsets, new_rows)
        finished_seqs = np.concatenate([finished_seqs, top_seqs], axis=0)[rows.reshape(-1)]
    return finished_seqs.reshape(batch_size, k, max_length)[:, 0]


def _is_blank(sentence):
    if isinstance(sentence, bytes):
        sentence = sentence.decode("utf-8", errors="replace")
    return not sentence.strip()


class OnnxTranslator:
    """Translates text with `encoder.onnx` and `decoder_step.onnx` on onnxruntime.

    Args:
        export_dir: an ONNX export (`encoder.onnx`, `decoder_step.onnx`,
            `vocab.model`, `config.json`), e.g. `saved_models/<name>/onnx/<version>`.
        beam_size, alpha, max_extra_length: search defaults; None takes
            the values in config.json (those of the SavedModel).
        providers: onnxruntime execution providers (default CPU).
        intra_op_num_threads: onnxruntime threads per session (0 = all cores).
    """

    def __init__(
        self,
        export_dir,
        beam_size=None,
        alpha=None,
        max_extra_length=None,
        providers=("CPUExecutionProvider",),
        intra_op_num_threads=0,
    ):
        import onnxruntime as ort
        import sentencepiece as spm

        files = ("encoder.onnx", "decoder_step.onnx", "vocab.model", "config.json")
        missing = [f for f in files if not os.path.isfile(os.path.join(export_dir, f))]
        if missing:
            raise FileNotFoundError(f"{export_dir!r} is not an ONNX export: missing {missing}")
        with open(os.path.join(export_dir, "config.json")) as f:
            config = json.load(f)
        self.config = config["model"]
        search = config.get("search", {})
        self.beam_size = beam_size or search.get("beam_size", 4)
        self.alpha = search.get("alpha", 0.6) if alpha is None else alpha
        self.max_extra_length = (
            search.get("max_extra_length", 50) if max_extra_length is None else max_extra_length
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_num_threads

        def session(name):
            path = os.path.join(export_dir, name)
            return ort.InferenceSession(path, options, providers=list(providers))

        self.encoder = session("encoder.onnx")
        self.decoder_step = session("decoder_step.onnx")
        self.processor = spm.SentencePieceProcessor(
            model_file=os.path.join(export_dir, "vocab.model")
        )

    def encode(self, sentences):
        """Strings (or UTF-8 bytes) -> `(B, S)` int32 source ids ending with EOS, 0-padded.

        As the SavedModel does: invalid UTF-8 becomes U+FFFD and sentences
        are truncated to `max_length - 1` pieces before EOS.
        """
        cfg = self.config
        rows = []
        for sentence in sentences:
            if isinstance(sentence, bytes):
                sentence = sentence.decode("utf-8", errors="replace")
            if not isinstance(sentence, str):
                raise TypeError(
                    f"Sentences must be str or bytes. Received: {type(sentence).__name__} "
                    f"{sentence!r}"
                )
            rows.append(self.processor.encode(sentence)[: cfg["max_length"] - 1] + [cfg["eos_id"]])
        source_ids = np.full((len(rows), max(map(len, rows), default=1)), cfg["pad_id"], np.int32)
        for i, row in enumerate(rows):
            source_ids[i, : len(row)] = row
        return source_ids

    def decode(self, target_ids):
        """`(B, T)` output ids -> strings (the pieces before the first EOS)."""
        eos_id = self.config["eos_id"]
        texts = []
        for row in np.asarray(target_ids).tolist():
            row = row[: row.index(eos_id)] if eos_id in row else row
            texts.append(self.processor.decode(row))
        return texts

    def _step(self, token_ids, cache):
        feeds = {
            "token_ids": token_ids.astype(np.int32),
            "index": cache["index"],
            "self_key": cache["self_key"],
            "self_value": cache["self_value"],
            "cross_key": cache["cross_key"],
            "cross_value": cache["cross_value"],
            "source_mask": cache["source_mask"],
        }
        logits, self_key, self_value = self.decoder_step.run(None, feeds)
        cache = dict(cache, index=cache["index"] + 1, self_key=self_key, self_value=self_value)
        return logits, cache

    def translate_ids(self, source_ids, beam_size=None, alpha=None):
        """`(B, S)` source ids -> `(B, T)` output ids, as `decoding.translate_ids`."""
        cfg = self.config
        beam_size = beam_size or self.beam_size
        alpha = self.alpha if alpha is None else alpha
        source_ids = np.asarray(source_ids, np.int32)
        if source_ids.ndim != 2:
            raise ValueError(
                f"source_ids must be (batch, length). Received: shape={source_ids.shape}"
            )
        batch_size, source_length = source_ids.shape
        lengths = (source_ids != cfg["pad_id"]).sum(axis=1)
        max_lengths = np.minimum(np.maximum(lengths + self.max_extra_length, 1), cfg["max_length"])
        buffer_length = min(source_length + self.max_extra_length, cfg["max_length"])
        if batch_size == 0:
            return np.zeros((0, buffer_length), np.int32)
        cross_key, cross_value, source_mask = self.encoder.run(None, {"source_ids": source_ids})
        _, layers, _, heads, head_size = cross_key.shape  # (B, L, S, N, H)
        self_shape = (batch_size, layers, buffer_length, heads, head_size)
        cache = {
            "index": np.zeros(batch_size, np.int32),
            "self_key": np.zeros(self_shape, np.float32),
            "self_value": np.zeros(self_shape, np.float32),
            "cross_key": cross_key,
            "cross_value": cross_value,
            "source_mask": source_mask,
        }
        start_ids = np.full(batch_size, cfg["bos_id"], np.int32)
        search = dict(max_lengths=max_lengths, eos_id=cfg["eos_id"], pad_id=cfg["pad_id"])
        banned = [cfg["pad_id"], cfg["bos_id"]]

        def step(token_ids, cache):  # never PAD or BOS, as `decoding.suppress_tokens`
            logits, cache = self._step(token_ids, cache)
            logits[:, banned] = NEG_INF
            return logits, cache

        if beam_size == 1:
            return greedy_search(step, cache, start_ids, buffer_length, **search)
        return beam_search(
            step, cache, start_ids, buffer_length, beam_size=beam_size, alpha=alpha,
            reorder=("index", "self_key", "self_value"), **search,
        )  # fmt: skip

    def translate(self, sentences, beam_size=None, alpha=None):
        """list of str -> list of str (beam search by default; `beam_size=1` is greedy)."""
        if isinstance(sentences, (str, bytes)):
            raise TypeError(f"translate() takes a list of sentences. Received: {sentences!r:.80}")
        sentences = list(sentences)
        if not sentences:
            return []
        translations = self.decode(self.translate_ids(self.encode(sentences), beam_size, alpha))
        # As `Translator`: a blank sentence translates to "".
        return ["" if _is_blank(s) else t for s, t in zip(sentences, translations, strict=True)]
