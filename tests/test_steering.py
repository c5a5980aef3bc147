"""Steering a translation: banned words, positive constraints, and the exports' steering inputs.

Keras: a banned piece sequence never appears in an output, and the outputs
change no more than the ban needs (greedy search: only from a banned token
on); every output of the constrained beam search holds its constraints.
Exports: the SavedModel's `translate_steered` signature and
translate_steered.onnx's optional inputs give `Translator`'s outputs for a
forced prefix, banned words and sampling with the same seeds, and
OnnxTranslator without them gives translate.onnx's outputs; CTranslate2's own
options give its greedy search `Translator`'s outputs. The model is the tiny copy-task fixture (`export_fixtures`),
whose outputs repeat its inputs' words, so a banned input word is a ban the
search has to work around.

The Keras tests' mutations are planted here (monkeypatched, the check
asserted to fail): banned sequences left-aligned, and the constrained search
without its end rule and its missing-constraint penalty.
"""

import keras
import numpy as np
import pytest
from export_fixtures import (
    exported,
    held_out_sentences,
    loaded_saved_model,
    onnx_jobs,
    trained,
)

from keras_transformer import sampling
from keras_transformer.serving import frontend
from keras_transformer.translators.keras_translator import Translator


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)


@pytest.fixture(scope="module")
def sentences():
    # Blank and over-long sentences ride along: steering must not change their rules.
    return held_out_sentences(40, seed=21) + ["", "   "]


@pytest.fixture(scope="module")
def translators(tmp_path_factory):
    work_dir = trained(tmp_path_factory)  # the exported work dir, without waiting for the export
    return {
        "beam": Translator.load(work_dir, batch_size=16),
        "greedy": Translator.load(work_dir, beam_size=1, batch_size=16),
    }


def _ids(translator, texts):
    """Piece ids of `texts`, as `Translator` tokenizes a prefix or a banned word."""
    return [list(ids) for ids in translator._phrase_ids(list(texts), 1, "banned")[0]]


def _holds(output_ids, sequence):
    n = len(sequence)
    return any(output_ids[i : i + n] == sequence for i in range(len(output_ids) - n + 1))


def _output_ids(translator, texts):
    """Translations of `texts` tokenized again: their pieces, as the search wrote them
    (the copy task's outputs are pieces SentencePiece would give)."""
    return [_ids(translator, [t])[0] if t.strip() else [] for t in texts]


# The words the copy task's outputs hold most: banning one changes many outputs.
BANNED = ["haus", "katze baum", "hund"]


def test_a_banned_word_never_appears_and_the_rest_changes_as_little_as_the_search_allows(
    translators, sentences
):
    """Mutation: the banned sequences left-aligned (`test_the_ban_mutation_is_caught`)."""
    greedy, beam = translators["greedy"], translators["beam"]
    banned_ids = _ids(greedy, BANNED)
    assert any(len(ids) > 1 for ids in banned_ids)  # a sequence, not only single pieces
    for translator in (greedy, beam):
        free = translator.translate(sentences)
        held = [any(_holds(o, b) for b in banned_ids) for o in _output_ids(translator, free)]
        assert sum(held) >= 5, free  # the ban has work to do
        steered = translator.translate(sentences, banned=BANNED)
        for ids in _output_ids(translator, steered):
            assert not any(_holds(ids, b) for b in banned_ids), (ids, banned_ids)
        unchanged = [s == f for s, f, h in zip(steered, free, held, strict=True) if not h]
        if translator is greedy:
            # Greedy search changes an output only from its first banned token on.
            assert all(unchanged)
        else:  # the beam has slots freed by the ban: a few outputs may improve
            assert sum(unchanged) >= 0.8 * len(unchanged), (sum(unchanged), len(unchanged))
    # One list per sentence; "" and blank entries ban nothing.
    per_sentence = [["haus"] if i % 2 else ["", " "] for i in range(len(sentences))]
    mixed = greedy.translate(sentences, banned=per_sentence)
    free = greedy.translate(sentences)
    haus = _ids(greedy, ["haus"])[0]
    for i, ids in enumerate(_output_ids(greedy, mixed)):
        assert not (i % 2 and _holds(ids, haus))
        assert i % 2 or mixed[i] == free[i]
    with pytest.raises(ValueError, match="banned has 1 entries for 42 sentences"):
        greedy.translate(sentences, banned=[["haus"]])
    with pytest.raises(TypeError, match="banned takes a list"):
        greedy.translate(sentences, banned="haus")


def test_the_ban_mutation_is_caught(translators, sentences, monkeypatch):
    """Banned sequences left-aligned (`right_aligned` skipped, the mutation of the test
    above): the last column is then padding for the shorter ones, and the words appear."""
    monkeypatch.setattr(sampling, "right_aligned", lambda ids, pad_id=0: keras.ops.cast(
        ids, "int32"))  # fmt: skip
    greedy = translators["greedy"]
    fresh = Translator(greedy.model, greedy.tokenizer, beam_size=1)
    banned_ids = _ids(greedy, BANNED)
    outputs = _output_ids(fresh, fresh.translate(sentences, banned=BANNED))
    assert any(_holds(ids, b) for ids in outputs for b in banned_ids)


def test_positive_constraints_are_in_every_output_of_the_constrained_search(translators, sentences):
    """Dynamic beam allocation: each output holds each constraint's pieces, where its
    length limit leaves room. Mutation: `test_the_constraint_mutation_is_caught`."""
    for name, translator in translators.items():
        for constraints in (["garten"], ["fluss", "licht nacht"]):
            wanted = _ids(translator, constraints)
            outputs = translator.translate(sentences, constraints=constraints)
            for sentence, ids in zip(sentences, _output_ids(translator, outputs), strict=True):
                if sentence.strip():
                    assert all(_holds(ids, w) for w in wanted), (name, sentence, ids, wanted)
    # Per sentence, with n-best: every hypothesis holds its sentence's constraint.
    beam = translators["beam"]
    words = ["stadt" if i % 2 else "see" for i in range(len(sentences))]
    n_best = beam.translate(sentences, constraints=[[w] for w in words], num_hypotheses=2)
    for sentence, word, hypotheses in zip(sentences, words, n_best, strict=True):
        if sentence.strip():
            for text in hypotheses:
                assert _holds(_output_ids(beam, [text])[0], _ids(beam, [word])[0]), text
    with pytest.raises(ValueError, match="Positive constraints need a search"):
        beam.translate(sentences, constraints=["see"], sampling_topk=0)


def test_the_constraint_mutation_is_caught(translators, sentences, monkeypatch):
    """An output allowed to end before it holds its constraints and ranked by its
    score alone (`_end_when_complete` skipped, `MISSING_PENALTY` 0): outputs miss
    their constraints, so the check above fails (10 of 40 hold it here). Each of the
    search's three rules (the banks, EOS barred until complete, the penalty at the
    limit) alone carried this fixture's constraints: removing one was not caught."""
    from keras_transformer.decoding import constrained

    monkeypatch.setattr(constrained.Constraints, "end_when_complete",
                        staticmethod(lambda logits, *_: logits))  # fmt: skip
    monkeypatch.setattr(constrained, "MISSING_PENALTY", 0.0)
    beam = translators["beam"]
    fresh = Translator(beam.model, beam.tokenizer, beam_size=4)
    wanted = _ids(beam, ["garten"])[0]
    outputs = _output_ids(fresh, fresh.translate(sentences, constraints=["garten"]))
    assert not all(_holds(ids, wanted) for s, ids in zip(sentences, outputs, strict=True)
                   if s.strip())  # fmt: skip


def _cases(count):
    """Steering settings (`Translator.translate`'s arguments) the exports must follow."""
    prefixes = ["zebra licht" if i % 3 else ("" if i % 2 else "baum") for i in range(count)]
    per_sentence = [["haus", "katze baum"] if i % 2 else ["hund"] for i in range(count)]
    return {
        "prefix_beam": dict(target_prefix=prefixes),
        "banned_beam": dict(banned=per_sentence),
        "prefix_and_banned_greedy": dict(target_prefix="licht", banned=BANNED, beam_size=1),
        "sampling_all": dict(sampling_topk=0, seed=5),
        "sampling_top3_cold": dict(
            sampling_topk=3, sampling_temperature=0.7, seed=9, banned=BANNED, target_prefix=prefixes
        ),  # fmt: skip
    }


def _keras(translators, sentences, settings):
    settings = dict(settings)
    name = "greedy" if settings.pop("beam_size", 4) == 1 else "beam"
    return translators[name].translate(sentences, **settings)


def _saved_model(loaded, sentences, settings):
    """`translate_steered` with `settings` as its inputs (what a TF Serving client sends)."""
    import tensorflow as tf

    count = len(sentences)
    prefixes = frontend.per_sentence(settings.get("target_prefix"), count, "target_prefix")
    banned = frontend.per_sentence(settings.get("banned"), count, "banned") or [[]] * count
    width = max(len(row) for row in banned)
    banned = [row + [""] * (width - len(row)) for row in banned]
    topk = settings.get("sampling_topk", 1)
    seeds = frontend.steering_seeds(settings.get("seed", 0), count)
    out = loaded.signatures["translate_steered"](
        sentences=tf.constant(sentences, tf.string),
        target_prefix=tf.constant(prefixes or [""] * count, tf.string),
        banned=tf.reshape(tf.constant(banned, tf.string), [count, width]),
        seeds=tf.constant(seeds, tf.int32),
        sampling_topk=tf.constant(topk, tf.int32),
        sampling_temperature=tf.constant(settings.get("sampling_temperature", 1.0), tf.float32),
    )["translations"]
    return [t.decode("utf-8") for t in out.numpy()]


def test_the_saved_models_steered_signature_gives_translators_outputs(
    export, translators, sentences
):
    """Each case (`_cases`) against `Translator` with the same seeds; steering nothing,
    the signature gives serving_default's outputs."""
    import tensorflow_text  # noqa: F401, the SentencePiece ops of the SavedModel

    loaded = loaded_saved_model(export[1]["saved_model"])
    for name, settings in _cases(len(sentences)).items():
        if settings.get("beam_size") == 1:
            continue  # the signature's search is the export's beam; greedy: the ONNX test
        expected = _keras(translators, sentences, settings)
        assert _saved_model(loaded, sentences, settings) == expected, name
    # Steering nothing, the signature gives serving_default's outputs.
    import tensorflow as tf

    plain = loaded.signatures["serving_default"](sentences=tf.constant(sentences))
    plain = [t.decode("utf-8") for t in plain["translations"].numpy()]
    assert _saved_model(loaded, sentences, {}) == plain


def test_translate_steered_onnx_takes_the_steering_as_optional_inputs(
    export, translators, sentences
):
    """`OnnxTranslator` feeds translate_steered.onnx's optional inputs: `Translator`'s outputs;
    left out, OnnxTranslator runs translate.onnx, with its text-only outputs."""
    cases = _cases(len(sentences))
    jobs = [{"name": name, "call": "translate", "sentences": sentences, "kwargs": settings}
            for name, settings in cases.items()]  # fmt: skip
    jobs.append({"name": "plain", "call": "translate", "sentences": sentences})
    # A client in another language: one run with some inputs left out.
    seeds = frontend.steering_seeds(4, 3).tolist()
    jobs.append({"name": "run", "call": "run", "sentences": sentences[:3],
                 "kwargs": {"seeds": seeds, "sampling_topk": 0}})  # fmt: skip
    results = onnx_jobs(export[1]["onnx"], jobs)
    assert results["modules"]["value"] == []
    for name, settings in cases.items():
        assert results[name] == {"value": _keras(translators, sentences, settings)}, name
    assert results["plain"] == {"value": translators["beam"].translate(sentences)}
    expected = translators["greedy"].translate(sentences[:3], sampling_topk=0, seed=seeds)
    assert results["run"] == {"value": expected}


def test_steering_seeds_are_translators_seeds():
    """A list of seeds is used as it is; an int gives the seeds `Translator` always drew."""
    drawn = np.random.default_rng(5).integers(0, 2**31 - 1, 4)
    assert frontend.steering_seeds(5, 4).tolist() == drawn.tolist()
    assert frontend.steering_seeds([1, 2], 2).tolist() == [1, 2]
    with pytest.raises(ValueError, match="one per sentence"):
        frontend.steering_seeds([1, 2], 3)


def test_ctranslate2_maps_the_steering_onto_its_own_options(export, translators, sentences):
    """`target_prefix` and `banned` become CTranslate2's `target_prefix` and
    `suppress_sequences`: its greedy search, the package's exactly, gives
    `Translator`'s outputs with a prefix; no output holds a banned word's
    pieces; its sampling draws are its own."""
    pytest.importorskip("ctranslate2")
    from keras_transformer.translators.ctranslate2_translator import CTranslate2Translator

    translator = CTranslate2Translator(export[1]["ctranslate2"], beam_size=1, batch_size=16)
    greedy = translators["greedy"]
    prefixes = _cases(len(sentences))["prefix_beam"]["target_prefix"]
    assert translator.translate(sentences, target_prefix=prefixes) == greedy.translate(
        sentences, target_prefix=prefixes
    )
    banned_ids = _ids(greedy, BANNED)
    for ids in _output_ids(greedy, translator.translate(sentences, banned=BANNED)):
        assert not any(_holds(ids, b) for b in banned_ids), ids
    # Its sampling draws; a seed did not make two calls draw alike (CTranslate2's
    # generator), so only that it samples is checked.
    assert translator.translate(sentences, sampling_topk=0, seed=3) != translator.translate(
        sentences
    )
