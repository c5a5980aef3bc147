"""The search settings of every translation path, defined and checked in one place.

`SearchConfig` holds what a translation search needs besides the model:
beam size, length-penalty exponent and how many tokens an output may have
beyond its source. `decoding.translate_ids`, `Translator`, the SavedModel
and ONNX exports, `OnnxTranslator`, `train.py`'s test decode and the
command lines all take their defaults from `PAPER` and their checks from
`SearchConfig`, so a setting is written once.

This module imports neither Keras nor TensorFlow: `OnnxTranslator` uses it
in processes that have neither.

Example:

>>> PAPER
SearchConfig(beam_size=4, alpha=0.6, max_extra_length=50)
>>> PAPER.replace(beam_size=1, alpha=None)  # None keeps the setting
SearchConfig(beam_size=1, alpha=0.6, max_extra_length=50)
>>> SearchConfig(beam_size=0)
Traceback (most recent call last):
...
ValueError: beam_size must be a positive integer. Received: beam_size=0
"""

import dataclasses
import math
import numbers


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """How translations are searched; the defaults are the paper's (Section 6.1).

    Attributes:
        beam_size: int >= 1. 1 runs greedy search; the paper uses 4.
        alpha: float >= 0. Exponent of the GNMT length penalty
            (`decoding.length_penalty`); the paper uses 0.6.
        max_extra_length: int >= 0. An output has at most its source length
            plus this many tokens (the paper: 50), and at most the model's
            `max_length`.
    """

    beam_size: int = 4
    alpha: float = 0.6
    max_extra_length: int = 50

    def __post_init__(self):
        if not _is_int(self.beam_size) or self.beam_size < 1:
            raise ValueError(
                f"beam_size must be a positive integer. Received: beam_size={self.beam_size!r}"
            )
        if (
            not isinstance(self.alpha, numbers.Real)
            or isinstance(self.alpha, bool)
            or not math.isfinite(self.alpha)
            or self.alpha < 0
        ):
            raise ValueError(f"alpha must be a number >= 0. Received: alpha={self.alpha!r}")
        if not _is_int(self.max_extra_length) or self.max_extra_length < 0:
            raise ValueError(
                "max_extra_length must be an integer >= 0. "
                f"Received: max_extra_length={self.max_extra_length!r}"
            )

    def replace(self, **settings):
        """A copy with the settings given; a setting given as None keeps this one's."""
        return dataclasses.replace(
            self, **{name: value for name, value in settings.items() if value is not None}
        )

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, settings):
        """From a dict such as `config.json`'s `search` (unknown keys refused, None ignored)."""
        if isinstance(settings, cls):
            return settings
        unknown = sorted(set(settings or {}) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"Unknown search settings {unknown}. Known: {PAPER.to_dict()}")
        return PAPER.replace(**(settings or {}))


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


PAPER = SearchConfig()
