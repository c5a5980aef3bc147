"""Decoding for data work: sampling (back-translation) and a forced target prefix.

Sampling draws from the model's distribution with counter-based random
numbers (`sampling.uniform`): the draws follow the softmax, a seed gives the
same outputs in any batch, no seed gives new ones. A forced prefix starts
every output, through greedy search, beam search (n-best included) and
sampling. The model is the tiny copy-task fixture (`export_fixtures`), whose
greedy outputs are its inputs, so "not trivial" is checkable.
"""

import keras
import numpy as np
import pytest
from export_fixtures import held_out_sentences, trained

from keras_transformer.sampling import sampler, uniform
from keras_transformer.translators.keras_translator import Translator

pytestmark = pytest.mark.multibackend


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return trained(tmp_path_factory)


def _draws(logits, temperature=1.0, top_k=0, count=6000):
    """`count` draws of `sampler` from one row of `logits`, one seed each."""
    rows = np.tile(np.asarray(logits, "float32")[None], (count, 1))
    choose = sampler(np.arange(count, dtype="int32"), temperature, top_k)
    ids = choose(keras.ops.convert_to_tensor(rows), 0, np.arange(count, dtype="int32"))
    return np.bincount(keras.ops.convert_to_numpy(ids), minlength=len(logits)) / count


def _close(frequencies, probabilities, count=6000):
    sigma = np.sqrt(np.asarray(probabilities) * (1 - np.asarray(probabilities)) / count)
    assert np.all(np.abs(frequencies - probabilities) <= 4 * sigma + 1e-9), (
        frequencies,
        probabilities,
    )


def test_draws_follow_the_softmax_with_temperature_and_top_k():
    probabilities = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probabilities)
    _close(_draws(logits), probabilities)
    sharpened = probabilities**2 / np.sum(probabilities**2)  # temperature 0.5
    _close(_draws(logits, temperature=0.5), sharpened)
    top_two = np.array([0.5, 0.3, 0, 0]) / 0.8
    _close(_draws(logits, top_k=2), top_two)
    # The uniform numbers: in (0, 1), new at every step, uncorrelated across seeds.
    u = keras.ops.convert_to_numpy(uniform(np.arange(20000, dtype="int32"), 3))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.03
    v = keras.ops.convert_to_numpy(uniform(np.arange(20000, dtype="int32"), 4))
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.03


def test_sampling_is_reproducible_with_a_seed_in_any_batch_and_differs_without_one(work_dir):
    sentences = held_out_sentences(24, seed=11)
    small = Translator.load(work_dir, batch_size=3)
    large = Translator.load(work_dir, batch_size=16)
    drawn = small.translate(sentences, sampling_topk=0, seed=5)
    assert drawn == large.translate(sentences, sampling_topk=0, seed=5)  # other batches
    greedy = Translator.load(work_dir, beam_size=1).translate(sentences)
    assert sum(d != g for d, g in zip(drawn, greedy, strict=True)) >= 4  # it does sample
    assert drawn != small.translate(sentences, sampling_topk=0, seed=6)
    assert drawn != small.translate(sentences, sampling_topk=0)  # no seed: a new draw
    # A temperature near 0 takes the most likely token: greedy search's outputs.
    cold = small.translate(sentences, sampling_topk=0, sampling_temperature=1e-4, seed=5)
    assert cold == greedy
    assert sum(len(g.split()) > 1 for g in greedy) > len(greedy) // 2  # not trivial outputs
    with pytest.raises(ValueError, match="one output per sentence"):
        small.translate(sentences, sampling_topk=0, num_hypotheses=2)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        small.translate(sentences, sampling_topk=0, sampling_temperature=0.0)


def test_a_forced_prefix_starts_every_output_of_every_search(work_dir):
    sentences = held_out_sentences(12, seed=12)
    greedy = Translator.load(work_dir, beam_size=1)
    beam = Translator.load(work_dir, beam_size=4)
    prefix = "zebra licht"
    for outputs in (
        greedy.translate(sentences, target_prefix=prefix),
        beam.translate(sentences, target_prefix=prefix),
        greedy.translate(sentences, target_prefix=prefix, sampling_topk=5, seed=1),
    ):
        assert all(o.startswith(prefix) for o in outputs), outputs
    n_best = beam.translate(sentences, target_prefix=prefix, num_hypotheses=3, return_scores=True)
    for hypotheses in n_best:
        assert all(text.startswith(prefix) for text, _ in hypotheses)
        scores = [score for _, score in hypotheses]
        assert scores == sorted(scores, reverse=True)
    # Forcing the start of a greedy or sampled output gives that output back: the
    # forced steps leave the cache as the free ones do, and a draw depends on its
    # seed and step alone. (Not so for beam search: forcing gives all K beams to
    # continuations of the prefix, which may find a better one than the free beam.)
    # An output holding U+FFFD (byte pieces that decode to no character, which a draw
    # can pick) has no text that encodes back to its pieces: it is forced nothing.
    for settings in ({}, {"sampling_topk": 0, "seed": 3}):
        free = greedy.translate(sentences, **settings)
        first_words = [
            "" if "\ufffd" in text else " ".join(text.split()[:2]) for text in free
        ]
        assert sum(bool(words) for words in first_words) >= 9, free
        assert greedy.translate(sentences, target_prefix=first_words, **settings) == free
    # One prefix per sentence; "" forces nothing.
    mixed = greedy.translate(sentences[:2], target_prefix=["baum", ""])
    assert mixed[0].startswith("baum") and mixed[1] == greedy.translate(sentences[1:2])[0]
    with pytest.raises(ValueError, match="target_prefix has 1 entries for 2 sentences"):
        greedy.translate(sentences[:2], target_prefix=["baum"])


def test_the_translate_command_samples_and_forces_prefixes(work_dir, tmp_path, capsys):
    from keras_transformer import translate

    sentences = held_out_sentences(6, seed=13)
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    (tmp_path / "prefix.txt").write_text("baum\n\nkatze\nhaus\n\nbuch\n")
    args = ["--work-dir", work_dir, "--input", str(tmp_path / "in.txt"), "--beam-size", "1"]
    translator = Translator.load(work_dir, beam_size=1)
    cases = [
        (["--sampling-topk", "0", "--seed", "4"], dict(sampling_topk=0, seed=4)),
        (["--target-prefix", "licht"], dict(target_prefix="licht")),
        (
            ["--target-prefix-file", str(tmp_path / "prefix.txt")],
            dict(target_prefix=["baum", "", "katze", "haus", "", "buch"]),
        ),
    ]
    for flags, options in cases:
        assert translate.main(args + flags) == 0
        assert capsys.readouterr().out.splitlines() == translator.translate(sentences, **options)
    (tmp_path / "short.txt").write_text("baum\n")
    with pytest.raises(SystemExit):
        translate.main(args + ["--target-prefix-file", str(tmp_path / "short.txt")])
    assert "has 1 lines for 6 input lines" in capsys.readouterr().err
