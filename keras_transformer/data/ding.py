"""Parser and leakage-free splits of the Ding German-English dictionary.

The Ding dictionary (https://dict.tu-chemnitz.de/, GPL-2+, Debian package
`trans-de-en`) has one entry per line:

    Abfahrt {f} /Abf./ | Abfahrten {pl} :: departure /dep./ | departures

`::` separates German from English; `|` separates sub-entries that align one
to one (a headword, its plural, idioms, example sentences); `;` separates
synonyms. `{f}`, `[ugs.]`, `(...)`, `<...>` and `/ABBR/` are annotations.
The text is parsed at run time and never stored in this repository.
"""

import collections
import dataclasses
import hashlib
import logging
import re

logger = logging.getLogger(__name__)

DEFAULT_CORPUS_PATH = "/usr/share/trans/de-en"
INSTALL_HINT = (
    "Install it with `sudo apt-get install trans-de-en` (Debian/Ubuntu; `make corpus` does it), "
    "or train on your own parallel text with `--data-dir DIR` (train.de/train.en, "
    "validation.*, test.*)."
)

# Annotations are removed innermost first so that nested brackets go too.
_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|\([^()]*\)|<[^<>]*>")
# Abbreviations such as `/Abf./` stand alone between spaces; `Abfahrt/Abflug` is kept.
_ABBREVIATION = re.compile(r"(?:(?<=\s)|^)/[^/\s][^/]*/(?=[\s;|]|$)")
_PLACEHOLDERS = [
    (re.compile(r"\bsb\.['’]s(?!\w)"), "somebody's"),
    (re.compile(r"\bsth\.(?!\w)"), "something"),
    (re.compile(r"\bsb\.(?!\w)"), "somebody"),
    (re.compile(r"\betw\.(?!\w)"), "etwas"),
    (re.compile(r"\bjdm\.(?!\w)"), "jemandem"),
    (re.compile(r"\bjdn\.(?!\w)"), "jemanden"),
    (re.compile(r"\bjds\.(?!\w)"), "jemandes"),
    (re.compile(r"\bjd\.(?!\w)"), "jemand"),
]
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.!?;:])")


def strip_annotations(text):
    """Removes `{...}`, `[...]`, `(...)`, `<...>` and `/ABBR/` from `text`."""
    previous = None
    while previous != text:
        previous, text = text, _ANNOTATION.sub(" ", text)
    return _ABBREVIATION.sub(" ", text)


def _first_group(match):
    return match.group(1)


def clean_phrase(text):
    """Expands placeholders (`etw.` -> `etwas`, `sb.` -> `somebody`) and normalizes spaces."""
    if "." in text:  # Every placeholder has a `.`; most phrases have none.
        for pattern, replacement in _PLACEHOLDERS:
            text = pattern.sub(replacement, text)
    text = " ".join(text.split())
    # A function, not r"\1": re parses a template string on every call.
    return _SPACE_BEFORE_PUNCT.sub(_first_group, text).strip(" ,")


def is_sentence(german, english):
    """A full sentence: capitalized, at least three words, ends with `.`, `!` or `?`."""
    return all(
        len(text.split()) >= 3 and text[0].isupper() and text[-1] in ".!?"
        for text in (german, english)
    )


@dataclasses.dataclass
class Entry:
    """One dictionary line: its headword and its aligned `(german, english)` pairs."""

    headword: str
    pairs: list


def _aligned_synonyms(line):
    """Splits one dictionary line into its aligned sub-entries.

    The one place that knows the line format: annotations are stripped, the
    sides are split on `::`, `|` and `;`, and every synonym is cleaned.

    Returns:
        A list of `(german_synonyms, english_synonyms)`, one per `|` sub-entry
        with a non-empty phrase on both sides, in line order; or None for
        comments, lines without `::` and lines whose sides have different
        numbers of `|` sub-entries.
    """
    line = line.strip()
    if not line or line.startswith("#") or line.count(" :: ") != 1:
        return None
    german, english = (strip_annotations(side) for side in line.split(" :: "))
    german_parts, english_parts = german.split("|"), english.split("|")
    if len(german_parts) != len(english_parts):
        return None
    aligned = []
    for german_part, english_part in zip(german_parts, english_parts, strict=True):
        german_synonyms = [s for s in (clean_phrase(t) for t in german_part.split(";")) if s]
        english_synonyms = [s for s in (clean_phrase(t) for t in english_part.split(";")) if s]
        if german_synonyms and english_synonyms:
            aligned.append((german_synonyms, english_synonyms))
    return aligned


def parse_line(line, synonyms="first"):
    """Parses one dictionary line into an `Entry`, or returns None.

    Args:
        line: str, `german | german2 :: english | english2`.
        synonyms: `"first"` keeps the first synonym of each sub-entry on both
            sides; `"product"` pairs every German synonym with every English one.

    Returns:
        `Entry`, or None for comments, lines without `::` and lines whose
        sides have different numbers of `|` sub-entries.
    """
    if synonyms not in ("first", "product"):
        raise ValueError(f"synonyms must be 'first' or 'product'. Received: synonyms={synonyms!r}")
    aligned = _aligned_synonyms(line)
    if not aligned:
        return None
    headword = aligned[0][0][0].lower()
    if synonyms == "first":
        pairs = [(germans[0], englishes[0]) for germans, englishes in aligned]
    else:
        pairs = [(g, e) for germans, englishes in aligned for g in germans for e in englishes]
    return Entry(headword, pairs)


def _read_lines(path):
    """The lines of the dictionary file at `path`, with an install hint if it is missing."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readlines()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"The Ding German-English dictionary was not found at {path}. {INSTALL_HINT}"
        ) from None


def read_entries(path=DEFAULT_CORPUS_PATH, synonyms="first"):
    """Parses the dictionary file at `path` into a list of `Entry`."""
    entries = [
        entry for entry in (parse_line(line, synonyms) for line in _read_lines(path)) if entry
    ]
    if not entries:
        raise ValueError(
            f"No `german :: english` entries could be parsed from {path}; "
            "is it the Ding dictionary?"
        )
    return entries


def accepted_translations(path=DEFAULT_CORPUS_PATH):
    """Every English phrase the dictionary accepts for each German phrase.

    A German phrase (cleaned as in `parse_line`) accepts all `;` synonyms of the
    aligned English sub-entry of every sub-entry where it is any of the `;`
    synonyms, on every line (sense) of the dictionary. The splits are not
    involved: this is the reference set for scoring, not training data.

    Returns:
        dict mapping each German phrase to its accepted English phrases: a list
        without duplicates, in file order, except that the English that
        `parse_line(line, "first")` first pairs with that German phrase comes
        first. Such a German phrase can be the source of several test pairs
        (several senses); `accepted_references` puts each pair's own English first.
    """
    accepted, first = {}, {}
    for line in _read_lines(path):
        for german_synonyms, english_synonyms in _aligned_synonyms(line) or ():
            first.setdefault(german_synonyms[0], english_synonyms[0])
            for german in german_synonyms:
                # A dict as an ordered set: insertion order, no duplicates.
                accepted.setdefault(german, {}).update(dict.fromkeys(english_synonyms))
    if not accepted:
        raise ValueError(
            f"No `german :: english` entries could be parsed from {path}; "
            "is it the Ding dictionary?"
        )
    result = {}
    for german, english in accepted.items():
        head = first.get(german)
        english = list(english)
        if head is not None and english[0] != head:
            english.remove(head)
            english.insert(0, head)
        result[german] = english
    return result


def accepted_references(pairs, accepted):
    """Reference lists for scoring `pairs` with `evaluation.score_multi`.

    Args:
        pairs: list of `(german, english)`, e.g. a test split.
        accepted: the dict of `accepted_translations`.

    Returns:
        One list per pair: the pair's own English first (the single reference),
        then the other phrases `accepted` lists for its German side.
    """
    return [
        [english] + [e for e in accepted.get(german, ()) if e != english]
        for german, english in pairs
    ]


def _unit_hash(text):
    """A deterministic number in [0, 1) for `text` (Python's hash() is salted)."""
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest()[:12], 16) / 16.0**12


def split_entries(
    entries,
    validation_fraction=0.01,
    test_fraction=0.01,
    sentence_headword_fraction=0.06,
):
    """Splits entries into train/validation/test pairs without leakage.

    Every sub-entry of a line and every line (sense) of a headword land in the
    same split, chosen by a hash of the headword. Headwords with an example
    sentence are held out `sentence_headword_fraction / (validation + test)`
    times more often, so that validation and test hold enough full sentences
    for BLEU to mean something. Exact duplicate pairs are dropped, and so are
    validation pairs whose German or English side occurs in train, and test
    pairs whose German or English side occurs in train or validation.

    Returns:
        `(splits, stats)`: `splits` maps "train", "validation", "test" to
        lists of `(german, english)`; `stats` counts pairs, sentences and drops.
    """
    _check_fractions(validation_fraction, test_fraction, sentence_headword_fraction)
    grouped = _group_by_headword_hash(
        entries, validation_fraction, test_fraction, sentence_headword_fraction
    )
    return _drop_duplicates_and_leaks(grouped)


def _check_fractions(validation_fraction, test_fraction, sentence_headword_fraction):
    """Raises ValueError unless the held-out and sentence fractions are in (0, 1)."""
    held_out = validation_fraction + test_fraction
    if not 0.0 < held_out < 1.0 or not 0.0 < sentence_headword_fraction < 1.0:
        raise ValueError(
            "Split fractions must be in (0, 1). Received: "
            f"validation_fraction={validation_fraction}, test_fraction={test_fraction}, "
            f"sentence_headword_fraction={sentence_headword_fraction}"
        )


def _group_by_headword_hash(
    entries, validation_fraction, test_fraction, sentence_headword_fraction
):
    """The pairs of `entries` by split, "train", "validation", "test", chosen by headword hash.

    Duplicates and leaks are still in; `_drop_duplicates_and_leaks` removes them.
    """
    held_out = validation_fraction + test_fraction
    has_sentence = collections.defaultdict(bool)
    for entry in entries:
        has_sentence[entry.headword] |= any(is_sentence(g, e) for g, e in entry.pairs)

    grouped = {"train": [], "validation": [], "test": []}
    for entry in entries:
        u = _unit_hash(entry.headword)
        # Scale the hash so that [0, held_out) covers the sentence-bearing fraction.
        if has_sentence[entry.headword]:
            u = u * held_out / sentence_headword_fraction
        if u < validation_fraction:
            split = "validation"
        elif u < held_out:
            split = "test"
        else:
            split = "train"
        grouped[split].extend(entry.pairs)
    return grouped


def _drop_duplicates_and_leaks(grouped):
    """`(splits, stats)` of `split_entries` from the pairs grouped by split.

    Drops exact duplicate pairs, and pairs of validation (then test) whose
    German or English side occurs in a split before it.
    """
    stats = {}
    seen_pairs, seen_german, seen_english = set(), set(), set()
    splits = {}
    for split in ("train", "validation", "test"):
        kept, duplicates, leaked = [], 0, 0
        for pair in grouped[split]:
            if pair in seen_pairs:
                duplicates += 1
                continue
            seen_pairs.add(pair)
            if split != "train" and (pair[0] in seen_german or pair[1] in seen_english):
                leaked += 1
                continue
            kept.append(pair)
        # Sides of this split become unavailable to the splits after it.
        seen_german.update(g for g, _ in kept)
        seen_english.update(e for _, e in kept)
        splits[split] = kept
        stats[split] = {
            "pairs": len(kept),
            "sentences": sum(is_sentence(g, e) for g, e in kept),
            "dropped_duplicates": duplicates,
            "dropped_overlapping": leaked,
        }
    return splits, stats


def load_ding_splits(path=DEFAULT_CORPUS_PATH, synonyms="first", **split_kwargs):
    """Reads, parses and splits the dictionary: `(splits, stats)`; see `split_entries`."""
    splits, stats = split_entries(read_entries(path, synonyms), **split_kwargs)
    logger.info("Ding splits from %s: %s", path, stats)
    return splits, stats
