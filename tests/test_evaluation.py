"""Evaluation against every translation the dictionary accepts."""

import math

import pytest

from keras_transformer.data import ding
from keras_transformer.evaluation import normalize_for_match, score, score_multi

# Two senses of `Abfahrt` (two lines), synonyms on both sides, a German phrase that is
# a second synonym on one line and a headword on another, and a line the parser skips.
ACCEPTED_FIXTURE = """\
# Version :: test fixture
Abfahrt {f} /Abf./ | Abfahrten {pl} :: departure /dep./; leaving | departures; leavings
Abfahrt {f} [Ski] :: downhill run; descent
Abflug {m}; Abfahrt {f} :: take-off; departure
Abflug {m} [aviat.] :: take-off; takeoff
jdm. etw. geben {vt} :: to give sb. sth.; to hand sb. sth.
defekte Zeile | ohne Partner :: never accepted
"""


def test_accepted_translations_collects_synonyms_across_senses(tmp_path):
    corpus = tmp_path / "de-en"
    corpus.write_text(ACCEPTED_FIXTURE, encoding="utf-8")
    accepted = ding.accepted_translations(str(corpus))
    assert accepted == {
        "Abfahrt": ["departure", "leaving", "downhill run", "descent", "take-off"],
        "Abfahrten": ["departures", "leavings"],
        "Abflug": ["take-off", "departure", "takeoff"],
        "jemandem etwas geben": ["to give somebody something", "to hand somebody something"],
    }
    # Keys are the German sides of the parser's pairs, first values their English sides.
    for line in ACCEPTED_FIXTURE.splitlines():
        entry = ding.parse_line(line)
        for german, english in entry.pairs if entry else ():
            assert english in accepted[german]
    assert accepted["Abfahrt"][0] == "departure"
    # Each pair's own English leads its references, even for a later sense.
    pairs = [("Abfahrt", "downhill run"), ("Abflug", "take-off")]
    assert ding.accepted_references(pairs, accepted) == [
        ["downhill run", "departure", "leaving", "descent", "take-off"],
        ["take-off", "departure", "takeoff"],
    ]


def test_accepted_translations_puts_the_parsed_english_first(tmp_path):
    # `Abfahrt` is first met as a second German synonym; its first reference is still
    # the English of its own headword line, the one `parse_line` pairs it with.
    corpus = tmp_path / "de-en"
    corpus.write_text("Abflug; Abfahrt :: take-off\nAbfahrt :: departure; leaving\n", "utf-8")
    accepted = ding.accepted_translations(str(corpus))
    assert accepted["Abfahrt"] == ["departure", "take-off", "leaving"]


def test_accepted_translations_on_missing_file_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install trans-de-en"):
        ding.accepted_translations(str(tmp_path / "nope"))


HYPOTHESES = ["the departure was late today", "a small dog barks loudly", "he arrived"]
FIRST_REFERENCES = ["the departure was late", "a small dog barks", "he arrived before us"]


def test_score_multi_with_one_reference_equals_score():
    single = score(HYPOTHESES, FIRST_REFERENCES)
    multi = score_multi(HYPOTHESES, [[r] for r in FIRST_REFERENCES])
    assert single["bleu"] > 0 and single["chrf"] > 0
    assert multi["bleu"] == pytest.approx(single["bleu"])
    assert multi["chrf"] == pytest.approx(single["chrf"])
    assert multi["bleu_single"] == pytest.approx(single["bleu"])
    assert multi["chrf_single"] == pytest.approx(single["chrf"])
    assert multi["segments"] == single["segments"] == 3
    assert multi["references_per_segment"] == 1.0
    assert multi["exact_match"] == multi["exact_match_first"] == 0.0


def test_second_synonym_counts_as_correct():
    hypotheses = ["leaving", "the departure was late"]
    references = [["departure", "leaving"], ["the departure was late"]]
    multi = score_multi(hypotheses, references)
    single = score(hypotheses, [refs[0] for refs in references])
    assert multi["exact_match"] == 1.0
    assert multi["exact_match_first"] == 0.5
    assert multi["chrf"] > single["chrf"] + 10
    assert multi["chrf_single"] == pytest.approx(single["chrf"])
    assert multi["references_per_segment"] == 1.5


def test_missing_references_are_skipped_not_scored_as_empty():
    # Segment 2 has one reference, so the second stream holds no reference for it.
    # Every n-gram matches; only the brevity penalty is below 1: the closest reference
    # lengths are 9 and 2 words for 9 + 1 hypothesis words. An empty reference (length
    # 0, as close to 1 word as "the bus") would shrink 11 to 9 and give BLEU 100.
    hypotheses = ["the train leaves at noon from the main station", "bus"]
    references = [["a train leaves at noon", hypotheses[0]], ["the bus"]]
    assert score_multi(hypotheses, references)["bleu"] == pytest.approx(100 * math.exp(1 - 11 / 10))


def test_exact_match_normalization():
    assert normalize_for_match("  The  Departure.\t") == "the departure"
    assert normalize_for_match("STRASSE") == normalize_for_match("straße")  # casefold
    assert normalize_for_match("departure .") == "departure"
    assert normalize_for_match("depart ure") != normalize_for_match("departure")
    multi = score_multi(
        ["  Leaving.", "He left!", "gone"], [["departure", "leaving"], ["he left"], ["went"]]
    )
    assert multi["exact_match"] == pytest.approx(1 / 3)
    assert multi["exact_match_first"] == 0.0


def test_score_multi_rejects_mismatched_or_empty_references():
    with pytest.raises(ValueError, match="2 hypotheses and 1 reference lists"):
        score_multi(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match=r"none for segments \[1\]"):
        score_multi(["a", "b"], [["a"], []])
