"""Writes the Ding dictionary's full sentences as a `--data-dir` corpus of short sentences.

    python benchmarks/ding_sentences.py runs/ding_sentences
    python train.py --data-dir runs/ding_sentences --preset small
    python benchmarks/quality.py --data-dir runs/ding_sentences --minutes 10

The folder gets `{train,validation,test}.{de,en}`, one sentence per line: the
pairs of each Ding split (the package's fixed split, `ding.load_ding_splits`)
that `ding.is_sentence` calls full sentences (about 18k / 0.7k / 0.6k). It
stands in for a user's own corpus of short sentences on machines without
internet, and keeps the same held-out sentences as the Ding test split.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_transformer.data import ding  # noqa: E402


def write_corpus(out_dir, path=ding.DEFAULT_CORPUS_PATH):
    """Writes the full-sentence pairs of every split; returns `{split: count}`."""
    splits, _ = ding.load_ding_splits(path)
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for split, pairs in splits.items():
        sentences = [(g, e) for g, e in pairs if ding.is_sentence(g, e)]
        for index, language in enumerate(("de", "en")):
            with open(os.path.join(out_dir, f"{split}.{language}"), "w", encoding="utf-8") as f:
                f.writelines(pair[index] + "\n" for pair in sentences)
        counts[split] = len(sentences)
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", help="folder to write")
    parser.add_argument("--ding-path", default=ding.DEFAULT_CORPUS_PATH)
    args = parser.parse_args(argv)
    print(write_corpus(args.out_dir, args.ding_path))


if __name__ == "__main__":
    main()
