"""The training step alone at real shapes: this package's and the keras-hub loop's, both batchings.

    python benchmarks/step_replay.py --vocab work/vocab.model
    python benchmarks/step_replay.py --vocab runs/ding_sentences_vocab.model \\
        --data-dir runs/ding_sentences --dropout 0.3

Separates the two things `benchmarks/quality.py`'s end-to-end ratio mixes:
how fast each step computes a position, and how many of its positions are
real tokens. One process (TensorFlow, train.py's allocator settings,
TensorFlow's default thread pools), one corpus, one vocabulary; the first
`--batches` batches of one epoch of each batching:

    packed   `pipeline.plan_packed_batches` (several pairs per row), train.py's default
    buckets  `pipeline.plan_batches` (length ranges, `pipeline.BUCKET_BOUNDARIES`),
             train.py's `--no-pack`
    loop     `keras_hub_loop.make_batches` (sorted by length, filled greedily)

go through each step:

    keras_transformer      this package's `Transformer`, compiled with the paper's
                           recipe as train.py does, `train_on_batch` (`fit`'s step);
                           on packed rows with XLA (`--no-jit-compile`: without;
                           train.py's calibration picks per machine), on buckets
                           without (as `--no-pack`)
    keras_hub              `_common._keras_hub_model` in `keras_hub_loop`'s own
                           `tf.function` step (Adam, label-smoothed cross-entropy);
                           it has no segment masks, so no packed rows

Rounds alternate between the (step, batching) pairs; the table has
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
    parser.add_argument(
        "--jit-compile", action=argparse.BooleanOptionalAction, default=True,
        help="XLA for the packed step (default on: what the calibration chose on the 2-core CPUs)",
    )  # fmt: skip
    return parser.parse_args(argv)


def load_batches(args, config):
    """`{batching: [(features, labels)]}`, numpy int32.

    The pairs are tokenized once, as train.py does (`pipeline.tokenize_split`);
    the loop's batching gets the same ids.
    """
    import numpy as np

    from benchmarks import keras_hub_loop
    from keras_transformer.data import load_translation_data, pipeline
    from keras_transformer.data.vocabulary import load_tokenizer

    data = load_translation_data(args.dataset, data_dir=args.data_dir)
    split = pipeline.tokenize_split(
        data.splits["train"], load_tokenizer(args.vocab), config.max_length, config.eos_id
    )
    special = dict(bos_id=config.bos_id, eos_id=config.eos_id)
    plan_args = (split, args.batch_tokens, 1, np.random.default_rng(0), True)
    packed = [
        pipeline.assemble_packed(split, width, rows, **special)
        for width, rows in pipeline.plan_packed_batches(*plan_args)[: args.batches]
    ]
    buckets = [
        pipeline.assemble(split, indices, **special)
        for indices in pipeline.plan_batches(*plan_args)[: args.batches]
    ]
    pairs = keras_hub_loop.Pairs(
        np.split(split.source, split.source_offsets[1:-1]),
        np.split(split.target, split.target_offsets[1:-1]),
        split.lengths,
        split.dropped,
    )
    loop = []
    for indices in keras_hub_loop.make_batches(
        pairs.lengths, args.batch_tokens, np.random.default_rng(0)
    )[: args.batches]:
        source, target_ids, labels = keras_hub_loop.pad_batch(
            pairs, indices, config.bos_id, config.eos_id, config.pad_id
        )
        loop.append(({"source_ids": source, "target_ids": target_ids}, labels))
    return {"packed": packed, "buckets": buckets, "loop": loop}


def positions_and_real(batches, pad_id=0):
    import numpy as np

    positions = real = 0
    for features, labels in batches:
        for ids in (features["source_ids"], labels):
            positions += ids.size
            real += int(np.count_nonzero(ids != pad_id))
    return positions, real


def main(argv=None):
    args = parse_args(argv)
    _common.hardware().reexec_with_allocator_env()  # before TensorFlow loads
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import numpy as np
    import tensorflow as tf

    from benchmarks import keras_hub_loop
    from keras_transformer.config import get_preset
    from keras_transformer.hardware import describe_cpu
    from keras_transformer.recipe import compile_with_paper_recipe

    overrides = {} if args.dropout is None else {"dropout": args.dropout}
    config = get_preset(args.preset, **overrides)
    batchings = load_batches(args, config)
    as_tensors = lambda batch: tf.nest.map_structure(tf.constant, batch)  # noqa: E731
    tensors = {name: [as_tensors(b) for b in batches] for name, batches in batchings.items()}

    keras.utils.set_random_seed(0)
    first = {key: tensors["loop"][0][0][key] for key in ("source_ids", "target_ids")}
    models = {}
    jit = args.jit_compile
    for name, jit_compile in (("packed", jit), ("buckets", False)):
        models[name] = _common.build_model("keras_transformer", config)
        models[name](first)
        compile_with_paper_recipe(models[name], jit_compile=jit_compile)
    models["buckets"].set_weights(models["packed"].get_weights())
    hub = _common._keras_hub_model(config)
    hub(first)
    optimizer = keras.optimizers.Adam(1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    hub_step, _ = keras_hub_loop.make_steps(hub, optimizer, config, label_smoothing=0.1)

    def ours(model):
        return lambda features, labels: model.train_on_batch(features, labels)

    def keras_hub(features, labels):
        return hub_step(features["source_ids"], features["target_ids"], labels)

    steps = [
        (f"keras_transformer{' (XLA)' if jit else ''}", "packed", ours(models["packed"])),
        ("keras_transformer", "buckets", ours(models["buckets"])),
        ("keras_hub", "buckets", keras_hub),
        ("keras_hub", "loop", keras_hub),
    ]
    for _, batching, step in steps:  # traces (compiles) every shape once, untimed
        for batch in tensors[batching]:
            step(*batch)
    seconds = {(name, batching): [] for name, batching, _ in steps}
    for _ in range(args.rounds):
        for name, batching, step in steps:
            start = time.perf_counter()
            for batch in tensors[batching]:
                out = step(*batch)
            np.asarray(out)  # synchronizes
            seconds[(name, batching)].append(time.perf_counter() - start)

    counts = {name: positions_and_real(batches) for name, batches in batchings.items()}
    cpu = describe_cpu()["summary"]
    print(
        f"{cpu}; preset {args.preset}, dropout {config.dropout}, {args.batch_tokens} batch "
        f"tokens, the first {args.batches} batches of an epoch, {args.rounds} rounds\n"
    )
    print("| step | batches | padding | ms/step | positions/s | real tokens/s |")
    print("|---|---|---:|---:|---:|---:|")
    for step, batching in seconds:
        positions, real = counts[batching]
        median = _common.median(seconds[(step, batching)])
        print(
            f"| {step} | {batching} | {1 - real / positions:.1%} | "
            f"{1000 * median / len(batchings[batching]):.0f} | {positions / median:,.0f} | "
            f"{real / median:,.0f} |"
        )


if __name__ == "__main__":
    main()
