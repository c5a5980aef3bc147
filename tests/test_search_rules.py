"""The search that drops finished sentences, its stopping rules and its shared cache.

- Dropping finished rows and sentences changes no output: the same search
  with and without it agrees token for token (a trained model, 240
  sentences of very different lengths in mixed batches, limits that cut
  rows short), and finished rows really leave the loop.
- Both stopping rules equal a plain-Python beam search written from their
  definitions (`reference_beam_search`), on a toy model whose logits depend
  on the whole history; on a toy small enough that the beam keeps every
  hypothesis, `"k_finished"`'s answer is read off the sorted list of all
  outputs (which ends count, when a sentence stops: ceil of K x patience).
  The shipped search through the exports: test_shipped_search.py.
- The hypotheses of a sentence share its cache entries named in `shared`
  (the cross-attention keys and values): the beam never tiles or reorders
  them, it only drops the rows of stopped sentences.
"""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import decoding
from keras_transformer.decoding import NEG_INF, beam_search, greedy_search

BOS, EOS, PAD = 2, 3, 0
TABLE_SIZE = 97


def _toy(vocab_size, beam_size, seed=0):
    """A step function whose logits depend on the whole output and on a per-sentence
    `offset`, a `shared` cache entry: it has one row per sentence, which the step
    repeats for the sentence's hypotheses (1 at the first step, `beam_size` after
    it). Were the search to tile or reorder it, or to run K rows at the first
    step, the repeat would no longer line up with the hypotheses and the step
    would fail on the shapes. Build a new one for each search.

    Returns `(tokens_to_logits, logits_after)`, the second the float64 logits
    after an output prefix for a sentence's offset.
    """
    table = np.random.default_rng(seed).normal(size=(TABLE_SIZE, vocab_size)).astype("float32")
    table *= 2

    calls = []

    def tokens_to_logits(token_ids, cache):
        # The first step runs one hypothesis per sentence, every later step K.
        group = beam_size if calls else 1
        calls.append(group)
        offset = ops.repeat(cache["offset"], group, axis=0)  # (A*K,)
        history = cache["history"] * 31 + ops.cast(token_ids, "int32") + 1 + offset
        history = ops.mod(history, TABLE_SIZE)  # (A*K,)
        return ops.take(ops.convert_to_tensor(table), history, axis=0), dict(cache, history=history)

    def logits_after(prefix, offset):
        history = 0
        for token in [BOS] + list(prefix):
            history = (history * 31 + token + 1 + offset) % TABLE_SIZE
        return table[history].astype("float64")

    return tokens_to_logits, logits_after


def _log_softmax(logits):
    top = np.max(logits)
    return logits - top - np.log(np.sum(np.exp(logits - top)))


def _stable_top(scores, count):
    """Indices of the `count` largest, earlier first on ties (as `ops.top_k`)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:count]


def reference_beam_search(logits_after, offset, k, alpha, limit, stopping, patience):
    """One sentence's beam search from the definitions in `decoding.beam_search`,
    hypothesis by hypothesis in Python: `(sequences, scores)` best first."""

    def penalty(length):
        return ((5.0 + length) / 6.0) ** alpha

    alive = [((), 0.0)] + [((), NEG_INF)] * (k - 1)  # only beam 0 at the start
    finished = [((), NEG_INF, False)] * k  # (sequence, score, real)
    count, needed = 0, max(1, math.ceil(k * patience - 1e-9))
    for step in range(limit):
        candidates = []
        for sequence, log_prob in alive:
            log_probs = _log_softmax(logits_after(sequence, offset))
            if step < decoding.MIN_LENGTH:
                log_probs[EOS] = NEG_INF
            candidates += [(sequence + (v,), log_prob + lp) for v, lp in enumerate(log_probs)]
        top = [candidates[i] for i in _stable_top([c[1] for c in candidates], 2 * k)]
        at_limit = step + 1 >= limit
        ends = [sequence[-1] == EOS or at_limit for sequence, _ in top]
        finishes = list(ends)
        if stopping == "k_finished":
            finishes = [end and (i < k or at_limit) and top[i][1] > NEG_INF / 2
                        for i, end in enumerate(ends)]  # fmt: skip
        count += sum(finishes)
        new = [
            (sequence, log_prob / penalty(step + 1) if f else NEG_INF, f)
            for (sequence, log_prob), f in zip(top, finishes, strict=True)
        ]
        merged = finished + new
        finished = [merged[i] for i in _stable_top([m[1] for m in merged], k)]
        survivors = [(s, lp if not e else NEG_INF) for (s, lp), e in zip(top, ends, strict=True)]
        alive = [(survivors[i][0], survivors[i][1])
                 for i in _stable_top([s[1] for s in survivors], k)]  # fmt: skip
        if stopping == "k_finished":
            done = count >= needed
        else:
            best_reachable = max(lp for _, lp in alive) / penalty(limit)
            done = (
                all(real for *_, real in finished)
                and min(score for _, score, _ in finished) > best_reachable
            )
        if done or at_limit:
            break
    return [s for s, _, _ in finished], [score for _, score, _ in finished]


def _drop_choices():
    # JAX's compiled loop cannot change shape: there the search keeps its rows.
    return [False] if keras.backend.backend() == "jax" else [True, False]


@pytest.mark.multibackend
@pytest.mark.parametrize("drop_finished", _drop_choices())
@pytest.mark.parametrize(
    "k, alpha, stopping, patience, vocab_size",
    [(2, 0.0, "bound", 1.0, 7), (3, 0.6, "bound", 1.0, 7), (3, 1.0, "k_finished", 1.0, 7),
     (2, 0.6, "k_finished", 2.0, 7), (4, 0.6, "k_finished", 0.5, 7),
     # Fewer first-step candidates than 2K, EOS forbidden among them: no end may count.
     (4, 0.6, "k_finished", 0.25, 4), (3, 0.0, "bound", 1.0, 4)],
)  # fmt: skip
def test_beam_search_equals_the_reference_of_its_rule(
    k, alpha, stopping, patience, vocab_size, drop_finished
):
    tokens_to_logits, logits_after = _toy(vocab_size, k, seed=k)
    offsets = np.array([0, 5, 11, 17, 23, 42], "int32")
    limits = np.array([6, 2, 5, 6, 1, 4], "int32")
    cache = {"history": ops.zeros((len(offsets),), dtype="int32"), "offset": offsets}
    sequences, scores = beam_search(
        tokens_to_logits, cache, ops.full((len(offsets),), BOS, dtype="int32"), 6, eos_id=EOS,
        beam_size=k, alpha=alpha, max_lengths=limits, pad_id=PAD, stopping=stopping,
        patience=patience, shared=("offset",), drop_finished=drop_finished,
    )  # fmt: skip
    sequences, scores = ops.convert_to_numpy(sequences), ops.convert_to_numpy(scores)
    for row, (offset, limit) in enumerate(zip(offsets, limits, strict=True)):
        expected, expected_scores = reference_beam_search(
            logits_after, int(offset), k, alpha, int(limit), stopping, patience
        )
        np.testing.assert_allclose(scores[row], expected_scores, rtol=1e-5, atol=1e-4)
        assert sequences[row, 0, 0] != EOS  # no empty best output
        for got, want in zip(sequences[row], expected, strict=True):
            assert tuple(int(t) for t in got[: len(want)]) == want, (row, got, want)
            assert np.all(got[len(want) :] == PAD)


@pytest.mark.multibackend
def test_the_rules_differ_where_k_finished_stops_first():
    """On the toy model the cheaper rule gives up some score on some sentence: the
    reference says where, so this test cannot pass with one rule run for both."""
    k, alpha, limit = 2, 1.0, 6
    _, logits_after = _toy(7, k, seed=3)
    differ = 0
    for offset in range(40):
        bound = reference_beam_search(logits_after, offset, k, alpha, limit, "bound", 1.0)
        first = reference_beam_search(logits_after, offset, k, alpha, limit, "k_finished", 1.0)
        assert first[1][0] <= bound[1][0] + 1e-9  # the bound's answer is the best
        differ += first[0][0] != bound[0][0]
    assert differ > 0


def _k_finished_from_all_outputs(logits_after, offset, vocab_size, k, alpha, limit, needed):
    """`"k_finished"`'s answer for one sentence, read off the sorted list of all outputs.

    At step t the continuations are every sequence of t + 1 tokens that did not end
    before (none starts with EOS: `decoding.MIN_LENGTH`), sorted by log-probability;
    an end (EOS, or any sequence at the limit) counts when it ranks among the K best
    of its step (at the limit, always), and the search stops at the first step by
    which `needed` ends have counted. The answer: the counted ends' K best scores
    under the length penalty, best first. This holds where the beam keeps every
    hypothesis (at most 2K continuations and K that go on, before the limit:
    asserted).

    Returns `(answer, stop_step, per_step)`: answer a list of `(sequence, score)`,
    per_step `(ends counted, ends)` of each step run.
    """

    def log_prob(sequence):
        return sum(_log_softmax(logits_after(sequence[:i], offset))[token]
                   for i, token in enumerate(sequence))  # fmt: skip

    counted, per_step, prefixes = [], [], [()]
    for step in range(limit):
        sequences = [p + (v,) for p in prefixes for v in range(vocab_size)
                     if step >= decoding.MIN_LENGTH or v != EOS]  # fmt: skip
        at_limit = step + 1 == limit
        going_on = [s for s in sequences if s[-1] != EOS]
        assert at_limit or (len(sequences) <= 2 * k and len(going_on) <= k)
        ranked = sorted(sequences, key=log_prob, reverse=True)
        ends = [rank for rank, s in enumerate(ranked) if s[-1] == EOS or at_limit]
        counts = [rank for rank in ends if rank < k or at_limit]
        penalty = ((5.0 + step + 1) / 6.0) ** alpha
        counted += [(ranked[rank], log_prob(ranked[rank]) / penalty) for rank in counts]
        per_step.append((len(counts), len(ends)))
        if len(counted) >= needed or at_limit:
            break
        prefixes = going_on
    return sorted(counted, key=lambda c: -c[1])[:k], step, per_step


@pytest.mark.multibackend
@pytest.mark.parametrize("alpha", [0.0, 1.5])
# ceil(K x patience) ends stop a sentence: 16 x 0.2 = 3.2 needs 4 (CTranslate2 rounds to 3).
@pytest.mark.parametrize("patience, needed", [(1 / 16, 1), (0.2, 4), (0.25, 4), (0.3, 5)])
def test_k_finished_on_an_exhaustive_toy(alpha, patience, needed):
    """A vocabulary of 5 and 3 tokens: beam 16 keeps every hypothesis, so what
    `"k_finished"` returns follows from the sorted list of all outputs
    (`_k_finished_from_all_outputs`): the stopping step from the count of ends ranked
    among the K best of their step, the K best of them under the length penalty. Forty
    sentences, some stopping after their second token and some at the limit, some with
    an end that ranks below the K best and does not count."""
    vocab_size, k, limit = 5, 16, 3
    tokens_to_logits, logits_after = _toy(vocab_size, k, seed=5)
    offsets = np.arange(40, dtype="int32")
    cache = {"history": ops.zeros((len(offsets),), dtype="int32"), "offset": offsets}
    sequences, scores = beam_search(
        tokens_to_logits, cache, ops.full((len(offsets),), BOS, dtype="int32"), limit,
        eos_id=EOS, beam_size=k, alpha=alpha, pad_id=PAD, stopping="k_finished",
        patience=patience, shared=("offset",),
    )  # fmt: skip
    sequences, scores = ops.convert_to_numpy(sequences), ops.convert_to_numpy(scores)
    stops, counted_at_second, uncounted = [], [], 0
    for row, offset in enumerate(offsets):
        answer, stop, per_step = _k_finished_from_all_outputs(
            logits_after, int(offset), vocab_size, k, alpha, limit, needed
        )
        stops.append(stop)
        counted_at_second.append(per_step[1][0])
        uncounted += per_step[1][0] < per_step[1][1]
        np.testing.assert_allclose(scores[row, : len(answer)], [s for _, s in answer], atol=1e-4)
        assert np.all(scores[row, len(answer) :] < NEG_INF / 2)  # no more ends counted
        for got, (want, _) in zip(sequences[row, : len(answer)], answer, strict=True):
            assert tuple(int(t) for t in got[: len(want)]) == want, (row, got, want)
            assert np.all(got[len(want) :] == PAD)
        assert np.all(sequences[row, len(answer) :] == PAD)  # the slots no end filled
    # The toy exercises the rule: ends ranked below the K best exist (they do not count);
    # one counted end stops sentences after their second token; at 4 needed some stop
    # there and some run to the limit (at 5, all); at 0.2 some have exactly 3 counted
    # (which run to the limit: ceil, not round).
    assert uncounted > 0
    assert (1 in stops) == (needed <= 4) and (needed == 1 or limit - 1 in stops), stops
    assert patience != 0.2 or 3 in counted_at_second


def _counting(tokens_to_logits, rows_seen):
    def step(token_ids, cache):
        rows_seen.append(int(ops.shape(token_ids)[0]))
        return tokens_to_logits(token_ids, cache)

    return step


@pytest.mark.multibackend
def test_finished_rows_leave_the_loop():
    if keras.backend.backend() == "jax":
        pytest.skip("JAX's compiled while loop keeps its shapes: nothing to count")

    # Row 0 ends at its first token, row 1 at its limit of 5, row 2 with EOS at step 3.
    def tokens_to_logits(token_ids, cache):
        step = cache["step"]
        wants_eos = ops.logical_or(cache["ends_at"] == step, cache["ends_at"] < 0)
        logits = ops.where(
            wants_eos[:, None], ops.one_hot(ops.full_like(step, EOS), 6) * 5.0,
            ops.one_hot(ops.full_like(step, 4), 6) * 5.0,
        )  # fmt: skip
        return logits, dict(cache, step=step + 1)

    cache = {"step": ops.zeros((3,), "int32"), "ends_at": ops.convert_to_tensor([1, 99, 3])}
    rows = []
    ids = greedy_search(
        _counting(tokens_to_logits, rows), cache, ops.full((3,), BOS, dtype="int32"), 6,
        eos_id=EOS, max_lengths=ops.convert_to_tensor([6, 5, 6]), pad_id=PAD,
    )  # fmt: skip
    np.testing.assert_array_equal(
        ops.convert_to_numpy(ids),
        [[4, EOS, PAD, PAD, PAD, PAD], [4, 4, 4, 4, 4, PAD], [4, 4, 4, EOS, PAD, PAD]],
    )
    assert rows == [3, 3, 2, 2, 1]  # the work: 11 rows x steps, not 3 x 5 = 15

    # Beam 2 on the toy model, limits 1, 3 and 6: after the first step each step computes
    # K rows per sentence still searching, and a stopped sentence's rows are gone.
    k = 2
    toy, _ = _toy(7, k, seed=1)
    rows = []
    beam_search(
        _counting(toy, rows), {"history": ops.zeros((3,), "int32"), "offset": np.array([0, 5, 11], "int32")},
        ops.full((3,), BOS, dtype="int32"), 6, eos_id=EOS, beam_size=k,
        max_lengths=ops.convert_to_tensor([1, 3, 6]), pad_id=PAD, shared=("offset",),
    )  # fmt: skip
    # The first step runs one row per sentence; the limit-1 sentence stops there.
    assert rows[0] == 3 and rows[1] == 2 * k
    assert all(r % k == 0 for r in rows[1:]) and rows[1:] == sorted(rows[1:], reverse=True)
    assert len(rows) <= 6 and rows[-1] < 2 * k


def test_dropping_finished_changes_no_translation(monkeypatch, tmp_path_factory):
    """A trained model (the export fixtures' shared copy-task run), 240 held-out sentences in
    batches of 48 mixing lengths 1 to 30 pieces, greedy and both beam rules, with
    output limits that stop rows at their source length (`max_extra_length=0`)
    or let them run."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the exports' search: TensorFlow's while loop")
    from export_fixtures import held_out_sentences, loaded_work_dir, trained

    from keras_transformer.decoding import compile_translate_ids
    from keras_transformer.translators.keras_translator import _as_lists

    model, tokenizer, _ = loaded_work_dir(trained(tmp_path_factory))  # read, not written
    rng = np.random.default_rng(0)
    sentences = held_out_sentences(240, seed=11)
    sentences = [s if i % 7 else s + " " + s + " " + s for i, s in enumerate(sentences)]
    pieces = [ids[:30] + [EOS] for ids in _as_lists(tokenizer.tokenize(sentences))]
    order = rng.permutation(len(pieces))
    batches = []
    for start in range(0, len(order), 48):
        rows = [pieces[i] for i in order[start : start + 48]]
        ids = np.zeros((len(rows), max(map(len, rows))), "int32")
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        batches.append(ids)
    searches = [
        dict(beam_size=1), dict(beam_size=4, alpha=0.6),
        dict(beam_size=4, alpha=1.0, stopping="k_finished"),
        dict(beam_size=3, alpha=0.0, stopping="k_finished", patience=1.5),
    ]  # fmt: skip
    ended_early = 0
    for search in searches:
        for extra in (0, 50):
            outputs = {}
            for drop in (True, False):
                monkeypatch.setattr(decoding.loop, "drops_finished", lambda drop=drop: drop)
                run = compile_translate_ids(model, max_extra_length=extra, **search)
                outputs[drop] = [ops.convert_to_numpy(run(ids)) for ids in batches]
            for dropped, kept in zip(outputs[True], outputs[False], strict=True):
                np.testing.assert_array_equal(dropped, kept, err_msg=str((search, extra)))
            lengths = np.concatenate([np.sum(o != PAD, axis=1) for o in outputs[True]])
            ended_early += int(np.sum(lengths < lengths.max()))
            assert len(set(lengths.tolist())) > 3  # rows of very different lengths
    assert ended_early > 0


@pytest.mark.multibackend
def test_the_models_cross_attention_cache_has_one_row_per_sentence(monkeypatch):
    """In the model's beam search each step sees the source's keys and values once per
    sentence still searching, and its K hypotheses' tokens: never K copies of them."""
    if keras.backend.backend() == "jax":
        pytest.skip("JAX's compiled loop: no per-step shapes to record")
    from keras_transformer import Transformer
    from keras_transformer.model import GrowingCache  # the cache of a loop that drops rows

    model = Transformer.from_preset(
        "tiny", vocab_size=32, dropout=0.0, d_model=32, d_ff=64, max_length=24
    )
    model.build()
    seen = []
    decode_step = GrowingCache.decode_step

    def recording(self, token_ids, cache):
        rows = [int(ops.shape(key)[0]) for key in cache["cross_key"]]  # one entry per layer
        assert len(set(rows)) == 1
        seen.append((int(ops.shape(token_ids)[0]), rows[0]))
        return decode_step(self, token_ids, cache)

    monkeypatch.setattr(GrowingCache, "decode_step", recording)
    source_ids = np.array([[5, 6, 7, 3], [8, 3, 0, 0], [9, 10, 3, 0]], "int32")
    decoding.translate_ids(model, source_ids, beam_size=3, max_extra_length=3)
    assert seen[0] == (3, 3)  # the first step: one hypothesis per sentence
    assert all(rows == 3 * sentences for rows, sentences in seen[1:]), seen
    assert seen[-1][1] < 3  # the shortest limits stopped their sentences first
