"""What a training run does: a frozen `TrainingConfig` and the per-preset defaults.

`TrainingConfig(preset="cpu")` leaves every option it is not given at None,
which means "the preset's default"; `resolved()` fills them in from
`TRAINING_DEFAULTS`. A value given is kept as given: 0 means 0 (no dropout,
no validation BLEU, a zero-minute budget), never "the default".
"""

import dataclasses

from keras_transformer.search import PAPER

DTYPE_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")

# Per-preset training defaults; command-line options override them.
TRAINING_DEFAULTS = {
    # The default run: 22 minutes of training on a 2-core CPU, then beam search on
    # the first 1,000 test pairs (`--test-samples 0`: all), within 30 minutes in
    # all, install included (docs/training.md, "Measured: the default run": about 5 minutes
    # go to install, start-up, averaging, test decoding and export). Small batches
    # and a short warm-up: in this budget the number of updates limits learning.
    "cpu": dict(
        epochs=200,
        steps=200,  # an epoch is a checkpoint: enough of them to average
        batch_tokens=1024,
        warmup_steps=300,
        learning_rate_scale=0.5,  # peak 1.8e-3; 1.0 learned slower
        max_train_minutes=22.0,
        test_samples=1000,
        validation_bleu_every=0,  # the test decode at the end measures quality
        # A pass over Ding's 4,367 validation pairs costs ~3 s, 6% of a 200-step
        # epoch on the EPYC; every other epoch (and the last) halves that.
        validation_every=2,
        # Averaging the last 2 of 200-step checkpoints won in both measured default
        # runs (validation loss 4.516 -> 4.472); 5 and 8 lost (docs/training.md).
        average_last=3,
        # The search, chosen on the validation split with benchmarks/search_sweep.py
        # (the 22-minute default model, 2-core AMD EPYC Zen 5, 2026-11-26; docs/performance.md,
        # "Serving"): stopping once 8 hypotheses ended (beam 4, patience 2) with alpha 1.5
        # beat the exact bound at alpha 1.0 by 0.9 chrF there and by 0.8 on the test
        # pairs (1.0 on their full sentences), decoding in half the time; alpha 1.5 under
        # the exact bound lost 1.5 (it searches to the length limit and favours long output).
        alpha=1.5,
        stopping="k_finished",
        patience=2.0,
    ),  # fmt: skip
    "small": dict(
        epochs=10,
        steps=400,
        batch_tokens=2048,
        warmup_steps=500,
        max_train_minutes=None,
    ),  # fmt: skip
    "tiny": dict(epochs=2, steps=20, batch_tokens=512, warmup_steps=50, max_train_minutes=None),
    "base": dict(
        epochs=100, steps=1000, batch_tokens=25000, warmup_steps=4000, max_train_minutes=None
    ),
    "big": dict(
        epochs=300, steps=1000, batch_tokens=25000, warmup_steps=4000, max_train_minutes=None
    ),
}
# What a preset's entry above leaves out.
COMMON_DEFAULTS = dict(
    learning_rate_scale=1.0,  # the paper's curve
    average_last=8,  # checkpoints averaged at most (k in 1, 2, 3, 5, 8)
    validation_bleu_every=1,  # greedy validation BLEU every epoch
    validation_every=1,  # validation loss every epoch
    test_samples=0,  # all test pairs
    max_train_minutes=None,  # no time budget
    cooldown=0.0,  # the paper's schedule to the end
    beam_size=PAPER.beam_size,
    alpha=PAPER.alpha,
    stopping=PAPER.stopping,
    patience=PAPER.patience,
    sentence_repeats=1,  # every training pair once per pass
)


def corpus_defaults(train_pairs, preset):
    """Config overrides for a corpus of `train_pairs` training pairs
    (docs/data.md, "Your own data").

    The `cpu` preset trains without dropout: it sees Ding's 377k pairs about
    1.8 times in its 22 minutes. A corpus under 200k pairs is seen many
    times in the same budget. Measured on Ding's 18k full sentences (2-core
    AMD EPYC Zen 3, benchmarks/README.md "Own data"): in 10 minutes (6
    passes) dropout 0 had stopped improving on the validation pairs while
    0.1 still improved, and 0.1 ended ahead at 22 minutes; 0.3, the
    published small-data recipes' value for runs of many more epochs, lost
    7 chrF at 10 minutes. The `small` and `tiny` presets have 0.1 already.

    Returns:
        dict of `TransformerConfig` fields (possibly empty).
    """
    overrides = {}
    if train_pairs < 200_000 and preset == "cpu":
        overrides["dropout"] = 0.1
    return overrides


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Options of `training.run()`; None means the preset's default (`resolved()`).

    Variants are values: `dataclasses.replace(config, max_train_minutes=60.0)`.
    """

    # What to train.
    preset: str | None = None  # a `config.PRESETS` name; None: `cpu`, or --init-from's
    init_from: str | None = None  # a finished work directory: its weights and vocabulary
    vocab_size: int | None = None  # of the shared BPE vocabulary; None: the preset's
    dropout: float | None = None  # None: the preset's, or `corpus_defaults` off Ding
    attention_dropout: float | None = None  # of the attention probabilities; None: the preset's
    # keras.ops.dot_product_attention (cuDNN / flash kernels where the backend has
    # them) where no attention dropout is active; None: the preset's (off).
    fused_attention: bool | None = None

    # On what.
    dataset: str = "ding"  # "ding" or a TFDS translation dataset name
    data_dir: str | None = None  # folder of parallel text files (overrides `dataset`)
    direction: str | None = None  # "de-en", "en-de"...; None: the corpus order
    ding_path: str | None = None  # the Ding dictionary file
    sentence_repeats: int | None = None  # full-sentence pairs this many times per pass

    # How long and how.
    epochs: int | None = None
    steps: int | None = None  # per epoch; an epoch ends with a checkpoint
    batch_tokens: int | None = None  # about this many tokens per batch and side
    warmup_steps: int | None = None  # of `TransformerSchedule`
    learning_rate_scale: float | None = None  # `scale` of `TransformerSchedule`
    cooldown: float | None = None  # last share of the budget with a linear decay to 0; 0: none
    dtype_policy: str | None = None  # None: the fastest measured here (`calibration`)
    max_train_minutes: float | None = None  # stop at the first step past it; 0: after one
    logical_devices: int | None = None  # split the CPU into N devices for MirroredStrategy
    pack: bool = True  # several pairs per row (`pipeline.plan_packed_batches`)
    jit_compile: bool | None = None  # XLA; None: chosen by `calibration` with the precision
    seed: int = 1234

    # Evaluation and what is written.
    work_dir: str = "work"
    overwrite: bool = False  # start again in a work directory that holds another run
    validation_every: int | None = None  # epochs between validation-loss passes (and the last)
    validation_bleu_samples: int = 300  # validation pairs decoded greedily by `ValidationBleu`
    validation_bleu_every: int | None = None  # epochs between them; 0: never
    test: bool = True  # beam-search the test split at the end
    test_samples: int | None = None  # test pairs decoded; 0: all
    beam_size: int | None = None  # of the test decode, and the exports' default
    alpha: float | None = None  # length penalty, as `beam_size`
    stopping: str | None = None  # when a sentence's beam stops (`search.SearchConfig`)
    patience: float | None = None  # of stopping="k_finished"
    average_last: int | None = None  # average up to this many last checkpoints; 1: none
    export: bool = True  # SavedModel and ONNX at the end
    # Stop after the vocabulary and the tokenized shards are written (as
    # `fairseq-preprocess`): tokenize on one machine, train on another.
    prepare_only: bool = False

    @property
    def search(self):
        """The `SearchConfig` of the test decode and the exports (None: the paper's)."""
        return PAPER.replace(beam_size=self.beam_size, alpha=self.alpha, stopping=self.stopping,
                             patience=self.patience)  # fmt: skip

    def __post_init__(self):
        positive = ("epochs", "steps", "batch_tokens", "warmup_steps", "vocab_size",
                    "logical_devices", "average_last", "beam_size", "validation_every",
                    "sentence_repeats")  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")
        for name in ("validation_bleu_every", "test_samples", "validation_bleu_samples"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0. Received: {name}={value!r}")
        if self.learning_rate_scale is not None and self.learning_rate_scale <= 0:
            raise ValueError(
                f"learning_rate_scale must be > 0. Received: "
                f"learning_rate_scale={self.learning_rate_scale}"
            )
        if self.max_train_minutes is not None and self.max_train_minutes < 0:
            raise ValueError(
                f"max_train_minutes must be >= 0. Received: max_train_minutes="
                f"{self.max_train_minutes}"
            )
        _ = self.search  # `SearchConfig`'s checks
        if self.cooldown is not None and not 0.0 <= self.cooldown <= 1.0:
            raise ValueError(f"cooldown must be in [0, 1]. Received: cooldown={self.cooldown}")
        if self.dtype_policy is not None and self.dtype_policy not in DTYPE_POLICIES:
            raise ValueError(
                f"dtype_policy must be one of {DTYPE_POLICIES}. "
                f"Received: dtype_policy={self.dtype_policy!r}"
            )
        if self.preset is not None and self.preset not in TRAINING_DEFAULTS:
            from keras_transformer.config import PRESETS

            if self.preset not in PRESETS:
                raise ValueError(
                    f"Unknown preset {self.preset!r}. Available presets: {sorted(PRESETS)}"
                )

    def resolved(self, preset=None):
        """A copy with every None replaced by the preset's default (`TRAINING_DEFAULTS`).

        Args:
            preset: the preset whose defaults apply when `self.preset` is None
                (`--init-from`: the finished run's); None: `cpu`.

        `dtype_policy` stays None (it depends on the machine: `training.run`
        chooses it) and so do the model options (`vocab_size`, `dropout`),
        which depend on the corpus.
        """
        preset = self.preset or preset or "cpu"
        defaults = {**COMMON_DEFAULTS, **TRAINING_DEFAULTS.get(preset, TRAINING_DEFAULTS["cpu"])}
        filled = {
            name: defaults[name]
            for name in defaults
            if getattr(self, name, None) is None and name in _FIELDS
        }
        return dataclasses.replace(self, preset=preset, **filled)


_FIELDS = frozenset(field.name for field in dataclasses.fields(TrainingConfig))
