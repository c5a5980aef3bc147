"""Model configurations: the paper's Table 3 and smaller CPU presets."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Architecture of an encoder-decoder Transformer.

    Variants are values: `dataclasses.replace(config, dropout=0.0)`.
    """

    vocab_size: int = 37000  # shared source/target BPE vocabulary (Section 5.1)
    num_layers: int = 6  # N, for both encoder and decoder unless one of the next two says
    # A deep encoder with a shallow decoder decodes faster for the same quality
    # (Kasai et al. 2021, "Deep Encoder, Shallow Decoder"); None: `num_layers`.
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    d_model: int = 512  # model width; embeddings are scaled by sqrt(d_model)
    num_heads: int = 8  # h; each head has d_model / h = 64 dims
    d_ff: int = 2048  # inner size of the position-wise feed-forward network
    dropout: float = 0.1  # P_drop on embeddings and every residual branch
    attention_dropout: float = 0.0  # the paper applies none to attention weights
    max_length: int = 256  # longest source or target sequence the model serves
    norm_first: bool = False  # the paper is post-LN; pre-LN trains deep stacks stably
    layer_norm_epsilon: float = 1e-6
    use_fused_attention: bool = False  # keras.ops.dot_product_attention when dropout allows
    pad_id: int = 0  # these three match the SentencePiece model we train
    bos_id: int = 2
    eos_id: int = 3

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff", "max_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")
        for name in ("encoder_layers", "decoder_layers"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value <= 0):  # fmt: skip
                raise ValueError(
                    f"{name} must be a positive integer or None (num_layers). "
                    f"Received: {name}={value!r}"
                )
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}"
            )
        if self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} must be even for the sinusoidal encoding")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1). Received: {name}={value}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"{name}={value} must be a token id in [0, vocab_size={self.vocab_size})"
                )

    @property
    def num_encoder_layers(self):
        """The encoder's layers: `encoder_layers`, or `num_layers` where it is None."""
        return self.num_layers if self.encoder_layers is None else self.encoder_layers

    @property
    def num_decoder_layers(self):
        """The decoder's layers (and the decoding cache's L): `decoder_layers`, or
        `num_layers` where it is None."""
        return self.num_layers if self.decoder_layers is None else self.decoder_layers


PRESETS = {
    # Table 3, "base": 65M parameters with a 37k shared vocabulary.
    "base": TransformerConfig(),
    # Table 3, "big": 213M parameters.
    "big": TransformerConfig(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
    # A small model for a GPU or a long CPU run; the benchmarks' default.
    "small": TransformerConfig(
        vocab_size=8000, num_layers=3, d_model=256, num_heads=4, d_ff=1024, max_length=128
    ),
    # The default of `python train.py`: as many updates as 22 minutes on 2 CPU
    # cores allow (0.15 to 0.28 s per 1,024-token step there, Zen 5 to Zen 3). No
    # dropout: measured when such a run saw less than one epoch, where dropout only
    # slows learning; it now sees 1.3 to 5 passes over Ding's 377k pairs (Zen 3 to 5)
    # (`training.presets.corpus_defaults` adds it from about 6 passes, 0.1 from 10).
    # FFN 512, not 1024: 21-25% more steps in the default run's time, and there +2.2 and
    # +1.4 chrF on the 1,000 test pairs with two seeds (2-core Zen 3, docs/training.md,
    # "Measured: the default run").
    "cpu": TransformerConfig(
        vocab_size=4000,
        num_layers=2,
        d_model=256,
        num_heads=4,
        d_ff=512,
        dropout=0.0,
        max_length=64,
    ),
    # For tests and smoke runs.
    "tiny": TransformerConfig(
        vocab_size=1000, num_layers=2, d_model=64, num_heads=4, d_ff=128, max_length=64
    ),
}


def get_preset(name, **overrides):
    """Returns the preset `name` with `overrides` replaced, e.g. `vocab_size`."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}. Available presets: {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)
