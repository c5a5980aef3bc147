"""The search that ships, through every export, and CTranslate2's rule beside ours.

The `cpu` preset's training (the default run) records its search in run.json
(`"k_finished"`, patience 2, alpha 1.5) and every export bakes it in;
`export_fixtures.shipped` is the tiny copy-task run with that search and a
tight output limit (0.5 x source + 1), exported once to the SavedModel, ONNX
and CTranslate2 (shared with test_output_limit.py).

- The SavedModel, translate.onnx and translate_int8.onnx against Keras, greedy
  and beam, on 240 sentences of 1 to 31 source pieces in batches that mix
  them, at the recorded limit (which cuts a quarter of the outputs: asserted) and
  at a loose one. Each export drops finished rows from its loop; the Keras
  reference keeps fixed shapes (`drops_finished` off), so dropping equals the
  fixed-shape search through the exports. The sentences tell the settings
  apart: Keras with patience 1 or alpha 0.6 (and, at the loose limit, the
  paper's rule) translates some of them differently, so an export that baked
  any of those would fail.
- CTranslate2 on the same weights: the settings our path passes (pinned), the
  score each side ranks by (the length-penalty form, and whether EOS is barred
  before or after the first softmax), and which outputs differ and why: those
  two everywhere alpha > 0, CTranslate2's early exit at alpha 0 (it ignores
  the patience) and its rounding of K x patience (nearest, ours up).
"""

import functools
import random

import numpy as np
import pytest
from export_fixtures import (
    held_out_sentences,
    loaded_saved_model,
    loaded_work_dir,
    onnx_jobs,
    shipped,
    shipped_search,
    trained,
)

from keras_transformer.search import PAPER, output_limit

pytestmark = pytest.mark.slow

# 240 sentences, every 7th three times over (past the training lengths, up to the
# model's 31 source pieces), run in batches of 60 that mix their lengths.
SENTENCES = [s if i % 7 else " ".join([s] * 3)
             for i, s in enumerate(held_out_sentences(240, seed=29))]  # fmt: skip
_ORDER = random.Random(0).sample(range(len(SENTENCES)), len(SENTENCES))
MIXED = [_ORDER[start : start + 60] for start in range(0, len(_ORDER), 60)]
LOOSE = 50  # max_extra_length: only the 32 positions cut (translate.onnx takes it as an input)
PATHS = ("greedy", "beam", "greedy_loose", "beam_loose")
CHANGED = ("paper_rule", "patience_1", "paper_alpha")  # the shipped beam, one setting changed


def _searches():
    """`{name: SearchConfig}`: the shipped search, greedy and beam, at the recorded limit
    and at the loose one, and the beam with one setting changed (`CHANGED`)."""
    search = shipped_search()
    searches = {}
    for suffix, extra in (("", None), ("_loose", LOOSE)):
        beam = search.replace(max_extra_length=extra)
        searches.update({
            f"greedy{suffix}": beam.replace(beam_size=1),
            f"beam{suffix}": beam,
            f"paper_rule{suffix}": beam.replace(stopping=PAPER.stopping),
            f"patience_1{suffix}": beam.replace(patience=1.0),
            f"paper_alpha{suffix}": beam.replace(alpha=PAPER.alpha),
        })  # fmt: skip
    return searches


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return shipped(tmp_path_factory)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """`(model, tokenizer)` of the shipped run: the shared tiny run's (Keras needs no export)."""
    model, tokenizer, _ = loaded_work_dir(trained(tmp_path_factory))
    return model, tokenizer


@pytest.fixture(scope="module")
def model(loaded):
    return loaded[0]


@pytest.fixture(scope="module")
def tokenizer(loaded):
    return loaded[1]


@pytest.fixture(scope="module")
def keras_side(model, tokenizer):
    """`(source ids, {name: (output ids, texts)})`: the Keras `Translator` under each of
    `_searches()`, with fixed shapes (every row stays in the loop to the end)."""
    from keras_transformer import decoding
    from keras_transformer.translators.keras_translator import Translator

    outputs = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoding.loop, "drops_finished", lambda: False)
        for name, search in _searches().items():
            translator = Translator(model, tokenizer, search=search)
            source_ids = translator.encode(SENTENCES)
            ids = translator.translate_ids(source_ids)
            outputs[name] = (ids, translator.decode(ids))
    return source_ids, outputs


@pytest.fixture(scope="module")
def onnx_side(export):
    """`{"float32_<path>" or "int8_<path>": texts}`: translate.onnx and translate_int8.onnx
    at their defaults (the shipped search), one graph run per batch of `MIXED`."""
    settings = {"greedy": {"beam_size": 1}, "beam": {}}
    jobs = []
    for precision in ("float32", "int8"):
        for path in PATHS:
            kwargs = dict(settings[path.split("_")[0]])
            if path.endswith("_loose"):
                kwargs["max_extra_length"] = LOOSE
            jobs += [{"name": f"{precision}_{path}_{i}", "call": "run", "kwargs": kwargs,
                      "sentences": [SENTENCES[j] for j in batch],
                      "translator": {"precision": precision}}
                     for i, batch in enumerate(MIXED)]  # fmt: skip
    results = onnx_jobs(export[1]["onnx"], jobs)
    assert results["modules"]["value"] == []
    outputs = {}
    for name in {job["name"].rsplit("_", 1)[0] for job in jobs}:
        texts = [None] * len(SENTENCES)
        for i, batch in enumerate(MIXED):
            result = results[f"{name}_{i}"]
            assert "error" not in result, result["error"]
            for j, text in zip(batch, result["value"], strict=True):
                texts[j] = text
        outputs[name] = texts
    return outputs


def _limits(source_ids, search, max_length):
    """Each sentence's output limit (tokens, EOS included): `search.output_limit`."""
    return [min(output_limit(len(ids), search.length_ratio, search.max_extra_length), max_length)
            for ids in source_ids]  # fmt: skip


def _cut(ids, limits, eos_id):
    """Which outputs reached their limit without EOS."""
    return [eos_id not in row[:limit] for row, limit in zip(ids, limits, strict=True)]


def _lengths(ids, pad_id):
    return [sum(t != pad_id for t in row) for row in ids]


def test_the_reference_cuts_rows_mixes_lengths_and_tells_the_settings_apart(keras_side, model):
    """What the export checks below stand on: at the recorded limit a quarter of the
    outputs are cut at it (53 to 60 of 240 seen; none passes it) and the rest end
    before it; outputs run from 2 to 11 tokens there, 2 to 32 at the loose limit; and
    each changed setting translates some sentences differently, so an export that baked
    it fails: alpha 0.6 and patience 1 at both limits (22 and 3 of 240 at the recorded
    one, 41 and 6 at the loose one), the paper's rule at the loose limit (8; at the
    recorded one it finds the same outputs, so there only translate.onnx's loose runs
    tell the rules apart)."""
    source_ids, outputs = keras_side
    config = model.config
    searches = _searches()
    stats, differ = {}, {}
    for path in PATHS:
        ids, _ = outputs[path]
        limits = _limits(source_ids, searches[path], config.max_length)
        lengths = _lengths(ids, config.pad_id)
        cut = _cut(ids, limits, config.eos_id)
        assert all(n <= limit for n, limit in zip(lengths, limits, strict=True))
        assert all(n == limit for n, c, limit in zip(lengths, cut, limits, strict=True) if c)
        stats[path] = (sum(cut), min(lengths), max(lengths), len(set(lengths)))
    for suffix in ("", "_loose"):
        shipped_texts = outputs[f"beam{suffix}"][1]
        for changed in CHANGED:
            differ[changed + suffix] = sum(
                a != b for a, b in zip(outputs[changed + suffix][1], shipped_texts, strict=True)
            )
    print(f"(cut, shortest, longest, lengths) {stats}; outputs unlike the shipped {differ}")
    for path, (cut, shortest, longest, distinct) in stats.items():
        assert path.endswith("_loose") or 40 <= cut <= len(SENTENCES) - 40, (path, cut)
        assert shortest <= 2 and longest >= 10 and distinct >= 6, path
    assert all(count > 0 for name, count in differ.items() if name != "paper_rule"), differ


def test_the_saved_model_searches_as_fixed_shape_keras(export, keras_side):
    """serving_default (beam) and translate_greedy at the recorded limit, whole batches
    of mixed lengths: each the same strings as Keras with fixed shapes."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  the SentencePiece ops the SavedModel holds

    saved = loaded_saved_model(export[1]["saved_model"])
    for path, signature in (("greedy", "translate_greedy"), ("beam", "serving_default")):
        texts = [None] * len(SENTENCES)
        for batch in MIXED:
            result = saved.signatures[signature](
                sentences=tf.constant([SENTENCES[j] for j in batch])
            )
            for j, text in zip(batch, result["translations"].numpy(), strict=True):
                texts[j] = text.decode("utf-8")
        assert texts == keras_side[1][path][1], path


def test_translate_onnx_searches_as_fixed_shape_keras(keras_side, onnx_side):
    """translate.onnx at its defaults (the shipped search) and at a loose limit, greedy
    and beam: the same strings as Keras with fixed shapes, on every sentence."""
    for path in PATHS:
        assert onnx_side[f"float32_{path}"] == keras_side[1][path][1], path


def test_int8_runs_the_shipped_search(export, model, keras_side, onnx_side):
    """translate_int8.onnx is translate.onnx's search on int8 products: its outputs are
    Keras's on most sentences; where the shipped search and a changed setting translate
    differently, it sides with the shipped one; and at the recorded limit no output
    passes its limit, and about as many are cut as Keras cuts."""
    import sentencepiece as spm

    source_ids, outputs = keras_side
    config = model.config
    processor = spm.SentencePieceProcessor(model_file=f"{export[1]['onnx']}/vocab.model")
    limits = _limits(source_ids, shipped_search(), config.max_length)
    for path in PATHS:
        int8, expected = onnx_side[f"int8_{path}"], outputs[path][1]
        same = sum(a == b for a, b in zip(int8, expected, strict=True))
        print(f"int8 {path}: {same} of {len(expected)} as Keras")
        assert same >= 0.8 * len(expected), (path, same)
        if not path.endswith("_loose"):
            pieces = [len(processor.encode(text)) for text in int8]
            assert all(n <= limit for n, limit in zip(pieces, limits, strict=True))
            cut = sum(n >= limit for n, limit in zip(pieces, limits, strict=True))
            expected_cut = sum(_cut(outputs[path][0], limits, config.eos_id))
            assert abs(cut - expected_cut) <= 0.1 * len(expected), (cut, expected_cut)
    sides = {}  # where a changed setting translates unlike the shipped search
    for suffix in ("", "_loose"):
        int8, shipped_texts = onnx_side[f"int8_beam{suffix}"], outputs[f"beam{suffix}"][1]
        for changed in CHANGED:
            other = outputs[changed + suffix][1]
            rows = [i for i in range(len(SENTENCES)) if other[i] != shipped_texts[i]]
            sides[changed + suffix] = (
                sum(int8[i] == shipped_texts[i] for i in rows),
                sum(int8[i] == other[i] for i in rows),
            )
    print(f"int8 where a changed setting differs: (as shipped, as changed) {sides}")
    # Sides with the shipped search wherever a setting changes enough outputs to tell.
    assert all(ours > theirs for ours, theirs in sides.values() if ours + theirs >= 5), sides
    assert sum(s[0] for s in sides.values()) > 2 * sum(s[1] for s in sides.values()), sides


# ------------------------------------------------------------ CTranslate2 beside ours


@pytest.fixture(scope="module")
def ct2(export):
    from keras_transformer import CTranslate2Translator

    return CTranslate2Translator.load(export[1]["ctranslate2"])


@pytest.fixture
def keras_rules(model, tokenizer):
    """`{name: output ids}`: Keras at the loose limit with the settings where
    CTranslate2's rule and ours part (`test_where_ctranslate2_and_ours_differ_and_why`)."""
    from keras_transformer.translators.keras_translator import Translator

    loose = shipped_search().replace(max_extra_length=LOOSE)
    searches = {
        "alpha_0_to_the_limit": loose.replace(alpha=0.0, patience=100.0),  # never 400 ends
        "alpha_0_one_end": loose.replace(alpha=0.0, patience=0.25),
        **{f"patience_{p}": loose.replace(patience=p) for p in (0.25, 0.3, 0.5)},
    }
    outputs = {}
    for name, search in searches.items():
        translator = Translator(model, tokenizer, search=search)
        outputs[name] = translator.translate_ids(translator.encode(SENTENCES))
    return outputs


def _ended(ids, eos_id, pad_id):
    """Output ids -> the tokens of each output, through EOS where it ended."""
    return [row[: row.index(eos_id) + 1] if eos_id in row else [t for t in row if t != pad_id]
            for row in ids]  # fmt: skip


def _ct2_outputs(ct2, sources, limits, eos_id, **search):
    """CTranslate2's best outputs as ids, through EOS where it ended (before its limit)."""
    outputs = ct2.translate_pieces(sources, **search)
    return [[ct2.processor.piece_to_id(p) for p in pieces] + [eos_id] * (len(pieces) < limit)
            for pieces, limit in zip(outputs, limits, strict=True)]  # fmt: skip


def _log_probs(model, pairs, first_eos_barred):
    """log P(output | source) of each `(source ids, output ids)` pair (the output through
    EOS where it ended), teacher-forced: PAD and BOS barred from every softmax (both
    searches bar them); EOS barred from the first step's softmax too where
    `first_eos_barred` (CTranslate2's `min_decoding_length`; the package's search bars it
    after the softmax, so its log-probabilities keep the first step's EOS mass)."""
    import keras

    config = model.config
    totals = []
    for start in range(0, len(pairs), 128):
        chunk = pairs[start : start + 128]
        sources = np.full((len(chunk), max(len(s) for s, _ in chunk)), config.pad_id, "int32")
        targets = np.full((len(chunk), max(len(o) for _, o in chunk)), config.pad_id, "int32")
        for row, (source, output) in enumerate(chunk):
            sources[row, : len(source)] = source
            targets[row, : len(output)] = [config.bos_id] + list(output[:-1])
        logits = keras.ops.convert_to_numpy(model({"source_ids": sources, "target_ids": targets}))
        logits = logits.astype("float64")  # (B, T, V)
        logits[:, :, [config.pad_id, config.bos_id]] = -np.inf
        if first_eos_barred:
            logits[:, 0, config.eos_id] = -np.inf
        top = logits.max(axis=-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
        totals += [sum(log_probs[row, t, token] for t, token in enumerate(output))
                   for row, (_, output) in enumerate(chunk)]  # fmt: skip
    return np.array(totals)


def _ours(raw, length, alpha):
    """The package's score: log P / ((5 + L) / 6) ** alpha (`decoding.length_penalty`)."""
    return raw / ((5.0 + np.asarray(length)) / 6.0) ** alpha


def _theirs(raw, length, alpha):
    """CTranslate2's score: log P / L ** alpha (`finalize_hypothesis_score`)."""
    return raw / np.asarray(length, dtype="float64") ** alpha


class _Recording:
    """Stands in for a `ctranslate2.Translator`: records each `translate_batch` call."""

    def __init__(self, translator):
        self.translator, self.calls = translator, []

    def translate_batch(self, sources, **settings):
        self.calls.append(([list(s) for s in sources], dict(settings)))
        return self.translator.translate_batch(sources, **settings)


def test_our_ctranslate2_path_passes_the_shipped_settings(export, model):
    """What `CTranslate2Translator` asks CTranslate2 for, call by call, is the export's
    search in CTranslate2's words, and nothing else: a setting added, dropped or changed
    (the patience, the alpha, the length limits, EOS barred first, PAD and BOS
    suppressed, no source truncation) fails here, beam and greedy."""
    from keras_transformer import CTranslate2Translator

    translator = CTranslate2Translator.load(export[1]["ctranslate2"])
    search = shipped_search()
    assert translator.search == search  # the export's record, read back
    config = model.config
    piece = translator.processor.id_to_piece
    expected = {
        "beam_size": search.beam_size,
        "length_penalty": search.alpha,  # the exponent: CTranslate2 divides by length ** alpha
        "patience": search.patience,
        "min_decoding_length": 1,  # decoding.MIN_LENGTH
        "suppress_sequences": [[piece(config.pad_id)], [piece(config.bos_id)]],
        "max_input_length": 0,  # the front end cuts sources, CTranslate2 does not
    }
    recording = _Recording(translator.translator)
    translator.translator = recording
    for beam_size in (search.beam_size, 1):
        recording.calls.clear()
        translator.translate(SENTENCES, beam_size=beam_size)
        assert sum(len(sources) for sources, _ in recording.calls) == len(SENTENCES)
        for sources, settings in recording.calls:
            limits = set(_limits(sources, search, config.max_length))
            # Beam: one call per limit, so an output never depends on its batch; greedy:
            # the batch's longest limit, each output cut to its own.
            assert settings.pop("max_decoding_length") == max(limits)
            assert beam_size == 1 or len(limits) == 1
            assert settings == dict(expected, beam_size=beam_size)


def test_each_side_scores_by_its_own_length_penalty(model, tokenizer, ct2, keras_side):
    """The 4 best hypotheses of each sentence on each side, at the shipped alpha and
    the loose limit, rescored by one teacher-forced pass. Both count L, an output's
    tokens, with EOS where it ended. The package's score is log P / ((5 + L) / 6) **
    alpha, with EOS barred from the first step after its softmax (log P keeps that EOS
    mass); CTranslate2's is log P / L ** alpha, with EOS barred before the first softmax
    (`min_decoding_length`: log P a few hundredths higher, alike on every hypothesis of
    a sentence). Neither side fits the other's form or the other's first step."""
    from keras_transformer.translators.keras_translator import Translator

    config = model.config
    search = shipped_search().replace(max_extra_length=LOOSE)
    source_ids = keras_side[0]
    translator = Translator(model, tokenizer, search=search)
    ours = translator.translate_n_best(source_ids, search.beam_size)
    sources = ct2.encode(SENTENCES)
    limits = _limits(source_ids, search, config.max_length)
    theirs = ct2.translate_pieces(sources, **search.to_dict(), num_hypotheses=search.beam_size)
    scored = {"ours": ([], []), "theirs": ([], [])}  # (source, output) pairs, scores
    for i, ((ids, scores), (pieces, ct2_scores)) in enumerate(zip(ours, theirs, strict=True)):
        for output, score in zip(_ended(ids, config.eos_id, config.pad_id), scores, strict=True):
            if score > -1e6:  # a slot that no hypothesis filled
                scored["ours"][0].append((source_ids[i], output))
                scored["ours"][1].append(score)
        for hypothesis, score in zip(pieces, ct2_scores, strict=True):
            output = [ct2.processor.piece_to_id(p) for p in hypothesis]
            scored["theirs"][0].append((source_ids[i], output + [config.eos_id] *
                                        (len(hypothesis) < limits[i])))  # fmt: skip
            scored["theirs"][1].append(score)
    for side, barred, form, other in (("ours", False, _ours, _theirs),
                                      ("theirs", True, _theirs, _ours)):  # fmt: skip
        pairs, scores = scored[side]
        lengths = np.array([len(output) for _, output in pairs])
        raw = _log_probs(model, pairs, first_eos_barred=barred)
        np.testing.assert_allclose(scores, form(raw, lengths, search.alpha), rtol=1e-4, atol=1e-4)
        assert np.max(np.abs(scores - other(raw, lengths, search.alpha))) > 0.1, side
        raw = _log_probs(model, pairs, first_eos_barred=not barred)
        assert np.max(np.abs(scores - form(raw, lengths, search.alpha))) > 1e-3, side


def test_where_ctranslate2_and_ours_differ_and_why(model, ct2, keras_side, keras_rules):
    """On the same weights and sentences, at the loose limit:

    - the shipped settings (alpha 1.5; 4 x 2 = 8 ends, rounded or not): both searches
      keep the same beam (the K best by log P, an end counting among the K best
      continuations of its step) and stop at the same step, so an output differs
      only where the two scores (`test_each_side_scores_by_its_own_length_penalty`)
      rank the same finished hypotheses differently: each side's output is its own
      score's better of the two, most of them by the length-penalty form alone;
    - alpha 0: CTranslate2 stops a sentence once its best continuation ends
      (`allow_early_exit`), whatever the patience; nothing scores higher after that,
      so ours run to the limit gives the same outputs, and ours stopped at its first
      counted end (patience 1/4) gives some of lower log P;
    - patience 0.3: 4 x 0.3 = 1.2 ends, which CTranslate2 rounds to 1 (as 0.25) and
      the package up to 2 (as 0.5); 0.25 and 0.5 give different outputs on each side.
    """
    config = model.config
    eos, pad = config.eos_id, config.pad_id
    source_ids = keras_side[0]
    sources = ct2.encode(SENTENCES)
    assert [[ct2.processor.piece_to_id(p) for p in s] for s in sources] == source_ids
    search = shipped_search().replace(max_extra_length=LOOSE)
    limits = _limits(source_ids, search, config.max_length)

    @functools.cache  # each setting searched once
    def theirs(alpha, patience):
        return _ct2_outputs(ct2, sources, limits, eos, **search.replace(alpha=alpha,
                                                                    patience=patience).to_dict())  # fmt: skip

    def ours(name):
        return _ended(keras_rules[name], eos, pad)

    # The shipped settings: the two scores.
    alpha = search.alpha
    shipped_ours = _ended(keras_side[1]["beam_loose"][0], eos, pad)
    shipped_theirs = theirs(alpha, search.patience)
    differ = [
        i for i, (a, b) in enumerate(zip(shipped_ours, shipped_theirs, strict=True)) if a != b
    ]
    pairs = [(source_ids[i], shipped_ours[i]) for i in differ]
    pairs += [(source_ids[i], shipped_theirs[i]) for i in differ]
    lengths = np.array([len(output) for _, output in pairs])
    n = len(differ)
    ours_raw = _log_probs(model, pairs, first_eos_barred=False)
    their_raw = _log_probs(model, pairs, first_eos_barred=True)
    ours_scores = _ours(ours_raw, lengths, alpha)
    their_scores = _theirs(their_raw, lengths, alpha)
    assert np.all(ours_scores[:n] >= ours_scores[n:] - 1e-4)  # ours: our rule's better
    assert np.all(their_scores[n:] >= their_scores[:n] - 1e-4)  # theirs: theirs
    by_form = np.sum(_theirs(ours_raw[n:], lengths[n:], alpha) > _theirs(ours_raw[:n], lengths[:n],
                                                                        alpha))  # fmt: skip
    print(
        f"shipped settings: {n} of {len(SENTENCES)} outputs differ, {by_form} of them by the "
        "length-penalty form alone"
    )
    assert n > 0 and by_form > n / 2

    # alpha 0: CTranslate2's early exit.
    at_0 = theirs(0.0, 0.25)
    assert at_0 == theirs(0.0, search.patience)  # the patience is ignored
    assert theirs(alpha, 0.25) != shipped_theirs  # at alpha 1.5 it is not
    assert ours("alpha_0_to_the_limit") == at_0
    eager = ours("alpha_0_one_end")
    differ = [i for i, (a, b) in enumerate(zip(eager, at_0, strict=True)) if a != b]
    raw = _log_probs(model, [(source_ids[i], eager[i]) for i in differ]
                     + [(source_ids[i], at_0[i]) for i in differ], first_eos_barred=False)  # fmt: skip
    print(f"alpha 0: ours stopped at its first end differs on {len(differ)}")
    assert differ and np.all(raw[len(differ) :] > raw[: len(differ)])

    # Patience 0.3: rounded to the nearest (CTranslate2) or up (the package).
    assert theirs(alpha, 0.3) == theirs(alpha, 0.25) != theirs(alpha, 0.5)
    assert ours("patience_0.3") == ours("patience_0.5") != ours("patience_0.25")
