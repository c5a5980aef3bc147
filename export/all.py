"""Exports a trained work directory as a SavedModel, ONNX graphs and (where installed) a
CTranslate2 model, under one shared version.

python export/all.py --work-dir work          # what `python train.py` runs at the end
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the exporters trace with TensorFlow

from keras_transformer.export.cli import main  # noqa: E402

if __name__ == "__main__":
    from keras_transformer.export import installed_formats

    main(installed_formats(), __doc__.splitlines()[0])
