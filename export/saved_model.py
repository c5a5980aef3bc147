"""Exports a trained work directory as a SavedModel for TF Serving.

    python export/saved_model.py --work-dir work --output-dir saved_models
    # -> saved_models/transformer_de_en/<version>/  (serving_default: sentences -> translations)

See export/serving/README.md for serving it with docker compose.
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
    main(("saved_model",), __doc__.splitlines()[0])
