"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3."""

from keras_transformer.config import PRESETS, TransformerConfig, get_preset
from keras_transformer.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    TokenEmbedding,
)
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.schedules import TransformerSchedule

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TokenEmbedding",
    "Transformer",
    "TransformerConfig",
    "TransformerSchedule",
    "get_preset",
]
