"""Beam size, length penalty and stopping rule of a finished run, chosen on validation,
reported on test.

    python benchmarks/search_sweep.py --work-dir work
    python benchmarks/search_sweep.py --work-dir work --beams 4 --alphas 0.6,1.0,1.5 \
        --stoppings bound,k_finished --patiences 1,1.5,2

Translates the first `--samples` pairs of the validation split with every
beam size x alpha x stopping rule (x patience, for `k_finished`)
(`search.SearchConfig`: the GNMT length penalty `((5 + len) / 6) ** alpha`),
each with the run's own output limit, and scores them as the run's test evaluation
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
    parser.add_argument("--stoppings", default="bound", help="comma-separated stopping rules")
    parser.add_argument("--patiences", default="1", help="comma-separated, for k_finished")
    parser.add_argument("--samples", type=int, default=1000, help="first N pairs of each split")
    parser.add_argument("--ding-path", help="the Ding dictionary file (default: the system's)")
    return parser.parse_args(argv)


def _row(search, seconds, scores):
    multi = scores.get("test_all_references", {}).get("chrf")
    sentence = scores.get("test_sentences", {}).get("chrf")
    cells = [
        str(search.beam_size), f"{search.alpha:g}", _rule(search),
        f"{scores['test']['chrf']:.2f}", f"{scores['test']['bleu']:.2f}",
        "-" if multi is None else f"{multi:.2f}", "-" if sentence is None else f"{sentence:.2f}",
        f"{seconds:.1f}",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _rule(search):
    if search.beam_size == 1:
        return "-"
    if search.stopping == "k_finished":
        return f"k_finished, patience {search.patience:g}"
    return search.stopping


HEADER = (
    "| beam | alpha | stopping | chrF | BLEU | chrF, all references | chrF, sentences | seconds |\n"
    "|---:|---:|---|---:|---:|---:|---:|---:|"
)


def main(argv=None):
    args = parse_args(argv)
    from checkpoint_curve import evaluate, evaluation_set

    from keras_transformer import workdir
    from keras_transformer.evaluation import make_translate_fn
    from keras_transformer.training import load_trained

    model, tokenizer, info = load_trained(args.work_dir)
    splits = {
        split: evaluation_set(args.work_dir, info, split, args.samples, args.ding_path)
        for split in ("validation", "test")
    }

    def run(split, search):
        translate = make_translate_fn(model, tokenizer, search)
        start = time.time()
        scores = evaluate(translate, *splits[split])
        return time.time() - start, scores

    # Every setting keeps the run's output limit (`length_ratio`,
    # `max_extra_length`, fitted on its corpus): only what the sweep names varies.
    own = workdir.search_of(info)
    settings = []
    for beam in (int(b) for b in args.beams.split(",")):
        for alpha in (float(a) for a in args.alphas.split(",")):
            for stopping in args.stoppings.split(","):
                for patience in (float(p) for p in args.patiences.split(",")):
                    search = own.replace(
                        beam_size=beam, alpha=alpha, stopping=stopping, patience=patience
                    )
                    if (beam == 1 or stopping == "bound") and patience != 1.0:
                        continue  # patience changes nothing there
                    if beam == 1 and stopping != args.stoppings.split(",")[0]:
                        continue  # greedy has no stopping rule
                    settings.append(search)
    results = {}
    print(f"validation, first {args.samples} pairs")
    print(HEADER)
    for search in settings:
        seconds, scores = run("validation", search)
        results[search] = scores
        print(_row(search, seconds, scores), flush=True)
    best = max(results, key=lambda key: results[key]["test"]["chrf"])
    print(f"\ntest, first {args.samples} pairs: the run's setting and validation's best")
    print(HEADER)
    rows = {}
    for search in dict.fromkeys([own, best]):
        seconds, scores = run("test", search)
        rows[_key(search)] = scores
        print(_row(search, seconds, scores), flush=True)
    with open(os.path.join(args.work_dir, "search_sweep.json"), "w") as f:
        json.dump(
            {"validation": {_key(s): r for s, r in results.items()}, "test": rows}, f, indent=2
        )


def _key(search):
    """`"beam,alpha"`, and `",k_finished,patience"` where that rule is used."""
    key = f"{search.beam_size},{search.alpha:g}"
    if search.beam_size > 1 and search.stopping == "k_finished":
        key += f",k_finished,{search.patience:g}"
    return key


if __name__ == "__main__":
    main()
