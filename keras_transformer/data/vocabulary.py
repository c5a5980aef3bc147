"""The shared SentencePiece BPE vocabulary of both languages.

Training and evaluation tokenize with the `sentencepiece` package
(`SentencePieceTokenizer`), on every backend and without TensorFlow; the
exported graphs tokenize with TF Text's ops on the same model file
(`load_keras_hub_tokenizer`), which give the same ids (tests/test_vocabulary.py).
"""

import logging
import os
import re

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


def train_vocabulary(train_pairs, path, vocab_size, max_sentences=300_000, byte_fallback=None,
                     user_defined_symbols=()):  # fmt: skip
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
        train_pairs: list of `(source, target)` strings.
        path: output file, usually `<work_dir>/vocab.model`.
        vocab_size: int.
        max_sentences: int. Trains on the first this many lines (source and
            target count separately): BPE merges converge long before the
            Ding dictionary's 750k lines, and training takes minutes on 2 cores.
        user_defined_symbols: strings kept as one piece each wherever they occur
            (SentencePiece's option; the model file records them): the glossary
            tags of `--terminology` (`terminology.TAGS`). They count towards
            `vocab_size` and take the ids after the four special ones.
        byte_fallback: bool, or None for `vocab_size >=
            BYTE_FALLBACK_MIN_VOCAB_SIZE`: the 256 byte pieces do not fit in the
            tests' 64-piece vocabularies, and cost too many merges in small ones.
    """
    if byte_fallback is None:
        byte_fallback = vocab_size >= BYTE_FALLBACK_MIN_VOCAB_SIZE
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        _train_bpe(
            temporary, train_pairs, vocab_size, max_sentences, byte_fallback, user_defined_symbols
        )
    except RuntimeError as error:
        os.remove(temporary)
        _raise_clearer_error(error, vocab_size, byte_fallback)
        raise
    os.replace(temporary, path)  # atomic: a concurrent reader never sees half a file
    logger.info(
        "Trained a %d-piece BPE vocabulary (byte_fallback=%s): %s", vocab_size, byte_fallback, path
    )


def _train_bpe(path, train_pairs, vocab_size, max_sentences, byte_fallback, user_defined_symbols):
    """Runs SentencePiece's BPE training with `train_vocabulary`'s options, written to `path`."""
    with open(path, "wb") as model_writer:
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
            user_defined_symbols=list(user_defined_symbols),
            minloglevel=1,  # warnings and errors only: its INFO log is a page per run
        )


def _raise_clearer_error(error, vocab_size, byte_fallback):
    """Raises a ValueError that says what to change for the SentencePiece training
    errors a flag causes; returns for the others (the caller re-raises them)."""
    too_high = re.search(r"Vocabulary size too high \((\d+)\)\. .*<= (\d+)", str(error))
    if too_high:  # the corpus holds fewer distinct pieces than asked for
        largest = int(too_high.group(2))
        if byte_fallback and largest < BYTE_FALLBACK_MIN_VOCAB_SIZE:
            largest -= 256  # that size has no byte pieces, which SentencePiece counted
        raise ValueError(
            f"The training pairs are too few for a {vocab_size}-piece vocabulary: "
            f"SentencePiece can make at most {largest} pieces of them; "
            f"use --vocab-size {largest} or less, or more data."
        ) from None
    if byte_fallback and "smaller than required_chars" in str(error):
        raise ValueError(
            f"vocab_size={vocab_size} is too small for byte_fallback=True, whose 256 byte "
            f"pieces count towards it: {error}"
        ) from error


class SentencePieceTokenizer:
    """The `sentencepiece` package's tokenizer of a model file, with the two
    methods `Translator` and the input pipeline call.

    Args:
        path: a SentencePiece model file (`vocab.model`).

    Example:

        tokenizer = SentencePieceTokenizer("work/vocab.model")
        ids = tokenizer.tokenize(["Guten Morgen."])  # [[...]]: lists of int, no EOS
        tokenizer.detokenize(ids)  # ["Guten Morgen."]
    """

    def __init__(self, path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No SentencePiece model at {path}")
        self.path = path
        self.processor = sentencepiece.SentencePieceProcessor(model_file=path)

    def vocabulary_size(self):
        return self.processor.vocab_size()

    def id_to_token(self, token_id):
        """The piece of `token_id`, e.g. "▁Haus" (keras-hub's name for it)."""
        return self.processor.id_to_piece(int(token_id))

    def tokenize(self, texts):
        """list of str -> list of lists of int ids."""
        return self.processor.encode(list(texts), out_type=int)

    def detokenize(self, ids):
        """lists of int ids -> list of str."""
        return self.processor.decode([[int(i) for i in row] for row in ids])


def load_tokenizer(path):
    """The `SentencePieceTokenizer` of the model file at `path`."""
    return SentencePieceTokenizer(path)


def load_keras_hub_tokenizer(path):
    """A `keras_hub.tokenizers.SentencePieceTokenizer` (TF Text ops, for the
    exported graphs) of the model file at `path`."""
    import keras_hub

    if not os.path.isfile(path):
        raise FileNotFoundError(f"No SentencePiece model at {path}")
    return keras_hub.tokenizers.SentencePieceTokenizer(proto=path, dtype="int32")


def _lines(pairs, count):
    """The first `count` lines of `pairs` read side by side: source, target, source, ..."""
    lines = 0
    for pair in pairs[: (count + 1) // 2]:
        for line in pair:
            if lines == count:
                return
            lines += 1
            yield line.encode("utf-8")


def get_tokenizer(path, train_pairs, vocab_size, user_defined_symbols=(), max_sentences=300_000):
    """Loads `path`, training it first (on the first `max_sentences` lines) if it does
    not exist; checks its size and that each of `user_defined_symbols` is one piece of it."""
    if not os.path.exists(path):
        train_vocabulary(train_pairs, path, vocab_size, max_sentences,
                         user_defined_symbols=user_defined_symbols)  # fmt: skip
    tokenizer = load_tokenizer(path)
    missing = [
        symbol for symbol in user_defined_symbols
        if tokenizer.processor.piece_to_id(symbol) == tokenizer.processor.unk_id()
    ]  # fmt: skip
    if missing:
        raise ValueError(
            f"{path} was trained without the pieces {', '.join(missing)} (the glossary tags "
            "of --terminology); train in a new --work-dir (or --overwrite), or without "
            "--terminology."
        )
    pieces = tokenizer.vocabulary_size()
    if pieces != vocab_size:
        raise ValueError(
            f"{path} has {pieces} pieces but vocab_size={vocab_size}; "
            "delete it or use another --work-dir to train a new vocabulary."
        )
    return tokenizer
