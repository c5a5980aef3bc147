"""Exports a trained work directory as a CTranslate2 model (C++ inference; int8 at load).

python export/ctranslate2_model.py --work-dir work   # saved_models/<name>/ctranslate2/<version>/
"""

import os
import sys

HERE = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
# The clone's root first, and export/ itself off the path: its onnx_model.py would
# shadow onnxruntime.transformers' `onnx_model` for whoever imports it (ONNX Runtime's tools).
sys.path[:] = [os.path.dirname(HERE)] + [p for p in sys.path if os.path.realpath(p or ".") != HERE]
os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the vocabulary loads as the others'

from keras_transformer.export.cli import main  # noqa: E402

if __name__ == "__main__":
    main(("ctranslate2",), __doc__.splitlines()[0])
