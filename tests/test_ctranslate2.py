"""The CTranslate2 export and `CTranslate2Translator`, against the Keras `Translator`.

On the tiny trained work directory the other export tests share
(`export_fixtures.py`): greedy search equals Keras's on 200 held-out
sentences in padded batches and on blank, over-long, non-ASCII, emoji and
CJK input, also at a short length limit; beam search, whose length penalty
differs (CTranslate2 divides by length ** alpha, the package by
((5 + length) / 6) ** alpha), is compared where the rules agree (alpha 0)
and its agreement measured. The translator imports neither Keras nor
TensorFlow.
"""

import os
import subprocess
import sys

import pytest
from export_fixtures import ODD, exported, held_out_sentences, keras_translations

pytest.importorskip("ctranslate2")
pytestmark = pytest.mark.slow

GREEDY = held_out_sentences(200) + ODD
BEAM = held_out_sentences(50, seed=11)
SETTINGS = held_out_sentences(20, seed=13)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """`(work_dir, ctranslate2 export dir)`: the shared tiny run and the CTranslate2 export
    that `exported` wrote of it, as `train.py` does at the end, with the run's search: the
    paper's (asserted), so no second export of the same weights is needed."""
    from keras_transformer import workdir
    from keras_transformer.search import PAPER

    work_dir, paths = exported(tmp_path_factory)
    assert workdir.read_search(work_dir) == PAPER
    return work_dir, paths["ctranslate2"]


@pytest.fixture(scope="module")
def translator(export):
    from keras_transformer import CTranslate2Translator

    return CTranslate2Translator.load(export[1])


def test_export_layout(export):
    files = set(os.listdir(export[1]))
    assert {"model.bin", "vocab.model", "keras_transformer.json", "config.json"} <= files
    assert os.path.basename(os.path.dirname(export[1])) == "ctranslate2"


def test_greedy_equals_keras_on_200_sentences_and_odd_input(export, translator):
    expected = keras_translations(export[0], GREEDY, beam_size=1)
    assert translator.translate(GREEDY, beam_size=1) == expected
    assert len(set(expected)) > 50  # the sentences translate differently
    assert expected[200:203] == ["", "", ""]


def test_greedy_equals_keras_at_a_short_length_limit(export, translator):
    expected = keras_translations(export[0], SETTINGS, beam_size=1, max_extra_length=2)
    assert translator.translate(SETTINGS, beam_size=1, max_extra_length=2) == expected


def test_beam_search_agrees_where_the_scoring_rules_do(export, translator):
    """alpha 0: both rank finished hypotheses by log-probability; CTranslate2 stops a
    sentence once 4 hypotheses have finished, the package once no open one can win,
    which decided 2 to 7 of these 50 differently on the fixture's trainings seen so far
    (it is trained afresh per test session)."""
    expected = keras_translations(export[0], BEAM, beam_size=4, alpha=0.0)
    got = translator.translate(BEAM, beam_size=4, alpha=0.0)
    agree = sum(a == b for a, b in zip(got, expected, strict=True))
    assert agree >= 35, f"{agree}/50 agree"
    assert expected != keras_translations(export[0], BEAM, beam_size=1)  # beam search mattered


def test_a_beam_output_does_not_depend_on_its_batch(translator):
    """Each sentence is searched under its own output limit (source + max_extra_length):
    one sentence alone translates as it does beside a much longer one, whose limit would
    otherwise be the whole batch's; `exact_limits=False` (the benchmark's one call) may not."""
    long = " ".join(["haus katze baum"] * 6)
    alone = [translator.translate([s], beam_size=4, max_extra_length=1)[0] for s in BEAM]
    beside = translator.translate(BEAM + [long], beam_size=4, max_extra_length=1)[:-1]
    assert beside == alone
    assert len(set(alone)) > 10


def test_bad_input_follows_the_front_end_contract(translator):
    assert translator("   ") == ""
    assert translator([]) == []
    invalid = b"haus \xff\xfe katze \xc3"
    assert translator([invalid]) == translator([invalid.decode("utf-8", errors="replace")])
    with pytest.raises(TypeError, match="sentence 1 is a int"):
        translator.translate(["haus", 5])
    with pytest.raises(TypeError, match="expects a list of strings"):
        translator.translate("haus")
    with pytest.raises(ValueError, match="beam_size must be a positive integer"):
        translator.translate(["haus"], beam_size=0)


INT8_SENTENCES = held_out_sentences(100, seed=17)


def _greedy_with_scores(translator):
    """`(outputs, scores)` of greedy search on INT8_SENTENCES."""
    n_best = translator.translate(INT8_SENTENCES, beam_size=1, num_hypotheses=1)
    return [n[0][0] for n in n_best], [n[0][1] for n in n_best]


def _scores_moved(scores, float32_scores):
    """How many scores differ from float32's: rounded weights move every score."""
    return sum(abs(a - b) > 1e-5 for a, b in zip(scores, float32_scores, strict=True))


def test_int8_translates_as_float32_does_on_most_sentences(export):
    """int8 is in use: CTranslate2 reports it (on a CPU int8_float32: int8 weights and
    matrix products, the rest float32) and its scores are not float32's. Its outputs
    stay close: most are float32's, and the rest close (chrF against float32's
    outputs). The bounds are this fixture's own measure less a margin (2026-11-26,
    Zen 5: 94% agree, chrF 98.3)."""
    import sacrebleu

    from keras_transformer import CTranslate2Translator

    float32 = CTranslate2Translator.load(export[1])
    int8 = CTranslate2Translator.load(export[1], compute_type="int8")
    assert float32.translator.compute_type == "float32"
    assert int8.translator.compute_type == "int8_float32"
    expected, expected_scores = _greedy_with_scores(float32)
    outputs, scores = _greedy_with_scores(int8)
    assert _scores_moved(scores, expected_scores) >= 50
    assert len(set(expected)) > 50  # the fixture's outputs are sentences, not one string
    agree = sum(a == b for a, b in zip(outputs, expected, strict=True)) / len(INT8_SENTENCES)
    assert agree >= 0.8, agree
    assert sacrebleu.corpus_chrf(outputs, [expected]).score >= 90.0


@pytest.mark.parametrize(
    "vendor, flags, saturates",
    [
        ("AuthenticAMD", "avx avx2 fma", True),  # Zen 3: oneDNN's u8s8 GEMM, 16-bit pairs
        ("AuthenticAMD", "avx2 avx512f avx512_vnni", False),  # Zen 4
        ("GenuineIntel", "avx avx2", False),  # CTranslate2 uses MKL on Intel anyway
        ("AuthenticAMD", "sse4_2 avx", False),  # no int8 GEMM of AVX2 to saturate
    ],
)
def test_the_cpus_whose_int8_saturates(tmp_path, vendor, flags, saturates):
    from keras_transformer.translators.ctranslate2_translator import int8_pairs_saturate

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu {flags}\n")
    assert int8_pairs_saturate(str(cpuinfo)) is saturates
    assert int8_pairs_saturate(str(tmp_path / "absent")) is False


def test_ctranslate2_is_imported_with_mkl_where_int8_saturates():
    """In a fresh process without CT2_USE_MKL, the package's import sets it to 1 exactly
    on the CPUs whose default int8 GEMM saturates (this machine's answer, either way);
    a value the user set is kept."""
    code = (
        "import os; from keras_transformer.translators.ctranslate2_translator import "
        "import_ctranslate2, int8_pairs_saturate; import_ctranslate2(); "
        "print(os.environ.get('CT2_USE_MKL'), int8_pairs_saturate())"
    )
    env = {k: v for k, v in os.environ.items() if k != "CT2_USE_MKL"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()  # fmt: skip
    assert out in (["1", "True"], ["None", "False"]), out
    env["CT2_USE_MKL"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()  # fmt: skip
    assert out[0] == "0"


def test_int8_warns_where_ctranslate2_kept_a_saturating_gemm(export, monkeypatch, caplog):
    from keras_transformer import CTranslate2Translator
    from keras_transformer.translators import ctranslate2_translator

    monkeypatch.setattr(ctranslate2_translator, "int8_pairs_saturate", lambda: True)
    monkeypatch.setenv("CT2_USE_MKL", "0")
    with caplog.at_level("WARNING", "keras_transformer"):
        CTranslate2Translator.load(export[1])
        assert not caplog.records
        CTranslate2Translator.load(export[1], compute_type="int8")
    assert "CT2_USE_MKL=1" in caplog.text and "saturates" in caplog.text


def test_the_int8_checks_fail_when_compute_type_is_ignored(export, monkeypatch):
    """The mutation the checks above are for: a translator that drops `compute_type`
    (float32 weights served as "int8") agrees with float32 on every sentence, which the
    old test accepted; its reported compute type and its scores both give it away."""
    import ctranslate2

    from keras_transformer import CTranslate2Translator

    float32 = CTranslate2Translator.load(export[1])
    original = ctranslate2.Translator
    monkeypatch.setattr(
        ctranslate2, "Translator",
        lambda *args, compute_type=None, **kwargs: original(*args, **kwargs),
    )  # fmt: skip
    ignored = CTranslate2Translator.load(export[1], compute_type="int8")
    assert ignored.translator.compute_type != "int8_float32"
    outputs, scores = _greedy_with_scores(ignored)
    assert _scores_moved(scores, _greedy_with_scores(float32)[1]) < 50


def test_a_sentence_translates_the_same_alone_and_in_a_batch_of_64(export):
    """200 sentences alone and inside batches of 64 mixed-length sentences (the sentences
    of test_onnx_translate.py's int8 check), float32 and int8, greedy and beam 4:
    CTranslate2's int8 quantizes each row's activations with its own scale, so a
    dynamically batching server's answers stay its own. Measured on this fixture
    (2026-11-27, Zen 4): 200 of 200 at both precisions and both searches; the bound
    leaves room for a near tie that a matrix product's blocking breaks differently."""
    import random

    from keras_transformer import CTranslate2Translator

    sentences = held_out_sentences(200, seed=19)
    around = sentences + held_out_sentences(56, seed=23)
    order = random.Random(0).sample(range(len(around)), len(around))
    for compute_type in ("float32", "int8"):
        translator = CTranslate2Translator.load(
            export[1], compute_type=compute_type, batch_size=64, intra_threads=1
        )
        for beam_size in (1, 4):
            alone = [translator.translate([s], beam_size=beam_size)[0] for s in sentences]
            in_batch = {}
            for start in range(0, len(order), 64):
                batch = order[start : start + 64]
                outputs = translator.translate([around[i] for i in batch], beam_size=beam_size)
                in_batch.update(zip(batch, outputs, strict=True))
            same = sum(alone[i] == in_batch[i] for i in range(len(sentences)))
            print(f"CTranslate2 {compute_type}, beam {beam_size}: {same} of 200 the same")
            assert same >= 196, (compute_type, beam_size, same)


def test_not_an_export_says_how_to_make_one(tmp_path):
    from keras_transformer import CTranslate2Translator

    with pytest.raises(FileNotFoundError, match="--formats ctranslate2"):
        CTranslate2Translator.load(str(tmp_path))


def test_the_translator_imports_neither_keras_nor_tensorflow(export):
    code = (
        "import sys; from keras_transformer import CTranslate2Translator as T; "
        f"print(T.load({export[1]!r})('haus katze')); "
        "assert not {'keras', 'tensorflow'} & set(sys.modules), sorted(sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
