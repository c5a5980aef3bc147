"""The training step alone at real shapes: this package's and the keras-hub loop's, both batchings.

    python benchmarks/step_replay.py --vocab work/vocab.model
    python benchmarks/step_replay.py --vocab runs/ding_sentences_vocab.model \\
        --data-dir runs/ding_sentences --dropout 0.3

Separates the two things `benchmarks/quality.py`'s end-to-end ratio mixes:
how fast each step computes a position, and how many of its positions are
real tokens. One process (TensorFlow, train.py's allocator settings,
TensorFlow's default thread pools), one corpus, one vocabulary; the first
`--batches` batches of one epoch of each batching:

    ours  `pipeline.plan_batches` (length ranges, `pipeline.BUCKET_BOUNDARIES`)
    loop  `keras_hub_loop.make_batches` (sorted by length, filled greedily)

go through each step:

    keras_transformer  this package's `Transformer`, compiled with the paper's
                       recipe as train.py does, `train_on_batch` (`fit`'s step)
    keras_hub          `_common._keras_hub_model` in `keras_hub_loop`'s own
                       `tf.function` step (Adam, label-smoothed cross-entropy)

Rounds alternate between the four (step, batching) pairs; the table has
medians. Positions count padding (B x (S + T)); real tokens do not. Timings
must run alone on the machine.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", required=True, help="a vocab.model of train.py's")
    parser.add_argument("--dataset", default="ding")
    parser.add_argument("--data-dir", help="folder of parallel files (as train.py's --data-dir)")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--dropout", type=float, help="(default: the preset's)")
    parser.add_argument("--batch-tokens", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=60, help="timed batches per pass")
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args(argv)


def load_batches(args, config):
    """(ours, loop): lists of `(source, target_ids, labels)` int32 tensors.

    The pairs are tokenized once, as train.py does (`pipeline.tokenize_split`);
    the loop's batching gets the same ids.
    """
    import numpy as np
    import tensorflow as tf

    from benchmarks import keras_hub_loop
    from keras_transformer.data import load_translation_data, pipeline
    from keras_transformer.data.vocabulary import load_tokenizer

    data = load_translation_data(args.dataset, data_dir=args.data_dir)
    split = pipeline.tokenize_split(
        data.splits["train"], load_tokenizer(args.vocab), config.max_length, config.eos_id
    )
    pairs = keras_hub_loop.Pairs(
        np.split(split.source, split.source_offsets[1:-1]),
        np.split(split.target, split.target_offsets[1:-1]),
        split.lengths,
        split.dropped,
    )
    plan = pipeline.plan_batches(
        split, args.batch_tokens, rng=np.random.default_rng(0), drop_remainder=True
    )[: args.batches]
    ours = []
    for indices in plan:
        features, labels = pipeline.assemble(split, indices, config.bos_id, config.eos_id)
        ours.append((features["source_ids"], features["target_ids"], labels))
    loop_plan = keras_hub_loop.make_batches(
        pairs.lengths, args.batch_tokens, np.random.default_rng(0)
    )[: args.batches]
    loop = [
        keras_hub_loop.pad_batch(pairs, indices, config.bos_id, config.eos_id, config.pad_id)
        for indices in loop_plan
    ]
    as_tensors = lambda batches: [tuple(tf.constant(a) for a in batch) for batch in batches]  # noqa: E731
    return as_tensors(ours), as_tensors(loop)


def positions_and_real(batches, pad_id=0):
    import numpy as np

    positions = sum(int(np.prod(s.shape)) + int(np.prod(labels.shape)) for s, _, labels in batches)
    real = sum(
        int(np.count_nonzero(s.numpy() != pad_id)) + int(np.count_nonzero(labels.numpy() != pad_id))
        for s, _, labels in batches
    )
    return positions, real


def main(argv=None):
    args = parse_args(argv)
    _common.hardware().reexec_with_allocator_env()  # before TensorFlow loads
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import numpy as np

    from benchmarks import keras_hub_loop
    from keras_transformer.config import get_preset
    from keras_transformer.hardware import describe_cpu
    from keras_transformer.recipe import compile_with_paper_recipe

    overrides = {} if args.dropout is None else {"dropout": args.dropout}
    config = get_preset(args.preset, **overrides)
    batchings = dict(zip(("ours", "loop"), load_batches(args, config), strict=True))

    keras.utils.set_random_seed(0)
    first = {"source_ids": batchings["ours"][0][0], "target_ids": batchings["ours"][0][1]}
    ours = _common.build_model("keras_transformer", config)
    ours(first)
    compile_with_paper_recipe(ours)
    hub = _common._keras_hub_model(config)
    hub(first)
    optimizer = keras.optimizers.Adam(1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    hub_step, _ = keras_hub_loop.make_steps(hub, optimizer, config, label_smoothing=0.1)

    def ours_step(source, target_ids, labels):
        features = {"source_ids": source, "target_ids": target_ids}
        return ours.train_on_batch(features, labels)

    steps = {"keras_transformer": ours_step, "keras_hub": hub_step}
    pairs = [(step, batching) for step in steps for batching in batchings]
    for step, batching in pairs:  # traces every shape once, untimed
        for batch in batchings[batching]:
            steps[step](*batch)
    seconds = {pair: [] for pair in pairs}
    for _ in range(args.rounds):
        for step, batching in pairs:
            start = time.perf_counter()
            for batch in batchings[batching]:
                out = steps[step](*batch)
            np.asarray(out)  # synchronizes
            seconds[(step, batching)].append(time.perf_counter() - start)

    counts = {name: positions_and_real(batches) for name, batches in batchings.items()}
    cpu = describe_cpu()["summary"]
    print(
        f"{cpu}; preset {args.preset}, dropout {config.dropout}, {args.batch_tokens} batch "
        f"tokens, the first {args.batches} batches of an epoch, {args.rounds} rounds\n"
    )
    print("| step | batches | padding | ms/step | positions/s | real tokens/s |")
    print("|---|---|---:|---:|---:|---:|")
    for step, batching in pairs:
        positions, real = counts[batching]
        median = _common.median(seconds[(step, batching)])
        print(
            f"| {step} | {batching} | {1 - real / positions:.1%} | "
            f"{1000 * median / len(batchings[batching]):.0f} | {positions / median:,.0f} | "
            f"{real / median:,.0f} |"
        )


if __name__ == "__main__":
    main()
