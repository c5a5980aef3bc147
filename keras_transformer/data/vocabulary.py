"""The shared SentencePiece BPE vocabulary of both languages."""

import logging
import os

import keras_hub
import sentencepiece

logger = logging.getLogger(__name__)


# `byte_fallback=None` turns byte fallback on from this vocabulary size up. Its
# 256 byte pieces come out of `vocab_size`, and SentencePiece refuses a vocabulary
# smaller than 4 + 256 + the characters that cover 99.95% of the text (328 for
# 300k Ding lines). Trained on 200k Ding lines and measured on 100k others (0.7%
# of which hold a character outside the vocabulary, which would be " ⁇ "), byte
# fallback costs 19% more tokens per line at 500 pieces, 6.4% at 1,000 and 1.4%
# at 4,000.
BYTE_FALLBACK_MIN_VOCAB_SIZE = 1000


def train_vocabulary(train_pairs, path, vocab_size, max_sentences=300_000, byte_fallback=None):
    """Trains a BPE SentencePiece model on both sides of `train_pairs`, written to `path`.

    Reserves pad_id=0, unk_id=1, bos_id=2, eos_id=3 (the `TransformerConfig`
    defaults) and normalizes with `nmt_nfkc`, as
    `keras_hub.tokenizers.compute_sentence_piece_proto` does; it is not called
    because it passes no other option to SentencePiece.

    With byte fallback, a character outside the vocabulary becomes the pieces
    of its UTF-8 bytes (`<0xF0><0x9F><0x8F><0xA0>` for 🏠), which the model can
    copy and detokenization turns back into the character; without it, the
    character becomes `<unk>`, detokenized as " ⁇ ". `character_coverage`
    stays at SentencePiece's default 0.9995, so rare characters are left to
    the byte pieces instead of taking a piece each.

    Args:
        train_pairs: `tf.data.Dataset` of `(source, target)` strings.
        path: output file, usually `<work_dir>/vocab.model`.
        vocab_size: int.
        max_sentences: int. Trains on the first this many lines (source and
            target count separately): BPE merges converge long before the
            Ding dictionary's 750k lines, and training takes minutes on 2 cores.
        byte_fallback: bool, or None for `vocab_size >=
            BYTE_FALLBACK_MIN_VOCAB_SIZE`: the 256 byte pieces do not fit in the
            tests' 64-piece vocabularies, and cost too many merges in small ones.
    """
    if byte_fallback is None:
        byte_fallback = vocab_size >= BYTE_FALLBACK_MIN_VOCAB_SIZE
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        with open(temporary, "wb") as model_writer:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=_lines(train_pairs, max_sentences),
                model_writer=model_writer,
                vocab_size=vocab_size,
                model_type="bpe",
                normalization_rule_name="nmt_nfkc",
                pad_id=0,
                unk_id=1,
                bos_id=2,
                eos_id=3,
                byte_fallback=byte_fallback,
                minloglevel=1,  # warnings and errors only: its INFO log is a page per run
            )
    except RuntimeError as error:
        os.remove(temporary)
        if byte_fallback and "smaller than required_chars" in str(error):
            raise ValueError(
                f"vocab_size={vocab_size} is too small for byte_fallback=True, whose 256 byte "
                f"pieces count towards it: {error}"
            ) from error
        raise
    os.replace(temporary, path)  # atomic: a concurrent reader never sees half a file
    logger.info(
        "Trained a %d-piece BPE vocabulary (byte_fallback=%s): %s", vocab_size, byte_fallback, path
    )


def load_tokenizer(path):
    """A `keras_hub.tokenizers.SentencePieceTokenizer` for the model file at `path`."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"No SentencePiece model at {path}")
    return keras_hub.tokenizers.SentencePieceTokenizer(proto=path, dtype="int32")


def _lines(pairs, count):
    """The first `count` lines of `pairs` read side by side: source, target, source, ...

    Read in batches: a `flat_map` to one line per element took 37 s for
    Ding's first 300,000 lines on 2 cores, these batches 5.6 s, in the same
    order, so the same vocabulary (`benchmarks/vocabulary_time.py`).
    """
    lines = 0
    for sources, targets in pairs.take((count + 1) // 2).batch(4096).as_numpy_iterator():
        for pair in zip(sources, targets, strict=True):
            for line in pair:
                if lines == count:
                    return
                lines += 1
                yield line


def get_tokenizer(path, train_pairs, vocab_size):
    """Loads `path`, training it first if it does not exist; checks its size."""
    if not os.path.exists(path):
        train_vocabulary(train_pairs, path, vocab_size)
    # Checked with the sentencepiece package: a throw-away keras-hub tokenizer
    # would, when garbage-collected, free the TF resource that others share.
    pieces = sentencepiece.SentencePieceProcessor(model_file=path).vocab_size()
    if pieces != vocab_size:
        raise ValueError(
            f"{path} has {pieces} pieces but vocab_size={vocab_size}; "
            "delete it or use another --work-dir to train a new vocabulary."
        )
    return load_tokenizer(path)
