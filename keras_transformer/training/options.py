"""What a training run does: `TrainingConfig`, and the command line made from it.

Each option is written once, here: its type, its default and its help.
`train.py`'s command line is generated from these fields (`add_arguments`,
flags.py), so the help and the behaviour cannot drift apart; checks.py
checks their values.

`TrainingConfig(preset="cpu")` leaves every option it is not given at None,
which means "the preset's default"; `resolved()` fills them in from
`TRAINING_DEFAULTS` (presets.py). A value given is kept as given: 0 means 0 (no dropout,
no validation BLEU, a zero-minute budget), never "the default".

This module imports neither Keras nor TensorFlow: `train.py` parses its
command line before either loads.
"""

import dataclasses

from keras_transformer.search import PAPER, STOPPING_RULES
from keras_transformer.terminology import RATE, TGT_TERM_END, TGT_TERM_START
from keras_transformer.training.checks import DTYPE_POLICIES, check
from keras_transformer.training.presets import (
    COMMON_DEFAULTS,
    CORPUS_DROPOUT,
    DROPOUT_RAMP,
    TRAINING_DEFAULTS,
)


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
    vocab_sample_size: int | None = _option(
        help="lines the vocabulary is trained on: the training pairs' first, source and "
        "target counted apart", metavar="LINES",
    )  # fmt: skip
    bpe_dropout: float | None = _option(
        help="BPE-dropout (Provilkov et al. 2020): training reads the training pairs "
        "segmented with each merge dropped with this probability (SentencePiece's sampling, "
        "e.g. 0.1), a new segmentation each pass over the data up to --bpe-dropout-copies; "
        "validation, test and translation are never sampled (0: off)", metavar="P",
    )  # fmt: skip
    bpe_dropout_copies: int | None = _option(
        help="sampled segmentations of the training pairs made with --bpe-dropout (tokenized "
        "once per work directory): pass N over the data reads copy N mod this",
        metavar="K",
    )  # fmt: skip
    dropout: float | None = _option(
        help=f"dropout of the model (the preset's; with --preset cpu, 0 where the budget buys "
        f"{DROPOUT_RAMP[0]:g} passes or fewer over the training pairs, growing linearly to "
        f"{CORPUS_DROPOUT} at {DROPOUT_RAMP[1]:g} passes and more)"
    )
    dropout_start: float | None = _option(
        help="late dropout (Liu et al. 2023): no residual or embedding dropout for this share "
        "of the budget (--max-train-minutes with the run's earlier processes, or epochs x "
        "steps, whichever ends first), then --dropout; --attention-dropout stays on "
        "throughout; nothing to do where --dropout is 0 (0: dropout from the first step)",
        metavar="SHARE",
    )  # fmt: skip
    attention_dropout: float | None = _option(
        help="dropout of the attention probabilities (the preset's: 0, as in the paper; "
        "keras-hub's layers and fairseq's --attention-dropout drop them)"
    )
    fused_attention: bool | None = _option(
        help="attention through keras.ops.dot_product_attention (cuDNN / flash kernels on GPUs "
        "where the backend has them, where no attention dropout is active; the same results, "
        "tests/test_attention.py); off unless the preset turns it on"
    )
    encoder_layers: int | None = _option(help="encoder layers")
    decoder_layers: int | None = _option(
        help="decoder layers: a deep encoder with a shallow decoder decodes "
        "faster for about the same quality (Kasai et al. 2021)"
    )
    d_model: int | None = _option(help="model width")
    num_heads: int | None = _option(help="attention heads; they divide --d-model")
    d_ff: int | None = _option(help="inner width of the feed-forward layers")
    max_length: int | None = _option(
        help="longest source or target, in pieces with EOS or BOS, the model trains on and "
        "serves; longer training pairs are dropped"
    )
    label_smoothing: float | None = _option(help="label smoothing of the loss (Section 5.4)")

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
        check(self)  # checks.py: each group of options in its own function

    def resolved(self, preset=None):
        """A copy with every None replaced by the preset's default (`TRAINING_DEFAULTS`).

        Args:
            preset: the preset whose defaults apply when `self.preset` is None
                (`--init-from`: the finished run's); None: `cpu`.

        `dtype_policy` and `jit_compile` stay None (they depend on the machine:
        `calibration` chooses them) and so do the model options (`vocab_size`,
        `dropout`, the shape, `max_length`), which depend on the corpus and the
        preset's model (`model_config`).
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


__all__ = ["DTYPE_POLICIES", "TrainingConfig", "config_from"]
