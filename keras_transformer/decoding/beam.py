"""Beam search with the GNMT length penalty, dropping sentences that have their answer."""

from keras import ops

from keras_transformer.decoding import loop
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


def _is_done(stopping, finished, alive_log_probs, limit_penalty, needed):
    """`(A,)` bool: sentences whose beam search has its answer, by the `stopping` rule."""
    if stopping == "k_finished":
        return finished["count"] >= needed
    # "bound": log-probabilities only fall as a hypothesis grows, so no alive one can
    # score above `max alive log P / length_penalty(limit)` (for alpha >= 0). Both sets
    # come sorted from `top_k`: the best alive one is first, the worst finished last.
    full = ops.all(finished["flags"], axis=1)  # (A,) K hypotheses have finished
    return ops.logical_and(full, finished["scores"][:, -1] > alive_log_probs[:, 0] / limit_penalty)


def beam_search(
    tokens_to_logits,
    cache,
    start_ids,
    max_length,
    eos_id,
    beam_size=PAPER.beam_size,
    alpha=PAPER.alpha,
    max_lengths=None,
    pad_id=0,
    min_length=MIN_LENGTH,
    stopping=PAPER.stopping,
    patience=PAPER.patience,
    shared=(),
    drop_finished=None,
):
    """Beam search with the GNMT length penalty, flax-style, dropping finished sentences.

    Keeps `K` alive hypotheses (not yet ended) ranked by log-probability and
    `K` finished ones ranked by `log P / length_penalty(length, alpha)`.
    Each step expands the alive beams, takes the `2K` best continuations
    (enough that `K` of them do not end), moves those that end into the
    finished set and keeps the `K` best others alive. A hypothesis ends by
    producing `eos_id` or by reaching its sequence's length limit, so every
    returned hypothesis is complete.

    A sentence stops at its length limit or, before it, by `stopping`:

    - `"bound"`: once no alive hypothesis can still beat its worst finished
      one (`max alive log P / length_penalty(limit)` bounds every score it
      can reach, for `alpha >= 0`): the search's exact answer.
    - `"k_finished"`: once `ceil(K * patience)` hypotheses have finished
      (fairseq's and CTranslate2's rule, Hugging Face's
      `early_stopping=True`); as in fairseq, an end counts only if it is
      among the `K` best continuations of its step.

    A stopped sentence leaves the loop with its hypotheses and cache rows
    (`drop_finished`), and its output is final. The hypotheses of one
    sentence share the cache entries named in `shared` (one row per
    sentence, e.g. the source's cross-attention keys and values): the beam
    never reorders them; they only lose the rows of stopped sentences.

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

    Returns:
        `(sequences (B, K, T) int32, scores (B, K) float32)`, best first;
        scores are length-penalized log-probabilities.
    """
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer. Received: beam_size={beam_size}")
    if _is_negative(alpha):
        raise ValueError(f"alpha must be >= 0. Received: alpha={alpha}")
    needed = SearchConfig(beam_size=beam_size, stopping=stopping, patience=patience).needed
    drop = loop.drops_finished() if drop_finished is None else drop_finished
    k = beam_size
    start_ids = ops.cast(start_ids, "int32")
    max_lengths = _check_limits(max_length, max_lengths, start_ids)  # (B,)
    batch_size = ops.shape(start_ids)[0]
    places = _rows(start_ids)  # (B,)

    shared_cache = {key: cache[key] for key in shared}
    if shared:
        cache = {key: value for key, value in cache.items() if key not in shared}
    empty = ops.zeros((batch_size * k, max_length), dtype="int32") + pad_id  # (B*K, T)
    zeros = ops.zeros_like(start_ids[:, None], dtype="float32")  # (B, 1)
    no_scores = zeros + NEG_INF + ops.zeros((1, k), dtype="float32")  # (B, K)
    output = dict(sequences=empty, scores=no_scores)  # (B*K, T), (B, K): filled as sentences stop
    # The A sentences still searching and their hypotheses (A*K rows), as named state.
    beams = dict(
        sentences=places,  # (A,) their places in the batch
        limits=max_lengths,  # (A,)
        limit_penalty=length_penalty(max_lengths, alpha),  # (A,)
        searching=ops.ones_like(start_ids, dtype="bool"),  # (A,) False once stopped (kept rows)
        # One hypothesis per sentence until the first step expands it to K.
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
    )

    def cond(step, output, beams):
        return ops.logical_and(step < max_length, ops.any(beams["searching"]))

    def body(step, output, beams, width=k, first=False):
        """One step of `width` hypotheses per sentence (1 at the first step, then K)."""
        logits, cache = tokens_to_logits(beams["last_ids"], {**beams["cache"], **beams["shared"]}
                                         if shared else beams["cache"])  # fmt: skip
        if shared:
            cache = {key: value for key, value in cache.items() if key not in shared}
        vocab_size = logits.shape[-1]  # static
        logits = ops.cast(logits, "float32")  # (A*W, V)
        # log P = logit - logsumexp, monotone within a row: a row's 2K best tokens
        # hold every continuation of it that can be among its sentence's 2K best, so
        # only those are normalized and scored, never the full (A*W, V) log-softmax.
        normalizer = ops.logsumexp(logits, axis=-1, keepdims=True)  # (A*W, 1)
        if first or min_length > 1:  # one pass over (A*W, V) saved on every later step
            logits = _forbid_early_end(logits, step, eos_id, min_length)
        per_row = min(2 * k, vocab_size)
        row_logits, row_ids = ops.top_k(logits, per_row)  # (A*W, P)
        log_probs = ops.reshape(row_logits - normalizer, (-1, width, per_row))  # (A, W, P)
        candidates = beams["alive_log_probs"][:, :, None] + log_probs  # (A, W, P)
        candidates = ops.reshape(candidates, (-1, width * per_row))  # (A, W*P)
        row_ids = ops.reshape(ops.cast(row_ids, "int32"), (-1, width * per_row))  # (A, W*P)
        if width * per_row < 2 * k:  # a small vocabulary's first step: NEG_INF fillers
            fillers = 2 * k - width * per_row
            filler = ops.zeros_like(candidates[:, :1]) + NEG_INF  # (A, 1)
            candidates = ops.concatenate([candidates] + [filler] * fillers, axis=1)
            row_ids = ops.concatenate([row_ids] + [ops.zeros_like(row_ids[:, :1]) + pad_id]
                                      * fillers, axis=1)  # fmt: skip

        # The 2K best continuations: at most K of them end, so K stay alive.
        top_log_probs, top_indices = ops.top_k(candidates, 2 * k)  # (A, 2K)
        top_indices = ops.cast(top_indices, "int32")
        top_beams = ops.minimum(ops.floor_divide(top_indices, per_row), width - 1)
        top_beams = top_beams + _batch_offsets(top_indices, width)  # rows of the A*W hypotheses
        top_ids = ops.take_along_axis(row_ids, top_indices, axis=1)  # (A, 2K)
        top_seqs = _write(_take(beams["alive_seqs"], top_beams), step, ops.reshape(top_ids, (-1,)))
        at_limit = (step + 1 >= beams["limits"])[:, None]  # (A, 1)
        ends = ops.logical_or(ops.equal(top_ids, eos_id), at_limit)  # (A, 2K)
        finishes = ends
        if stopping == "k_finished":  # fairseq: an end among the K best continuations
            among_best = ops.logical_or(_positions(top_ids) < k, at_limit)  # (A, 2K)
            possible = top_log_probs > NEG_INF / 2  # not a forbidden EOS or a filler
            finishes = ops.logical_and(ends, ops.logical_and(among_best, possible))

        # Alive: the K best that did not end.
        alive_log_probs, keep = ops.top_k(ops.where(ends, NEG_INF, top_log_probs), k)  # (A, K)
        keep = ops.cast(keep, "int32") + _batch_offsets(keep, 2 * k)  # into A*2K rows
        alive_seqs = _take(top_seqs, keep)  # (A*K, T)
        last_ids = _take(ops.reshape(top_ids, (-1,)), keep)  # (A*K,)
        parents = _take(ops.reshape(top_beams, (-1,)), keep)  # (A*K,) rows of the old cache

        # Finished: the K best of the old finished set and the new ends.
        old = beams["finished"]
        new_scores = top_log_probs / length_penalty(step + 1, alpha)
        new_scores = ops.where(finishes, new_scores, NEG_INF)  # (A, 2K)
        scores = ops.concatenate([old["scores"], new_scores], axis=1)  # (A, 3K)
        flags = ops.concatenate([old["flags"], finishes], axis=1)  # (A, 3K)
        finished_scores, pick = ops.top_k(scores, k)  # (A, K), old ones first on ties
        pick = ops.cast(pick, "int32")
        # Rows of concat([old sequences (A*K, T), top_seqs (A*2K, T)]).
        old_rows = pick + _batch_offsets(pick, k)
        new_rows = ops.shape(top_ids)[0] * k + (pick - k) + _batch_offsets(pick, 2 * k)
        rows = ops.where(pick < k, old_rows, new_rows)
        finished = dict(
            sequences=_take(ops.concatenate([old["sequences"], top_seqs], axis=0), rows),
            scores=finished_scores,
            flags=ops.take_along_axis(flags, pick, axis=1),
            count=old["count"] + ops.sum(ops.cast(finishes, "int32"), axis=1),
        )

        # A sentence that stops hands its finished hypotheses to the output.
        done = _is_done(stopping, finished, alive_log_probs, beams["limit_penalty"], needed)
        done = ops.logical_or(done, at_limit[:, 0])  # (A,)
        stops = ops.logical_and(beams["searching"], done)
        hit, source = _match(beams["sentences"], places, stops)  # (B,)
        # A slot with no finished hypothesis (fewer than K ended) holds PAD, score NEG_INF.
        real = ops.where(ops.reshape(finished["flags"], (-1, 1)), finished["sequences"], pad_id)
        output = dict(
            sequences=ops.where(
                ops.repeat(hit, k, axis=0)[:, None],
                _take(real, source[:, None] * k + ops.arange(k, dtype="int32")),
                output["sequences"],
            ),
            scores=ops.where(
                hit[:, None], ops.take(finished_scores, source, axis=0), output["scores"]
            ),  # fmt: skip
        )
        beams = dict(
            beams,
            searching=ops.logical_and(beams["searching"], ops.logical_not(done)),
            alive_log_probs=alive_log_probs,
            alive_seqs=alive_seqs,
            last_ids=last_ids,
            finished=finished,
            cache=cache,
        )
        if not drop:  # the cache follows its beams
            return step + 1, output, dict(beams, cache=_keep(cache, parents))

        def without_stopped():
            sentences = ops.where(beams["searching"])[0]  # (A',)
            hypotheses = ops.reshape(sentences[:, None] * k + ops.arange(k, dtype="int32"), (-1,))
            per_sentence = ("sentences", "limits", "limit_penalty", "searching",
                            "alive_log_probs", "shared")  # fmt: skip
            kept = {key: _keep(beams[key], sentences) for key in per_sentence}
            return dict(
                kept,
                alive_seqs=ops.take(alive_seqs, hypotheses, axis=0),
                last_ids=ops.take(last_ids, hypotheses, axis=0),
                finished=dict(
                    sequences=ops.take(finished["sequences"], hypotheses, axis=0),
                    **_keep(
                        {key: finished[key] for key in ("scores", "flags", "count")}, sentences
                    ),  # fmt: skip
                ),
                cache=_keep(cache, ops.take(parents, hypotheses, axis=0)),
            )

        beams = ops.cond(
            ops.any(done), without_stopped, lambda: dict(beams, cache=_keep(cache, parents))
        )
        return step + 1, output, beams

    # The first step expands one hypothesis per sentence (computing K identical
    # rows would waste K - 1); the loop then runs K per sentence still searching.
    # It runs outside the loop, also for an empty batch (every op takes 0 rows).
    step = ops.convert_to_tensor(0, dtype="int32")
    state = body(step, output, beams, width=1, first=True)
    _, output, _ = _while_loop(cond, body, state, drop)
    rows = _batch_offsets(output["scores"], k)[:, 0]  # (B,)
    sequences = ops.stack(
        [ops.take(output["sequences"], rows + i, axis=0) for i in range(k)], axis=1
    )  # (B, K, T)
    return sequences, output["scores"]
