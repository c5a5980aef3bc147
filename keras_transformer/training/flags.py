"""`train.py`'s command line, made from `TrainingConfig`'s fields (options.py).

A field's flag, type, help and default are read from the field, and the help
ends with what each preset makes of it (`TRAINING_DEFAULTS`, or the model
presets' `TransformerConfig` for the model's shape), so that the help says
what `resolved()` and `model_config` do. Imports neither Keras nor TensorFlow.
"""

import argparse
import dataclasses
import types

from keras_transformer.training.presets import COMMON_DEFAULTS, TRAINING_DEFAULTS

# Options whose default is the model preset's (`config.PRESETS`), read through
# this `TransformerConfig` attribute.
MODEL_DEFAULTS = {
    "encoder_layers": "num_encoder_layers",
    "decoder_layers": "num_decoder_layers",
    "d_model": "d_model",
    "num_heads": "num_heads",
    "d_ff": "d_ff",
    "max_length": "max_length",
}


def add_arguments(parser):
    """Adds a flag per `TrainingConfig` field to an `argparse` parser.

    `--max-train-minutes` for `max_train_minutes`; a field whose default is True
    becomes `--no-NAME`, one defaulting to False `--NAME`, an optional bool
    `--NAME/--no-NAME`. The help ends with the per-preset defaults, read from
    `TRAINING_DEFAULTS`. `vars(parser.parse_args())` gives `TrainingConfig`'s fields.
    """
    from keras_transformer.training.options import TrainingConfig

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
    if name in MODEL_DEFAULTS:
        from keras_transformer.config import PRESETS

        return _shown({p: getattr(c, MODEL_DEFAULTS[name]) for p, c in PRESETS.items()})
    if not any(name in defaults for defaults in TRAINING_DEFAULTS.values()):
        if name in COMMON_DEFAULTS and COMMON_DEFAULTS[name] is not None:
            return f" (default: {COMMON_DEFAULTS[name]})"
        return ""
    return _shown(
        {preset: defaults.get(name, COMMON_DEFAULTS.get(name))
         for preset, defaults in TRAINING_DEFAULTS.items()}
    )  # fmt: skip


def _shown(per_preset):
    """`" (default: cpu/tiny 2; small 3)"` of a dict preset -> value."""
    values = {}
    for preset, value in per_preset.items():
        values.setdefault(value, []).append(preset)
    shown = "; ".join(
        f"{'/'.join(presets)} {'none' if value is None else value}"
        for value, presets in values.items()
    )
    return f" (default: {shown})"
