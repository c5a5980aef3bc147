"""Corpora, the shared vocabulary and the tf.data input pipeline."""

from keras_transformer.data.pipeline import (
    InputTimer,
    TokenizedSplit,
    bucket_sizes,
    make_dataset,
    plan_statistics,
    tokenize_split,
)
from keras_transformer.data.sources import (
    TranslationData,
    load_translation_data,
    repeat_sentences,
)
from keras_transformer.data.vocabulary import get_tokenizer, load_tokenizer, train_vocabulary

__all__ = [
    "InputTimer",
    "TokenizedSplit",
    "TranslationData",
    "bucket_sizes",
    "get_tokenizer",
    "load_tokenizer",
    "load_translation_data",
    "make_dataset",
    "plan_statistics",
    "repeat_sentences",
    "tokenize_split",
    "train_vocabulary",
]
