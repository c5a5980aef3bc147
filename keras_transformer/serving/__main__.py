"""`python -m keras_transformer.serving`: `keras-transformer-serve`."""

from keras_transformer.serving.cli import main

main()
