"""What steering a translation costs in the Keras search: banned words, a forced prefix,
positive constraints (dynamic beam allocation) and sampling, against plain search.

    python benchmarks/steering.py --work-dir runs/cpu --sentences 256 --out results.jsonl

The sentences are the first `--sentences` German sides of the Ding test split
(the pairs `train.py` scores) with 3 to 20 words. Per mode and batch size
(64, and 1 over the first 32 sentences): CPU seconds of this process per
sentence (`time.process_time`, stable on a shared machine) and wall seconds,
the best of `--rounds` after a warm-up; for the constraints, the share of
outputs that hold the constraint (a word of the sentence's reference: the
longest, so rarely a function word), and the same share without it.

Modes: `beam` (the run's beam search), `banned` (each sentence's first output
word banned, so every ban has work to do), `prefix` (each sentence's first
output word forced), `constraint` (one reference word per sentence),
`constraints_2` (two), `greedy`, `sampling` (top-k 10, one seed).
"""

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pairs(count):
    from keras_transformer.data import ding

    splits, _ = ding.load_ding_splits()
    pairs = [p for p in splits["test"] if 3 <= len(p[0].split()) <= 20]
    return pairs[:count]


def longest_words(text, count):
    words = sorted(set(re.findall(r"[A-Za-z]{3,}", text)), key=lambda w: (-len(w), w))
    return words[:count]


def timed(run, rounds):
    """`(output, cpu seconds, wall seconds)`: the best of `rounds` after a warm-up run."""
    output = run()
    best = None
    for _ in range(rounds):
        cpu, wall = time.process_time(), time.perf_counter()
        output = run()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        best = (cpu, wall) if best is None or cpu < best[0] else best
    return output, best[0], best[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="JSON lines, one per mode and batch size")
    args = parser.parse_args(argv)

    from keras_transformer.translators.keras_translator import Translator

    pairs = test_pairs(args.sentences)
    sources = [german for german, _ in pairs]
    references = [english for _, english in pairs]
    beam = Translator.load(args.work_dir, batch_size=64)
    greedy = Translator.load(args.work_dir, beam_size=1, batch_size=64)
    plain = beam.translate(sources)
    first_words = [(text.split() or [""])[0] for text in plain]
    one = [longest_words(r, 1) for r in references]
    two = [longest_words(r, 2) for r in references]
    modes = {
        "beam": (beam, {}),
        "banned": (beam, {"banned": [[w] if w else [] for w in first_words]}),
        "prefix": (beam, {"target_prefix": first_words}),
        "constraint": (beam, {"constraints": one}),
        "constraints_2": (beam, {"constraints": two}),
        "greedy": (greedy, {}),
        "sampling": (greedy, {"sampling_topk": 10, "seed": 1}),
    }
    lines = []
    for batch_size, count in ((64, len(sources)), (1, min(32, len(sources)))):
        for mode, (translator, options) in modes.items():
            translator.batch_size = batch_size
            chosen = {k: (v[:count] if isinstance(v, list) else v) for k, v in options.items()}
            outputs, cpu, wall = timed(
                lambda t=translator, o=chosen, n=count: t.translate(sources[:n], **o), args.rounds
            )
            line = {
                "mode": mode, "batch_size": batch_size, "sentences": count,
                "cpu_s_per_sentence": cpu / count, "wall_s_per_sentence": wall / count,
            }  # fmt: skip
            if mode.startswith("constraint"):
                words = chosen["constraints"]
                line["holds"] = _share(outputs, words)
                line["holds_without"] = _share(plain[:count], words)
            lines.append(line)
            print(json.dumps(line), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


def _share(outputs, words):
    """The share of (output, constraint word) pairs where the output holds the word."""
    pairs = [(o, w) for o, ws in zip(outputs, words, strict=True) for w in ws]
    return sum(w.lower() in o.lower() for o, w in pairs) / max(len(pairs), 1)


if __name__ == "__main__":
    main()
