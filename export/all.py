"""Exports a trained work directory as a SavedModel, ONNX graphs and (where installed) a
CTranslate2 model, under one shared version.

python export/all.py --work-dir work          # what `python train.py` runs at the end
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
    from keras_transformer.export import installed_formats

    main(installed_formats(), __doc__.splitlines()[0])
