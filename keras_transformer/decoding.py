"""Greedy and beam search over a step function, with a key/value cache.

Search does not know the model. It drives a step function

    tokens_to_logits(token_ids (B,), cache) -> (logits (B, V), cache)

as flax's WMT example and OpenNMT-tf do. The cache is any nested structure
whose every tensor has the batch on axis 0; beam search tiles it with
`ops.repeat` and reorders it with `ops.take`, never looking inside.

Everything is `keras.ops` inside one `ops.while_loop` with fixed-shape
state, so the same code runs under TensorFlow (in a `tf.function` with
dynamic batch and source length), JAX (under `jax.jit`) and torch. Output
tokens are written into a fixed-size buffer with `ops.where` on a one-hot
position, never `ops.slice_update`: that exports as XlaDynamicUpdateSlice,
which TF Serving on CPU cannot run.

Shapes: B batch, K beam size, T longest output (the buffer), V vocabulary.
Output sequences hold the generated tokens without the start token, the
end token included, and `pad_id` after it.
"""

import numbers

import keras
from keras import ops

from keras_transformer.search import PAPER

# A large negative log-probability instead of -inf, which turns into NaN in
# `-inf - -inf` and `0 * -inf` (the flax example makes the same choice).
NEG_INF = -1.0e7


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


def greedy_search(
    tokens_to_logits, cache, start_ids, max_length, eos_id, max_lengths=None, pad_id=0,
    min_length=MIN_LENGTH,
):  # fmt: skip
    """Greedy decoding: the most likely next token at every step.

    Stops when every sequence has produced `eos_id` or reached its length
    limit; finished sequences are fed `pad_id` and their output is padded.
    `eos_id` cannot come before `min_length` other tokens (a length limit
    below it still ends the sequence).

    Args:
        tokens_to_logits: `(token_ids (B,), cache) -> (logits (B, V), cache)`.
        cache: nested structure of tensors, batch on axis 0.
        start_ids: `(B,)` int, the first input token (BOS).
        max_length: int or int scalar tensor, T: size of the output buffer.
        eos_id: int, the end-of-sequence id.
        max_lengths: optional `(B,)` int, per-sequence limit on generated
            tokens (EOS included), at most `max_length`.
        pad_id: int written after EOS.

    Returns:
        `(B, T)` int32 ids.
    """
    start_ids = ops.cast(start_ids, "int32")
    max_lengths = _check_limits(max_length, max_lengths, start_ids)
    tokens = ops.zeros((ops.shape(start_ids)[0], max_length), dtype="int32") + pad_id  # (B, T)
    finished = ops.zeros_like(start_ids, dtype="bool")  # (B,)

    def cond(step, tokens, last_ids, finished, cache):
        return ops.logical_and(step < max_length, ops.logical_not(ops.all(finished)))

    def body(step, tokens, last_ids, finished, cache):
        logits, cache = tokens_to_logits(last_ids, cache)  # (B, V)
        logits = _forbid_early_end(ops.cast(logits, "float32"), step, eos_id, min_length)
        next_ids = ops.cast(ops.argmax(logits, axis=-1), "int32")  # (B,)
        next_ids = ops.where(finished, pad_id, next_ids)
        tokens = _write(tokens, step, next_ids)
        ended = ops.logical_or(ops.equal(next_ids, eos_id), step + 1 >= max_lengths)
        return step + 1, tokens, next_ids, ops.logical_or(finished, ended), cache

    step = ops.convert_to_tensor(0, dtype="int32")
    _, tokens, _, _, _ = ops.while_loop(cond, body, (step, tokens, start_ids, finished, cache))
    return tokens


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
):
    """Beam search with the GNMT length penalty, flax-style.

    Keeps `K` alive hypotheses (not yet ended) ranked by log-probability and
    `K` finished ones ranked by `log P / length_penalty(length, alpha)`.
    Each step expands the alive beams, takes the `2K` best continuations
    (enough that `K` of them do not end), moves those that end into the
    finished set and keeps the `K` best others alive. A hypothesis ends by
    producing `eos_id` or by reaching its sequence's length limit, so every
    returned hypothesis is complete. A sequence stops early once no alive
    hypothesis can still beat its worst finished one: log-probabilities only
    fall as a hypothesis grows, so `max alive log P / length_penalty(limit)`
    bounds every score it can reach (for `alpha >= 0`).

    Args:
        tokens_to_logits: `(token_ids (B*K,), cache) -> (logits (B*K, V), cache)`.
        cache: nested structure of tensors with batch `B` on axis 0; tiled
            to `B*K` here (beam `k` of sequence `b` is row `b*K + k`).
        start_ids: `(B,)` int, the first input token (BOS).
        max_length: int or int scalar tensor, T: size of the output buffer.
        eos_id: int.
        beam_size: int K >= 1.
        alpha: float >= 0 (or a float32 scalar tensor), the length-penalty exponent.
        max_lengths: optional `(B,)` int, per-sequence limit on generated
            tokens (EOS included), at most `max_length`.
        pad_id: int written after EOS.
        min_length: int. `eos_id` cannot come before this many other tokens.

    Returns:
        `(sequences (B, K, T) int32, scores (B, K) float32)`, best first;
        scores are length-penalized log-probabilities.
    """
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer. Received: beam_size={beam_size}")
    if _is_negative(alpha):
        raise ValueError(f"alpha must be >= 0. Received: alpha={alpha}")
    k = beam_size
    start_ids = ops.cast(start_ids, "int32")
    max_lengths = _check_limits(max_length, max_lengths, start_ids)  # (B,)
    batch_size = ops.shape(start_ids)[0]

    cache = keras.tree.map_structure(lambda x: ops.repeat(x, k, axis=0), cache)  # (B*K, ...)
    last_ids = ops.repeat(start_ids, k, axis=0)  # (B*K,)
    empty = ops.zeros((batch_size * k, max_length), dtype="int32") + pad_id  # (B*K, T)
    zeros = ops.zeros_like(start_ids[:, None], dtype="float32")  # (B, 1)
    # Only beam 0 is alive at the start, so the first step expands one hypothesis.
    first_beam = ops.convert_to_tensor([0.0] + [NEG_INF] * (k - 1), dtype="float32")
    alive_log_probs = zeros + first_beam[None, :]  # (B, K)
    finished_scores = zeros + NEG_INF + ops.zeros((1, k), dtype="float32")  # (B, K)
    finished_flags = ops.zeros_like(finished_scores, dtype="bool")  # (B, K)
    limit_penalty = length_penalty(max_lengths, alpha)  # (B,)

    def cond(step, alive_seqs, alive_log_probs, last_ids, finished_seqs, finished_scores,
             finished_flags, cache):  # fmt: skip
        best_reachable = ops.max(alive_log_probs, axis=1) / limit_penalty  # (B,)
        worst_finished = ops.min(ops.where(finished_flags, finished_scores, 2 * NEG_INF), axis=1)
        done = ops.logical_or(worst_finished > best_reachable, step >= max_lengths)  # (B,)
        return ops.logical_and(step < max_length, ops.logical_not(ops.all(done)))

    def body(step, alive_seqs, alive_log_probs, last_ids, finished_seqs, finished_scores,
             finished_flags, cache):  # fmt: skip
        logits, cache = tokens_to_logits(last_ids, cache)  # (B*K, V)
        vocab_size = logits.shape[-1]  # static; K*V >= 2K candidates for any V >= 2
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (B*K, V)
        log_probs = _forbid_early_end(log_probs, step, eos_id, min_length)
        log_probs = ops.reshape(log_probs, (-1, k, vocab_size))  # (B, K, V)
        candidates = alive_log_probs[:, :, None] + log_probs  # (B, K, V)
        candidates = ops.reshape(candidates, (-1, k * vocab_size))  # (B, K*V)

        # The 2K best continuations: at most K of them end, so K stay alive.
        top_log_probs, top_indices = ops.top_k(candidates, 2 * k)  # (B, 2K)
        top_indices = ops.cast(top_indices, "int32")
        top_beams = ops.floor_divide(top_indices, vocab_size) + _batch_offsets(top_indices, k)
        top_ids = ops.mod(top_indices, vocab_size)  # (B, 2K)
        top_seqs = _write(_take(alive_seqs, top_beams), step, ops.reshape(top_ids, (-1,)))
        ends = ops.logical_or(
            ops.equal(top_ids, eos_id), (step + 1 >= max_lengths)[:, None]
        )  # (B, 2K)

        # Alive: the K best that did not end. The cache follows its beams.
        alive_log_probs, keep = ops.top_k(ops.where(ends, NEG_INF, top_log_probs), k)  # (B, K)
        keep = ops.cast(keep, "int32") + _batch_offsets(keep, 2 * k)  # into B*2K rows
        alive_seqs = _take(top_seqs, keep)  # (B*K, T)
        last_ids = _take(ops.reshape(top_ids, (-1,)), keep)  # (B*K,)
        parents = _take(ops.reshape(top_beams, (-1,)), keep)  # (B*K,) rows of the old cache
        cache = keras.tree.map_structure(lambda x: ops.take(x, parents, axis=0), cache)

        # Finished: the K best of the old finished set and the new ends.
        new_scores = top_log_probs / length_penalty(step + 1, alpha)
        new_scores = ops.where(ends, new_scores, NEG_INF)  # (B, 2K)
        scores = ops.concatenate([finished_scores, new_scores], axis=1)  # (B, 3K)
        flags = ops.concatenate([finished_flags, ends], axis=1)  # (B, 3K)
        finished_scores, pick = ops.top_k(scores, k)  # (B, K), old ones first on ties
        pick = ops.cast(pick, "int32")
        finished_flags = ops.take_along_axis(flags, pick, axis=1)
        # Rows of concat([finished_seqs (B*K, T), top_seqs (B*2K, T)]).
        from_old = pick < k
        old_rows = pick + _batch_offsets(pick, k)
        new_rows = batch_size * k + (pick - k) + _batch_offsets(pick, 2 * k)
        rows = ops.where(from_old, old_rows, new_rows)
        finished_seqs = _take(ops.concatenate([finished_seqs, top_seqs], axis=0), rows)
        return (step + 1, alive_seqs, alive_log_probs, last_ids, finished_seqs, finished_scores,
                finished_flags, cache)  # fmt: skip

    step = ops.convert_to_tensor(0, dtype="int32")
    state = (step, empty, alive_log_probs, last_ids, empty, finished_scores, finished_flags, cache)
    state = ops.while_loop(cond, body, state)
    finished_seqs, finished_scores = state[4], state[5]
    rows = _batch_offsets(finished_scores, k)[:, 0]  # (B,)
    sequences = ops.stack([ops.take(finished_seqs, rows + i, axis=0) for i in range(k)], axis=1)
    return sequences, finished_scores


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

    Returns:
        `(B, T)` int32 ids: the best hypothesis without BOS, EOS included,
        `pad_id` after it; `T = min(S + max_extra_length, config.max_length)`.
        With `num_hypotheses=N`: `(ids (B, N, T), scores (B, N))`, best first,
        the scores length-penalized log-probabilities (`beam_search`'s).
    """
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
    cache = model.init_cache(source_ids, buffer_length)
    start_ids = ops.zeros_like(source_ids[:, 0]) + config.bos_id  # (B,)
    search = dict(max_lengths=max_lengths, eos_id=config.eos_id, pad_id=config.pad_id)
    step = suppress_tokens(model.decode_step, (config.pad_id, config.bos_id))
    if beam_size == 1 and num_hypotheses is None:
        return greedy_search(step, cache, start_ids, buffer_length, **search)
    sequences, scores = beam_search(
        step, cache, start_ids, buffer_length, beam_size=beam_size, alpha=alpha,
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
):
    """`translate_ids` compiled for the current backend: `fn(source_ids) -> ids`
    (with `num_hypotheses`: `-> (ids, scores)`).

    TensorFlow: one `tf.function` with an int32 `(None, None)` input
    signature (traced once for every batch size and source length), with
    XLA when `jit_compile=True`. JAX: `jax.jit` over the model's variables
    (recompiles per input shape, so pad lengths to a few buckets). torch:
    eager under `torch.no_grad()`.
    """

    def run(source_ids):
        return translate_ids(model, source_ids, beam_size, alpha, max_extra_length, num_hypotheses)

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(
            run,
            input_signature=[tf.TensorSpec((None, None), tf.int32, name="source_ids")],
            jit_compile=jit_compile,
        )
    if backend == "jax":
        import jax

        variables = model.variables

        @jax.jit
        def stateless(values, source_ids):
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                return run(source_ids)

        return lambda source_ids: stateless([v.value for v in variables], source_ids)
    if backend == "torch":
        import torch

        def no_grad(source_ids):
            with torch.no_grad():
                return run(source_ids)

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
