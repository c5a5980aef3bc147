"""The shared SentencePiece BPE vocabulary of both languages."""

import logging
import os

import keras_hub
import sentencepiece
import tensorflow as tf

logger = logging.getLogger(__name__)


def train_vocabulary(train_pairs, path, vocab_size, max_sentences=300_000):
    """Trains a BPE SentencePiece model on both sides of `train_pairs`, written to `path`.

    Uses `keras_hub.tokenizers.compute_sentence_piece_proto`, which reserves
    pad_id=0, unk_id=1, bos_id=2, eos_id=3 (the `TransformerConfig` defaults).

    Args:
        train_pairs: `tf.data.Dataset` of `(source, target)` strings.
        path: output file, usually `<work_dir>/vocab.model`.
        vocab_size: int.
        max_sentences: int. Trains on the first this many lines (source and
            target count separately): BPE merges converge long before the
            Ding dictionary's 750k lines, and training takes minutes on 2 cores.
    """
    text = train_pairs.flat_map(
        lambda source, target: tf.data.Dataset.from_tensor_slices(tf.stack([source, target]))
    ).take(max_sentences)
    temporary = f"{path}.tmp{os.getpid()}"
    keras_hub.tokenizers.compute_sentence_piece_proto(
        text,
        vocabulary_size=vocab_size,
        model_type="bpe",
        proto_output_file=temporary,
    )
    os.replace(temporary, path)  # atomic: a concurrent reader never sees half a file
    logger.info("Trained a %d-piece BPE vocabulary: %s", vocab_size, path)


def load_tokenizer(path):
    """A `keras_hub.tokenizers.SentencePieceTokenizer` for the model file at `path`."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"No SentencePiece model at {path}")
    return keras_hub.tokenizers.SentencePieceTokenizer(proto=path, dtype="int32")


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
