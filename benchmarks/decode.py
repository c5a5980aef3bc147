"""Decoding speed: cached vs uncached greedy search, and beam search vs greedy.

    python benchmarks/decode.py --preset small --batch-size 32 --source-length 24

A randomly initialized model (the speed does not depend on the weights)
decodes a fixed number of steps: the end token is ignored (`eos_id=-1`),
so every search runs exactly `steps` steps. Everything is compiled with
`tf.function`; XLA (`jit_compile=True`) is measured separately.

- cached greedy: `decoding.greedy_search` over `model.decode_step`, one
  `while_loop` in one `tf.function`, encoder included.
- uncached greedy: the TensorFlow tutorial's approach, the whole decoder
  re-run on the growing prefix at each step (a `tf.function`-compiled
  `model.decode`, traced once for all lengths; the encoder runs once, which
  favours it over the tutorial, which re-runs the encoder too).
- beam: `decoding.beam_search` with the same forced number of steps.

Prints a Markdown table of median wall times and ratios.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import Transformer  # noqa: E402
from keras_transformer.decoding import (  # noqa: E402
    beam_search,
    greedy_search,
)

NEVER = -1  # an eos_id no token has: every search runs its full number of steps
SPEC = tf.TensorSpec((None, None), tf.int32)  # source ids, and the decoder's prefix


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=24)
    parser.add_argument("--steps", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--beam-steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-xla", action="store_true", help="do not measure jit_compile=True")
    return parser.parse_args(argv)


def median_seconds(fn, repeats):
    keras.ops.convert_to_numpy(fn())  # trace / compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        keras.ops.convert_to_numpy(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_source_ids(args, config):
    """The batch every case decodes: random ids, each row ending in the end token."""
    rng = np.random.default_rng(0)
    source_ids = rng.integers(4, config.vocab_size, (args.batch_size, args.source_length))
    source_ids[:, -1] = config.eos_id
    return tf.constant(source_ids, tf.int32)


def cached_greedy(model, source_ids, steps, jit_compile=False):
    """A call of cached greedy search for `steps` tokens: one `tf.function`, encoder included."""
    config = model.config

    @tf.function(input_signature=[SPEC], jit_compile=jit_compile)
    def run(source_ids):
        cache = model.init_cache(source_ids, steps)
        start = tf.fill(tf.shape(source_ids)[:1], config.bos_id)
        return greedy_search(
            model.decode_step, cache, start, steps, eos_id=NEVER, drop_finished=not jit_compile
        )  # XLA: static shapes

    return lambda: run(source_ids)


def beam(model, source_ids, steps, beam_size, jit_compile=False):
    """A call of beam search for `steps` tokens (the best beam): one `tf.function`."""
    config = model.config

    @tf.function(input_signature=[SPEC], jit_compile=jit_compile)
    def run(source_ids):
        cache = model.init_cache(source_ids, steps)
        start = tf.fill(tf.shape(source_ids)[:1], config.bos_id)
        sequences, _ = beam_search(
            model.decode_step,
            cache,
            start,
            steps,
            eos_id=NEVER,
            beam_size=beam_size,
            drop_finished=not jit_compile,  # XLA: static shapes
        )
        return sequences[:, 0]

    return lambda: run(source_ids)


def uncached_steps(model):
    """`(encode, decode)`: the model's encoder and whole decoder as `tf.function`s, each
    traced once for every prefix length."""
    encode = tf.function(model.encode, input_signature=[SPEC])
    decode = tf.function(
        model.decode,
        input_signature=[SPEC, tf.TensorSpec((None, None, model.config.d_model)), SPEC],
    )
    return encode, decode


def uncached_greedy(encode, decode, source_ids, bos, steps):
    """A call of the tutorial's greedy search: the whole decoder re-run on the prefix."""

    def run():
        encoder_outputs = encode(source_ids)
        prefix = bos[:, None]  # (B, 1)
        for _ in range(steps):
            logits = decode(prefix, encoder_outputs, source_ids)  # (B, t, V), all re-run
            next_ids = tf.argmax(logits[:, -1], axis=-1, output_type=tf.int32)
            prefix = tf.concat([prefix, next_ids[:, None]], axis=1)
        return prefix[:, 1:]

    return run


def greedy_rows(args, model, source_ids, bos, uncached):
    """Rows of cached against uncached greedy search, one per `--steps`."""
    rows = []
    for steps in args.steps:
        if steps > model.config.max_length:
            raise SystemExit(
                f"--steps {steps} exceeds the preset's max_length={model.config.max_length}"
            )
        cached = median_seconds(cached_greedy(model, source_ids, steps), args.repeats)
        uncached_time = median_seconds(
            uncached_greedy(*uncached, source_ids, bos, steps), args.repeats
        )
        rows.append(
            (f"greedy, {steps} tokens", cached, uncached_time, uncached_time / cached,
             "uncached / cached")
        )  # fmt: skip
    return rows


def beam_rows(args, model, source_ids):
    """Rows of beam against greedy search and, unless `--skip-xla`, of XLA against
    `tf.function` for each, all at `--beam-steps` tokens."""
    steps, size = args.beam_steps, args.beam_size
    greedy_time = median_seconds(cached_greedy(model, source_ids, steps), args.repeats)
    beam_time = median_seconds(beam(model, source_ids, steps, size), args.repeats)
    rows = [
        (f"beam {size} vs greedy, {steps} tokens", greedy_time, beam_time,
         beam_time / greedy_time, "beam / greedy")
    ]  # fmt: skip
    if not args.skip_xla:
        xla_greedy = median_seconds(
            cached_greedy(model, source_ids, steps, jit_compile=True), args.repeats
        )
        rows.append(
            (f"XLA greedy, {steps} tokens", greedy_time, xla_greedy,
             xla_greedy / greedy_time, "XLA / tf.function")
        )  # fmt: skip
        xla_beam = median_seconds(
            beam(model, source_ids, steps, size, jit_compile=True), args.repeats
        )
        rows.append(
            (f"XLA beam {size}, {steps} tokens", beam_time, xla_beam,
             xla_beam / beam_time, "XLA / tf.function")
        )  # fmt: skip
    return rows


def print_table(args, rows, load):
    """The settings line, the Markdown table of `rows` and the load average at the end."""
    print(
        f"\npreset={args.preset} batch={args.batch_size} source_length={args.source_length} "
        f"repeats={args.repeats} (median), load average at start {load:.1f} on "
        f"{os.cpu_count()} CPUs, {tf.__version__=}"
    )
    print("| case | A (s) | B (s) | B / A | ratio |")
    print("|---|---:|---:|---:|---|")
    for name, a, b, ratio, what in rows:
        print(f"| {name} | {a:.3f} | {b:.3f} | {ratio:.2f}x | {what} |")
    print(f"load average at end {os.getloadavg()[0]:.1f}")


def main(argv=None):
    args = parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        raise SystemExit("benchmarks/decode.py measures the TensorFlow tf.function path")
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset(args.preset, dropout=0.0)
    model.build()
    source_ids = make_source_ids(args, model.config)
    bos = tf.fill([args.batch_size], model.config.bos_id)
    uncached = uncached_steps(model)
    load = os.getloadavg()[0]
    rows = greedy_rows(args, model, source_ids, bos, uncached)
    rows += beam_rows(args, model, source_ids)
    print_table(args, rows, load)


if __name__ == "__main__":
    main()
