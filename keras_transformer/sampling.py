"""Steering a search's choices, for data work: sampling the next token (back-
translation) and forcing each output's first tokens (a prefix), as CTranslate2's
`sampling_topk` and `target_prefix` do. `decoding.translate_ids` applies them;
everything is `keras.ops`, inside the search's loop, on every backend.
"""

from keras import ops

from keras_transformer.search import NEG_INF


def _mix(x):
    """An int32 hash with full avalanche (Thomas Mueller's, the multiplications
    wrapping, the shifts made logical by masking): counter-based random numbers
    that every backend computes alike, inside any loop, from tensor seeds."""
    for _ in range(2):
        x = ops.multiply(ops.bitwise_xor(ops.bitwise_and(ops.right_shift(x, 16), 0xFFFF), x),
                         0x45D9F3B)  # fmt: skip
    return ops.bitwise_xor(ops.bitwise_and(ops.right_shift(x, 16), 0xFFFF), x)


def uniform(seeds, step):
    """`(A,)` float32 in (0, 1): the number of each row's seed at `step`, the same
    on every backend and in every batch the row is decoded in."""
    x = _mix(ops.bitwise_xor(_mix(ops.cast(seeds, "int32")), ops.cast(step, "int32") + 1))
    return (ops.cast(ops.bitwise_and(x, 0xFFFFFF), "float32") + 0.5) / float(1 << 24)


def sampler(seeds, temperature=1.0, top_k=0):
    """A `greedy_search` `choose` that draws the next token from the model's
    distribution, as back-translation samples (Edunov et al., 2018; fairseq's
    `--sampling`, CTranslate2's `sampling_topk`).

    Args:
        seeds: `(B,)` int32, one per row of the batch: its draws depend on its
            seed and the step alone (`uniform`), not on the batch it is in.
        temperature: float > 0; the logits are divided by it.
        top_k: int; draw among the `top_k` most likely tokens (0: all).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0. Received: temperature={temperature}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0. Received: top_k={top_k!r}")

    def choose(logits, step, rows):
        if top_k:
            logits, ids = ops.top_k(logits, min(top_k, logits.shape[-1]))  # (A, k)
        probs = ops.softmax(logits / temperature, axis=-1)
        cdf = ops.cumsum(probs, axis=-1)  # (A, k)
        u = uniform(ops.take(seeds, rows), step)[:, None] * cdf[:, -1:]
        index = ops.minimum(ops.sum(ops.cast(cdf < u, "int32"), axis=-1), cdf.shape[-1] - 1)
        if not top_k:
            return index
        return ops.take_along_axis(ops.cast(ids, "int32"), index[:, None], axis=1)[:, 0]

    return choose


FORCED = ("forced_ids", "forced_step")  # the cache entries of `force_prefix`


def force_prefix(tokens_to_logits, pad_id=0):
    """Wraps a step function so that each row's first outputs are its forced
    prefix (CTranslate2's `target_prefix`): the cache carries `forced_ids`
    `(B, P)` (the prefix, `pad_id` after it: no forcing) and `forced_step`
    `(B,)`, so that they follow their rows through beam reordering and
    dropped rows. At a forced step every other token's logit is NEG_INF: greedy
    search and sampling take the prefix, beam search keeps one hypothesis
    through it (the prefix's probability is not in the scores)."""

    def step(tokens, cache):
        forced_ids, at = cache["forced_ids"], cache["forced_step"]
        inner = {key: value for key, value in cache.items() if key not in FORCED}
        logits, inner = tokens_to_logits(tokens, inner)  # (A, V)
        width = ops.shape(forced_ids)[1]
        column = ops.minimum(at, width - 1)[:, None]
        forced = ops.take_along_axis(forced_ids, column, axis=1)[:, 0]  # (A,)
        active = ops.logical_and(at < width, ops.not_equal(forced, pad_id))  # (A,)
        vocab = ops.arange(ops.shape(logits)[-1], dtype="int32")[None, :]  # (1, V)
        other = ops.logical_and(active[:, None], ops.not_equal(vocab, forced[:, None]))
        logits = ops.where(other, ops.cast(NEG_INF, logits.dtype), logits)
        return logits, dict(inner, forced_ids=forced_ids, forced_step=at + 1)

    return step
