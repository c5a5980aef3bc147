"""A model's source ids to output ids: length limits, suppressed tokens, compiled entry points."""

import math

import keras
from keras import ops

from keras_transformer.decoding import loop
from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.greedy import greedy_search
from keras_transformer.decoding.loop import (
    MIN_LENGTH,
    _forbid_early_end,
    _is_negative,
    _write,
)
from keras_transformer.sampling import ban_init, ban_sequences, force_prefix, sampler
from keras_transformer.search import NEG_INF, PAPER


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


def output_limits(source_ids, max_extra_length=PAPER.max_extra_length, max_length=None, pad_id=0,
                  length_ratio=PAPER.length_ratio):  # fmt: skip
    """Output length limits: `ceil(length_ratio * source length) + max_extra_length`
    (`search.output_limit`), at most `max_length`.

    Args:
        source_ids: `(B, S)` int ids, `pad_id` for padding.
        max_extra_length: int >= 0 (or an int32 scalar tensor), tokens allowed beyond
            `length_ratio` times the source length.
        max_length: int or None, the model's positional range.
        length_ratio: float > 0 (a Python number: it is part of the graph).

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
    max_lengths = ops.maximum(_scaled(lengths, length_ratio) + max_extra_length, 1)
    buffer_length = _scaled(ops.shape(source_ids)[1], length_ratio) + max_extra_length
    if max_length is not None:
        max_lengths = ops.minimum(max_lengths, max_length)
        if isinstance(buffer_length, int):
            buffer_length = min(buffer_length, max_length)
        else:
            buffer_length = ops.minimum(buffer_length, max_length)
    return buffer_length, max_lengths


def _scaled(length, ratio):
    """`ceil(ratio * length)` of an int or int tensor, as `search.output_limit` rounds it."""
    if ratio == 1:
        return length
    if isinstance(length, int):
        return math.ceil(ratio * length - 1e-6)
    scaled = ops.ceil(ops.cast(length, "float32") * ratio - 1e-6)
    return ops.cast(scaled, "int32")


def translate_ids(
    model, source_ids, beam_size=PAPER.beam_size, alpha=PAPER.alpha,
    max_extra_length=PAPER.max_extra_length, num_hypotheses=None, stopping=PAPER.stopping,
    patience=PAPER.patience, drop_finished=None, prefix_ids=None, sampling=None, seeds=None,
    length_ratio=PAPER.length_ratio, banned_ids=None, constraints=None,
):  # fmt: skip
    """Source ids to output ids with the model's key/value cache. Pure tensor code.

    Args:
        model: a `Transformer` (anything with `config`, `init_cache` and
            `decode_step`).
        source_ids: `(B, S)` int ids ending with EOS, `pad_id` for padding.
        beam_size: int. 1 runs greedy search.
        alpha: float, the length-penalty exponent of beam search.
        max_extra_length, length_ratio: each output has at most
            `ceil(length_ratio * source length) + max_extra_length` tokens,
            and at most `config.max_length` (`output_limits`).

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
        banned_ids: optional `(B, N, L)` int, L >= 1: token sequences no
            output may hold (`ban_sequences`), `pad_id` after a shorter one.
        constraints: optional `(B, C, L)` int: token sequences every output
            must hold (positive lexical constraints, `pad_id` after a shorter
            one), found by dynamic beam allocation (`beam_search`'s
            `constraints`; not with `sampling`).

    Returns:
        `(B, T)` int32 ids: the best hypothesis without BOS, EOS included,
        `pad_id` after it; `T = min(S + max_extra_length, config.max_length)`.
        With `num_hypotheses=N`: `(ids (B, N, T), scores (B, N))`, best first,
        the scores length-penalized log-probabilities (`beam_search`'s).
    """
    _check_search(beam_size, num_hypotheses, sampling, seeds, constraints)
    model, cache, start_ids, buffer_length, search = _start(
        model, source_ids, max_extra_length, length_ratio, drop_finished
    )
    step, cache = _steered(model, cache, start_ids, prefix_ids, banned_ids)
    if beam_size == 1 and num_hypotheses is None and constraints is None:
        choose = None if sampling is None else sampler(seeds, *sampling)
        return greedy_search(step, cache, start_ids, buffer_length, choose=choose, **search)
    sequences, scores = beam_search(
        step, cache, start_ids, buffer_length, beam_size=beam_size, alpha=alpha,
        stopping=stopping, patience=patience, shared=getattr(model, "SOURCE_CACHE", ()),
        constraints=constraints, **search,
    )  # fmt: skip
    if num_hypotheses is not None:
        return sequences[:, :num_hypotheses], scores[:, :num_hypotheses]
    return sequences[:, 0]


def _start(model, source_ids, max_extra_length, length_ratio, drop_finished):
    """`(model, cache, start_ids, buffer_length, search settings)` before a search: the
    model built, the output limits, the cache (growing where rows may leave the loop)."""
    config = model.config
    if not model.built:  # build outside the loop: variables created in a trace would leak
        model.build()
    source_ids = ops.cast(source_ids, "int32")
    buffer_length, max_lengths = output_limits(
        source_ids, max_extra_length, config.max_length, config.pad_id, length_ratio
    )
    drop_finished = loop.drops_finished() if drop_finished is None else drop_finished
    if drop_finished:  # a loop that may change shapes: the cache grows as it is filled
        from keras_transformer.model import GrowingCache

        model = GrowingCache(model)
    cache = model.init_cache(source_ids, buffer_length)
    start_ids = ops.zeros_like(source_ids[:, 0]) + config.bos_id  # (B,)
    search = dict(max_lengths=max_lengths, eos_id=config.eos_id, pad_id=config.pad_id,
                  drop_finished=drop_finished)  # fmt: skip
    return model, cache, start_ids, buffer_length, search


def _check_search(beam_size, num_hypotheses, sampling, seeds, constraints):
    """`ValueError` for settings of `translate_ids` that cannot go together."""
    if sampling is not None and (beam_size != 1 or num_hypotheses is not None or seeds is None):
        raise ValueError(
            "Sampling draws one output per sentence: it needs beam_size=1, no num_hypotheses, "
            f"and seeds. Received: beam_size={beam_size}, num_hypotheses={num_hypotheses}"
        )
    if constraints is not None and sampling is not None:
        raise ValueError("Positive constraints need a search: sampling cannot carry them.")
    if num_hypotheses is not None and not 1 <= num_hypotheses <= beam_size:
        raise ValueError(
            f"num_hypotheses must be between 1 and beam_size={beam_size}. "
            f"Received: num_hypotheses={num_hypotheses}"
        )


def _steered(model, cache, start_ids, prefix_ids, banned_ids):
    """`(step function, cache)`: the model's step without PAD and BOS, with the bans
    and the forced prefix as rules of the step (every search takes them)."""
    config = model.config
    step = suppress_tokens(model.decode_step, (config.pad_id, config.bos_id))
    if banned_ids is not None:  # inside the prefix: a forced token is taken even if banned
        cache = dict(cache, **ban_init(banned_ids, config.pad_id))
        step = ban_sequences(step, config.pad_id)
    if prefix_ids is not None:
        prefix_ids = ops.cast(prefix_ids, "int32")
        cache = dict(cache, forced_ids=prefix_ids, forced_step=ops.zeros_like(start_ids))
        step = force_prefix(step, config.pad_id)
    return step, cache


def compile_translate_ids(
    model, beam_size=PAPER.beam_size, alpha=PAPER.alpha, max_extra_length=PAPER.max_extra_length,
    jit_compile=False, num_hypotheses=None, stopping=PAPER.stopping, patience=PAPER.patience,
    sampling=None, prefix=False, length_ratio=PAPER.length_ratio, bans=False, constrained=False,
):  # fmt: skip
    """`translate_ids` compiled for the current backend: `fn(source_ids) -> ids`
    (with `num_hypotheses`: `-> (ids, scores)`). With `sampling` (`(temperature,
    top_k)`), `prefix`, `bans` or `constrained`: `fn(source_ids, seeds (B,),
    prefix_ids (B, P), banned_ids (B, N, L), constraints (B, C, L)) -> ids`, the
    inputs of the steering not asked for ignored (pass None or anything).

    TensorFlow: one `tf.function` with an int32 `(None, None)` input
    signature (traced once for every batch size and source length), with
    XLA when `jit_compile=True`. JAX: `jax.jit` over the model's variables
    (recompiles per input shape, so pad lengths to a few buckets). torch:
    eager under `torch.no_grad()`.
    """
    settings = dict(
        beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length,
        num_hypotheses=num_hypotheses, stopping=stopping, patience=patience,
        length_ratio=length_ratio,
        drop_finished=False if jit_compile else None,  # XLA: static shapes
    )  # fmt: skip
    extra = sampling is not None or prefix or bans or constrained

    def run(source_ids, seeds=None, prefix_ids=None, banned_ids=None, constraints=None):
        if not extra:
            return translate_ids(model, source_ids, **settings)
        return translate_ids(
            model, source_ids, **settings, sampling=sampling, seeds=seeds,
            prefix_ids=prefix_ids if prefix else None,
            banned_ids=banned_ids if bans else None,
            constraints=constraints if constrained else None,
        )  # fmt: skip

    backend = keras.backend.backend()
    if backend == "tensorflow":
        return _tf_function(run, extra, jit_compile)
    if backend == "jax":
        return _jax_jit(run, model)
    if backend == "torch":
        import torch

        def no_grad(*inputs):
            with torch.no_grad():
                return run(*inputs)

        return no_grad
    return run


def _tf_function(run, extra, jit_compile):
    """`run` as one `tf.function` over int32 inputs of any batch size and length."""
    import tensorflow as tf

    signature = [tf.TensorSpec((None, None), tf.int32, name="source_ids")]
    if extra:
        signature += [
            tf.TensorSpec((None,), tf.int32, name="seeds"),
            tf.TensorSpec((None, None), tf.int32, name="prefix_ids"),
            tf.TensorSpec((None, None, None), tf.int32, name="banned_ids"),
            tf.TensorSpec((None, None, None), tf.int32, name="constraints"),
        ]
    return tf.function(
        run,
        input_signature=signature,
        jit_compile=jit_compile,
        autograph=False,  # the search's loops are explicit `ops` loops
    )


def _jax_jit(run, model):
    """`run` under `jax.jit`, the model's variables passed in (stateless)."""
    import jax

    variables = model.variables

    @jax.jit
    def stateless(values, *inputs):
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return run(*inputs)

    return lambda *inputs: stateless([v.value for v in variables], *inputs)


def uncached_greedy_search(model, source_ids, max_extra_length=PAPER.max_extra_length, eos_id=None,
                           length_ratio=PAPER.length_ratio):  # fmt: skip
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
        source_ids, max_extra_length, config.max_length, config.pad_id, length_ratio
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
