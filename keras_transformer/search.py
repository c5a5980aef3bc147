"""The search settings of every translation path, defined and checked in one place.

`SearchConfig` holds what a translation search needs besides the model:
beam size, length-penalty exponent, stopping rule and how many tokens an
output may have for its source's length (`output_limit`).
`decoding.translate_ids`, `Translator`, the SavedModel and ONNX exports,
`OnnxTranslator`, `train.py`'s test decode and the command lines all take
their defaults from `PAPER` and their checks from `SearchConfig`, so a
setting is written once.

This module imports neither Keras nor TensorFlow: `OnnxTranslator` uses it
in processes that have neither.

Example:

>>> PAPER.beam_size, PAPER.alpha, PAPER.max_extra_length, PAPER.stopping
(4, 0.6, 50, 'bound')
>>> PAPER.replace(beam_size=1, alpha=None).to_dict()  # None keeps the setting
{'beam_size': 1, 'alpha': 0.6, 'max_extra_length': 50, 'stopping': 'bound', \
'patience': 1.0, 'length_ratio': 1.0}
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
        max_extra_length: int >= 0. An output has at most
            `ceil(length_ratio * source length) + max_extra_length` tokens
            (EOS included on both sides; the paper: source + 50), and at most
            the model's `max_length`.
        length_ratio: float > 0, the `a` of that limit (fairseq's
            `max_len_a`). `train.py` fits `length_ratio` and
            `max_extra_length` on the training corpus (`fit_output_limit`).
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
    length_ratio: float = 1.0

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
        if not _is_finite(self.length_ratio) or self.length_ratio <= 0:
            raise ValueError(
                f"length_ratio must be a number > 0. Received: length_ratio={self.length_ratio!r}"
            )

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


# The ratios `fit_output_limit` tries, and the share of training pairs a limit must hold.
LENGTH_RATIOS = (1.0, 1.25, 1.5, 2.0, 3.0)
LIMIT_COVERAGE = 0.9999
MIN_EXTRA_LENGTH = 5


def output_limit(source_length, length_ratio, max_extra_length):
    """Generated tokens (EOS included) allowed for a source of `source_length` tokens
    (EOS included): `ceil(length_ratio * source_length) + max_extra_length`. The
    one formula of every path (`decoding.output_limits` computes it as tensors)."""
    return math.ceil(length_ratio * source_length - 1e-6) + max_extra_length


def fit_output_limit(source_lengths, output_lengths, coverage=LIMIT_COVERAGE):
    """`(length_ratio, max_extra_length)` fitted on a corpus's token lengths.

    For each ratio `a` of `LENGTH_RATIOS`, `b` is the smallest slack
    (at least `MIN_EXTRA_LENGTH`) under which `coverage` of the pairs fit
    (`output_length <= ceil(a * source_length) + b`); the pair `(a, b)` with
    the smallest mean limit over the corpus wins (the smaller `a` on ties):
    the tightest output buffer that cuts at most 1 pair in 10,000. fairseq
    leaves `max_len_a`/`max_len_b` to the user (0 and 200); this reads them
    off the corpus, as a `source + 50` rule cannot.

    Args:
        source_lengths: `(N,)` ints, source tokens with EOS.
        output_lengths: `(N,)` ints, target tokens with EOS.

    Returns:
        `(float, int)`.

    >>> fit_output_limit([4, 10, 20] * 100, [5, 12, 22] * 100)
    (1.0, 5)
    """
    import numpy as np

    source = np.asarray(source_lengths, dtype=np.float64)
    output = np.asarray(output_lengths, dtype=np.float64)
    if not len(source) or len(source) != len(output):
        raise ValueError(
            f"fit_output_limit needs as many output lengths as source lengths, at least one. "
            f"Received: {len(source)} and {len(output)}"
        )
    best = None
    for ratio in LENGTH_RATIOS:
        base = np.ceil(ratio * source - 1e-6)
        extra = max(MIN_EXTRA_LENGTH, int(np.ceil(np.quantile(output - base, coverage))))
        mean = float(np.mean(base)) + extra
        if best is None or mean < best[0] - 1e-9:
            best = (mean, ratio, extra)
    return best[1], best[2]


def _is_finite(value):
    """A finite real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


PAPER = SearchConfig()
