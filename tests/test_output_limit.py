"""The output limit `ceil(length_ratio x source tokens) + max_extra_length`: fitted on a
corpus by `train.py`, recorded in run.json and the same on every path.

`search.output_limit` is the formula, `decoding.output_limits` its tensor
form (the Keras search, the SavedModel and translate.onnx), and
`CTranslate2Translator` computes it per sentence; a work directory whose
run.json records a ratio and a slack exports them to every format, and each
path then cuts the same outputs at the same lengths.
"""

import math
import os

import numpy as np
import pytest
from export_fixtures import held_out_sentences, onnx_jobs, shipped
from keras import ops

from keras_transformer.search import (
    LIMIT_COVERAGE,
    MIN_EXTRA_LENGTH,
    SearchConfig,
    fit_output_limit,
    output_limit,
)


def test_the_fitted_limit_holds_its_share_of_pairs_with_the_smallest_mean_limit():
    rng = np.random.default_rng(0)
    source = rng.integers(2, 40, 20_000)
    doubled = 2 * source + rng.integers(0, 3, len(source))  # a language twice as long
    ratio, extra = fit_output_limit(source, doubled)
    assert (ratio, extra) == (2.0, MIN_EXTRA_LENGTH)
    limits = np.array([output_limit(s, ratio, extra) for s in source])
    assert np.mean(doubled <= limits) >= LIMIT_COVERAGE
    # At ratio 1 the same coverage needs a slack of ~40: a larger mean limit, not chosen.
    one = np.array([output_limit(s, 1.0, 0) for s in source])
    assert np.quantile(doubled - one, LIMIT_COVERAGE) > 30
    same = source + 1  # a language as long as the source: ratio 1 and the minimum slack
    assert fit_output_limit(source, same) == (1.0, MIN_EXTRA_LENGTH)
    with pytest.raises(ValueError, match="as many output lengths"):
        fit_output_limit([1, 2], [3])


def test_search_config_checks_the_ratio():
    assert SearchConfig(length_ratio=1.5).length_ratio == 1.5
    with pytest.raises(ValueError, match="length_ratio must be a number > 0"):
        SearchConfig(length_ratio=0)


@pytest.mark.multibackend
@pytest.mark.parametrize("ratio", [1.0, 1.25, 1.5, 3.0])
def test_the_tensor_limits_are_the_formula(ratio):
    from keras_transformer.decoding import output_limits

    lengths = [1, 2, 3, 7, 10, 13]
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype="int32")
    for row, n in enumerate(lengths):
        ids[row, :n] = 5
    buffer, limits = output_limits(ids, 4, max_length=64, pad_id=0, length_ratio=ratio)
    expected = [min(output_limit(n, ratio, 4), 64) for n in lengths]
    assert ops.convert_to_numpy(limits).tolist() == expected
    assert int(buffer) == min(math.ceil(ratio * width - 1e-6) + 4, 64)


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """The shared tiny run with a tight recorded limit (0.5 x source + 1) and the `cpu`
    preset's search, exported (`export_fixtures.shipped`, shared with
    test_shipped_search.py)."""
    return shipped(tmp_path_factory)


def test_a_recorded_limit_cuts_the_same_outputs_on_every_path(limited):
    """Greedy on Keras, the SavedModel, translate.onnx and CTranslate2, with the run's
    limit ceil(0.5 x source) + 1 (tighter than most outputs: the copy task's outputs
    are as long as their sources), outputs cut at exactly that many tokens."""
    import sentencepiece as spm

    from keras_transformer import CTranslate2Translator, Translator, workdir

    work_dir, paths = limited
    search = workdir.read_search(work_dir)
    assert (search.length_ratio, search.max_extra_length) == (0.5, 1)
    sentences = held_out_sentences(40)
    keras_out = Translator.load(work_dir, beam_size=1).translate(sentences)
    processor = spm.SentencePieceProcessor(model_file=os.path.join(work_dir, "vocab.model"))
    cut = 0
    for sentence, output in zip(sentences, keras_out, strict=True):
        source = len(processor.encode(sentence)) + 1  # EOS
        pieces = len(processor.encode(output)) if output else 0
        assert pieces <= output_limit(source, 0.5, 1)  # without EOS: at most the limit
        cut += pieces >= output_limit(source, 0.5, 1) - 1
    # The shared fixture's weights depend on which tests trained it first: most outputs
    # copy their source (18 to 30 of 40 cut, seen); some must reach the limit.
    assert cut >= len(sentences) // 4, "the limit should cut many copy-task outputs"

    ct2 = CTranslate2Translator.load(paths["ctranslate2"]).translate(sentences, beam_size=1)
    assert ct2 == keras_out

    import tensorflow as tf

    saved = tf.saved_model.load(paths["saved_model"])
    result = saved.signatures["translate_greedy"](sentences=tf.constant(sentences))
    assert [t.decode() for t in result["translations"].numpy()] == keras_out

    jobs = [{"name": "greedy", "call": "translate", "sentences": sentences,
             "kwargs": {"beam_size": 1}}]  # fmt: skip
    results = onnx_jobs(paths["onnx"], jobs)
    assert results["greedy"]["value"] == keras_out
