"""Corpora, the shared vocabulary and the input pipeline (numpy; no TensorFlow needed).

The names below are imported on first use (PEP 562): `import
keras_transformer.data.pipeline` loads numpy alone, so a process that only
plans batches (`pipeline.Batches`'s planner) starts without Keras.
"""

import importlib

_EXPORTS = {
    "PyDataset": "keras_transformer.data.datasets",
    "make_dataset": "keras_transformer.data.datasets",
    "to_tf_dataset": "keras_transformer.data.datasets",
    "Batches": "keras_transformer.data.pipeline",
    "InputTimer": "keras_transformer.data.pipeline",
    "TokenizedSplit": "keras_transformer.data.pipeline",
    "bucket_sizes": "keras_transformer.data.planning",
    "plan_statistics": "keras_transformer.data.planning",
    "tokenize_split": "keras_transformer.data.pipeline",
    "TranslationData": "keras_transformer.data.sources",
    "load_translation_data": "keras_transformer.data.sources",
    "repeat_sentences": "keras_transformer.data.sources",
    "SentencePieceTokenizer": "keras_transformer.data.vocabulary",
    "get_tokenizer": "keras_transformer.data.vocabulary",
    "load_tokenizer": "keras_transformer.data.vocabulary",
    "train_vocabulary": "keras_transformer.data.vocabulary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'keras_transformer.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
