"""What a training run does: `TrainingConfig`, and the command line made from it.

Each option is written once, here: its type, its default and its help.
`train.py`'s command line is generated from these fields (`add_arguments`),
so the help and the behaviour cannot drift apart.

`TrainingConfig(preset="cpu")` leaves every option it is not given at None,
which means "the preset's default"; `resolved()` fills them in from
`TRAINING_DEFAULTS` (presets.py). A value given is kept as given: 0 means 0 (no dropout,
no validation BLEU, a zero-minute budget), never "the default".

This module imports neither Keras nor TensorFlow: `train.py` parses its
command line before either loads.
"""

import argparse
import dataclasses
import types

from keras_transformer.search import PAPER, STOPPING_RULES
from keras_transformer.terminology import RATE, TGT_TERM_END, TGT_TERM_START
from keras_transformer.training.presets import (
    COMMON_DEFAULTS,
    SMALL_CORPUS_DROPOUT,
    SMALL_CORPUS_PAIRS,
    TRAINING_DEFAULTS,
)

DTYPE_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def _option(default=None, help="", **flag):
    """A `TrainingConfig` field with its command-line help (and argparse extras:
    `choices`, `metavar`, `flag` for a name other than `--field-name`)."""
    return dataclasses.field(default=default, metadata={"help": help, **flag})


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Options of `training.run()`; None means the preset's default (`resolved()`).

    Variants are values: `dataclasses.replace(config, max_train_minutes=60.0)`.
    """

    # What to train.
    preset: str | None = _option(help="base | big | small | cpu | tiny (cpu, or --init-from's)")
    init_from: str | None = _option(
        help="start from a finished run's weights and vocabulary (its architecture too), in a "
        "new --work-dir: train it longer, or fine-tune it on --data-dir", metavar="WORK_DIR",
    )  # fmt: skip
    vocab_size: int | None = _option(help="shared BPE vocabulary size (the preset's)")
    dropout: float | None = _option(
        help=f"dropout of the model (the preset's; with --preset cpu on a corpus of fewer than "
        f"{SMALL_CORPUS_PAIRS:,} training pairs other than Ding, {SMALL_CORPUS_DROPOUT})"
    )
    attention_dropout: float | None = _option(
        help="dropout of the attention probabilities (the preset's: 0, as in the paper; "
        "keras-hub's layers and fairseq's --attention-dropout drop them)"
    )
    fused_attention: bool | None = _option(
        help="attention through keras.ops.dot_product_attention (cuDNN / flash kernels on GPUs "
        "where the backend has them, where no attention dropout is active; the same results, "
        "tests/test_attention.py); off unless the preset turns it on"
    )

    # On what.
    dataset: str = _option(
        "ding", help="'ding' (the local dictionary) or a TFDS name, e.g. wmt14_translate/de-en"
    )
    data_dir: str | None = _option(
        help="folder of train.xx/train.yy, validation.*, test.* text (overrides --dataset)"
    )
    mix: str | None = _option(
        help="more training corpora mixed with --data-dir's, each DIR=WEIGHT (their train.* "
        "files; --data-dir's weight is 1), comma separated: each pass over the data draws "
        "the corpora's pairs in proportion to their weights (OpenNMT's and Eole's corpus "
        "weights), e.g. --data-dir in_domain --mix general=0.5",
        metavar="LIST",
    )
    direction: str | None = _option(help="source-target languages, e.g. de-en or en-de")
    ding_path: str | None = _option(
        help="the Ding dictionary file (/usr/share/trans/de-en; a copy elsewhere, e.g. on a "
        "machine without the Debian package)"
    )
    filters: str | None = _option(
        help="training pairs dropped before training, counted in the corpus report "
        "(WORK/corpus.json): copies (the sides identical), duplicates (after the first), "
        "ratio (a side over 3x the other's characters); 'none' keeps them all (default: "
        "copies,duplicates,ratio; none on Ding, whose parser dedups and whose copies are "
        "names). Evaluation pairs are never filtered",
        metavar="LIST",
    )
    workers: int | None = _option(
        help="processes that tokenize a folder's training pairs, in chunks, when a work "
        "directory is prepared (default: one per core)"
    )
    sentence_repeats: int | None = _option(
        help="full-sentence training pairs (capitalized, 3+ words, ending in . ! ?) this many "
        "times per pass over the data (1: once)"
    )
    terminology: str | None = _option(
        help="a glossary, one 'source term<TAB>target term' per line: training pairs whose "
        "source holds a term and whose target its translation get the translation inline, "
        f"{TGT_TERM_START} ... {TGT_TERM_END} (Eole's terminology transform), so that a "
        "glossary given at translation time (--glossary) steers the output; the tags join "
        "the vocabulary", metavar="FILE",
    )  # fmt: skip
    terminology_rate: float = _option(
        RATE, help="share of the training pairs that match --terminology annotated (Eole's "
        "term_corpus_ratio), chosen per pair from --seed", metavar="RATE",
    )  # fmt: skip

    # How long and how.
    epochs: int | None = _option(help="epochs")
    steps: int | None = _option(help="steps per epoch; an epoch ends with a checkpoint")
    batch_tokens: int | None = _option(help="about this many tokens per batch and side")
    warmup_steps: int | None = _option(help="learning-rate warm-up steps")
    accumulate_steps: int = _option(
        1,
        help="update the weights every N batches with the mean of their gradients (Keras's "
        "gradient_accumulation_steps): N x --batch-tokens per update on a device that holds "
        "one batch; the learning-rate schedule counts updates",
    )
    ema: float | None = _option(
        help="keep an exponential moving average of the weights with this momentum (e.g. "
        "0.999; Keras's use_ema; 0: none): the model takes it when training ends, and "
        "checkpoint averaging keeps it unless the last checkpoint or an average of the last "
        "ones has a lower validation loss",
        metavar="MOMENTUM",
    )
    learning_rate_scale: float | None = _option(
        help="multiplier of the paper's learning-rate curve (1.0 in the paper)"
    )
    cooldown: float | None = _option(
        help="share of the budget (--max-train-minutes, or epochs x steps) at the end over "
        "which the learning rate decays linearly to 0 (0: the paper's curve to the end)"
    )
    dtype_policy: str | None = _option(
        help="precision of training (mixed: float32 variables; the saved model is float32); "
        "unset: the fastest of the candidates timed at start-up (keras_transformer.calibration)",
        choices=DTYPE_POLICIES,
    )  # fmt: skip
    max_train_minutes: float | None = _option(
        help="stop at the first training step that ends past this many minutes of training "
        "(0: after one step)"
    )
    early_stopping: int | None = _option(
        help="stop when the validation metric (--early-stopping-metric) has not improved for "
        "this many validations, and keep the weights of its best one (off by default)",
        metavar="PATIENCE",
    )
    early_stopping_metric: str = _option(
        "chrf",
        help="what early stopping follows: validation chrF or BLEU (greedy, on "
        "--validation-bleu-samples pairs every --validation-bleu-every epochs) or loss",
        choices=("chrf", "bleu", "loss"),
    )
    logical_devices: int | None = _option(help="split the CPU into N devices for MirroredStrategy")
    pack: bool = _option(
        True, help="one pair per row in length buckets, instead of several pairs packed per row"
    )
    jit_compile: bool | None = _option(
        help="compile the training step with XLA (unset: timed against the step without it "
        "at start-up where the backend allows both; JAX: always)"
    )
    seed: int = _option(1234, help="of the initial weights and the shuffling")

    # Evaluation and what is written.
    work_dir: str = _option(
        "work", help="output folder. Run the same command again there to resume a killed run, "
        "or with a larger --max-train-minutes / --epochs to continue a finished one",
    )  # fmt: skip
    overwrite: bool = _option(
        False, help="delete what an earlier run wrote in --work-dir and start again there"
    )
    validation_every: int | None = _option(help="validation loss every N epochs and after the last")
    validation_bleu_samples: int = _option(
        300, help="validation pairs decoded greedily for the validation BLEU"
    )
    validation_bleu_every: int | None = _option(
        help="greedy validation BLEU every N epochs (0: never)"
    )
    test: bool = _option(True, help="skip the final test decoding")
    test_samples: int | None = _option(help="test pairs to decode (0: all)")
    beam_size: int | None = _option(help="beam of the test decode and the exports")
    alpha: float | None = _option(help="length penalty of the test decode and the exports")
    stopping: str | None = _option(
        help="when a sentence's beam search stops: 'k_finished' once beam-size x patience "
        "hypotheses have ended (fairseq, CTranslate2), 'bound' when no alive one can win "
        "(exact, slower); of the test decode and the exports", choices=STOPPING_RULES,
    )  # fmt: skip
    patience: float | None = _option(help="of --stopping k_finished")
    length_ratio: float | None = _option(
        help="output limit ceil(A x source tokens) + B of the test decode and the exports: "
        "A (default: A and B fitted on the training corpus, the tightest that holds 99.99%% "
        "of its pairs)", metavar="A",
    )  # fmt: skip
    max_extra_length: int | None = _option(
        help="the B of --length-ratio's limit (default: fitted with A)", metavar="B"
    )
    average_last: int | None = _option(
        help="average the last k epoch checkpoints, k <= N chosen by validation loss "
        "(1: no averaging)"
    )
    export: bool = _option(True, help="skip the SavedModel, ONNX and CTranslate2 exports")
    export_name: str | None = _option(
        help="the exports' folder under saved_models/ (default: transformer_<src>_<tgt>, e.g. "
        "transformer_de_en); each export call adds one version number to it, the same for "
        "every format",
        metavar="NAME",
    )
    prepare_only: bool = _option(
        False, help="write the vocabulary and the tokenized splits to --work-dir and stop (as "
        "fairseq-preprocess); the same command without it, here or on another machine with "
        "the work directory copied, trains from them",
    )  # fmt: skip

    @property
    def search(self):
        """The `SearchConfig` of the test decode and the exports (None: the paper's)."""
        return PAPER.replace(beam_size=self.beam_size, alpha=self.alpha, stopping=self.stopping,
                             patience=self.patience, length_ratio=self.length_ratio,
                             max_extra_length=self.max_extra_length)  # fmt: skip

    @property
    def filter_names(self):
        """`filters` as a tuple of names (() for "none"), or the corpus's default:
        all of them off Ding, none on Ding."""
        if self.filters is None:
            from keras_transformer.data.report import FILTERS

            return () if self.data_dir is None and self.dataset == "ding" else FILTERS
        if self.filters.strip() in ("", "none"):
            return ()
        return tuple(name.strip() for name in self.filters.split(","))

    @property
    def mixture(self):
        """`mix` as a tuple of `(folder, weight)`; () without it."""
        if not self.mix:
            return ()
        entries = []
        for entry in self.mix.split(","):
            folder, equals, weight = entry.strip().rpartition("=")
            try:
                weight = float(weight)
            except ValueError:
                weight = None
            if not equals or not folder or weight is None or not weight > 0:
                raise ValueError(
                    f"mix takes DIR=WEIGHT entries with a positive weight, comma separated; "
                    f"{entry.strip()!r} is not one. Received: mix={self.mix!r}"
                )
            entries.append((folder, weight))
        return tuple(entries)

    def __post_init__(self):
        from keras_transformer.data.report import FILTERS

        if self.export_name is not None and (
            not self.export_name.strip()
            or "/" in self.export_name
            or self.export_name in (".", "..")
        ):
            raise ValueError(
                "export_name names one folder, without '/'. "
                f"Received: export_name={self.export_name!r}"
            )
        if self.mixture and self.data_dir is None:
            raise ValueError("mix adds corpora to data_dir's: give data_dir (--data-dir) too.")

        unknown = set(self.filter_names) - set(FILTERS)
        if unknown:
            raise ValueError(
                f"Unknown filter(s) {', '.join(sorted(unknown))} in filters={self.filters!r}; "
                f"choose from {', '.join(FILTERS)}, or none."
            )
        positive = ("epochs", "steps", "batch_tokens", "warmup_steps", "vocab_size",
                    "logical_devices", "average_last", "beam_size", "validation_every",
                    "sentence_repeats", "accumulate_steps", "early_stopping")  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")
        at_least_zero = ("validation_bleu_every", "test_samples", "validation_bleu_samples",
                         "max_train_minutes")  # fmt: skip
        for name in at_least_zero:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0. Received: {name}={value!r}")
        if not 0.0 <= self.terminology_rate <= 1.0:
            raise ValueError(
                "terminology_rate must be in [0, 1]. "
                f"Received: terminology_rate={self.terminology_rate}"
            )
        if self.learning_rate_scale is not None and self.learning_rate_scale <= 0:
            raise ValueError(
                f"learning_rate_scale must be > 0. Received: "
                f"learning_rate_scale={self.learning_rate_scale}"
            )
        _ = self.search  # `SearchConfig`'s checks
        if self.cooldown is not None and not 0.0 <= self.cooldown <= 1.0:
            raise ValueError(f"cooldown must be in [0, 1]. Received: cooldown={self.cooldown}")
        if self.ema is not None and not 0.0 <= self.ema < 1.0:
            raise ValueError(
                f"ema must be in [0, 1): e.g. 0.999, or 0 for none. Received: ema={self.ema}"
            )
        if (
            self.early_stopping
            and self.early_stopping_metric != "loss"
            and self.validation_bleu_every == 0
        ):
            raise ValueError(
                f"early stopping on validation {self.early_stopping_metric} needs "
                "validation_bleu_every >= 1 (how often it decodes the validation pairs)."
            )
        if self.accumulate_steps > 1 and self.cooldown:
            raise ValueError(
                "accumulate_steps > 1 with a cooldown is not supported yet: the cooldown sets "
                "the rate per batch, not per update. Use one of them."
            )
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

        `dtype_policy` and `jit_compile` stay None (they depend on the machine:
        `calibration` chooses them) and so do the model options (`vocab_size`,
        `dropout`), which depend on the corpus (`model_config`).
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


def config_from(config=None, options=None):
    """`run()`'s arguments as one `TrainingConfig`: `config` (a `TrainingConfig`, a
    preset name or None) with `options` (a dict of fields) replacing its fields."""
    options = options or {}
    if isinstance(config, str):
        options = {"preset": config, **options}
        config = None
    return dataclasses.replace(config, **options) if config else TrainingConfig(**options)


# --------------------------------------------------------------------------- command line


def add_arguments(parser):
    """Adds a flag per `TrainingConfig` field to an `argparse` parser.

    `--max-train-minutes` for `max_train_minutes`; a field whose default is True
    becomes `--no-NAME`, one defaulting to False `--NAME`, an optional bool
    `--NAME/--no-NAME`. The help ends with the per-preset defaults, read from
    `TRAINING_DEFAULTS`. `vars(parser.parse_args())` gives `TrainingConfig`'s fields.
    """
    for field in dataclasses.fields(TrainingConfig):
        flag = "--" + field.name.replace("_", "-")
        help = field.metadata["help"] + _preset_defaults(field.name)
        kind = _base_type(field.type)
        extra = {k: v for k, v in field.metadata.items() if k in ("choices", "metavar")}
        if kind is bool and field.default is True:
            parser.add_argument(
                "--no-" + flag[2:], dest=field.name, action="store_false", help=help
            )
        elif kind is bool and field.default is False:
            parser.add_argument(flag, action="store_true", help=help)
        elif kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help)
        else:
            if field.default is not None:
                help += f" (default: {field.default})"
            parser.add_argument(flag, type=kind, default=field.default, help=help, **extra)
    return parser


def _base_type(annotation):
    """`int` for `int | None`."""
    if isinstance(annotation, types.UnionType):
        (annotation,) = [a for a in annotation.__args__ if a is not type(None)]
    return annotation


def _preset_defaults(name):
    """`" (default: cpu 1024; small 2048; ...)"` from the defaults tables, or ""."""
    if not any(name in defaults for defaults in TRAINING_DEFAULTS.values()):
        if name in COMMON_DEFAULTS and COMMON_DEFAULTS[name] is not None:
            return f" (default: {COMMON_DEFAULTS[name]})"
        return ""
    values = {}
    for preset, defaults in TRAINING_DEFAULTS.items():
        value = defaults.get(name, COMMON_DEFAULTS.get(name))
        values.setdefault(value, []).append(preset)
    shown = "; ".join(
        f"{'/'.join(presets)} {'none' if value is None else value}"
        for value, presets in values.items()
    )
    return f" (default: {shown})"
