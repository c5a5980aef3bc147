"""Steering a search's choices: sampling the next token (back-translation),
forcing each output's first tokens (a prefix) and banning token sequences, as
CTranslate2's `sampling_topk`, `target_prefix` and `suppress_sequences` do.
`decoding.translate_ids` applies them; everything is `keras.ops`, inside the
search's loop, on every backend, and the exports run the same code in their graphs.
"""

import numbers

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

    The candidates are sorted, most likely first (`ops.top_k`, all V of them
    for `top_k=0`), and each row takes the first whose cumulative probability
    passes its uniform number.

    Args:
        seeds: `(B,)` int32, one per row of the batch: its draws depend on its
            seed and the step alone (`uniform`), not on the batch it is in.
        temperature: float > 0; the logits are divided by it.
        top_k: int; draw among the `top_k` most likely tokens (0: all).
            Either may be a scalar tensor (the exports' inputs): then a
            temperature <= 0 counts as 1e-6, and each row draws exactly as
            with the same Python values (1 takes the most likely token).
    """
    if _is_tensor(top_k) or _is_tensor(temperature):  # one path, no branch in the loop
        temperature = ops.maximum(ops.cast(temperature, "float32"), 1e-6)
        top_k = ops.cast(top_k, "int32")
    else:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0. Received: temperature={temperature}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0. Received: top_k={top_k!r}")

    def choose(logits, step, rows):
        vocab_size = logits.shape[-1]
        if _is_tensor(top_k):
            k = ops.where(top_k > 0, ops.minimum(top_k, vocab_size), vocab_size)
        else:
            k = min(top_k, vocab_size) if top_k else vocab_size
        logits, ids = ops.top_k(logits, k)  # (A, k) most likely first
        probs = ops.softmax(logits / temperature, axis=-1)
        cdf = ops.cumsum(probs, axis=-1)  # (A, k)
        u = uniform(ops.take(seeds, rows), step)[:, None] * cdf[:, -1:]
        index = ops.minimum(ops.sum(ops.cast(cdf < u, "int32"), axis=-1), ops.shape(cdf)[-1] - 1)
        return ops.take_along_axis(ops.cast(ids, "int32"), index[:, None], axis=1)[:, 0]

    return choose


def _is_tensor(value):
    return not isinstance(value, numbers.Number)


FORCED = ("forced_ids", "forced_step")  # the cache entries of `force_prefix`


def force_prefix(tokens_to_logits, pad_id=0):
    """Wraps a step function so that each row's first outputs are its forced
    prefix (CTranslate2's `target_prefix`): the cache carries `forced_ids`
    `(B, P)` (the prefix, `pad_id` after it: no forcing) and `forced_step`
    `(B,)`, so that they follow their rows through beam reordering and
    dropped rows. At a forced step every other token's logit is NEG_INF: greedy
    search and sampling take the prefix, beam search keeps one hypothesis
    through it (the prefix's probability is not in the scores). A forced token
    is taken even where a ban would forbid it: the caller asked for both."""

    def step(tokens, cache):
        forced_ids, at = cache["forced_ids"], cache["forced_step"]
        inner = {key: value for key, value in cache.items() if key not in FORCED}
        logits, inner = tokens_to_logits(tokens, inner)  # (A, V)
        width = ops.shape(forced_ids)[1]
        column = ops.minimum(at, width - 1)[:, None]
        forced = ops.take_along_axis(forced_ids, column, axis=1)[:, 0]  # (A,)
        active = ops.logical_and(at < width, ops.not_equal(forced, pad_id))  # (A,)
        vocab = ops.arange(ops.shape(logits)[-1], dtype="int32")[None, :]  # (1, V)
        # 0 for the forced token, also where a ban (`ban_sequences`) gave it NEG_INF:
        # its log-probability is 0 either way (the only finite logit of its row).
        only_forced = ops.where(ops.equal(vocab, forced[:, None]), 0.0, NEG_INF)  # (A, V)
        logits = ops.where(active[:, None], ops.cast(only_forced, logits.dtype), logits)
        return logits, dict(inner, forced_ids=forced_ids, forced_step=at + 1)

    return step


BANNED = ("banned_ids", "recent_ids")  # the cache entries of `ban_sequences`


def right_aligned(ids, pad_id=0):
    """`(..., L)` ids followed by `pad_id` -> the same ids ending at column L - 1,
    `pad_id` before them: `[[7, 8, 0]] -> [[0, 7, 8]]`."""
    ids = ops.cast(ids, "int32")
    lengths = ops.sum(ops.cast(ops.not_equal(ids, pad_id), "int32"), axis=-1, keepdims=True)
    positions = ops.cumsum(ops.ones_like(ids), axis=-1) - 1  # (..., L) 0..L-1
    source = positions - (ops.shape(ids)[-1] - lengths)  # (..., L) where each id comes from
    moved = ops.take_along_axis(ids, ops.maximum(source, 0), axis=-1)
    return ops.where(source >= 0, moved, pad_id)


def ban_init(banned_ids, pad_id=0):
    """The cache entries of `ban_sequences` for `banned_ids (B, N, L)`: each row's
    N banned token sequences, `pad_id` after a shorter one (an all-`pad_id` row bans
    nothing); L >= 1."""
    banned = right_aligned(banned_ids, pad_id)  # (B, N, L)
    recent = ops.zeros_like(ops.sum(banned, axis=1)[:, 1:]) + pad_id  # (B, L - 1), also N = 0
    return {"banned_ids": banned, "recent_ids": recent}


def ban_sequences(tokens_to_logits, pad_id=0):
    """Wraps a step function so that no output holds a banned token sequence
    (CTranslate2's `suppress_sequences`, Hugging Face's `bad_words_ids`).

    The cache carries `banned_ids` `(B, N, L)` (right-aligned, `ban_init`) and
    `recent_ids` `(B, L - 1)`, the last L - 1 tokens each row fed to the
    model (BOS and a forced prefix included), so that both follow their rows
    through beam reordering and dropped rows. A sequence's last token gets
    NEG_INF where the tokens before it are the row's most recent ones: a
    one-token sequence is banned at every step. The other logits are left as
    they are (beam search then renormalizes over the tokens left, as
    CTranslate2 does). Costs an `(A, N, V)` comparison per step.
    """

    def step(tokens, cache):
        banned, recent = cache["banned_ids"], cache["recent_ids"]  # (A, N, L), (A, L - 1)
        inner = {key: value for key, value in cache.items() if key not in BANNED}
        logits, inner = tokens_to_logits(tokens, inner)  # (A, V)
        tokens = ops.cast(tokens, "int32")
        recent = ops.concatenate([recent, tokens[:, None]], axis=1)[:, 1:]  # (A, L - 1)
        context = banned[:, :, :-1]  # (A, N, L - 1) pad_id: any token (a shorter sequence)
        follows = ops.all(
            ops.logical_or(ops.equal(context, pad_id), ops.equal(context, recent[:, None, :])),
            axis=2,
        )  # (A, N) the sequence's last token would complete it
        last = banned[:, :, -1]  # (A, N)
        vocab = ops.arange(ops.shape(logits)[-1], dtype="int32")[None, None, :]  # (1, 1, V)
        hit = ops.any(ops.logical_and(follows[:, :, None], ops.equal(last[:, :, None], vocab)),
                      axis=1)  # fmt: skip  # (A, V)
        logits = ops.where(hit, ops.cast(NEG_INF, logits.dtype), logits)
        return logits, dict(inner, banned_ids=banned, recent_ids=recent)

    return step
