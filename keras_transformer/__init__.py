"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

The public names below are imported on first use (PEP 562), not when the
package is imported: `keras_transformer.translators.onnx_translator` runs with
onnxruntime alone, in a process where Keras and TensorFlow are not even
installed (and must not import TensorFlow: its protobuf clashes with
onnxruntime-extensions'). The package's Keras classes are registered for
`keras.saving.load_model` as soon as Keras is imported, before or after
this package (`_register_when_keras_loads`), as `import keras_hub` does for
its own: `import keras_transformer` then `keras.saving.load_model("m.keras")`
reloads a model built from its layers, in a fresh process.
"""

import importlib
import importlib.abc
import importlib.util
import logging
import sys

from keras_transformer import _moved

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
    "TrainingConfig": "keras_transformer.training.options",
    "Translator": "keras_transformer.translators.keras_translator",
    "OnnxTranslator": "keras_transformer.translators.onnx_translator",
    "CTranslate2Translator": "keras_transformer.translators.ctranslate2_translator",
    "compile_with_paper_recipe": "keras_transformer.recipe",
}

__all__ = sorted(_EXPORTS)


def register_keras_classes():
    """Imports every module that registers a Keras serializable class; returns nothing.

    Call it (or import `keras_transformer.model`) before `keras.saving.load_model`
    of a file saved by this package.
    """
    translators = {
        "keras_transformer.translators.onnx_translator",
        "keras_transformer.translators.ctranslate2_translator",
    }
    for module in sorted(set(_EXPORTS.values()) - translators):
        importlib.import_module(module)


class _AfterKerasLoads(importlib.abc.MetaPathFinder):
    """Registers this package's classes once `keras` has loaded and no module of
    this package is half imported; then leaves `sys.meta_path`.

    `from keras_transformer import DecoderLayer` imports `keras` from inside
    `keras_transformer.layers`: registering then would import
    `keras_transformer.model`, which needs the half-imported layers (a
    circular import). So the finder also counts the modules of this package
    being executed, and registers when `keras` has loaded and that count is
    back to 0: at the end of the import that loaded Keras.
    """

    def __init__(self):
        self.keras_loaded = False
        self.importing = 0  # modules of this package being executed

    def find_spec(self, name, path=None, target=None):
        if name != "keras" and not name.startswith(__name__ + "."):
            return None
        spec = None
        for finder in sys.meta_path:  # as Python would, without this finder
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        is_keras = name == "keras"
        counted = 0 if is_keras else 1  # Keras is not one of this package's modules

        def exec_then_register(module):
            self.importing += counted
            try:
                exec_module(module)
            finally:
                self.importing -= counted
            self.keras_loaded = self.keras_loaded or is_keras
            if self.keras_loaded and self.importing == 0 and self in sys.meta_path:
                sys.meta_path.remove(self)
                _register_quietly()

        spec.loader.exec_module = exec_then_register
        return spec


def _register_quietly():
    try:
        register_keras_classes()
    except Exception as error:  # a broken backend must not break `import keras`
        logging.getLogger(__name__).warning(
            "keras_transformer's Keras classes are not registered (%s: %s); call "
            "keras_transformer.register_keras_classes() before keras.saving.load_model.",
            type(error).__name__, error,
        )  # fmt: skip


def _register_when_keras_loads():
    if "keras" in sys.modules:
        _register_quietly()
    elif not any(isinstance(finder, _AfterKerasLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterKerasLoads())


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


_moved.install()  # the old names of the modules now in serving/ and translators/
_register_when_keras_loads()  # last: registering reads `__getattr__`
