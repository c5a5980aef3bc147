"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

The public names below are imported on first use (PEP 562), not when the
package is imported: `keras_transformer.onnx_translator` runs with
onnxruntime alone, in a process where Keras and TensorFlow are not even
installed. Touching any of them (or importing `keras_transformer.model`)
imports Keras and registers the package's serializable classes, which
`keras.saving.load_model` needs.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "PRESETS": "keras_transformer.config",
    "TransformerConfig": "keras_transformer.config",
    "get_preset": "keras_transformer.config",
    "DecoderLayer": "keras_transformer.layers",
    "EncoderLayer": "keras_transformer.layers",
    "FeedForward": "keras_transformer.layers",
    "MultiHeadAttention": "keras_transformer.layers",
    "PositionalEncoding": "keras_transformer.layers",
    "TokenEmbedding": "keras_transformer.layers",
    "LabelSmoothedCrossEntropy": "keras_transformer.losses",
    "MaskedAccuracy": "keras_transformer.losses",
    "Transformer": "keras_transformer.model",
    "TransformerSchedule": "keras_transformer.schedules",
    "TrainingConfig": "keras_transformer.training_config",
    "compile_with_paper_recipe": "keras_transformer.recipe",
}

__all__ = sorted(_EXPORTS)


def register_keras_classes():
    """Imports every module that registers a Keras serializable class; returns nothing.

    Call it (or import `keras_transformer.model`) before `keras.saving.load_model`
    of a file saved by this package.
    """
    for module in sorted(set(_EXPORTS.values())):
        importlib.import_module(module)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
