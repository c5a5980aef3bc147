"""Corpora larger than memory: preparing and starting to train on 1M to 16M pairs.

    python benchmarks/scale.py --pairs 1000000 4000000 --workers 1 2
    python benchmarks/scale.py --pairs 16000000 --workers 2 --json results.json

For each size a folder of parallel text files is written in a temporary
directory (never committed): a block of 100,000 synthetic pairs with
WMT-like lengths (5 to 40 words a side, 3,000-word vocabularies, word
order kept so that the sides correlate), repeated to the size. Then, each
in a process of its own, alone on the machine:

    prepare   `train.py --data-dir DIR --prepare-only --workers W --filters none`:
              scan, corpus report, vocabulary (8,000 pieces, on its 300,000-line
              sample), tokenization in chunks, memory-mapped shards
    start-up  what training does before its first step with the input side:
              the shards loaded (`data.shards.load_split`), the first pass
              planned (`data.Batches`, packed rows at 8,192 tokens) and its
              first batch assembled

and reports wall time, pairs/s (and per worker), peak RSS of the process
tree (parent and workers summed, sampled every 50 ms with psutil), and
shard bytes per pair.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

START_UP = r"""
import sys, time
start = time.time()
from keras_transformer.data import shards
from keras_transformer.data.pipeline import Batches
split = shards.load_split(sys.argv[1])
loaded = time.time() - start
batches = Batches(split, max_length=128, batch_tokens=8192, training=True, seed=0, pack=True)
batches.batch(0)
print("START_UP", len(split), loaded, time.time() - start, flush=True)
batches._planner.close() if batches._planner else None
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--no-start-up", action="store_true", help="preparation only")
    parser.add_argument("--dir", help="where the corpora go (default: a temporary directory)")
    parser.add_argument("--json", help="write the results here")
    return parser.parse_args(argv)


def write_corpus(folder, pairs, block=100_000, seed=0):
    """`pairs` synthetic pairs in `folder/train.{de,en}` (and small validation/test files)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = {
        side: [f"{side}{''.join(rng.choice(list('aeiounrstlmk'), 6))}" for _ in range(3000)]
        for side in ("de", "en")
    }
    zipf = np.minimum(rng.zipf(1.3, size=(block, 40)) - 1, 2999)
    lengths = rng.integers(5, 41, size=block)
    lines = {side: [] for side in ("de", "en")}
    for row, length in zip(zipf, lengths, strict=True):
        for side in ("de", "en"):
            lines[side].append(" ".join(words[side][i] for i in row[:length]) + "\n")
    os.makedirs(folder, exist_ok=True)
    for side in ("de", "en"):
        text = "".join(lines[side]).encode("utf-8")
        with open(os.path.join(folder, f"train.{side}"), "wb") as f:
            for _ in range(pairs // block):
                f.write(text)
            f.write("".join(lines[side][: pairs % block]).encode("utf-8"))
        for split, (start, end) in {"validation": (0, 1000), "test": (1000, 2000)}.items():
            with open(os.path.join(folder, f"{split}.{side}"), "w", encoding="utf-8") as f:
                f.writelines(lines[side][start:end])


def measured(command, env=None):
    """`(seconds, peak RSS bytes of the process tree, output)` of a command; the peak
    of RSS less file-backed pages goes to `measured.anonymous`."""
    import psutil

    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    peak = [0, 0]  # RSS; RSS less file-backed pages (the shards' mapped pages, reclaimable)

    def sample():
        parent = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                infos = [p.memory_info() for p in (parent, *parent.children(recursive=True))]
                peak[0] = max(peak[0], sum(i.rss for i in infos))
                peak[1] = max(peak[1], sum(i.rss - i.shared for i in infos))
            except psutil.Error:
                pass
            time.sleep(0.05)

    start = time.time()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    output = process.communicate()[0]
    seconds = time.time() - start
    thread.join()
    if process.returncode:
        raise RuntimeError(f"{command[:4]} failed:\n{output[-3000:]}")
    measured.anonymous = peak[1]
    return seconds, peak[0], output


def folder_bytes(path):
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


def main(argv=None):
    args = parse_args(argv)
    from keras_transformer.hardware import describe_cpu

    cpu = describe_cpu()["summary"]
    base = args.dir or tempfile.mkdtemp(prefix="scale_")
    env = dict(os.environ, KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "jax"))
    results = []
    print(f"CPU: {cpu}")
    print(
        "| pairs | workers | prepare | pairs/s | per worker | peak RSS | shard bytes/pair "
        "| start-up | start-up RSS |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for pairs in args.pairs:
        corpus = os.path.join(base, f"corpus_{pairs}")
        write_corpus(corpus, pairs)
        for workers in args.workers:
            work = os.path.join(base, f"work_{pairs}_{workers}")
            shutil.rmtree(work, ignore_errors=True)
            command = [
                sys.executable, os.path.join(ROOT, "train.py"), "--data-dir", corpus,
                "--work-dir", work, "--prepare-only", "--workers", str(workers),
                "--vocab-size", str(args.vocab_size),
                # A repeated block is all duplicates by construction; the report still runs.
                "--filters", "none",
            ]  # fmt: skip
            seconds, rss, _ = measured(command, env)
            train = os.path.join(work, "data", "train")
            row = {
                "pairs": pairs,
                "workers": workers,
                "prepare_seconds": seconds,
                "pairs_per_second": pairs / seconds,
                "peak_rss_bytes": rss,
                "peak_anonymous_bytes": measured.anonymous,
                "shard_bytes_per_pair": folder_bytes(train) / pairs,
            }
            if not args.no_start_up:
                up_seconds, up_rss, output = measured([sys.executable, "-c", START_UP, train], env)
                row.update(
                    start_up_seconds=up_seconds, start_up_rss_bytes=up_rss,
                    start_up_anonymous_bytes=measured.anonymous,
                )  # fmt: skip
            results.append(row)
            start_up = (
                f"{row['start_up_seconds']:.0f} s | {row['start_up_rss_bytes'] / 2**30:.2f} GB"
                if "start_up_seconds" in row else "- | -"
            )  # fmt: skip
            print(
                f"| {pairs:,} | {workers} | {seconds:.0f} s | {pairs / seconds:,.0f} | "
                f"{pairs / seconds / workers:,.0f} | {rss / 2**30:.2f} GB | "
                f"{row['shard_bytes_per_pair']:.0f} | {start_up} |", flush=True,
            )  # fmt: skip
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(corpus, ignore_errors=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu, "results": results}, f, indent=1)
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
