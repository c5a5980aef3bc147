"""Writes the Ding dictionary's full sentences as a `--data-dir` corpus of short sentences
(or, with `--sample N`, a seeded sample of N of its training pairs).

    python benchmarks/ding_sentences.py runs/ding_sentences
    python benchmarks/ding_sentences.py runs/ding_30k --sample 30000
    python train.py --data-dir runs/ding_sentences --preset small
    python benchmarks/quality.py --data-dir runs/ding_sentences --minutes 10

The folder gets `{train,validation,test}.{de,en}`, one sentence per line: the
pairs of each Ding split (the package's fixed split, `ding.load_ding_splits`)
that `ding.is_sentence` calls full sentences (about 18k / 0.7k / 0.6k). It
stands in for a user's own corpus of short sentences on machines without
internet, and keeps the same held-out sentences as the Ding test split.

`--sample N` stands in for a user's corpus of N pairs of the dictionary's
kind (words, phrases and sentences): N training pairs drawn without
replacement from Ding's training split with a fixed seed, and the first
1,000 pairs of its validation and test splits (`make train`'s test pairs),
so that every sample is scored on the same held-out pairs.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_transformer.data import ding  # noqa: E402


def _write_splits(out_dir, splits):
    """`{split: [(german, english), ...]}` as `split.de` / `split.en` line files;
    returns `{split: count}`."""
    os.makedirs(out_dir, exist_ok=True)
    for split, pairs in splits.items():
        for index, language in enumerate(("de", "en")):
            with open(os.path.join(out_dir, f"{split}.{language}"), "w", encoding="utf-8") as f:
                f.writelines(pair[index] + "\n" for pair in pairs)
    return {split: len(pairs) for split, pairs in splits.items()}


def write_corpus(out_dir, path=ding.DEFAULT_CORPUS_PATH):
    """Writes the full-sentence pairs of every split; returns `{split: count}`."""
    splits, _ = ding.load_ding_splits(path)
    return _write_splits(out_dir, {split: [(g, e) for g, e in pairs if ding.is_sentence(g, e)]
                                   for split, pairs in splits.items()})  # fmt: skip


SAMPLE_SEED = 1234
SAMPLE_HELD_OUT = 1000  # validation and test pairs of a sample: the first of each split


def write_pair_sample(out_dir, train_pairs, path=ding.DEFAULT_CORPUS_PATH, seed=SAMPLE_SEED):
    """Writes `train_pairs` training pairs drawn from Ding's training split with `seed`,
    and the first `SAMPLE_HELD_OUT` validation and test pairs; returns `{split: count}`."""
    import random

    splits, _ = ding.load_ding_splits(path)
    if not 0 < train_pairs <= len(splits["train"]):
        raise ValueError(
            f"--sample takes 1 to {len(splits['train'])} pairs. Received: {train_pairs}"
        )
    chosen = {
        "train": random.Random(seed).sample(splits["train"], train_pairs),
        "validation": splits["validation"][:SAMPLE_HELD_OUT],
        "test": splits["test"][:SAMPLE_HELD_OUT],
    }
    return _write_splits(out_dir, chosen)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", help="folder to write")
    parser.add_argument("--ding-path", default=ding.DEFAULT_CORPUS_PATH)
    parser.add_argument(
        "--sample", type=int, metavar="N", help="N seeded training pairs of any kind instead"
    )
    args = parser.parse_args(argv)
    if args.sample is not None:
        print(write_pair_sample(args.out_dir, args.sample, args.ding_path))
    else:
        print(write_corpus(args.out_dir, args.ding_path))


if __name__ == "__main__":
    main()
