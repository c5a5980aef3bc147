"""Greedy search (and sampling, with a `choose` that draws): one token per row per step."""

import functools

from keras import ops

from keras_transformer.decoding import loop
from keras_transformer.decoding.loop import (
    MIN_LENGTH,
    _check_limits,
    _forbid_early_end,
    _keep,
    _match,
    _positions,
    _rows,
    _while_loop,
)


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
    drop = loop.drops_finished() if drop_finished is None else drop_finished
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

    body = functools.partial(_step, tokens_to_logits, choose, places, drop,
                             dict(eos_id=eos_id, pad_id=pad_id, min_length=min_length))  # fmt: skip
    # The first step runs outside the loop, the only one that forbids an early end
    # (with `min_length` 1), so that the loop's steps do not pay for it.
    step = ops.convert_to_tensor(0, dtype="int32")
    state = body(step, tokens, running, first=True)
    _, tokens, _ = _while_loop(cond, body, state, drop)
    return tokens


def _step(tokens_to_logits, choose, places, drop, ids, step, tokens, running, first=False):
    """One step of the rows still running: the next token of each, written to `tokens`
    (B, T); the rows that end leave `running` (`drop`). `ids`: eos_id, pad_id and
    min_length."""
    eos_id, pad_id, min_length = ids["eos_id"], ids["pad_id"], ids["min_length"]
    alive = running["alive"]
    logits, cache = tokens_to_logits(running["last_ids"], running["cache"])  # (A, V)
    logits = ops.cast(logits, "float32")
    if first or min_length > 1:  # one pass over (A, V) saved on every later step
        logits = _forbid_early_end(logits, step, eos_id, min_length)
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
