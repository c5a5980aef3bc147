"""Where training the vocabulary spends its time: reading the lines against SentencePiece.

    python benchmarks/vocabulary_time.py
    python benchmarks/vocabulary_time.py --dataset ding --lines 300000 --vocab-size 4000

Reads the first `--lines` lines of the train split (source and target side
by side, as `train_vocabulary` feeds them) two ways, one after the other in
one process: a `flat_map` to one line per element (how `train_vocabulary`
read them before commit 2a67891) and `vocabulary._lines` (batches of 4,096
pairs, what it reads now), after an untimed read that caches the files.
Checks that both give the same lines in the same order, then times
`train_vocabulary` as training calls it (reading and SentencePiece's BPE
trainer). Prints seconds and the ratio.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="ding")
    parser.add_argument("--data-dir", help="a folder of parallel files instead of --dataset")
    parser.add_argument("--tfds-data-dir", default="runs/tfds")
    parser.add_argument("--lines", type=int, default=300_000)
    parser.add_argument("--vocab-size", type=int, default=4000)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    from keras_transformer.data import load_translation_data, train_vocabulary
    from keras_transformer.data.vocabulary import _lines
    from keras_transformer.hardware import describe_cpu

    data = load_translation_data(
        args.dataset, data_dir=args.data_dir, tfds_data_dir=args.tfds_data_dir
    )
    pairs = data.splits["train"]
    for _ in _lines(pairs, args.lines):  # untimed: both timed reads find the files cached
        pass

    start = time.perf_counter()
    one_by_one = list(
        pairs.flat_map(lambda s, t: tf.data.Dataset.from_tensor_slices(tf.stack([s, t])))
        .take(args.lines)
        .as_numpy_iterator()
    )
    flat_map_seconds = time.perf_counter() - start
    start = time.perf_counter()
    batched = list(_lines(pairs, args.lines))
    batched_seconds = time.perf_counter() - start
    if batched != one_by_one:
        raise SystemExit("The two readers gave different lines.")

    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        train_vocabulary(pairs, os.path.join(directory, "vocab.model"), args.vocab_size, args.lines)
        whole_seconds = time.perf_counter() - start

    cpu = describe_cpu()["summary"]
    print(f"\n{len(batched):,} lines of {args.data_dir or args.dataset}, CPU {cpu}\n")
    print("| step | seconds |")
    print("|---|---:|")
    print(f"| read, `flat_map` one line per element (before) | {flat_map_seconds:.1f} |")
    print(f"| read, `vocabulary._lines` (batches of 4,096 pairs) | {batched_seconds:.1f} |")
    print(f"| `train_vocabulary` (read + BPE, {args.vocab_size} pieces) | {whole_seconds:.1f} |")
    print(f"\nreading: {flat_map_seconds / batched_seconds:.2f}x faster; same lines, same order")


if __name__ == "__main__":
    main()
