"""The three translators, side by side: text in, text out, the same front end.

    keras_translator.py        Translator: a trained work directory, on any Keras backend
    onnx_translator.py         OnnxTranslator: translate.onnx on ONNX Runtime
    ctranslate2_translator.py  CTranslate2Translator: the CTranslate2 export

Each is also `keras_transformer.Translator` (and so on), imported on first use:
importing `OnnxTranslator` or `CTranslate2Translator` loads neither Keras nor
TensorFlow, so this package's `__init__` imports nothing.
"""
