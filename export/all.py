"""Exports a trained work directory as a SavedModel and as ONNX graphs (one shared version).

python export/all.py --work-dir work          # what `python train.py` runs at the end
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the exporters trace with TensorFlow

from keras_transformer.export.cli import main  # noqa: E402

if __name__ == "__main__":
    main(("saved_model", "onnx"), __doc__.splitlines()[0])
