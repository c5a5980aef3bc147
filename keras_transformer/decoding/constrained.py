"""Beam search with positive lexical constraints: dynamic beam allocation (DBA).

Every output must hold every constraint, a token sequence (the pieces of a
word or phrase), in any order: Post & Vilar (2018), https://arxiv.org/abs/1804.06609,
as fairseq's `--constraints` runs it (Hu et al., 2019, vectorized it).

Each hypothesis carries its progress through each constraint (tokens matched
so far; a token that breaks a partly matched constraint starts it over). At
each step the candidates of a hypothesis are its 2K best continuations and,
besides them, the next token of each constraint it has not met, so that a
constraint enters hypotheses the model finds unlikely. The candidates are
grouped into banks by the number of constraint tokens they have met, and
the K alive slots are dealt out in turns, the bank with the most met first:
each bank's best, then each bank's second best, and so on; DBA's even
allocation, where the slots a bank cannot fill go to the others. A
hypothesis may end (EOS) only once it holds every constraint; at its length
limit it ends anyway, its score lowered by `MISSING_PENALTY` per constraint
token it lacks, so that it ranks below every complete one.

A sentence stops by the `"bound"` rule of `beam_search` (no alive hypothesis
can still beat its K-th finished one) or at its limit. The loop keeps fixed
shapes (no rows leave it) and scores `K * (2K + C)` candidates per sentence
and step: its cost against `beam_search` is measured in docs/translating.md.

Shapes: B batch, K beam size, C constraints, L longest constraint, T output
buffer, V vocabulary, M = K * (2K + C) candidates per sentence.
"""

import keras
from keras import ops

from keras_transformer.decoding.loop import (
    MIN_LENGTH,
    _batch_offsets,
    _check_limits,
    _forbid_early_end,
    _keep,
    _take,
    _while_loop,
    _write,
    length_penalty,
)
from keras_transformer.search import NEG_INF, PAPER

MISSING_PENALTY = 1.0e4  # per constraint token missing from an output ended by its limit


def _progress(progress, token_ids, next_ids, first_ids, lengths):
    """Each constraint's tokens matched after `token_ids`; all `(..., C)` but
    `token_ids (...)`: one more where the token is the constraint's next, 1 where
    it starts it over, 0 where it breaks it; a met constraint stays met."""
    token_ids = token_ids[..., None]
    advanced = ops.where(
        ops.equal(token_ids, next_ids),
        progress + 1,
        ops.cast(ops.equal(token_ids, first_ids), "int32"),
    )
    return ops.where(progress >= lengths, progress, advanced)


def _end_when_complete(log_probs, complete, eos_id):
    """`log_probs (N, V)` with EOS at NEG_INF in the rows not `complete (N,)`: an
    output ends once it holds every constraint."""
    is_eos = ops.equal(ops.arange(log_probs.shape[-1], dtype="int32"), eos_id)[None, :]
    return ops.where(ops.logical_and(is_eos, ops.logical_not(complete)[:, None]), NEG_INF,
                     log_probs)  # fmt: skip


def _allocate(scores, met, total, stays, k):
    """`(B, K)` int32: the candidates kept alive, dynamic beam allocation's way.

    The candidates that `stays (B, M)` are grouped into banks by the constraint
    tokens they have `met (B, M)` (0 to `total (B,)`), ranked by `scores (B, M)`
    within their bank, and dealt out in turns: rank 0 of the fullest bank, rank 0
    of the next, ..., then rank 1 of each; the others come last.
    """
    order = ops.cumsum(ops.ones_like(met), axis=1) - 1  # (B, M) 0..M-1
    same_bank = ops.logical_and(ops.equal(met[:, :, None], met[:, None, :]),
                                stays[:, None, :])  # fmt: skip  # (B, M, M) [i, j]
    ahead = ops.logical_or(
        scores[:, None, :] > scores[:, :, None],
        ops.logical_and(ops.equal(scores[:, None, :], scores[:, :, None]),
                        order[:, None, :] < order[:, :, None]),
    )  # fmt: skip  # (B, M, M) j ranks before i
    rank = ops.sum(ops.cast(ops.logical_and(same_bank, ahead), "int32"), axis=2)  # (B, M)
    turn = rank * (total[:, None] + 1) + (total[:, None] - met)  # (B, M) distinct
    turn = ops.where(stays, turn, 1_000_000 + order)
    _, keep = ops.top_k(-ops.cast(turn, "float32"), k)  # (B, K)
    return ops.cast(keep, "int32")


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
    """Beam search whose outputs hold every constraint (dynamic beam allocation).

    Args:
        tokens_to_logits, cache, start_ids, max_length, eos_id, beam_size,
            alpha, max_lengths, pad_id, min_length, shared: as `beam_search`.
        constraints: `(B, C, L)` int token sequences, `pad_id` after a shorter
            one (an all-`pad_id` row is no constraint).
        drop_finished: ignored: this loop keeps its shapes.

    Returns:
        `(sequences (B, K, T) int32, scores (B, K) float32)`, best first, as
        `beam_search`; an output that misses a constraint (its limit came
        first) scores `MISSING_PENALTY` lower per missing token.
    """
    del drop_finished
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer. Received: beam_size={beam_size}")
    k = beam_size
    start_ids = ops.cast(start_ids, "int32")
    max_lengths = _check_limits(max_length, max_lengths, start_ids)  # (B,)
    limit_penalty = length_penalty(max_lengths, alpha)  # (B,)
    constraints = ops.cast(constraints, "int32")  # (B, C, L)
    lengths = ops.sum(ops.cast(ops.not_equal(constraints, pad_id), "int32"), axis=2)  # (B, C)
    total = ops.sum(lengths, axis=1)  # (B,) constraint tokens an output must hold
    batch_size = ops.shape(start_ids)[0]

    def per_hypothesis(x):
        return ops.repeat(x, k, axis=0)

    hypothesis_constraints = per_hypothesis(constraints)  # (B*K, C, L)
    hypothesis_lengths = per_hypothesis(lengths)  # (B*K, C)
    last_column = ops.shape(constraints)[2] - 1
    shared_cache = {key: cache[key] for key in shared}
    cache = keras.tree.map_structure(
        per_hypothesis, {key: value for key, value in cache.items() if key not in shared}
    )
    empty = ops.zeros((batch_size * k, max_length), dtype="int32") + pad_id  # (B*K, T)
    beams = ops.arange(k, dtype="int32")[None, :]  # (1, K)
    no_scores = ops.zeros_like(start_ids[:, None], dtype="float32") + NEG_INF + ops.zeros((1, k))
    state = dict(
        # One hypothesis per sentence at first: the others score NEG_INF.
        alive_log_probs=ops.where(ops.equal(beams, 0), 0.0, no_scores),  # (B, K)
        alive_seqs=empty,  # (B*K, T)
        last_ids=per_hypothesis(start_ids),  # (B*K,)
        progress=ops.zeros_like(hypothesis_lengths),  # (B*K, C) tokens matched
        finished=dict(
            sequences=empty,  # (B*K, T)
            scores=no_scores,  # (B, K)
            flags=ops.zeros_like(no_scores, dtype="bool"),  # (B, K)
        ),
        done=ops.zeros_like(start_ids, dtype="bool"),  # (B,)
        cache=cache,  # (B*K, ...)
    )

    def cond(step, state):
        return ops.logical_and(step < max_length, ops.logical_not(ops.all(state["done"])))

    def body(step, state):
        logits, cache = tokens_to_logits(state["last_ids"], {**state["cache"], **shared_cache})
        cache = {key: value for key, value in cache.items() if key not in shared}
        logits = ops.cast(logits, "float32")  # (B*K, V)
        vocab_size = logits.shape[-1]
        log_probs = logits - ops.logsumexp(logits, axis=-1, keepdims=True)
        log_probs = _forbid_early_end(log_probs, step, eos_id, min_length)
        progress = state["progress"]  # (B*K, C)
        complete = ops.all(progress >= hypothesis_lengths, axis=1)  # (B*K,)
        log_probs = _end_when_complete(log_probs, complete, eos_id)

        # Candidates: the 2K best tokens and each unmet constraint's next token.
        per_row = min(2 * k, vocab_size)
        top_log_probs, top_ids = ops.top_k(log_probs, per_row)  # (B*K, P)
        top_ids = ops.cast(top_ids, "int32")
        column = ops.minimum(progress, last_column)[:, :, None]  # (B*K, C, 1)
        next_ids = ops.take_along_axis(hypothesis_constraints, column, axis=2)[:, :, 0]
        unmet = progress < hypothesis_lengths  # (B*K, C)
        among_top = ops.any(ops.equal(next_ids[:, :, None], top_ids[:, None, :]), axis=2)
        index = ops.cumsum(ops.ones_like(next_ids[:1]), axis=1) - 1  # (1, C)
        earlier = index[:, None, :] < index[:, :, None]  # (1, C, C) [c, c']: c' before c
        repeated = ops.any(
            ops.logical_and(
                ops.logical_and(earlier, unmet[:, None, :]),
                ops.equal(next_ids[:, :, None], next_ids[:, None, :]),
            ),
            axis=2,
        )  # (B*K, C) an earlier unmet constraint proposes the same token
        proposed = ops.logical_and(unmet, ops.logical_not(ops.logical_or(among_top, repeated)))
        next_log_probs = ops.where(
            proposed, ops.take_along_axis(log_probs, next_ids, axis=1), NEG_INF
        )  # (B*K, C)
        candidates = ops.concatenate([top_log_probs, next_log_probs], axis=1)  # (B*K, Q)
        width = ops.shape(candidates)[1]  # Q = P + C
        scores = ops.reshape(state["alive_log_probs"], (-1, 1)) + candidates  # (B*K, Q)
        scores = ops.reshape(scores, (batch_size, -1))  # (B, M)
        token_ids = ops.concatenate([top_ids, next_ids], axis=1)  # (B*K, Q)
        flat_ids = ops.reshape(token_ids, (-1,))  # (B*M,)
        candidate_rows = ops.cumsum(ops.ones_like(flat_ids), axis=0) - 1  # (B*M,)
        parents = ops.floor_divide(candidate_rows, width)  # (B*M,) rows of the B*K hypotheses
        new_progress = _progress(
            _take(progress, parents), flat_ids, _take(next_ids, parents),
            _take(hypothesis_constraints[:, :, 0], parents), _take(hypothesis_lengths, parents),
        )  # fmt: skip  # (B*M, C)
        met = ops.reshape(
            ops.sum(ops.minimum(new_progress, _take(hypothesis_lengths, parents)), axis=1),
            (batch_size, -1),
        )  # (B, M) constraint tokens met: the bank
        ids = ops.reshape(flat_ids, (batch_size, -1))  # (B, M)
        possible = scores > NEG_INF / 2
        at_limit = (step + 1 >= max_lengths)[:, None]  # (B, 1)
        ends = ops.logical_or(ops.equal(ids, eos_id), at_limit)  # (B, M)

        # Alive: K slots dealt to the banks in turns, most constraint tokens met first.
        stays = ops.logical_and(possible, ops.logical_not(ends))  # (B, M)
        keep = _allocate(scores, met, total, stays, k)  # (B, K)
        alive_log_probs = ops.take_along_axis(ops.where(stays, scores, NEG_INF), keep, axis=1)
        kept = ops.reshape(keep + _batch_offsets(keep, ops.shape(ids)[1]), (-1,))  # (B*K,)
        alive_parents = ops.take(parents, kept, axis=0)
        last_ids = ops.take(flat_ids, kept, axis=0)
        alive_seqs = _write(ops.take(state["alive_seqs"], alive_parents, axis=0), step, last_ids)

        # Finished: the K best of the old ones and the candidates that end now.
        done = state["done"]
        finishes = ops.logical_and(ops.logical_and(possible, ends),
                                   ops.logical_not(done)[:, None])  # fmt: skip
        missing = ops.cast(total[:, None] - met, "float32") * MISSING_PENALTY
        new_scores = scores / length_penalty(step + 1, alpha) - missing
        old = state["finished"]
        merged = ops.concatenate([old["scores"], ops.where(finishes, new_scores, NEG_INF)], axis=1)
        finished_scores, pick = ops.top_k(merged, k)  # (B, K), old ones first on ties
        pick = ops.cast(pick, "int32")
        from_old = ops.reshape(pick < k, (-1,))  # (B*K,)
        old_rows = ops.reshape(ops.minimum(pick, k - 1) + _batch_offsets(pick, k), (-1,))
        new_rows = ops.reshape(
            ops.maximum(pick - k, 0) + _batch_offsets(pick, ops.shape(ids)[1]), (-1,)
        )  # rows of the B*M candidates
        new_seqs = _write(
            ops.take(state["alive_seqs"], ops.take(parents, new_rows, axis=0), axis=0),
            step, ops.take(flat_ids, new_rows, axis=0),
        )  # fmt: skip
        finished = dict(
            sequences=ops.where(
                from_old[:, None], ops.take(old["sequences"], old_rows, axis=0), new_seqs
            ),
            scores=finished_scores,
            flags=ops.take_along_axis(
                ops.concatenate([old["flags"], finishes], axis=1), pick, axis=1
            ),
        )
        best_alive = ops.max(alive_log_probs, axis=1)  # (B,)
        bound = ops.logical_and(
            ops.all(finished["flags"], axis=1),
            finished_scores[:, -1] > best_alive / limit_penalty,
        )
        stops = ops.logical_or(ops.logical_or(bound, at_limit[:, 0]), best_alive <= NEG_INF / 2)
        state = dict(
            alive_log_probs=alive_log_probs,
            alive_seqs=alive_seqs,
            last_ids=last_ids,
            progress=ops.take(new_progress, kept, axis=0),
            finished=finished,
            done=ops.logical_or(done, stops),
            cache=_keep(cache, alive_parents),
        )
        return step + 1, state

    step = ops.convert_to_tensor(0, dtype="int32")
    _, state = _while_loop(cond, body, (step, state), drop_finished=False)
    finished = state["finished"]
    real = ops.where(ops.reshape(finished["flags"], (-1, 1)), finished["sequences"], pad_id)
    return ops.reshape(real, (batch_size, k, -1)), finished["scores"]
