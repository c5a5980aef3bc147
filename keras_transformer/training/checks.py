"""The checks of `TrainingConfig`'s values, one function per group of options.

`TrainingConfig.__post_init__` calls `check(config)`: a bad value is named in
a one-line `ValueError` when the config is made, which `train.py` does
before TensorFlow loads. Like options.py, this module imports neither Keras
nor TensorFlow.
"""

from keras_transformer.training.presets import SHAPE, TRAINING_DEFAULTS

DTYPE_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")

# Options that must be positive integers when given, and those that may be 0.
POSITIVE = ("epochs", "steps", "batch_tokens", "warmup_steps", "vocab_size", "logical_devices",
            "average_last", "beam_size", "validation_every", "sentence_repeats",
            "accumulate_steps", "early_stopping", "encoder_layers", "decoder_layers", "d_model",
            "num_heads", "d_ff", "max_length", "vocab_sample_size",
            "bpe_dropout_copies")  # fmt: skip
AT_LEAST_ZERO = ("validation_bleu_every", "test_samples", "validation_bleu_samples",
                 "max_train_minutes")  # fmt: skip
# The options that set the model's shape, which `--init-from` keeps.


def check(config):
    """Raises a `ValueError` that names the first bad value of a `TrainingConfig`."""
    check_names(config)
    check_counts(config)
    check_rates(config)
    check_combinations(config)
    check_model_shape(config)


def check_names(config):
    """The options that name something: the preset, the precision, the filters,
    the mixed corpora, the exports' folder."""
    from keras_transformer.data.report import FILTERS

    if config.preset is not None and config.preset not in TRAINING_DEFAULTS:
        from keras_transformer.config import PRESETS

        if config.preset not in PRESETS:
            raise ValueError(
                f"Unknown preset {config.preset!r}. Available presets: {sorted(PRESETS)}"
            )
    if config.dtype_policy is not None and config.dtype_policy not in DTYPE_POLICIES:
        raise ValueError(
            f"dtype_policy must be one of {DTYPE_POLICIES}. "
            f"Received: dtype_policy={config.dtype_policy!r}"
        )
    name = config.export_name
    if name is not None and (not name.strip() or "/" in name or name in (".", "..")):
        raise ValueError(
            f"export_name names one folder, without '/'. Received: export_name={name!r}"
        )
    if config.mixture and config.data_dir is None:
        raise ValueError("mix adds corpora to data_dir's: give data_dir (--data-dir) too.")
    unknown = set(config.filter_names) - set(FILTERS)
    if unknown:
        raise ValueError(
            f"Unknown filter(s) {', '.join(sorted(unknown))} in filters={config.filters!r}; "
            f"choose from {', '.join(FILTERS)}, or none."
        )


def check_counts(config):
    """Counts are integers: positive (`POSITIVE`) or at least 0 (`AT_LEAST_ZERO`)."""
    for name in POSITIVE:
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or value <= 0):
            raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")
    for name in AT_LEAST_ZERO:
        value = getattr(config, name)
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0. Received: {name}={value!r}")


def check_rates(config):
    """Rates, shares and probabilities in their ranges; the search's settings."""
    if not 0.0 <= config.terminology_rate <= 1.0:
        raise ValueError(
            "terminology_rate must be in [0, 1]. "
            f"Received: terminology_rate={config.terminology_rate}"
        )
    if config.learning_rate_scale is not None and config.learning_rate_scale <= 0:
        raise ValueError(
            f"learning_rate_scale must be > 0. Received: "
            f"learning_rate_scale={config.learning_rate_scale}"
        )
    _ = config.search  # `SearchConfig`'s checks
    if config.cooldown is not None and not 0.0 <= config.cooldown <= 1.0:
        raise ValueError(f"cooldown must be in [0, 1]. Received: cooldown={config.cooldown}")
    if config.ema is not None and not 0.0 <= config.ema < 1.0:
        raise ValueError(
            f"ema must be in [0, 1): e.g. 0.999, or 0 for none. Received: ema={config.ema}"
        )
    for name in ("label_smoothing", "bpe_dropout", "dropout_start"):
        value = getattr(config, name)
        if value is not None and not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1). Received: {name}={value}")


def check_combinations(config):
    """Options that do not go together."""
    if (
        config.early_stopping
        and config.early_stopping_metric != "loss"
        and config.validation_bleu_every == 0
    ):
        raise ValueError(
            f"early stopping on validation {config.early_stopping_metric} needs "
            "validation_bleu_every >= 1 (how often it decodes the validation pairs)."
        )
    if config.accumulate_steps > 1 and config.cooldown:
        raise ValueError(
            "accumulate_steps > 1 with a cooldown is not supported yet: the cooldown sets "
            "the rate per batch, not per update. Use one of them."
        )
    if config.accumulate_steps > 1 and config.dropout_start:
        raise ValueError(
            "accumulate_steps > 1 with dropout_start is not supported yet: late dropout "
            "counts its step budget in batches, a resumed run's step in updates. "
            "Use one of them."
        )
    given = [name for name in SHAPE if getattr(config, name) is not None]
    if config.init_from is not None and given:
        raise ValueError(
            f"--init-from {config.init_from} keeps its model's shape; leave out "
            f"{', '.join('--' + name.replace('_', '-') for name in given)}."
        )


def check_model_shape(config):
    """The preset's model with the shape options given is a valid `TransformerConfig`
    (e.g. `d_model` divisible by `num_heads`); with `--init-from`, whose shape is
    kept, nothing to check."""
    from keras_transformer.config import PRESETS, get_preset

    if config.init_from is not None or (config.preset or "cpu") not in PRESETS:
        return
    shape = {name: getattr(config, name) for name in SHAPE + ("max_length", "vocab_size")}
    get_preset(config.preset or "cpu", **{k: v for k, v in shape.items() if v is not None})
