"""`python -m keras_transformer.export --work-dir work`: SavedModel and ONNX (see cli.py);
`--formats saved_model,onnx,ctranslate2` adds the CTranslate2 model."""

# Run with KERAS_BACKEND=tensorflow (Keras's default): the package import picks the backend.
from keras_transformer.export.cli import main

if __name__ == "__main__":
    main(
        ("saved_model", "onnx"),
        "Exports a trained work directory as a SavedModel and ONNX (--formats adds ctranslate2).",
    )
