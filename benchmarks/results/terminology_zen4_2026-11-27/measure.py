"""The figures of docs/translating.md, "Glossary": run from the repository root as
`python benchmarks/results/terminology_zen4_2026-11-27/measure.py WORK_DIR`, WORK_DIR the
work directory that tests/test_terminology.py's `run` fixture trains (train.py --preset
tiny ... --terminology glossary.tsv --terminology-rate 0.5 --seed 1234, 1,000 steps).

Prints JSON lines: term accuracy with and without the glossary (the share of outputs
that hold the fruit the glossary names, on the 248 training sources with "ding"),
greedy and beam 4; the source pieces a term adds; and the host time of
`terminology.annotate` for glossaries of 4, 1,000 and 10,000 entries.
"""

import json
import random
import sys
import time

sys.path.insert(0, "tests")
from test_terminology import FRUITS, _ding_sentences, _said, _with_glossary, ding_pairs  # noqa: E402

from keras_transformer import terminology, workdir  # noqa: E402
from keras_transformer.translator import Translator  # noqa: E402

work = sys.argv[1]
rows = _ding_sentences({"train": ding_pairs(2000, 0)})
sources = [s for s, _ in rows]
for beam in (1, 4):
    translator = Translator.load(work, beam_size=beam)
    plain = translator.translate(sources)
    for name, fruits in (
        ("the reference's", [f for _, f in rows]),
        ("another", [FRUITS[(FRUITS.index(f) + 1) % 4] for _, f in rows]),
    ):
        out = _with_glossary(
            lambda s, g, t=translator: t.translate(s, glossary=g), rows, fruits
        )
        print(json.dumps({"beam": beam, "glossary_fruit": name, "sentences": len(rows),
                          "term_accuracy_without": _said(plain, fruits),
                          "term_accuracy_with": _said(out, fruits)}))

tokenizer = workdir.load_tokenizer(work)
annotated = terminology.annotate_all(sources, {"ding": "cherry"})
plain_pieces = sum(map(len, tokenizer.tokenize(sources)))
tagged_pieces = sum(map(len, tokenizer.tokenize(annotated)))
cherry = len(tokenizer.tokenize(["cherry"])[0])
print(json.dumps({"sentences": len(sources), "source_pieces_without": plain_pieces,
                  "source_pieces_with": tagged_pieces,
                  "pieces_per_term": (tagged_pieces - plain_pieces) / len(sources),
                  "pieces_of_the_target_term_alone": cherry}))

rng = random.Random(0)
letters = "abcdefghijklmnopqrstuvwxyzäöüß"
words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 10))) for _ in range(20000)]
sentences = [" ".join(rng.choice(words) for _ in range(20)) + "." for _ in range(1000)]
for entries in (4, 1000, 10000):
    pairs = {" ".join(rng.sample(words, rng.choice((1, 1, 2)))): "t" for _ in range(entries)}
    start = time.process_time()
    glossary = terminology.Glossary.from_value(pairs)
    built = time.process_time() - start
    start = time.process_time()
    out = terminology.annotate_all(sentences, glossary)
    per_sentence = (time.process_time() - start) / len(sentences)
    print(json.dumps({"glossary_entries": len(glossary), "build_ms": 1000 * built,
                      "annotate_us_per_20_word_sentence": 1e6 * per_sentence,
                      "terms_found": sum(s.count(terminology.SRC_TERM_START) for s in out)}))
