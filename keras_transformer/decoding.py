"""Greedy and beam search over a step function, with a key/value cache.

Search does not know the model. It drives a step function

    tokens_to_logits(token_ids (B,), cache) -> (logits (B, V), cache)

as flax's WMT example and OpenNMT-tf do. The cache is any nested structure
whose every tensor has the batch on axis 0; beam search tiles it with
`ops.repeat` after its first step and reorders it with `ops.take`, never
looking inside, except for the entries named in `shared` (one row per
sentence, such as the source's cross-attention keys and values), which it
never tiles or reorders.

Everything is `keras.ops` inside one `ops.while_loop`, so the same code
runs under TensorFlow (in a `tf.function` with dynamic batch and source
length), JAX (under `jax.jit`) and torch. Where the loop may change shapes
(`drops_finished()`: TensorFlow, and so the SavedModel and translate.onnx,
and torch) finished rows and stopped sentences leave the loop state, as in
CTranslate2 and fairseq; under JAX and XLA the state keeps its shapes and
finished rows are computed and ignored, with the same outputs. Output
tokens are written with `ops.where` on a one-hot position, never
`ops.slice_update`: that exports as XlaDynamicUpdateSlice, which TF Serving
on CPU cannot run.

Shapes: B batch, K beam size, T longest output (the buffer), V vocabulary.
Output sequences hold the generated tokens without the start token, the
end token included, and `pad_id` after it.
"""

import numbers

import keras
from keras import ops

from keras_transformer.sampling import force_prefix, sampler
from keras_transformer.search import NEG_INF, PAPER, SearchConfig


def length_penalty(length, alpha):
    """GNMT length penalty `((5 + length) / 6) ** alpha` (https://arxiv.org/abs/1609.08144).

    Beam search ranks finished hypotheses by `log P(y | x) / length_penalty`;
    `alpha=0` compares raw log-probabilities, larger `alpha` favours longer
    outputs. The Transformer paper uses `alpha=0.6` (Section 6.1).

    Args:
        length: int or int tensor, number of generated tokens (EOS included).
        alpha: float >= 0.

    Returns:
        float32 tensor of the shape of `length`.
    """
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def _positions(buffer):
    """`(N, T)` buffer -> `(1, T)` int32 positions 0..T-1, also for a dynamic T."""
    ones = ops.ones_like(buffer[:1], dtype="int32")  # (1, T)
    return ops.cumsum(ones, axis=1) - 1


def _write(buffer, step, token_ids):
    """Writes `token_ids (N,)` at column `step` of `buffer (N, T)` (no slice_update)."""
    at_step = ops.equal(_positions(buffer), step)  # (1, T)
    return ops.where(at_step, token_ids[:, None], buffer)


def _batch_offsets(reference, stride):
    """`(B, ...)` tensor -> `(B, 1)` int32 `[0, stride, 2 * stride, ...]` for flat indexing."""
    ones = ops.ones_like(reference[:, :1], dtype="int32")  # (B, 1)
    return (ops.cumsum(ones, axis=0) - 1) * stride


def _take(tensor, indices):
    """Rows `indices (...)` of `tensor (N, ...)` along axis 0, flattened to `(M, ...)`."""
    return ops.take(tensor, ops.reshape(indices, (-1,)), axis=0)


def _is_negative(value):
    """True for a negative Python or numpy number; a (maybe symbolic) tensor is not checked."""
    return isinstance(value, numbers.Real) and value < 0


def _check_limits(max_length, max_lengths, start_ids):
    if isinstance(max_length, int) and max_length <= 0:
        raise ValueError(
            f"max_length must be a positive integer. Received: max_length={max_length}"
        )
    if max_lengths is None:
        return ops.zeros_like(ops.cast(start_ids, "int32")) + max_length
    return ops.minimum(ops.cast(max_lengths, "int32"), max_length)


# Tokens an output holds before it may end: 1, so that a non-blank sentence
# never translates to "" (OpenNMT-tf's `minimum_decoding_length`, CTranslate2's
# `min_decoding_length`). Without it the beam let EOS end a hypothesis at its
# first step: 2 of the 159 Ding test sentences came out empty under beam 4.
MIN_LENGTH = 1


def _forbid_early_end(scores, step, eos_id, min_length):
    """`scores (N, V)` float32 with `eos_id`'s column at `NEG_INF` while `step < min_length`."""
    if not min_length:
        return scores
    is_eos = ops.equal(ops.arange(scores.shape[-1], dtype="int32"), eos_id)[None, :]  # (1, V)
    return ops.where(ops.logical_and(is_eos, step < min_length), NEG_INF, scores)


def drops_finished():
    """Whether this backend's search drops finished rows from its loop.

    TensorFlow (`tf.while_loop` with shape invariants, also in the
    SavedModel and, converted, in translate.onnx's ONNX `Loop`) and torch
    (a Python loop) let loop state change its batch size from step to
    step. JAX's compiled `lax.while_loop` cannot: there finished rows keep
    their place (computed, their output ignored), as in a fixed-shape search.
    """
    return keras.backend.backend() != "jax"


def _rows(vector):
    """`(N,)` tensor -> `(N,)` int32 `[0, 1, ..., N-1]`, also for a dynamic (or zero) N."""
    return ops.cumsum(ops.ones_like(vector, dtype="int32")) - 1


def _while_loop(cond, body, loop_vars, drop_finished):
    """`ops.while_loop`, whose state may change its shapes if `drop_finished`."""
    if drop_finished and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        # Any axis may change: the batch as rows finish, a growing cache's positions.
        loop_vars = keras.tree.map_structure(tf.convert_to_tensor, loop_vars)
        invariants = keras.tree.map_structure(lambda x: tf.TensorShape([None] * x.shape.rank),
                                              loop_vars)  # fmt: skip
        return tf.while_loop(cond, body, loop_vars, shape_invariants=invariants)
    return ops.while_loop(cond, body, loop_vars)


def _match(rows, places, mask):
    """Where each of `rows (A,)` goes among `places` `0..B-1`, for those with `mask (A,)`.

    Returns `(hit (B,) bool, source (B,) int32)`: place `b` takes row
    `source[b]` where `hit[b]`. `rows` are distinct. A `(B, A)` comparison:
    gathers and `where` only, which every runtime runs (no scatter op).
    """
    match = ops.logical_and(ops.equal(places[:, None], rows[None, :]), mask[None, :])  # (B, A)
    hit = ops.any(match, axis=1)
    # A last, never-matching column keeps argmax defined when A = 0 (an empty batch).
    match = ops.concatenate([match, ops.zeros_like(places[:, None], dtype="bool")], axis=1)
    source = ops.cast(ops.argmax(ops.cast(match, "int32"), axis=1), "int32")
    return hit, source


def _keep(structure, indices):
    """Rows `indices` of every tensor of `structure` (batch on axis 0)."""
    return keras.tree.map_structure(lambda x: ops.take(x, indices, axis=0), structure)


def greedy_search(
    tokens_to_logits, cache, start_ids, max_length, eos_id, max_lengths=None, pad_id=0,
    min_length=MIN_LENGTH, drop_finished=None, choose=None,
):  # fmt: skip
    """Greedy decoding: the most likely next token at every step (or one drawn by `choose`).

    A row stops when it produces `eos_id` or reaches its length limit, and
    leaves the loop (`drop_finished`): later steps compute only the rows
    still running, as CTranslate2 and fairseq do. The loop ends when no row
    runs. `eos_id` cannot come before `min_length` other tokens (a length
    limit below it still ends the sequence).

    Args:
        tokens_to_logits: `(token_ids (A,), cache) -> (logits (A, V), cache)`
            for the A rows still running.
        cache: nested structure of tensors, batch on axis 0.
        start_ids: `(B,)` int, the first input token (BOS).
        max_length: int or int scalar tensor, T: size of the output buffer.
        eos_id: int, the end-of-sequence id.
        max_lengths: optional `(B,)` int, per-sequence limit on generated
            tokens (EOS included), at most `max_length`.
        pad_id: int written after EOS.
        drop_finished: bool; None: `drops_finished()` (not under JAX).
            Either way the output is the same.
        choose: `(logits (A, V) float32, step, rows (A,)) -> ids (A,)`, the next
            token of each running row (`rows`: their places in the batch);
            None: the most likely (`sampler` draws one).

    Returns:
        `(B, T)` int32 ids.
    """
    drop = drops_finished() if drop_finished is None else drop_finished
    start_ids = ops.cast(start_ids, "int32")
    max_lengths = _check_limits(max_length, max_lengths, start_ids)
    tokens = ops.zeros((ops.shape(start_ids)[0], max_length), dtype="int32") + pad_id  # (B, T)
    places = _rows(start_ids)  # (B,)
    # The rows still running (A of them): `rows` are their places in the batch.
    running = dict(
        rows=places,  # (A,)
        last_ids=start_ids,  # (A,)
        limits=max_lengths,  # (A,)
        alive=ops.ones_like(start_ids, dtype="bool"),  # (A,) False once ended (kept rows)
        cache=cache,
    )

    def cond(step, tokens, running):
        return ops.logical_and(step < max_length, ops.any(running["alive"]))

    def body(step, tokens, running):
        alive = running["alive"]
        logits, cache = tokens_to_logits(running["last_ids"], running["cache"])  # (A, V)
        logits = _forbid_early_end(ops.cast(logits, "float32"), step, eos_id, min_length)
        if choose is None:
            next_ids = ops.cast(ops.argmax(logits, axis=-1), "int32")  # (A,)
        else:
            next_ids = ops.cast(choose(logits, step, running["rows"]), "int32")
        next_ids = ops.where(alive, next_ids, pad_id)
        hit, source = _match(running["rows"], places, alive)  # (B,)
        at_step = ops.logical_and(hit[:, None], ops.equal(_positions(tokens), step))  # (B, T)
        tokens = ops.where(at_step, ops.take(next_ids, source)[:, None], tokens)
        ended = ops.logical_or(ops.equal(next_ids, eos_id), step + 1 >= running["limits"])
        alive = ops.logical_and(alive, ops.logical_not(ended))
        running = dict(running, last_ids=next_ids, alive=alive, cache=cache)
        if drop:
            running = ops.cond(
                ops.any(ended),
                lambda: _keep(running, ops.where(alive)[0]),  # (A', ...)
                lambda: running,
            )
        return step + 1, tokens, running

    step = ops.convert_to_tensor(0, dtype="int32")
    _, tokens, _ = _while_loop(cond, body, (step, tokens, running), drop)
    return tokens


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
    drop = drops_finished() if drop_finished is None else drop_finished
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

    def body(step, output, beams, width=k):
        """One step of `width` hypotheses per sentence (1 at the first step, then K)."""
        logits, cache = tokens_to_logits(beams["last_ids"], {**beams["cache"], **beams["shared"]}
                                         if shared else beams["cache"])  # fmt: skip
        if shared:
            cache = {key: value for key, value in cache.items() if key not in shared}
        vocab_size = logits.shape[-1]  # static
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (A*W, V)
        log_probs = _forbid_early_end(log_probs, step, eos_id, min_length)
        log_probs = ops.reshape(log_probs, (-1, width, vocab_size))  # (A, W, V)
        candidates = beams["alive_log_probs"][:, :, None] + log_probs  # (A, W, V)
        candidates = ops.reshape(candidates, (-1, width * vocab_size))  # (A, W*V)
        if width * vocab_size < 2 * k:  # a small vocabulary's first step: NEG_INF fillers
            filler = ops.zeros_like(candidates[:, :1]) + NEG_INF  # (A, 1)
            candidates = ops.concatenate([candidates] + [filler] * (2 * k - width * vocab_size),
                                         axis=1)  # fmt: skip

        # The 2K best continuations: at most K of them end, so K stay alive.
        top_log_probs, top_indices = ops.top_k(candidates, 2 * k)  # (A, 2K)
        top_indices = ops.cast(top_indices, "int32")
        top_beams = ops.minimum(ops.floor_divide(top_indices, vocab_size), width - 1)
        top_beams = top_beams + _batch_offsets(top_indices, width)  # rows of the A*W hypotheses
        top_ids = ops.mod(top_indices, vocab_size)  # (A, 2K)
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
    state = body(step, output, beams, width=1)
    _, output, _ = _while_loop(cond, body, state, drop)
    rows = _batch_offsets(output["scores"], k)[:, 0]  # (B,)
    sequences = ops.stack(
        [ops.take(output["sequences"], rows + i, axis=0) for i in range(k)], axis=1
    )  # (B, K, T)
    return sequences, output["scores"]


def suppress_tokens(tokens_to_logits, token_ids):
    """Wraps a step function so that it never predicts `token_ids` (e.g. PAD and BOS).

    Neither is ever a training label after the first position, but nothing
    stops an (under-trained) model from scoring them highest; a decoded PAD
    would silently end the output, a BOS would restart it. fairseq does the same.
    """
    token_ids = tuple(int(i) for i in token_ids)

    def step(tokens, cache):
        logits, cache = tokens_to_logits(tokens, cache)  # (B, V)
        return _suppress(logits, token_ids), cache

    return step


def _suppress(logits, token_ids):
    """`(B, V)` logits with the columns `token_ids` set to NEG_INF."""
    vocab = ops.arange(ops.shape(logits)[-1], dtype="int32")[None, :]  # (1, V)
    banned = ops.any(ops.stack([ops.equal(vocab, i) for i in token_ids]), axis=0)
    return ops.where(banned, ops.cast(NEG_INF, logits.dtype), logits)


def output_limits(source_ids, max_extra_length=PAPER.max_extra_length, max_length=None, pad_id=0):
    """Output length limits: source length + `max_extra_length`, at most `max_length`.

    Args:
        source_ids: `(B, S)` int ids, `pad_id` for padding.
        max_extra_length: int >= 0 (or an int32 scalar tensor), tokens allowed beyond
            the source length.
        max_length: int or None, the model's positional range.

    Returns:
        `(buffer_length, max_lengths)`: the buffer size T (a Python int when
        S is static) and the `(B,)` int32 per-sentence limits.
    """
    if _is_negative(max_extra_length):
        raise ValueError(
            f"max_extra_length must be >= 0. Received: max_extra_length={max_extra_length}"
        )
    source_ids = ops.cast(source_ids, "int32")
    lengths = ops.sum(ops.cast(ops.not_equal(source_ids, pad_id), "int32"), axis=1)  # (B,)
    max_lengths = ops.maximum(lengths + max_extra_length, 1)
    buffer_length = ops.shape(source_ids)[1] + max_extra_length
    if max_length is not None:
        max_lengths = ops.minimum(max_lengths, max_length)
        if isinstance(buffer_length, int):
            buffer_length = min(buffer_length, max_length)
        else:
            buffer_length = ops.minimum(buffer_length, max_length)
    return buffer_length, max_lengths


def translate_ids(
    model,
    source_ids,
    beam_size=PAPER.beam_size,
    alpha=PAPER.alpha,
    max_extra_length=PAPER.max_extra_length,
    num_hypotheses=None,
    stopping=PAPER.stopping,
    patience=PAPER.patience,
    drop_finished=None,
    prefix_ids=None,
    sampling=None,
    seeds=None,
):
    """Source ids to output ids with the model's key/value cache. Pure tensor code.

    Args:
        model: a `Transformer` (anything with `config`, `init_cache` and
            `decode_step`).
        source_ids: `(B, S)` int ids ending with EOS, `pad_id` for padding.
        beam_size: int. 1 runs greedy search.
        alpha: float, the length-penalty exponent of beam search.
        max_extra_length: int. Each output has at most its source length +
            `max_extra_length` tokens, and at most `config.max_length`.

        num_hypotheses: None, or int N <= beam_size: return the N best
            hypotheses of the beam with their scores.
        stopping, patience: when a sentence's beam search stops
            (`search.SearchConfig`).
        drop_finished: bool; None: `drops_finished()`. Finished rows leave
            the loop and the self-attention cache grows step by step
            (`model.GrowingCache`); False keeps fixed shapes (JAX, XLA).
        prefix_ids: optional `(B, P)` int, each output's forced first tokens
            (`force_prefix`), `pad_id` after a shorter prefix.
        sampling: optional `(temperature, top_k)`: draw each token (`sampler`)
            instead of searching; needs `seeds` and `beam_size=1`.
        seeds: `(B,)` int32, each sentence's seed for `sampling`.

    Returns:
        `(B, T)` int32 ids: the best hypothesis without BOS, EOS included,
        `pad_id` after it; `T = min(S + max_extra_length, config.max_length)`.
        With `num_hypotheses=N`: `(ids (B, N, T), scores (B, N))`, best first,
        the scores length-penalized log-probabilities (`beam_search`'s).
    """
    if sampling is not None and (beam_size != 1 or num_hypotheses is not None or seeds is None):
        raise ValueError(
            "Sampling draws one output per sentence: it needs beam_size=1, no num_hypotheses, "
            f"and seeds. Received: beam_size={beam_size}, num_hypotheses={num_hypotheses}"
        )
    if num_hypotheses is not None and not 1 <= num_hypotheses <= beam_size:
        raise ValueError(
            f"num_hypotheses must be between 1 and beam_size={beam_size}. "
            f"Received: num_hypotheses={num_hypotheses}"
        )
    config = model.config
    if not model.built:  # build outside the loop: variables created in a trace would leak
        model.build()
    source_ids = ops.cast(source_ids, "int32")
    buffer_length, max_lengths = output_limits(
        source_ids, max_extra_length, config.max_length, config.pad_id
    )
    drop_finished = drops_finished() if drop_finished is None else drop_finished
    if drop_finished:  # a loop that may change shapes: the cache grows as it is filled
        from keras_transformer.model import GrowingCache

        model = GrowingCache(model)
    cache = model.init_cache(source_ids, buffer_length)
    start_ids = ops.zeros_like(source_ids[:, 0]) + config.bos_id  # (B,)
    search = dict(max_lengths=max_lengths, eos_id=config.eos_id, pad_id=config.pad_id,
                  drop_finished=drop_finished)  # fmt: skip
    step = suppress_tokens(model.decode_step, (config.pad_id, config.bos_id))
    if prefix_ids is not None:
        prefix_ids = ops.cast(prefix_ids, "int32")
        cache = dict(cache, forced_ids=prefix_ids, forced_step=ops.zeros_like(start_ids))
        step = force_prefix(step, config.pad_id)
    if beam_size == 1 and num_hypotheses is None:
        choose = None if sampling is None else sampler(seeds, *sampling)
        return greedy_search(step, cache, start_ids, buffer_length, choose=choose, **search)
    sequences, scores = beam_search(
        step, cache, start_ids, buffer_length, beam_size=beam_size, alpha=alpha,
        stopping=stopping, patience=patience, shared=getattr(model, "SOURCE_CACHE", ()),
        **search,
    )  # fmt: skip
    if num_hypotheses is not None:
        return sequences[:, :num_hypotheses], scores[:, :num_hypotheses]
    return sequences[:, 0]


def compile_translate_ids(
    model,
    beam_size=PAPER.beam_size,
    alpha=PAPER.alpha,
    max_extra_length=PAPER.max_extra_length,
    jit_compile=False,
    num_hypotheses=None,
    stopping=PAPER.stopping,
    patience=PAPER.patience,
    sampling=None,
    prefix=False,
):
    """`translate_ids` compiled for the current backend: `fn(source_ids) -> ids`
    (with `num_hypotheses`: `-> (ids, scores)`). With `sampling` (`(temperature,
    top_k)`) or `prefix`: `fn(source_ids, seeds (B,), prefix_ids (B, P)) -> ids`.

    TensorFlow: one `tf.function` with an int32 `(None, None)` input
    signature (traced once for every batch size and source length), with
    XLA when `jit_compile=True`. JAX: `jax.jit` over the model's variables
    (recompiles per input shape, so pad lengths to a few buckets). torch:
    eager under `torch.no_grad()`.
    """
    settings = dict(
        beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length,
        num_hypotheses=num_hypotheses, stopping=stopping, patience=patience,
        drop_finished=False if jit_compile else None,  # XLA: static shapes
    )  # fmt: skip
    extra = sampling is not None or prefix

    def run(source_ids, seeds=None, prefix_ids=None):
        if not extra:
            return translate_ids(model, source_ids, **settings)
        return translate_ids(
            model, source_ids, **settings, sampling=sampling, seeds=seeds,
            prefix_ids=prefix_ids if prefix else None,
        )  # fmt: skip

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        signature = [tf.TensorSpec((None, None), tf.int32, name="source_ids")]
        if extra:
            signature += [
                tf.TensorSpec((None,), tf.int32, name="seeds"),
                tf.TensorSpec((None, None), tf.int32, name="prefix_ids"),
            ]
        return tf.function(
            run,
            input_signature=signature,
            jit_compile=jit_compile,
            autograph=False,  # the search's loops are explicit `ops` loops
        )
    if backend == "jax":
        import jax

        variables = model.variables

        @jax.jit
        def stateless(values, *inputs):
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                return run(*inputs)

        return lambda *inputs: stateless([v.value for v in variables], *inputs)
    if backend == "torch":
        import torch

        def no_grad(*inputs):
            with torch.no_grad():
                return run(*inputs)

        return no_grad
    return run


def uncached_greedy_search(model, source_ids, max_extra_length=PAPER.max_extra_length, eos_id=None):
    """Reference greedy search without a cache, as the TensorFlow tutorial decodes.

    Every step re-runs the whole decoder on the output so far (the encoder
    runs once) and keeps the prediction at the newest position. The output
    lives in a fixed-size buffer, so every step has the same shapes (JAX
    compiles once); the causal mask keeps later, not yet decoded positions
    from changing earlier ones. Quadratic in the output length; kept to test
    the cached search against.

    Args:
        model: a `Transformer`.
        source_ids: `(B, S)` int ids.
        max_extra_length: int, as in `translate_ids`.
        eos_id: int; defaults to `model.config.eos_id`. Pass -1 to never stop early.

    Returns:
        `(B, T)` int32 ids laid out as `translate_ids` returns them.
    """
    config = model.config
    eos_id = config.eos_id if eos_id is None else eos_id
    source_ids = ops.cast(source_ids, "int32")
    buffer_length, max_lengths = output_limits(
        source_ids, max_extra_length, config.max_length, config.pad_id
    )
    encoder_outputs = model.encode(source_ids, training=False)
    start = ops.zeros_like(source_ids[:, :1]) + config.bos_id  # (B, 1)
    padding = ops.zeros((1, buffer_length), dtype="int32") + config.pad_id  # (1, T)
    inputs = ops.concatenate([start, ops.zeros_like(start) + padding], axis=1)  # (B, T + 1)
    finished = ops.zeros_like(source_ids[:, 0], dtype="bool")  # (B,)
    for step in range(int(buffer_length)):
        logits = model.decode(inputs[:, :-1], encoder_outputs, source_ids)  # (B, T, V)
        next_logits = _suppress(logits[:, step], (config.pad_id, config.bos_id))  # (B, V)
        next_logits = _forbid_early_end(ops.cast(next_logits, "float32"), step, eos_id, MIN_LENGTH)
        next_ids = ops.cast(ops.argmax(next_logits, axis=-1), "int32")  # (B,)
        next_ids = ops.where(finished, config.pad_id, next_ids)
        inputs = _write(inputs, step + 1, next_ids)
        ended = ops.logical_or(ops.equal(next_ids, eos_id), step + 1 >= max_lengths)
        finished = ops.logical_or(finished, ended)
        if bool(ops.convert_to_numpy(ops.all(finished))):
            break
    return inputs[:, 1:]
