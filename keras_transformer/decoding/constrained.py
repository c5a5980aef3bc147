"""Beam search with positive lexical constraints: the beam search of `beam` with its
`constraints` (dynamic beam allocation, `beam.Constraints`), under the name it had
when it was a loop of its own."""

from keras_transformer.decoding.beam import MISSING_PENALTY, beam_search
from keras_transformer.decoding.loop import MIN_LENGTH
from keras_transformer.search import PAPER

__all__ = ["MISSING_PENALTY", "constrained_beam_search"]


def constrained_beam_search(
    tokens_to_logits,
    cache,
    start_ids,
    max_length,
    eos_id,
    constraints,
    beam_size=PAPER.beam_size,
    alpha=PAPER.alpha,
    max_lengths=None,
    pad_id=0,
    min_length=MIN_LENGTH,
    shared=(),
    drop_finished=None,
):
    """`beam_search(..., constraints=constraints)`: every output holds every constraint,
    a `(B, C, L)` int token sequence (`pad_id` after a shorter one); the `"bound"`
    stopping rule. Returns `(sequences (B, K, T), scores (B, K))` as `beam_search`."""
    return beam_search(
        tokens_to_logits, cache, start_ids, max_length, eos_id, beam_size=beam_size,
        alpha=alpha, max_lengths=max_lengths, pad_id=pad_id, min_length=min_length,
        shared=shared, drop_finished=drop_finished, constraints=constraints,
    )  # fmt: skip
