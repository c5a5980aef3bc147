"""The text front-end of every translation path: input checks, blank input, batching.

`Translator` (Keras), the SavedModel (`export/saved_model.py`, TensorFlow
ops), `translate.onnx` (`export/onnx_text.py`, ONNX nodes) and
`OnnxTranslator` (which runs translate.onnx) follow one contract:

- a string gives its translation, a list gives a list in the same order;
  anything else in the list is a `TypeError` naming its index and type;
- U+0000 (NUL) is removed (`clean`): C strings end at it, so ONNX
  Runtime's string inputs and many callers in other languages would cut
  the sentence there, while SentencePiece keeps it as a byte piece. Other
  control characters are left to SentencePiece's normalizer, which drops
  them on every path;
- a blank sentence (empty, or only characters for which Python's
  `str.isspace()` is True: `BLANK_CHARACTERS`) translates to "" without
  taking a place in a batch;
- a sentence is cut to `max_source_pieces(max_length)` pieces, then EOS;
- the output is everything before the first EOS, detokenized;
- sentences run longest first, `batch_size` at a time (`batches_by_length`).

The graph exports implement the rules with their runtime's ops and take
the constants from here; the two translators share the host side. This
module imports neither Keras nor TensorFlow (`OnnxTranslator` uses it).
"""

# RE2 (TensorFlow's regex ops, onnxruntime-extensions' StringRegexReplace) character
# class of exactly the code points for which Python's `str.isspace()` is True
# (tests/test_serving_bad_input.py checks every code point).
BLANK_CHARACTERS = r"[\t\n\x0b\x0c\r\x1c-\x1f\x85\p{Z}]"


NUL = "\x00"


def clean(text):
    """`text` without U+0000, the one character the paths could see differently."""
    return text.replace(NUL, "")


def max_source_pieces(max_length):
    """Pieces kept of a source sentence: one position is left for EOS."""
    return max_length - 1


def check_sentences(sentences, caller, accept_bytes=False):
    """`sentences` as a list of str without NUL (`clean`); a str alone, or a non-string
    item, is a `TypeError`.

    With `accept_bytes`, UTF-8 bytes are decoded, invalid sequences replaced
    by U+FFFD (as the SavedModel does in its graph).
    """
    if isinstance(sentences, (str, bytes)):
        raise TypeError(
            "translate() expects a list of strings; use translator(text) for one. "
            f"Received: {sentences!r:.80}"
        )
    texts = []
    for i, sentence in enumerate(sentences):
        if accept_bytes and isinstance(sentence, bytes):
            sentence = sentence.decode("utf-8", errors="replace")
        if not isinstance(sentence, str):
            kinds = "str or bytes" if accept_bytes else "strings"
            raise TypeError(
                f"{caller} expects {kinds}; sentence {i} is a {type(sentence).__name__}: "
                f"{sentence!r:.80}"
            )
        texts.append(clean(sentence))
    return texts


def steering_seeds(seed, count):
    """`(count,)` int32 seeds, one per sentence, as every translator derives them from
    its `seed` (an int; None: a new one; a list of `count` ints: used as they are):
    what the SavedModel's `translate_steered` and translate.onnx take as `seeds`."""
    import numbers

    import numpy as np

    if seed is not None and not isinstance(seed, numbers.Integral):
        seeds = np.asarray(list(seed))
        if seeds.shape != (count,) or not np.issubdtype(seeds.dtype, np.integer):
            raise ValueError(
                f"seed must be an int or {count} ints, one per sentence. Received: {seed!r:.80}"
            )
        return seeds.astype("int32")
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0] >> 1)
    return np.random.default_rng(seed).integers(0, 2**31 - 1, count).astype("int32")


def check_sampling(sampling_topk, sampling_temperature):
    """The sampling settings of `Translator.translate` and the exports, checked."""
    if isinstance(sampling_topk, bool) or not isinstance(sampling_topk, int) or sampling_topk < 0:
        raise ValueError(f"top_k must be an integer >= 0. Received: top_k={sampling_topk!r}")
    if not sampling_temperature > 0:
        raise ValueError(f"temperature must be > 0. Received: temperature={sampling_temperature}")


def per_sentence(value, count, name):
    """`target_prefix` (one str for all, or one per sentence) as `count` strings, or
    `banned` / `constraints` (a list of str for all, or one list per sentence) as
    `count` lists of str; None stays None."""
    if value is None:
        return None
    if name == "target_prefix":
        rows = [value] * count if isinstance(value, str) else list(value)
        rows = check_sentences(rows, name)
    else:
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{name} takes a list of words or phrases. Received: {value!r:.80}")
        value = list(value)
        if not value or all(isinstance(v, str) for v in value):
            value = [value] * count
        elif any(isinstance(row, (str, bytes)) for row in value):
            raise TypeError(f"{name} takes a list of str, or one such list per sentence.")
        rows = [check_sentences(list(row), name) for row in value]
    if len(rows) != count:
        raise ValueError(
            f"{name} has {len(rows)} entries for {count} sentences: give one per sentence, "
            f"or one {'str' if name == 'target_prefix' else 'list of str'} for all."
        )
    return rows


def is_blank(text):
    """True for "" and whitespace-only text (translated to "" without the model)."""
    return not text.strip()


def batches_by_length(lengths, batch_size):
    """Lists of indices into `lengths`, longest first, at most `batch_size` each.

    Items of length 0 (blank sentences) are in no batch. Sorting by length
    keeps the padding of each batch small.
    """
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: -lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def run_batches(batches, run, progress=False):
    """Calls `run(batch)` for each batch of `batches_by_length`, with a progress bar
    (tqdm, on stderr) counting sentences when `progress`."""
    bar = None
    if progress:
        from tqdm import tqdm

        total = sum(len(batch) for batch in batches)
        bar = tqdm(total=total, unit="sentence", desc="translate", leave=False)
    for batch in batches:
        run(batch)
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()


def newest_version(export_dir):
    """`export_dir`, or where it holds TF Serving's integer version folders and no
    export of its own, its newest version: `OnnxTranslator("saved_models/NAME/onnx")`
    loads what the last export call wrote, as TF Serving serves the newest."""
    import os

    if not os.path.isdir(export_dir) or any(
        os.path.isfile(os.path.join(export_dir, name))
        for name in ("config.json", "keras_transformer.json", "saved_model.pb")
    ):
        return export_dir
    versions = [int(name) for name in os.listdir(export_dir) if name.isdigit()]
    return os.path.join(export_dir, str(max(versions))) if versions else export_dir
