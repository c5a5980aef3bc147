"""Exports a trained work directory as a SavedModel for TF Serving.

    python export/saved_model.py --work-dir work --output-dir saved_models
    # -> saved_models/transformer_de_en/<version>/  (serving_default: sentences -> translations)

See export/serving/README.md for serving it with docker compose.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the exporters trace with TensorFlow

from keras_transformer.export.cli import main  # noqa: E402

if __name__ == "__main__":
    main(("saved_model",), __doc__.splitlines()[0])
