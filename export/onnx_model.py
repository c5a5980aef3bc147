"""Exports a trained work directory as ONNX graphs for ONNX Runtime.

    python export/onnx_model.py --work-dir work --output-dir saved_models
    # -> saved_models/transformer_de_en/onnx/<version>/translate.onnx (text in, text out),
    #    {encoder,decoder_step}.onnx, vocab.model, config.json

Named onnx_model.py, not onnx.py: `python export/onnx.py` would put export/
first on sys.path and shadow the `onnx` package. Load the result with
`keras_transformer.translators.onnx_translator.OnnxTranslator`, or translate.onnx with plain
onnxruntime + onnxruntime-extensions from any language.
"""

import os
import sys

HERE = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
# The clone's root first, and export/ itself off the path: its onnx_model.py would
# shadow onnxruntime.transformers' `onnx_model` for whoever imports it (ONNX Runtime's tools).
sys.path[:] = [os.path.dirname(HERE)] + [p for p in sys.path if os.path.realpath(p or ".") != HERE]
os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the exporters trace with TensorFlow

from keras_transformer.export.cli import main  # noqa: E402

if __name__ == "__main__":
    main(("onnx",), __doc__.splitlines()[0])
