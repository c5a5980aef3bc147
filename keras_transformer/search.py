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
SearchConfig(beam_size=4, alpha=0.6, max_extra_length=50, stopping='bound', patience=1.0)
>>> PAPER.replace(beam_size=1, alpha=None)  # None keeps the setting
SearchConfig(beam_size=1, alpha=0.6, max_extra_length=50, stopping='bound', patience=1.0)
>>> SearchConfig(beam_size=0)
Traceback (most recent call last):
...
ValueError: beam_size must be a positive integer. Received: beam_size=0
"""

import dataclasses
import math
import numbers

# How a beam search decides that a sentence has its answer (`decoding.beam_search`):
# "bound": no alive hypothesis can still beat the worst finished one (exact);
# "k_finished": beam_size * patience hypotheses have finished (fairseq, CTranslate2).
STOPPING_RULES = ("bound", "k_finished")
# A large negative log-probability instead of -inf, which turns into NaN in
# `-inf - -inf` and `0 * -inf` (the flax example makes the same choice).
NEG_INF = -1.0e7


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
        stopping: one of `STOPPING_RULES`: when a sentence's beam search
            stops before its length limit. `"bound"` (the default) stops
            once no alive hypothesis can score above the worst of the K
            finished ones, under `log P / ((5 + length) / 6) ** alpha`:
            the search's exact answer, which at large alpha runs most
            sentences to their limit. `"k_finished"` stops once
            `ceil(beam_size * patience)` hypotheses have ended (an end
            counts when it is among the K best continuations of its step),
            as fairseq and CTranslate2 do; the best finished one under the
            same score wins.
        patience: float > 0, `"k_finished"`'s factor (CTranslate2's
            `patience`; 1.0 is fairseq's rule).
    """

    beam_size: int = 4
    alpha: float = 0.6
    max_extra_length: int = 50
    stopping: str = "bound"
    patience: float = 1.0

    def __post_init__(self):
        if not _is_int(self.beam_size) or self.beam_size < 1:
            raise ValueError(
                f"beam_size must be a positive integer. Received: beam_size={self.beam_size!r}"
            )
        if not _is_finite(self.alpha) or self.alpha < 0:
            raise ValueError(f"alpha must be a number >= 0. Received: alpha={self.alpha!r}")
        if not _is_int(self.max_extra_length) or self.max_extra_length < 0:
            raise ValueError(
                "max_extra_length must be an integer >= 0. "
                f"Received: max_extra_length={self.max_extra_length!r}"
            )
        if self.stopping not in STOPPING_RULES:
            raise ValueError(
                f"stopping must be one of {STOPPING_RULES}. Received: stopping={self.stopping!r}"
            )
        if not _is_finite(self.patience) or self.patience <= 0:
            raise ValueError(f"patience must be a number > 0. Received: patience={self.patience!r}")

    @property
    def needed(self):
        """Finished hypotheses that stop a sentence under `"k_finished"`: ceil(K * patience)."""
        return max(1, math.ceil(self.beam_size * self.patience - 1e-9))

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


def _is_finite(value):
    """A finite real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


PAPER = SearchConfig()
