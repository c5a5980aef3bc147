"""Beam size and length penalty of a finished run, chosen on validation, reported on test.

    python benchmarks/search_sweep.py --work-dir work
    python benchmarks/search_sweep.py --work-dir work --beams 1,4,5,8 --alphas 0.6,1.0

Translates the first `--samples` pairs of the validation split with every
beam size x alpha (`search.SearchConfig`: the GNMT length penalty
`((5 + len) / 6) ** alpha`) and scores them as the run's test evaluation
does (chrF and BLEU against the single reference; for Ding also against
every accepted translation and on the full sentences alone). The setting
with the best validation chrF, and the run's own, are then scored on the
test pairs the run decoded, so that the test split is not what chooses.
Prints Markdown tables with the seconds each decode took.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work-dir", default="work")
    parser.add_argument("--beams", default="1,4,5,8", help="comma-separated beam sizes")
    parser.add_argument("--alphas", default="0.6,1.0", help="comma-separated length penalties")
    parser.add_argument("--samples", type=int, default=1000, help="first N pairs of each split")
    parser.add_argument("--ding-path", help="the Ding dictionary file (default: the system's)")
    return parser.parse_args(argv)


def _row(beam, alpha, seconds, scores):
    multi = scores.get("test_all_references", {}).get("chrf")
    sentence = scores.get("test_sentences", {}).get("chrf")
    cells = [
        str(beam), f"{alpha:g}", f"{scores['test']['chrf']:.2f}", f"{scores['test']['bleu']:.2f}",
        "-" if multi is None else f"{multi:.2f}", "-" if sentence is None else f"{sentence:.2f}",
        f"{seconds:.0f}",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| beam | alpha | chrF | BLEU | chrF, all references | chrF, sentences | seconds |\n"
    "|---:|---:|---:|---:|---:|---:|---:|"
)


def main(argv=None):
    args = parse_args(argv)
    from checkpoint_curve import evaluate, evaluation_set

    from keras_transformer.evaluation import make_translate_fn
    from keras_transformer.search import PAPER
    from keras_transformer.training import load_trained

    model, tokenizer, info = load_trained(args.work_dir)
    splits = {
        split: evaluation_set(args.work_dir, info, split, args.samples, args.ding_path)
        for split in ("validation", "test")
    }

    def run(split, beam, alpha):
        translate = make_translate_fn(model, tokenizer, PAPER.replace(beam_size=beam, alpha=alpha))
        start = time.time()
        scores = evaluate(translate, *splits[split])
        return time.time() - start, scores

    results = {}
    print(f"validation, first {args.samples} pairs")
    print(HEADER)
    for beam in (int(b) for b in args.beams.split(",")):
        for alpha in (float(a) for a in args.alphas.split(",")):
            seconds, scores = run("validation", beam, alpha)
            results[(beam, alpha)] = scores
            print(_row(beam, alpha, seconds, scores), flush=True)
    best = max(results, key=lambda key: results[key]["test"]["chrf"])
    own = (info["metrics"]["beam_size"], info["metrics"]["alpha"])
    print(f"\ntest, first {args.samples} pairs: the run's setting and validation's best")
    print(HEADER)
    rows = {}
    for beam, alpha in dict.fromkeys([own, best]):
        seconds, scores = run("test", beam, alpha)
        rows[f"{beam},{alpha:g}"] = scores
        print(_row(beam, alpha, seconds, scores), flush=True)
    with open(os.path.join(args.work_dir, "search_sweep.json"), "w") as f:
        json.dump(
            {"validation": {f"{b},{a:g}": s for (b, a), s in results.items()}, "test": rows},
            f,
            indent=2,
        )


if __name__ == "__main__":
    main()
