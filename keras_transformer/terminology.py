"""A glossary in the source text: terms annotated with their required translation.

OpenNMT-py's and Eole's `terminology` transform, with plain word matching
in place of spaCy lemmas. At training time (`train.py --terminology FILE`)
a share of the training pairs whose source holds a glossary term and whose
target holds that term's translation get the translation inline:

    Der Auftrag ist da.
    Der ｟src_term_start｠ Auftrag ｟tgt_term_start｠ order ｟tgt_term_end｠ ist da.

so the model learns to copy what follows `｟tgt_term_start｠`. At translation
time the same annotation is made from a glossary given per call
(`annotate`), by every translator before its graph: the hint lives in the
text, so it needs nothing of the runtime. It is a soft constraint: the
model usually follows it, nothing forces it to.

Matching, the same at training and translation time: a term is a sequence
of words (runs of `\\w` characters, compared casefolded: "straße" matches
"STRASSE"), found only at word boundaries ("Haus" is not found in
"Hausarzt"), left to right, the longest term first where several start at
one word; found terms do not overlap. Where a source term has several
entries, training takes the first whose translation is in the target,
translation the first listed. The rest of the sentence, its spacing and
punctuation, is kept as it is.

Eole's options and their counterparts here:

    termbase_path            --terminology FILE (source term TAB target term per line)
    term_corpus_ratio 0.3    --terminology-rate 0.3: each training pair that has a
                             match is annotated with this probability, decided by a
                             hash of the run's seed and the pair's index, so a
                             resumed or re-tokenized run annotates the same pairs
                             (Eole caps the annotated share of each bucket and tries
                             every other example)
    term_example_ratio 0.2   TERMS_PER_WORD: at most this share of a training
                             source's words annotated, but at least one term (Eole's
                             int(0.2 x words) annotates nothing below 5 words, most
                             of a dictionary's phrases); translation annotates all
    src_term_stoken, tgt_term_stoken, tgt_term_etoken
                             TAGS, Eole's defaults; SentencePiece's
                             user_defined_symbols keep each one piece
    src/tgt_spacy_language_model, term_source_delimiter
                             none: words are matched as written, and there is no
                             fuzzy-match transform to delimit

This module imports only the standard library: `OnnxTranslator` and the
server use it without Keras.
"""

import dataclasses
import hashlib
import os
import re

SRC_TERM_START = "｟src_term_start｠"  # U+FF5F ... U+FF60, as Eole writes them
TGT_TERM_START = "｟tgt_term_start｠"
TGT_TERM_END = "｟tgt_term_end｠"
TAGS = (SRC_TERM_START, TGT_TERM_START, TGT_TERM_END)

RATE = 0.3  # Eole's term_corpus_ratio
TERMS_PER_WORD = 0.2  # Eole's term_example_ratio (here with at least one term)

_WORD = re.compile(r"\w+")


def _words(text):
    """`[(start, end, casefolded word)]` of `text`'s words."""
    return [(m.start(), m.end(), m.group().casefold()) for m in _WORD.finditer(text)]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One glossary line: a source term and the translation it must get."""

    source: str
    target: str
    words: tuple  # the source term's casefolded words
    target_words: tuple


class Glossary:
    """Source terms and their translations, indexed for matching.

    Args:
        pairs: `(source term, target term)` strings, in order of preference.
        name: where they came from, for error messages.

    `Glossary.from_value` also takes a dict `{source: target}`, a list of
    pairs, a path to a tab-separated file, or a `Glossary`.
    """

    def __init__(self, pairs, name="glossary"):
        self.name = name
        self.entries = []
        for index, pair in enumerate(pairs):
            if (
                not isinstance(pair, (tuple, list))
                or len(pair) != 2
                or not all(isinstance(side, str) for side in pair)
            ):
                raise ValueError(
                    f"{name}: entry {index} must be a (source term, target term) pair of "
                    f"strings. Received: {pair!r:.80}"
                )
            self.entries.append(_entry(*pair, where=f"{name}: entry {index}"))
        # A trie over the terms' words: matching walks it from each word, so its
        # work is words x the depth walked, however many entries share a prefix.
        self._root = _Node()
        self._max_words = 0
        for entry in self.entries:
            node = self._root
            for word in entry.words:
                node = node.children.setdefault(word, _Node())
            node.add(entry)
            self._max_words = max(self._max_words, len(entry.words))

    def __len__(self):
        return len(self.entries)

    @property
    def max_words(self):
        """The longest source term's word count (0 for an empty glossary): no match
        spans more words."""
        return self._max_words

    def __repr__(self):
        return f"Glossary({len(self)} entries from {self.name})"

    @classmethod
    def from_value(cls, value):
        """A `Glossary` of `value`: a `Glossary`, a path (str or `os.PathLike`) to a
        tab-separated file (`load_glossary`), a dict `{source: target}` or a list
        of `(source, target)` pairs."""
        if isinstance(value, Glossary):
            return value
        if isinstance(value, (str, os.PathLike)):
            return load_glossary(value)
        if isinstance(value, dict):
            return cls(list(value.items()))
        if isinstance(value, (list, tuple)):
            return cls(value)
        raise TypeError(
            "A glossary is a dict {source: target}, a list of (source, target) pairs, a "
            f"path to a tab-separated file or a Glossary. Received: {type(value).__name__}"
        )

    def matches(self, words, target_words=None, limit=None):
        """`[(first word, last word + 1, entry)]` of the terms found in `words`
        (`_words`), left to right, the longest first where several start at one
        word; with `target_words`, only entries whose target term is among them;
        at most `limit` (None: all).

        From each word it walks the trie as far as the words follow a term's
        words, then tries the terms that ended along the walk, longest first,
        each term's entries in the order given: the work is words x the depth
        walked (at most `max_words`), whatever the number of entries."""
        grams = None if target_words is None else _Ngrams(target_words)
        found, i = [], 0
        while i < len(words) and (limit is None or len(found) < limit):
            ends, node = [], self._root
            for j in range(i, len(words)):
                node = node.children.get(words[j][2])
                if node is None:
                    break
                if node.entries:
                    ends.append((j + 1, node))
            for end, node in reversed(ends):
                entry = node.first(grams)
                if entry is not None:
                    found.append((i, end, entry))
                    i = end
                    break
            else:
                i += 1
        return found


class _Node:
    """A node of `Glossary`'s trie: the words that continue a term, and the entries
    whose source term ends here."""

    __slots__ = ("children", "entries", "by_target", "target_lengths")

    def __init__(self):
        self.children = {}  # casefolded word -> _Node
        self.entries = []  # in the order given
        self.by_target = {}  # target words -> (position in entries) of the first with them
        self.target_lengths = set()

    def add(self, entry):
        self.by_target.setdefault(entry.target_words, len(self.entries))
        self.target_lengths.add(len(entry.target_words))
        self.entries.append(entry)

    def first(self, grams):
        """The first entry (in the order given) whose target term is in `grams` (an
        `_Ngrams`; None: any), or None.

        Entries with one target term are alike to the filter, so it looks at each
        distinct target term once, or, where there are more of them than the
        target's word sequences of their lengths, looks those sequences up: at
        most target words x lengths lookups, whatever the number of entries."""
        if grams is None:
            return self.entries[0]
        if len(self.by_target) <= len(grams.words) * len(self.target_lengths):
            for target, position in self.by_target.items():  # in the order given
                if target in grams.of_length(len(target)):
                    return self.entries[position]
            return None
        positions = [
            self.by_target[gram]
            for n in self.target_lengths
            for gram in grams.of_length(n)
            if gram in self.by_target
        ]
        return self.entries[min(positions)] if positions else None


class _Ngrams:
    """The contiguous word sequences of `words` (a target's casefolded words), by
    length, each length's made when first asked for."""

    def __init__(self, words):
        self.words = tuple(words)
        self._by_length = {}

    def of_length(self, n):
        grams = self._by_length.get(n)
        if grams is None:
            w = self.words
            grams = self._by_length[n] = {w[i : i + n] for i in range(len(w) - n + 1)}
        return grams


def _entry(source, target, where):
    source, target = source.strip(), target.strip()
    for side, term in (("source", source), ("target", target)):
        if not term:
            raise ValueError(f"{where}: the {side} term is empty.")
        if not _WORD.search(term):
            raise ValueError(f"{where}: the {side} term {term!r} has no word characters to match.")
        for tag in TAGS:
            if tag in term:
                raise ValueError(f"{where}: the {side} term {term!r} holds the tag {tag}.")
    words = tuple(w for _, _, w in _words(source))
    return Entry(source, target, words, tuple(w for _, _, w in _words(target)))


def load_glossary(path):
    """The `Glossary` of a tab-separated file: `source term<TAB>target term` per line.

    Blank lines are skipped; any other line must hold exactly one tab between
    two non-blank terms, or a `ValueError` names the file and the line number.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"The glossary {path} is not a file.")
    pairs = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise ValueError(
                    f"{path} line {number}: expected 'source term<TAB>target term', found "
                    f"{len(fields) - 1} tabs: {line!r:.80}"
                )
            _entry(*fields, where=f"{path} line {number}")  # its errors name the line
            pairs.append(tuple(fields))
    return Glossary(pairs, name=path)


def _tagged(source, words, matches):
    """`source` with each match's translation inserted after its source term."""
    pieces, position = [], 0
    for first, end, entry in matches:
        start, stop = words[first][0], words[end - 1][1]
        pieces += [source[position:start], SRC_TERM_START, " ", source[start:stop], " ",
                   TGT_TERM_START, " ", entry.target, " ", TGT_TERM_END]  # fmt: skip
        position = stop
    pieces.append(source[position:])
    return "".join(pieces)


def annotate(source, glossary):
    """`source` with every glossary term found in it followed by its translation,
    between Eole's tags: `annotate("Der Auftrag.", {"auftrag": "order"})` is
    `"Der ｟src_term_start｠ Auftrag ｟tgt_term_start｠ order ｟tgt_term_end｠."`.

    Args:
        source: str.
        glossary: a `Glossary`, or what `Glossary.from_value` takes; None or an
            empty glossary returns `source` unchanged.
    """
    if glossary is None:
        return source
    glossary = Glossary.from_value(glossary)
    if not len(glossary):
        return source
    words = _words(source)
    return _tagged(source, words, glossary.matches(words))


def annotate_all(sentences, glossary):
    """`annotate` of each of `sentences` (a list of str), the glossary read once: what
    every translator runs on its checked input before tokenizing."""
    if glossary is None:
        return list(sentences)
    glossary = Glossary.from_value(glossary)
    return [annotate(sentence, glossary) for sentence in sentences]


def annotate_pair(source, target, glossary):
    """`(source annotated, terms)` of a training pair: the terms found in `source`
    whose translation is in `target`, at most `TERMS_PER_WORD` of its words (at
    least one)."""
    words = _words(source)
    limit = max(1, int(len(words) * TERMS_PER_WORD))
    matches = glossary.matches(words, [w for _, _, w in _words(target)], limit)
    return _tagged(source, words, matches), len(matches)


def chosen(seed, index, rate):
    """Whether training pair `index` is annotated (if it matches): a hash of the
    run's seed and the index below `rate`, the same in every process."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < rate


def annotate_training_pairs(pairs, glossary, rate=RATE, seed=0):
    """The training pairs with the chosen matching ones annotated (`annotate_pair`):
    a list for a list, else an iterable with the same `len()` and `sizes` (a
    `text_files.TrainStream` or `MixedTrainStream`, read once)."""
    annotated = AnnotatedPairs(pairs, glossary, rate, seed)
    return list(annotated) if isinstance(pairs, list) else annotated


class AnnotatedPairs:
    """`annotate_training_pairs` of an iterable of pairs, lazily (a corpus larger than
    memory is annotated as it is tokenized)."""

    def __init__(self, pairs, glossary, rate, seed):
        self.pairs, self.glossary, self.rate, self.seed = pairs, glossary, rate, seed
        if hasattr(pairs, "sizes"):
            self.sizes = pairs.sizes

    def __len__(self):
        return len(self.pairs)

    def __iter__(self):
        for index, (source, target) in enumerate(self.pairs):
            if chosen(self.seed, index, self.rate):
                source, _ = annotate_pair(source, target, self.glossary)
            yield source, target


def settings(path, glossary, rate, seed):
    """What run.json records of a run's glossary (and what names its tokenized pairs)."""
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {
        "path": os.path.abspath(path),
        "sha256": digest,
        "entries": len(glossary),
        "rate": rate,
        "terms_per_word": TERMS_PER_WORD,
        "seed": seed,
        "tags": list(TAGS),
    }


def tokenizer_has_tags(pieces):
    """Whether a vocabulary keeps each tag whole, from `pieces`: the tokenizer's
    pieces (or ids) of each of `TAGS` alone, in order.

    A tag alone is at most two pieces ("▁" and the tag) where the vocabulary
    holds it (trained with `--terminology`), at least three otherwise (its
    two brackets and its name)."""
    return len(pieces) == len(TAGS) and all(len(tag) <= 2 for tag in pieces)


def file_has_tags(path):
    """Whether the SentencePiece model file at `path` holds the tags (its pieces and
    its trainer's `user_defined_symbols` are stored as plain UTF-8 strings): for
    a runtime that tokenizes inside its graph (`OnnxTranslator`); False where
    there is no such file."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        data = f.read()
    return all(tag.encode("utf-8") in data for tag in TAGS)


def check_tags(has_tags, where):
    """Raises a `ValueError` naming `where` unless `has_tags`."""
    if not has_tags:
        raise ValueError(
            f"{where}: its vocabulary has no glossary tags ({', '.join(TAGS)}): the model "
            "was trained without --terminology, so it cannot take a glossary. Train with "
            "`python train.py --terminology FILE`."
        )
