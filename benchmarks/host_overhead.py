"""Host time per training step: train.py's input path and `model.fit` loop, with a model
whose device work is negligible, so that what is left of a step is the host's.

    KERAS_BACKEND=jax python benchmarks/host_overhead.py
    KERAS_BACKEND=jax python benchmarks/host_overhead.py --batch-tokens 2048 --steps 400

On a GPU every millisecond of host work per step that the device does not
hide is lost (issue: train.py's Ding `small` step was 71 ms on an H200 for
a few ms of device work). On a CPU the same loop runs with a model of one
8-wide layer over a 64-piece vocabulary, so the step is almost all host:
`data.Batches` assembling the packed batch (`Batches.batch`), Keras's
`PyDataset` adapter handing it over, the dispatch of the compiled step, and
the callbacks of `fit` (train.py's own list, `callbacks.training_callbacks`).

The batches are the package's, planned from a synthetic corpus whose
lengths follow Ding's (about 7 pieces a side; no corpus or vocabulary
needed), at the `small` preset's 2,048 tokens a side by default. Two ways
of reading them are timed alternately, `--rounds` times each:

    inline  each batch assembled on the training loop's thread, between steps
    ahead   assembled `--ahead` batches ahead in a thread (`datasets.AheadOfStep`:
            what train.py does under JAX and torch)

Per step it reports the whole step (wall clock of `fit` / steps), the CPU
time of assembling one batch (thread time, wherever it ran), and the time
the loop waited for a batch (ahead only). Writes one JSON line with `--json`.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=200_000, help="synthetic training pairs")
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ahead", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    return parser.parse_args(argv)


def synthetic_split(pairs, max_length=64, vocab=64, seed=0):
    """A `TokenizedSplit` whose side lengths follow Ding's (median 5, a long tail)."""
    import numpy as np

    from keras_transformer.data.pipeline import TokenizedSplit

    rng = np.random.default_rng(seed)
    sides = {}
    for side in ("source", "target"):
        lengths = np.clip(rng.lognormal(1.7, 0.6, pairs).astype(int), 1, max_length - 1)
        sides[side] = rng.integers(4, vocab, int(lengths.sum()), dtype=np.int32)
        sides[side + "_offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        sides[side + "_lengths"] = lengths
    # The source's pieces include its EOS; the target gains a BOS in the batch.
    longest = np.maximum(sides["source_lengths"], sides["target_lengths"] + 1)
    return TokenizedSplit(
        source=sides["source"], source_offsets=sides["source_offsets"],
        target=sides["target"], target_offsets=sides["target_offsets"],
        lengths=longest, dropped=0,
    )  # fmt: skip


def tiny_model():
    import keras
    import numpy as np

    from keras_transformer.config import get_preset
    from keras_transformer.model import Transformer
    from keras_transformer.recipe import compile_with_paper_recipe

    config = get_preset(
        "tiny", vocab_size=64, num_layers=1, d_model=8, num_heads=1, d_ff=8, dropout=0.0
    )
    model = Transformer(**config.__dict__)
    ids = np.array([[5, 6, 3]], dtype="int32")
    model({"source_ids": ids, "target_ids": ids}, training=False)
    compile_with_paper_recipe(model, warmup_steps=100)
    keras.utils.set_random_seed(0)
    return model


def time_round(split, args, ahead):
    """Milliseconds per step of one `fit` of `args.steps` steps after its first
    (`PhaseTimer`'s, which leaves out the first step's compile), and the input
    figures. A fresh model and folder each round: a second `fit` of a model
    whose first ran Keras's callbacks in their own thread failed under JAX
    ("Buffer has been deleted or donated"), and an earlier round's backup
    would skip the epoch."""
    model = tiny_model()
    from keras_transformer import workdir
    from keras_transformer.callbacks import ValidationBleu, training_callbacks
    from keras_transformer.data import Batches, InputTimer, PyDataset

    timer = InputTimer()
    batches = Batches(split, max_length=64, batch_tokens=args.batch_tokens, pack=True,
                      seed=0, timer=timer)  # fmt: skip
    batches.training_pass(0)  # the first pass's plan, made before the clock starts
    dataset = PyDataset(batches, ahead=ahead)
    with tempfile.TemporaryDirectory() as work_dir:
        callbacks, phases = training_callbacks(
            workdir.WorkDir(work_dir), ValidationBleu([], None, every=0)
        )
        model.fit(dataset, epochs=1, steps_per_epoch=args.steps + 1, verbose=0,
                  callbacks=callbacks, shuffle=False)  # fmt: skip
    assert phases.steps == args.steps + 1, phases.steps
    return {
        "step_ms": 1000 * phases.step_seconds / args.steps,
        "assemble_ms": 1000 * timer.seconds / max(timer.batches, 1),
        "wait_ms": None if not ahead else 1000 * dataset.input_wait_seconds / args.steps,
    }


def main(argv=None):
    args = parse_args(argv)
    import keras

    from keras_transformer.hardware import describe_cpu

    split = synthetic_split(args.pairs)
    results = {"inline": [], "ahead": []}
    for _ in range(args.rounds):
        for name, ahead in (("inline", 0), ("ahead", args.ahead)):
            results[name].append(time_round(split, args, ahead))
    summary = {
        "backend": keras.backend.backend(),
        "cpu": describe_cpu()["summary"],
        "batch_tokens": args.batch_tokens,
        "steps": args.steps,
        "rounds": args.rounds,
    }
    print(f"{summary['backend']}, {summary['cpu']}; packed batches of {args.batch_tokens} tokens "
          f"a side, {args.steps} steps x {args.rounds} rounds (median, min-max)")  # fmt: skip
    for name, rounds in results.items():
        row = {}
        for key in ("step_ms", "assemble_ms", "wait_ms"):
            values = [r[key] for r in rounds if r[key] is not None]
            if values:
                row[key] = {"median": statistics.median(values), "min": min(values),
                            "max": max(values)}  # fmt: skip
        summary[name] = row
        cells = "  ".join(
            f"{key[:-3]} {v['median']:.2f} ms ({v['min']:.2f}-{v['max']:.2f})"
            for key, v in row.items()
        )
        print(f"  {name:6s}  {cells}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
