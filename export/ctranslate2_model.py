"""Exports a trained work directory as a CTranslate2 model (C++ inference; int8 at load).

python export/ctranslate2_model.py --work-dir work   # saved_models/<name>/ctranslate2/<version>/
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the vocabulary loads as the others'

from keras_transformer.export.cli import main  # noqa: E402

if __name__ == "__main__":
    main(("ctranslate2",), __doc__.splitlines()[0])
