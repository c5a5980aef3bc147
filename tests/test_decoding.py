"""Greedy and beam search: cached == uncached, beam >= greedy, exhaustive beam == brute force."""

import itertools

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import Transformer
from keras_transformer.decoding import (
    beam_search,
    compile_translate_ids,
    greedy_search,
    length_penalty,
    output_limits,
    suppress_tokens,
    translate_ids,
    uncached_greedy_search,
)

BOS, EOS, PAD = 2, 3, 0


def small_model(vocab_size=32, max_length=24):
    model = Transformer.from_preset(
        "tiny", vocab_size=vocab_size, dropout=0.0, d_model=32, d_ff=64, max_length=max_length
    )
    model.build()
    return model


def random_sources(rng, batch_size, max_source_length, vocab_size):
    """`(B, S)` ids ending with EOS, then padding; lengths vary in [2, S]."""
    lengths = rng.integers(2, max_source_length + 1, size=batch_size)
    lengths[0] = max_source_length
    ids = np.zeros((batch_size, max_source_length), "int32")
    for row, length in enumerate(lengths):
        ids[row, : length - 1] = rng.integers(4, vocab_size, size=length - 1)
        ids[row, length - 1] = EOS
    return ids


def output_length(ids):
    """Generated tokens per row of `(B, T)` output ids, EOS included."""
    ids = np.asarray(ids)
    return np.array([int(np.sum(row != PAD)) for row in ids])


def teacher_forced_score(model, source_ids, output_ids, alpha):
    """Length-penalized log P(output | source), scored by one full forward pass."""
    output_ids = np.asarray(output_ids)
    lengths = output_length(output_ids)
    target_in = np.concatenate([np.full((len(output_ids), 1), BOS), output_ids[:, :-1]], axis=1)
    target_in = np.where(np.arange(target_in.shape[1])[None] < lengths[:, None], target_in, PAD)
    logits = ops.convert_to_numpy(
        model({"source_ids": source_ids, "target_ids": target_in.astype("int32")})
    )
    logits[:, :, [PAD, BOS]] = -1e7  # as the search, which never predicts them
    log_probs = ops.convert_to_numpy(ops.log_softmax(logits, axis=-1))  # (B, T, V)
    token_log_probs = np.take_along_axis(log_probs, output_ids[:, :, None], axis=-1)[:, :, 0]
    token_log_probs = np.where(
        np.arange(output_ids.shape[1])[None] < lengths[:, None], token_log_probs, 0
    )
    return token_log_probs.sum(axis=1) / ((5.0 + lengths) / 6.0) ** alpha


@pytest.mark.multibackend
def test_search_never_predicts_pad_or_bos():
    def tokens_to_logits(tokens, cache):  # PAD and BOS score highest everywhere
        logits = ops.convert_to_tensor(np.array([[9.0, 0.0, 8.0, -1.0, 1.0]] * 2, "float32"))
        return logits, cache

    step = suppress_tokens(tokens_to_logits, (PAD, BOS))
    logits, _ = step(ops.convert_to_tensor(np.array([BOS, BOS], "int32")), {})
    assert list(np.argmax(ops.convert_to_numpy(logits), axis=-1)) == [4, 4]
    ids = greedy_search(
        step, {}, ops.convert_to_tensor(np.array([BOS, BOS], "int32")), 3, max_lengths=None,
        eos_id=EOS,
    )  # fmt: skip
    assert PAD not in ops.convert_to_numpy(ids)[:, 0] and BOS not in ops.convert_to_numpy(ids)


@pytest.mark.multibackend
def test_length_penalty_matches_gnmt_formula():
    lengths = np.array([1, 2, 7, 50], "int32")
    for alpha in (0.0, 0.6, 1.0):
        expected = ((5.0 + lengths) / 6.0) ** alpha
        np.testing.assert_allclose(
            ops.convert_to_numpy(length_penalty(lengths, alpha)), expected, rtol=1e-6
        )
    assert float(ops.convert_to_numpy(length_penalty(1, 0.6))) == pytest.approx(1.0)


@pytest.mark.multibackend
def test_cached_greedy_equals_uncached_greedy():
    rng = np.random.default_rng(0)
    model = small_model()
    source_ids = random_sources(rng, batch_size=4, max_source_length=6, vocab_size=32)
    cached = ops.convert_to_numpy(translate_ids(model, source_ids, beam_size=1, max_extra_length=8))
    uncached = ops.convert_to_numpy(uncached_greedy_search(model, source_ids, max_extra_length=8))
    np.testing.assert_array_equal(cached, uncached)
    # Each row stops at EOS or at its limit (source length + 8), then pads.
    limits = np.sum(source_ids != PAD, axis=1) + 8
    for row, limit in zip(cached, limits, strict=True):
        length = output_length(row[None])[0]
        assert length <= limit
        assert length == limit or row[length - 1] == EOS
        assert np.all(row[length:] == PAD)

    # Step-by-step cached logits equal one teacher-forced decoder pass.
    target_in = np.concatenate([np.full((4, 1), BOS), cached[:, :-1]], axis=1).astype("int32")
    full = ops.convert_to_numpy(
        model.decode(target_in, model.encode(source_ids), source_ids)
    )  # (B, T, V)
    lengths = output_length(cached)
    cache = model.init_cache(source_ids, target_in.shape[1])
    for step in range(target_in.shape[1]):
        logits, cache = model.decode_step(target_in[:, step], cache)
        real = step < lengths  # after EOS the full pass masks the padding, the cache does not
        np.testing.assert_allclose(ops.convert_to_numpy(logits)[real], full[real, step], atol=1e-5)


@pytest.mark.multibackend
def test_beam_size_one_equals_greedy():
    """Under "k_finished" one beam is greedy search: an end counts only as the best
    continuation, so the beam ends exactly where greedy does. (Under "bound" it is not:
    an EOS ranked second joins the finished set and can outscore the greedy path at the
    end; this test's JAX weights show it on a row.)"""
    rng = np.random.default_rng(1)
    model = small_model(vocab_size=16)
    source_ids = random_sources(rng, batch_size=6, max_source_length=5, vocab_size=16)
    greedy = translate_ids(model, source_ids, beam_size=1, max_extra_length=6)
    for alpha in (0.0, 1.0):
        # num_hypotheses runs beam_search itself (beam_size=1 alone takes the greedy path).
        beam, _ = translate_ids(
            model, source_ids, beam_size=1, alpha=alpha, max_extra_length=6, num_hypotheses=1,
            stopping="k_finished",
        )  # fmt: skip
        np.testing.assert_array_equal(
            ops.convert_to_numpy(beam)[:, 0], ops.convert_to_numpy(greedy)
        )


@pytest.mark.multibackend
def test_batched_equals_one_by_one():
    rng = np.random.default_rng(2)
    model = small_model(vocab_size=16)
    source_ids = random_sources(rng, batch_size=3, max_source_length=6, vocab_size=16)
    search = compile_translate_ids(model, beam_size=3, max_extra_length=5)
    batched = ops.convert_to_numpy(search(source_ids))
    for row, source in enumerate(source_ids):
        alone = ops.convert_to_numpy(search(source[None]))[0]
        np.testing.assert_array_equal(batched[row], alone)


def test_beam_search_scores_at_least_greedy_on_100_inputs():
    # Beam search is not monotone in the beam size: the greedy prefix can fall
    # out of the beam and the beams that pushed it out can end worse. On this
    # near-uniform random model that happens on a few of 100 inputs (always at
    # the length limit); the exhaustive test below checks the search exactly.
    rng = np.random.default_rng(3)
    model = small_model(vocab_size=24)
    source_ids = random_sources(rng, batch_size=100, max_source_length=8, vocab_size=24)
    alpha = 0.6
    greedy = translate_ids(model, source_ids, beam_size=1, max_extra_length=6)
    buffer_length, max_lengths = output_limits(source_ids, 6, model.config.max_length)
    sequences, scores = beam_search(
        suppress_tokens(model.decode_step, (PAD, BOS)),
        model.init_cache(source_ids, buffer_length),
        ops.full((100,), BOS, dtype="int32"),
        buffer_length,
        eos_id=EOS,
        beam_size=4,
        alpha=alpha,
        max_lengths=max_lengths,
    )
    best = ops.convert_to_numpy(sequences)[:, 0]
    np.testing.assert_array_equal(
        best, ops.convert_to_numpy(translate_ids(model, source_ids, 4, alpha, 6))
    )
    greedy_scores = teacher_forced_score(model, source_ids, ops.convert_to_numpy(greedy), alpha)
    beam_scores = teacher_forced_score(model, source_ids, best, alpha)
    # The search's own scores are the length-penalized log-probabilities.
    np.testing.assert_allclose(ops.convert_to_numpy(scores)[:, 0], beam_scores, atol=1e-4)
    below = beam_scores < greedy_scores - 1e-5
    assert np.mean(below) <= 0.1, np.flatnonzero(below)
    assert np.any(beam_scores > greedy_scores + 1e-5)  # the search does search
    assert np.mean(beam_scores) > np.mean(greedy_scores)


def _history_model(vocab_size, seed=0, table_size=97):
    """A toy autoregressive model whose logits depend on the whole history via its cache.

    Returns `(tokens_to_logits, logits_after)`: the step function, and the
    float64 logits of the next token after a given output prefix.
    """
    table = np.random.default_rng(seed).normal(size=(table_size, vocab_size)).astype("float32") * 2

    def tokens_to_logits(token_ids, cache):
        history = ops.mod(cache["history"] * 31 + ops.cast(token_ids, "int32") + 1, table_size)
        return ops.take(ops.convert_to_tensor(table), history, axis=0), {"history": history}

    def logits_after(prefix):
        history = 0
        for token in [BOS] + list(prefix):
            history = (history * 31 + token + 1) % table_size
        return table[history].astype("float64")

    return tokens_to_logits, logits_after


def _log_prob(logits_after, sequence):
    total = 0.0
    for i, token in enumerate(sequence):
        logits = logits_after(sequence[:i])
        total += logits[token] - np.log(np.sum(np.exp(logits)))
    return total


@pytest.mark.multibackend
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_exhaustive_beam_search_finds_the_best_hypothesis(alpha):
    vocab_size, max_length = 5, 3
    tokens_to_logits, logits_after = _history_model(vocab_size)
    # Brute force over every hypothesis: it ends at its first EOS or at max_length.
    best, best_sequence = -np.inf, None
    for length in range(1, max_length + 1):
        for sequence in itertools.product(range(vocab_size), repeat=length):
            if EOS in sequence[:-1] or (length < max_length and sequence[-1] != EOS):
                continue
            if sequence[0] == EOS:  # decoding.MIN_LENGTH: no empty output
                continue
            score = _log_prob(logits_after, sequence) / ((5.0 + length) / 6.0) ** alpha
            if score > best:
                best, best_sequence = score, sequence
    start_ids = ops.convert_to_tensor([BOS, BOS], dtype="int32")
    cache = {"history": ops.zeros((2,), dtype="int32")}
    # K = V ** (max_length - 1) keeps every prefix alive: the search is exhaustive.
    sequences, scores = beam_search(
        tokens_to_logits, cache, start_ids, max_length, eos_id=EOS, beam_size=vocab_size ** 2,
        alpha=alpha, pad_id=PAD,
    )  # fmt: skip
    sequences, scores = ops.convert_to_numpy(sequences), ops.convert_to_numpy(scores)
    assert scores[0, 0] == pytest.approx(best, abs=1e-4)
    found = tuple(int(t) for t in sequences[0, 0][: len(best_sequence)])
    assert found == best_sequence
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # best first
    # Every returned score is the length-penalized log-probability of its sequence.
    for sequence, score in zip(sequences[1], scores[1], strict=True):
        tokens = [int(t) for t in sequence]
        length = tokens.index(EOS) + 1 if EOS in tokens else max_length
        expected = _log_prob(logits_after, tokens[:length]) / ((5.0 + length) / 6.0) ** alpha
        assert score == pytest.approx(expected, abs=1e-4)


@pytest.mark.multibackend
def test_greedy_search_on_toy_model_follows_argmax():
    tokens_to_logits, logits_after = _history_model(vocab_size=6, seed=4)
    start_ids = ops.convert_to_tensor([BOS], dtype="int32")
    cache = {"history": ops.zeros((1,), dtype="int32")}
    output = greedy_search(tokens_to_logits, cache, start_ids, 5, eos_id=EOS)
    output = ops.convert_to_numpy(output)[0]
    expected = []
    while len(expected) < 5 and EOS not in expected:
        expected.append(int(np.argmax(logits_after(expected))))
    np.testing.assert_array_equal(output[: len(expected)], expected)
    assert np.all(output[len(expected) :] == PAD)


def test_search_traces_in_tf_function_with_dynamic_shapes():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.function tracing is TensorFlow-only")
    model = small_model()
    rng = np.random.default_rng(5)
    for beam_size in (1, 3):
        fn = compile_translate_ids(model, beam_size=beam_size, max_extra_length=4)
        fn(random_sources(rng, 2, 5, vocab_size=32))
        source_ids = random_sources(rng, 3, 7, vocab_size=32)  # another batch size and length
        np.testing.assert_array_equal(
            ops.convert_to_numpy(fn(source_ids)),
            ops.convert_to_numpy(translate_ids(model, source_ids, beam_size, max_extra_length=4)),
        )
        assert fn.experimental_get_tracing_count() == 1
        graph = fn.get_concrete_function().graph.as_graph_def()
        op_types = {node.op for node in graph.node}
        for function in graph.library.function:
            op_types.update(node.op for node in function.node_def)
        assert "While" in op_types or "StatelessWhile" in op_types
        assert not {"XlaDynamicUpdateSlice", "TensorScatterUpdate"} & op_types


def test_bad_search_arguments_raise():
    model = small_model()
    source_ids = np.array([[5, 6, EOS]], "int32")
    with pytest.raises(ValueError, match="beam_size"):
        translate_ids(model, source_ids, beam_size=0)
    with pytest.raises(ValueError, match="alpha"):
        translate_ids(model, source_ids, beam_size=2, alpha=-0.5)
    with pytest.raises(ValueError, match="max_extra_length"):
        translate_ids(model, source_ids, max_extra_length=-1)


@pytest.mark.multibackend
def test_no_search_ends_before_its_first_token():
    """A model that most wants EOS first: greedy and beam search still emit a
    token before it (`decoding.MIN_LENGTH`), which the SavedModel and
    translate.onnx run too, and `min_length=0` gives the empty output back."""
    vocab_size = 6
    table = np.zeros((2, vocab_size), "float32")
    table[0, EOS], table[0, 4] = 5.0, 1.0  # first step: EOS, then token 4
    table[1, EOS] = 5.0  # later steps: EOS

    def tokens_to_logits(token_ids, cache):
        logits = ops.take(ops.convert_to_tensor(table), cache["step"], axis=0)
        return logits, {"step": ops.minimum(cache["step"] + 1, 1)}

    start_ids = ops.convert_to_tensor([BOS, BOS], dtype="int32")
    cache = {"step": ops.zeros((2,), dtype="int32")}
    greedy = ops.convert_to_numpy(
        greedy_search(tokens_to_logits, cache, start_ids, 4, eos_id=EOS, pad_id=PAD)
    )
    np.testing.assert_array_equal(greedy, [[4, EOS, PAD, PAD]] * 2)
    sequences, _ = beam_search(
        tokens_to_logits, cache, start_ids, 4, eos_id=EOS, beam_size=3, pad_id=PAD
    )
    best = ops.convert_to_numpy(sequences)[:, 0]
    np.testing.assert_array_equal(best, [[4, EOS, PAD, PAD]] * 2)
    assert not (ops.convert_to_numpy(sequences)[:, :, 0] == EOS).any()  # no hypothesis is empty
    empty = greedy_search(
        tokens_to_logits, cache, start_ids, 4, eos_id=EOS, pad_id=PAD, min_length=0
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(empty)[:, 0], [EOS, EOS])
    sequences, _ = beam_search(
        tokens_to_logits, cache, start_ids, 4, eos_id=EOS, beam_size=3, pad_id=PAD, min_length=0
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(sequences)[:, 0, 0], [EOS, EOS])


def _contains(row, phrase):
    return any(list(row[i : i + len(phrase)]) == phrase for i in range(len(row) - len(phrase) + 1))


@pytest.mark.multibackend
@pytest.mark.parametrize("seed", range(2))
def test_constrained_beam_holds_its_constraints_whether_rows_leave_or_stay(seed):
    """The one beam loop with positive constraints, on every backend: each output holds
    each of its sentence's constraints where its length limit leaves room, the n-best
    come best first, and finished sentences leaving the loop (`drop_finished`) or
    staying in it (JAX's and XLA's fixed shapes) change no token and no score."""
    rng = np.random.default_rng(seed)
    vocab_size, batch_size, k = 16, 5, 4
    table = rng.normal(size=(vocab_size, vocab_size)).astype("float32") * 3
    table[:, EOS] += 2.0  # the model likes to end early: constraints must hold it back

    def tokens_to_logits(ids, cache):
        return ops.take(table, ids, axis=0), cache

    constraints = rng.integers(4, vocab_size, size=(batch_size, 2, 2)).astype("int32")
    constraints[:, 1, 1] = PAD  # the second constraint is one token
    runs = {}
    for drop in (None, False):  # None: the backend's way (rows leave, but under JAX)
        runs[drop] = [
            ops.convert_to_numpy(x)
            for x in beam_search(
                tokens_to_logits, {"dummy": ops.zeros((batch_size, 1))},
                ops.full((batch_size,), BOS, "int32"), 12, EOS, beam_size=k, pad_id=PAD,
                drop_finished=drop, constraints=constraints,
            )
        ]  # fmt: skip
    np.testing.assert_array_equal(runs[None][0], runs[False][0])
    np.testing.assert_allclose(runs[None][1], runs[False][1], rtol=1e-6)
    sequences, scores = runs[None]
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # best first
    for row, wanted in zip(sequences[:, 0], constraints, strict=True):
        for phrase in wanted:
            phrase = [int(t) for t in phrase if t != PAD]
            assert _contains(list(row), phrase), (row, phrase)
