"""Corpora, the shared vocabulary and the input pipeline (numpy; no TensorFlow needed)."""

from keras_transformer.data.datasets import PyDataset, make_dataset, to_tf_dataset
from keras_transformer.data.pipeline import (
    Batches,
    InputTimer,
    TokenizedSplit,
    bucket_sizes,
    plan_statistics,
    tokenize_split,
)
from keras_transformer.data.sources import (
    TranslationData,
    load_translation_data,
    repeat_sentences,
)
from keras_transformer.data.vocabulary import (
    SentencePieceTokenizer,
    get_tokenizer,
    load_tokenizer,
    train_vocabulary,
)

__all__ = [
    "Batches",
    "InputTimer",
    "PyDataset",
    "SentencePieceTokenizer",
    "TokenizedSplit",
    "TranslationData",
    "bucket_sizes",
    "get_tokenizer",
    "load_tokenizer",
    "load_translation_data",
    "make_dataset",
    "plan_statistics",
    "repeat_sentences",
    "to_tf_dataset",
    "tokenize_split",
    "train_vocabulary",
]
