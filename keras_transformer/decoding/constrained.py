"""Positive lexical constraints: the rules they add to the beam search (`beam.py`'s one
loop), dynamic beam allocation.

Every output must hold every constraint, a token sequence (the pieces of a word or
phrase), in any order: Post & Vilar (2018), https://arxiv.org/abs/1804.06609, as
fairseq's `--constraints` runs it (Hu et al., 2019, vectorized it). The search's
state carries them (`BeamState.constraints` per sentence, `.progress` per
hypothesis); `Constraints` holds the rules that read them.

Shapes: A sentences still searching, W hypotheses per sentence, M candidates per
sentence, T output buffer, V vocabulary, C constraints of at most L tokens.
"""

import collections

from keras import ops

from keras_transformer.decoding.loop import _rows, _take, _write
from keras_transformer.search import NEG_INF

MISSING_PENALTY = 1.0e4  # per constraint token missing from an output ended by its limit

# The candidates of one step: log_probs, ids and parents (rows of the A*W hypotheses)
# are (A, M); seqs (A*M, T) are the parents' sequences with the candidate written;
# met (A, M) and progress (A*M, C): the constraint tokens each has met ({} without).
Candidates = collections.namedtuple("Candidates", "log_probs ids parents seqs met progress")


class Constraints:
    """Positive lexical constraints as rules of the beam: dynamic beam allocation.

    Every output must hold every constraint, a token sequence (the pieces of a
    word or phrase), in any order: Post & Vilar (2018),
    https://arxiv.org/abs/1804.06609, as fairseq's `--constraints` runs it (Hu et
    al., 2019, vectorized it). Each hypothesis carries its progress through each
    constraint (tokens matched so far; a token that breaks a partly matched
    constraint starts it over). The candidates of a hypothesis are its 2K best
    continuations and the next token of each constraint it has not met, so that
    a constraint enters hypotheses the model finds unlikely. The candidates are
    grouped into banks by the constraint tokens they have met, and the K alive
    slots are dealt out in turns, the bank with the most met first (`allocate`).
    A hypothesis may end (EOS) only once it holds every constraint; at its
    length limit it ends anyway, `MISSING_PENALTY` lower per token it lacks.
    """

    @staticmethod
    def initial(constraints, pad_id):
        """The per-sentence state: the tokens `(B, C, L)`, each constraint's length
        `(B, C)` and the tokens an output must hold `(B,)`."""
        tokens = ops.cast(constraints, "int32")
        lengths = ops.sum(ops.cast(ops.not_equal(tokens, pad_id), "int32"), axis=2)
        return dict(tokens=tokens, lengths=lengths, total=ops.sum(lengths, axis=1))

    @staticmethod
    def no_progress(constraints):
        """The per-hypothesis state at the start: nothing matched, `(B, C)`."""
        return dict(matched=ops.zeros_like(ops.cast(constraints[:, :, 0], "int32")))

    @staticmethod
    def end_when_complete(logits, state, eos_id, width):
        """`logits (A*W, V)` with EOS at NEG_INF in the hypotheses that do not yet
        hold every constraint."""
        lengths = ops.repeat(state.constraints["lengths"], width, axis=0)  # (A*W, C)
        complete = ops.all(state.progress["matched"] >= lengths, axis=1)  # (A*W,)
        is_eos = ops.equal(ops.arange(logits.shape[-1], dtype="int32"), eos_id)[None, :]
        incomplete_eos = ops.logical_and(is_eos, ops.logical_not(complete)[:, None])
        return ops.where(incomplete_eos, NEG_INF, logits)

    @staticmethod
    def candidates(logits, normalizer, log_probs, row_ids, state, step, width):
        """`Candidates` (A, M = W * (P + C)): each hypothesis's best tokens `row_ids`
        (A*W, P) and each unmet constraint's next token (not already among them, nor
        proposed by an earlier constraint)."""
        constraints, matched = state.constraints, state.progress["matched"]  # (A*W, C)
        tokens = ops.repeat(constraints["tokens"], width, axis=0)  # (A*W, C, L)
        lengths = ops.repeat(constraints["lengths"], width, axis=0)  # (A*W, C)
        column = ops.minimum(matched, ops.shape(tokens)[2] - 1)[:, :, None]  # (A*W, C, 1)
        next_ids = ops.take_along_axis(tokens, column, axis=2)[:, :, 0]  # (A*W, C)
        unmet = matched < lengths
        among_top = ops.any(ops.equal(next_ids[:, :, None], row_ids[:, None, :]), axis=2)
        index = ops.cumsum(ops.ones_like(next_ids[:1]), axis=1) - 1  # (1, C)
        earlier = index[:, None, :] < index[:, :, None]  # (1, C, C) [c, c']: c' before c
        repeated = ops.any(
            ops.logical_and(ops.logical_and(earlier, unmet[:, None, :]),
                            ops.equal(next_ids[:, :, None], next_ids[:, None, :])),
            axis=2,
        )  # fmt: skip  # (A*W, C) an earlier unmet constraint proposes the same token
        proposed = ops.logical_and(unmet, ops.logical_not(ops.logical_or(among_top, repeated)))
        next_log_probs = ops.take_along_axis(logits, next_ids, axis=1) - normalizer
        next_log_probs = ops.where(proposed, next_log_probs, NEG_INF)  # (A*W, C)
        row_log_probs = ops.concatenate([log_probs, next_log_probs], axis=1)  # (A*W, Q)
        ids = ops.concatenate([row_ids, next_ids], axis=1)  # (A*W, Q)
        per_row = ops.shape(ids)[1]  # Q = P + C
        scores = ops.reshape(state.alive_log_probs, (-1, 1)) + row_log_probs  # (A*W, Q)
        rows = _rows(ops.reshape(ids, (-1,)))  # (A*W*Q,)
        parents = ops.floor_divide(rows, per_row)  # rows of the A*W hypotheses
        flat_ids = ops.reshape(ids, (-1,))
        progress = _advance(_take(matched, parents), flat_ids, _take(next_ids, parents),
                            _take(tokens[:, :, 0], parents), _take(lengths, parents))  # fmt: skip
        sentences = ops.shape(state.alive_log_probs)[0]
        met = ops.sum(ops.minimum(progress, _take(lengths, parents)), axis=1)  # (A*M,)
        return Candidates(
            log_probs=ops.reshape(scores, (sentences, -1)),  # (A, M)
            ids=ops.reshape(flat_ids, (sentences, -1)),
            parents=ops.reshape(parents, (sentences, -1)),
            seqs=_write(_take(state.alive_seqs, parents), step, flat_ids),  # (A*M, T)
            met=ops.reshape(met, (sentences, -1)),  # (A, M) the bank
            progress=dict(matched=progress),  # (A*M, C)
        )

    @staticmethod
    def allocate(candidates, ends, state, k):
        """`(alive_log_probs (A, K), keep (A, K))`: dynamic beam allocation. The
        candidates that stay (possible, not ending) are grouped into banks by the
        constraint tokens they have met, ranked by score within their bank, and dealt
        out in turns: rank 0 of the fullest bank, rank 0 of the next, ..., then rank
        1 of each; the others come last."""
        scores, met = candidates.log_probs, candidates.met
        total = state.constraints["total"]  # (A,)
        stays = ops.logical_and(scores > NEG_INF / 2, ops.logical_not(ends))  # (A, M)
        order = ops.cumsum(ops.ones_like(met), axis=1) - 1  # (A, M) 0..M-1
        same_bank = ops.logical_and(ops.equal(met[:, :, None], met[:, None, :]),
                                    stays[:, None, :])  # fmt: skip  # (A, M, M) [i, j]
        ahead = ops.logical_or(
            scores[:, None, :] > scores[:, :, None],
            ops.logical_and(ops.equal(scores[:, None, :], scores[:, :, None]),
                            order[:, None, :] < order[:, :, None]),
        )  # fmt: skip  # (A, M, M) j ranks before i
        rank = ops.sum(ops.cast(ops.logical_and(same_bank, ahead), "int32"), axis=2)  # (A, M)
        turn = rank * (total[:, None] + 1) + (total[:, None] - met)  # (A, M) distinct
        turn = ops.where(stays, turn, 1_000_000 + order)
        _, keep = ops.top_k(-ops.cast(turn, "float32"), k)  # (A, K)
        keep = ops.cast(keep, "int32")
        alive_log_probs = ops.take_along_axis(ops.where(stays, scores, NEG_INF), keep, axis=1)
        return alive_log_probs, keep

    @staticmethod
    def missing(candidates, state):
        """`(A, M)` float32: `MISSING_PENALTY` per constraint token each candidate lacks."""
        total = state.constraints["total"][:, None]  # (A, 1)
        return ops.cast(total - candidates.met, "float32") * MISSING_PENALTY


def _advance(matched, token_ids, next_ids, first_ids, lengths):
    """Each constraint's tokens matched after `token_ids`; all `(N, C)` but `token_ids
    (N,)`: one more where the token is the constraint's next, 1 where it starts it
    over, 0 where it breaks it; a met constraint stays met."""
    token_ids = token_ids[..., None]
    advanced = ops.where(
        ops.equal(token_ids, next_ids),
        matched + 1,
        ops.cast(ops.equal(token_ids, first_ids), "int32"),
    )
    return ops.where(matched >= lengths, matched, advanced)
