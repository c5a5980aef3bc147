"""From-scratch Transformer layers written with `keras.ops`."""

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.decoder import DecoderLayer
from keras_transformer.layers.embedding import TokenEmbedding
from keras_transformer.layers.encoder import EncoderLayer
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.masks import causal_mask, merge_masks, padding_mask_from_ids
from keras_transformer.layers.positional import PositionalEncoding

__all__ = [
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TokenEmbedding",
    "causal_mask",
    "merge_masks",
    "padding_mask_from_ids",
]
