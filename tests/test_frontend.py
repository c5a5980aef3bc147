"""The translators' shared front-end and search settings (no model)."""

import sys

import numpy as np
import pytest

from keras_transformer.search import PAPER, SearchConfig
from keras_transformer.serving import frontend


def test_blank_characters_are_exactly_pythons_whitespace():
    import tensorflow as tf

    code_points = [c for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    texts = [chr(c) for c in code_points]
    matched = tf.strings.regex_full_match(texts, frontend.BLANK_CHARACTERS).numpy()
    expected = np.array([t.isspace() for t in texts])
    differ = [hex(c) for c, m, e in zip(code_points, matched, expected, strict=True) if m != e]
    assert not differ, differ[:20]
    assert frontend.is_blank("") and frontend.is_blank(" \t\u3000") and not frontend.is_blank("a")


@pytest.mark.multibackend
def test_batches_by_length_cover_every_nonblank_item_once_longest_first():
    lengths = list(np.random.default_rng(0).integers(0, 30, size=101))
    batches = frontend.batches_by_length(lengths, 8)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == [i for i, n in enumerate(lengths) if n]
    assert all(1 <= len(batch) <= 8 for batch in batches)
    assert [lengths[i] for i in flat] == sorted((n for n in lengths if n), reverse=True)
    assert frontend.batches_by_length([0, 0], 4) == []


@pytest.mark.multibackend
def test_check_sentences_names_the_bad_item():
    assert frontend.check_sentences(("a", "b"), "T") == ["a", "b"]
    with pytest.raises(TypeError, match="sentence 1 is a int"):
        frontend.check_sentences(["a", 3], "Translator")
    with pytest.raises(TypeError, match="sentence 0 is a bytes"):
        frontend.check_sentences([b"a"], "Translator")
    with pytest.raises(TypeError, match="use translator\\(text\\) for one"):
        frontend.check_sentences("a sentence", "Translator")
    assert frontend.check_sentences([b"a\xff"], "OnnxTranslator", accept_bytes=True) == ["a\ufffd"]


@pytest.mark.multibackend
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(beam_size=0), "beam_size must be a positive integer"),
        (dict(beam_size=2.0), "beam_size must be a positive integer"),
        (dict(beam_size=True), "beam_size must be a positive integer"),
        (dict(alpha=-0.1), "alpha must be a number >= 0"),
        (dict(alpha=float("nan")), "alpha must be a number >= 0"),
        (dict(max_extra_length=-1), "max_extra_length must be an integer >= 0"),
        (dict(stopping="early"), "stopping must be one of \\('bound', 'k_finished'\\)"),
        (dict(patience=0), "patience must be a number > 0"),
        (dict(patience=float("inf")), "patience must be a number > 0"),
    ],
)
def test_search_config_refuses_bad_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        SearchConfig(**settings)


@pytest.mark.multibackend
def test_search_config_from_dict():
    assert SearchConfig.from_dict(None) == PAPER
    assert SearchConfig.from_dict({"beam_size": 1, "alpha": None}) == PAPER.replace(beam_size=1)
    assert SearchConfig.from_dict({"beam_size": np.int32(2)}).beam_size == 2  # numpy ints too
    with pytest.raises(ValueError, match="Unknown search settings \\['beam'\\]"):
        SearchConfig.from_dict({"beam": 4})
    # ceil(K * patience) hypotheses stop a sentence under "k_finished"; at least one.
    assert [PAPER.replace(patience=p).needed for p in (1.0, 2.0, 1.1, 0.01)] == [4, 8, 5, 1]
