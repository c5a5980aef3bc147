"""Beam search: one loop for the plain search and the constrained one, dropping the
sentences that have their answer.

It keeps `K` alive hypotheses (not yet ended) ranked by log-probability and
`K` finished ones ranked by `log P / length_penalty(length, alpha)`. Each step
expands the alive beams, takes the `2K` best continuations (enough that `K`
of them do not end), moves those that end into the finished set and keeps
the `K` best others alive. A hypothesis ends by producing EOS or by reaching
its sequence's length limit, so every returned hypothesis is complete. A
sentence stops at its length limit or, before it, by the stopping rule:

- `"bound"`: once no alive hypothesis can still beat its worst finished one
  (`max alive log P / length_penalty(limit)` bounds every score it can reach,
  for `alpha >= 0`): the search's exact answer.
- `"k_finished"`: once `ceil(K * patience)` hypotheses have finished
  (fairseq's and CTranslate2's rule, Hugging Face's `early_stopping=True`);
  as in fairseq, an end counts only if it is among the `K` best
  continuations of its step.

A stopped sentence leaves the loop with its hypotheses and cache rows
(`drop_finished`), and its output is final. The hypotheses of one sentence
share the cache entries named in `shared` (one row per sentence, e.g. the
source's cross-attention keys and values): the beam never reorders them;
they only lose the rows of stopped sentences.

Each step is a few named rules over a named state (`BeamState`), as flax's
`decode.py` and CTranslate2's `decoding.cc` read:

    logits -> candidates (`_expand`) -> the alive hypotheses (`_choose_alive`)
           -> the finished ones (`_finish`) -> who stops (`_stops`)
           -> their answer to the output (`_hand_off`) -> rows that leave (`_retire`)

Positive lexical constraints (`Constraints`, dynamic beam allocation) are a
parameter of the same loop, not a second one: their state rides in
`BeamState.constraints` (per sentence) and `BeamState.progress` (per
hypothesis), and they change three rules: the candidates (each unmet
constraint's next token joins a hypothesis's best tokens), the alive choice
(slots dealt to banks of constraint tokens met) and the finished scores (a
penalty per constraint token missing). A forced prefix and banned sequences
are rules of the step function (`sampling.force_prefix`, `ban_sequences`),
so every search takes them.

Shapes: B batch, A sentences still searching, W hypotheses per sentence (1 at
the first step, then K), M candidates per sentence, T output buffer, V
vocabulary, C constraints of at most L tokens.
"""

import collections
import dataclasses
import functools

from keras import ops

from keras_transformer.decoding import loop
from keras_transformer.decoding.constrained import MISSING_PENALTY, Candidates, Constraints
from keras_transformer.decoding.loop import (
    MIN_LENGTH,
    _batch_offsets,
    _check_limits,
    _forbid_early_end,
    _is_negative,
    _keep,
    _match,
    _positions,
    _rows,
    _take,
    _while_loop,
    _write,
    length_penalty,
)
from keras_transformer.search import NEG_INF, PAPER, SearchConfig

# The loop's state. Per sentence (A rows): sentences (their places in the batch),
# limits, limit_penalty, searching (False once stopped, where rows stay), alive_log_probs
# (A, W), finished's scores, flags and count, shared (the cache entries of one row per
# sentence), constraints ({} or tokens (A, C, L), lengths (A, C), total (A,)). Per
# hypothesis (A*W rows): alive_seqs (A*W, T), last_ids, finished's sequences, cache,
# progress ({} or progress (A*W, C): each constraint's tokens matched).
BeamState = collections.namedtuple(
    "BeamState",
    "sentences limits limit_penalty searching alive_log_probs alive_seqs last_ids finished "
    "cache shared constraints progress",
)
PER_SENTENCE = ("sentences", "limits", "limit_penalty", "searching", "alive_log_probs",
                "shared", "constraints")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Rules:
    """The search's settings, as its rules read them."""

    k: int
    alpha: object  # float, or a float32 scalar tensor
    eos_id: int
    pad_id: int
    min_length: int
    stopping: str
    needed: int  # "k_finished": hypotheses that must finish
    constrained: bool

    @classmethod
    def of(cls, k, alpha, eos_id, pad_id, min_length, stopping, patience, constrained):
        """The rules of `beam_search`'s arguments, checked."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"beam_size must be a positive integer. Received: beam_size={k}")
        if _is_negative(alpha):
            raise ValueError(f"alpha must be >= 0. Received: alpha={alpha}")
        stopping = "bound" if constrained else stopping  # dynamic beam allocation's rule
        needed = SearchConfig(beam_size=k, stopping=stopping, patience=patience).needed
        return cls(k, alpha, eos_id, pad_id, min_length, stopping, needed, constrained)


def beam_search(
    tokens_to_logits, cache, start_ids, max_length, eos_id, beam_size=PAPER.beam_size,
    alpha=PAPER.alpha, max_lengths=None, pad_id=0, min_length=MIN_LENGTH,
    stopping=PAPER.stopping, patience=PAPER.patience, shared=(), drop_finished=None,
    constraints=None,
):  # fmt: skip
    """Beam search with the GNMT length penalty, flax-style, dropping finished sentences
    (its rules: this module's docstring).

    Args:
        tokens_to_logits: `(token_ids (A*K,), cache) -> (logits (A*K, V), cache)`
            for the A sentences still running; the `shared` entries of its
            cache have A rows, the others A*K.
        cache: nested structure of tensors with batch `B` on axis 0 (a dict
            if `shared` is given); the entries not in `shared` are tiled to
            `B*K` here (beam `k` of sequence `b` is row `b*K + k`).
        start_ids: `(B,)` int, the first input token (BOS).
        max_length: int or int scalar tensor, T: size of the output buffer.
        eos_id: int.
        beam_size: int K >= 1.
        alpha: float >= 0 (or a float32 scalar tensor), the length-penalty exponent.
        max_lengths: optional `(B,)` int, per-sequence limit on generated
            tokens (EOS included), at most `max_length`.
        pad_id: int written after EOS.
        min_length: int. `eos_id` cannot come before this many other tokens.
        stopping: `"bound"` or `"k_finished"` (`search.STOPPING_RULES`).
        patience: float > 0, for `"k_finished"`.
        shared: top-level keys of `cache` shared by a sentence's hypotheses.
        drop_finished: bool; None: `drops_finished()` (not under JAX).
            Either way the output is the same.
        constraints: optional `(B, C, L)` int token sequences every output must
            hold, `pad_id` after a shorter one (an all-`pad_id` row is none).

    Returns:
        `(sequences (B, K, T) int32, scores (B, K) float32)`, best first: length-penalized
        log-probabilities (`MISSING_PENALTY` lower per constraint token missing).
    """
    rules = Rules.of(beam_size, alpha, eos_id, pad_id, min_length, stopping, patience,
                     constraints is not None)  # fmt: skip
    drop = loop.drops_finished() if drop_finished is None else drop_finished
    start_ids = ops.cast(start_ids, "int32")
    max_lengths = _check_limits(max_length, max_lengths, start_ids)  # (B,)
    output, state = _initial(cache, start_ids, max_length, max_lengths, shared, constraints, rules)
    # The sentences' places in the batch (B,): at the start, every sentence is searching.
    step = functools.partial(_step, tokens_to_logits, shared, rules, state.sentences, drop)

    def cond(i, output, state):
        return ops.logical_and(i < max_length, ops.any(state.searching))

    # The first step expands one hypothesis per sentence (computing K identical
    # rows would waste K - 1); the loop then runs K per sentence still searching.
    # It runs outside the loop, also for an empty batch (every op takes 0 rows).
    first = step(ops.convert_to_tensor(0, dtype="int32"), output, state, width=1, first=True)
    _, output, _ = _while_loop(cond, step, first, drop)
    rows = _batch_offsets(output["scores"], beam_size)[:, 0]  # (B,)
    sequences = ops.stack(
        [ops.take(output["sequences"], rows + i, axis=0) for i in range(beam_size)], axis=1
    )  # (B, K, T)
    return sequences, output["scores"]


def _step(tokens_to_logits, shared, rules, places, drop, step, output, state, width=None,
          first=False):  # fmt: skip
    """One step of `width` hypotheses per sentence (1 at the `first` step, then K):
    the loop's body, its rules in order."""
    width = rules.k if width is None else width
    logits, cache = _logits(tokens_to_logits, state, shared)
    candidates = _expand(logits, state, step, rules, width, first)
    at_limit = (step + 1 >= state.limits)[:, None]  # (A, 1)
    ends = ops.logical_or(ops.equal(candidates.ids, rules.eos_id), at_limit)  # (A, M)
    alive_log_probs, kept = _choose_alive(candidates, ends, state, rules)
    finished = _finish(candidates, ends, at_limit, state.finished, step, state, rules)
    done = ops.logical_or(_stops(finished, alive_log_probs, state, rules), at_limit[:, 0])
    output = _hand_off(output, state, finished, done, places, rules)
    state = state._replace(
        searching=ops.logical_and(state.searching, ops.logical_not(done)),
        alive_log_probs=alive_log_probs,
        alive_seqs=_take(candidates.seqs, kept),  # (A*K, T)
        last_ids=_take(ops.reshape(candidates.ids, (-1,)), kept),  # (A*K,)
        finished=finished,
        progress={key: _take(value, kept) for key, value in candidates.progress.items()},
    )
    parents = _take(ops.reshape(candidates.parents, (-1,)), kept)  # rows of the old cache
    if not drop:  # the cache follows its beams
        return step + 1, output, state._replace(cache=_keep(cache, parents))
    state = ops.cond(
        ops.any(done), lambda: _retire(state, cache, parents, rules.k),
        lambda: state._replace(cache=_keep(cache, parents)),
    )  # fmt: skip
    return step + 1, output, state


def _initial(cache, start_ids, max_length, max_lengths, shared, constraints, rules):
    """`(output, BeamState)` before the first step: one hypothesis per sentence."""
    k, batch_size = rules.k, ops.shape(start_ids)[0]
    shared_cache = {key: cache[key] for key in shared}
    if shared:
        cache = {key: value for key, value in cache.items() if key not in shared}
    empty = ops.zeros((batch_size * k, max_length), dtype="int32") + rules.pad_id  # (B*K, T)
    zeros = ops.zeros_like(start_ids[:, None], dtype="float32")  # (B, 1)
    no_scores = zeros + NEG_INF + ops.zeros((1, k), dtype="float32")  # (B, K)
    output = dict(sequences=empty, scores=no_scores)  # (B*K, T), (B, K): filled as they stop
    state = BeamState(
        sentences=_rows(start_ids),  # (A,) their places in the batch
        limits=max_lengths,  # (A,)
        limit_penalty=length_penalty(max_lengths, rules.alpha),  # (A,)
        searching=ops.ones_like(start_ids, dtype="bool"),  # (A,)
        alive_log_probs=zeros,  # (A, 1), then (A, K)
        alive_seqs=empty[:batch_size],  # (A, T), then (A*K, T)
        last_ids=start_ids,  # (A,), then (A*K,)
        finished=dict(
            sequences=empty,  # (A*K, T)
            scores=no_scores,  # (A, K)
            flags=ops.zeros_like(no_scores, dtype="bool"),  # (A, K)
            count=ops.zeros_like(start_ids),  # (A,) hypotheses finished so far
        ),
        cache=cache,  # (A, ...), then (A*K, ...)
        shared=shared_cache,  # (A, ...)
        constraints={} if constraints is None else Constraints.initial(constraints, rules.pad_id),
        progress={} if constraints is None else Constraints.no_progress(constraints),
    )
    return output, state


def _logits(tokens_to_logits, state, shared):
    """`(logits (A*W, V) float32, cache without the shared entries)` of one step."""
    cache = {**state.cache, **state.shared} if shared else state.cache
    logits, cache = tokens_to_logits(state.last_ids, cache)
    if shared:
        cache = {key: value for key, value in cache.items() if key not in shared}
    return ops.cast(logits, "float32"), cache


def _expand(logits, state, step, rules, width, first):
    """The step's `Candidates`: without constraints, the `2K` best continuations of
    each sentence; with them, every hypothesis's `2K` best tokens and each unmet
    constraint's next token."""
    k, vocab_size = rules.k, logits.shape[-1]  # static
    # log P = logit - logsumexp, monotone within a row: a row's 2K best tokens
    # hold every continuation of it that can be among its sentence's 2K best, so
    # only those are normalized and scored, never the full (A*W, V) log-softmax.
    normalizer = ops.logsumexp(logits, axis=-1, keepdims=True)  # (A*W, 1)
    if first or rules.min_length > 1:  # one pass over (A*W, V) saved on every later step
        logits = _forbid_early_end(logits, step, rules.eos_id, rules.min_length)
    if rules.constrained:
        logits = Constraints.end_when_complete(logits, state, rules.eos_id, width)
    per_row = min(2 * k, vocab_size)
    row_logits, row_ids = ops.top_k(logits, per_row)  # (A*W, P)
    row_ids = ops.cast(row_ids, "int32")
    log_probs = row_logits - normalizer  # (A*W, P)
    if rules.constrained:
        return Constraints.candidates(logits, normalizer, log_probs, row_ids, state, step, width)
    log_probs = ops.reshape(log_probs, (-1, width, per_row))  # (A, W, P)
    candidates = state.alive_log_probs[:, :, None] + log_probs  # (A, W, P)
    candidates = ops.reshape(candidates, (-1, width * per_row))  # (A, W*P)
    row_ids = ops.reshape(row_ids, (-1, width * per_row))  # (A, W*P)
    if width * per_row < 2 * k:  # a small vocabulary's first step: NEG_INF fillers
        fillers = 2 * k - width * per_row
        filler = ops.zeros_like(candidates[:, :1]) + NEG_INF  # (A, 1)
        candidates = ops.concatenate([candidates] + [filler] * fillers, axis=1)
        row_ids = ops.concatenate([row_ids] + [ops.zeros_like(row_ids[:, :1]) + rules.pad_id]
                                  * fillers, axis=1)  # fmt: skip
    # The 2K best continuations: at most K of them end, so K stay alive.
    top_log_probs, top_indices = ops.top_k(candidates, 2 * k)  # (A, 2K)
    top_indices = ops.cast(top_indices, "int32")
    top_beams = ops.minimum(ops.floor_divide(top_indices, per_row), width - 1)
    top_beams = top_beams + _batch_offsets(top_indices, width)  # rows of the A*W hypotheses
    top_ids = ops.take_along_axis(row_ids, top_indices, axis=1)  # (A, 2K)
    top_seqs = _write(_take(state.alive_seqs, top_beams), step, ops.reshape(top_ids, (-1,)))
    return Candidates(top_log_probs, top_ids, top_beams, top_seqs, {}, {})


def _choose_alive(candidates, ends, state, rules):
    """`(alive_log_probs (A, K), kept (A, K))`: the candidates that stay alive, as rows
    of the A*M candidates: the K best that did not end, or (constraints) dynamic beam
    allocation's K."""
    k = rules.k
    if rules.constrained:
        alive_log_probs, keep = Constraints.allocate(candidates, ends, state, k)
        return alive_log_probs, keep + _batch_offsets(keep, ops.shape(candidates.ids)[1])
    alive_log_probs, keep = ops.top_k(ops.where(ends, NEG_INF, candidates.log_probs), k)
    keep = ops.cast(keep, "int32")
    return alive_log_probs, keep + _batch_offsets(keep, 2 * k)  # M = 2K


def _finish(candidates, ends, at_limit, old, step, state, rules):
    """The finished set after this step: the K best of the old one and the candidates
    that finish now, by score (`log P / length_penalty`)."""
    k, log_probs = rules.k, candidates.log_probs
    finishes = ends
    if rules.stopping == "k_finished":  # fairseq: an end among the K best continuations
        among_best = ops.logical_or(_positions(candidates.ids) < k, at_limit)  # (A, M)
        possible = log_probs > NEG_INF / 2  # not a forbidden EOS or a filler
        finishes = ops.logical_and(ends, ops.logical_and(among_best, possible))
    new_scores = log_probs / length_penalty(step + 1, rules.alpha)
    if rules.constrained:
        finishes = ops.logical_and(ends, log_probs > NEG_INF / 2)
        new_scores = new_scores - Constraints.missing(candidates, state)
    new_scores = ops.where(finishes, new_scores, NEG_INF)  # (A, M)
    scores = ops.concatenate([old["scores"], new_scores], axis=1)  # (A, K + M)
    flags = ops.concatenate([old["flags"], finishes], axis=1)  # (A, K + M)
    finished_scores, pick = ops.top_k(scores, k)  # (A, K), old ones first on ties
    pick = ops.cast(pick, "int32")
    width = ops.shape(candidates.ids)[1] if rules.constrained else 2 * k  # M
    # Rows of concat([old sequences (A*K, T), the candidates' (A*M, T)]).
    old_rows = pick + _batch_offsets(pick, k)
    new_rows = ops.shape(candidates.ids)[0] * k + (pick - k) + _batch_offsets(pick, width)
    rows = ops.where(pick < k, old_rows, new_rows)
    return dict(
        sequences=_take(ops.concatenate([old["sequences"], candidates.seqs], axis=0), rows),
        scores=finished_scores,
        flags=ops.take_along_axis(flags, pick, axis=1),
        count=old["count"] + ops.sum(ops.cast(finishes, "int32"), axis=1),
    )


def _stops(finished, alive_log_probs, state, rules):
    """`(A,)` bool: sentences whose beam search has its answer, by the stopping rule."""
    if rules.stopping == "k_finished":
        return finished["count"] >= rules.needed
    # "bound": log-probabilities only fall as a hypothesis grows, so no alive one can
    # score above `max alive log P / length_penalty(limit)` (for alpha >= 0). Without
    # constraints both sets come sorted from `top_k`: the best alive one is first, the
    # worst finished last.
    full = ops.all(finished["flags"], axis=1)  # (A,) K hypotheses have finished
    if not rules.constrained:
        best = alive_log_probs[:, 0]
        return ops.logical_and(full, finished["scores"][:, -1] > best / state.limit_penalty)
    best = ops.max(alive_log_probs, axis=1)  # (A,) allocation keeps no order
    bound = ops.logical_and(full, finished["scores"][:, -1] > best / state.limit_penalty)
    return ops.logical_or(bound, best <= NEG_INF / 2)  # or no hypothesis can go on


def _hand_off(output, state, finished, done, places, rules):
    """The output with the finished hypotheses of the sentences that stop now."""
    k = rules.k
    stops = ops.logical_and(state.searching, done)
    hit, source = _match(state.sentences, places, stops)  # (B,)
    # A slot with no finished hypothesis (fewer than K ended) holds PAD, score NEG_INF.
    real = ops.where(
        ops.reshape(finished["flags"], (-1, 1)), finished["sequences"], rules.pad_id
    )  # fmt: skip
    return dict(
        sequences=ops.where(
            ops.repeat(hit, k, axis=0)[:, None],
            _take(real, source[:, None] * k + ops.arange(k, dtype="int32")),
            output["sequences"],
        ),
        scores=ops.where(
            hit[:, None], ops.take(finished["scores"], source, axis=0), output["scores"]
        ),  # fmt: skip
    )


def _retire(state, cache, parents, k):
    """The state without the rows of the sentences that stopped (their answers are in
    the output): per-sentence rows by sentence, the others by hypothesis."""
    sentences = ops.where(state.searching)[0]  # (A',)
    hypotheses = ops.reshape(sentences[:, None] * k + ops.arange(k, dtype="int32"), (-1,))
    kept = {key: _keep(getattr(state, key), sentences) for key in PER_SENTENCE}
    finished = state.finished
    return state._replace(
        **kept,
        alive_seqs=ops.take(state.alive_seqs, hypotheses, axis=0),
        last_ids=ops.take(state.last_ids, hypotheses, axis=0),
        finished=dict(
            sequences=ops.take(finished["sequences"], hypotheses, axis=0),
            **_keep({key: finished[key] for key in ("scores", "flags", "count")}, sentences),
        ),
        cache=_keep(cache, ops.take(parents, hypotheses, axis=0)),
        progress=_keep(state.progress, hypotheses),
    )


def constrained_beam_search(tokens_to_logits, cache, start_ids, max_length, eos_id, constraints,
                            **kwargs):  # fmt: skip
    """`beam_search(..., constraints=constraints)`: every output holds every constraint
    (`constrained.Constraints`), under the name it had as a loop of its own."""
    return beam_search(tokens_to_logits, cache, start_ids, max_length, eos_id,
                       constraints=constraints, **kwargs)  # fmt: skip


__all__ = ["MISSING_PENALTY", "BeamState", "beam_search", "constrained_beam_search"]
