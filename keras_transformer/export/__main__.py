"""`python -m keras_transformer.export --work-dir work`: every installed format (the
SavedModel, ONNX and, where ctranslate2 is installed, the CTranslate2 model) under one
new version, as `export/all.py` and the end of `train.py`; `--formats` picks (cli.py)."""

# Run with KERAS_BACKEND=tensorflow (Keras's default): the package import picks the backend.
from keras_transformer.export import installed_formats
from keras_transformer.export.cli import main

if __name__ == "__main__":
    main(
        installed_formats(),
        "Exports a trained work directory in every installed format under one new version.",
    )
