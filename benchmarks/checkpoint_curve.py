"""Test chrF against training time: beam-decodes checkpoints of a finished run.

    python benchmarks/checkpoint_curve.py --work-dir work --every 3
    python benchmarks/checkpoint_curve.py --work-dir work --epochs 3,6,9 --test-samples 1000
    python benchmarks/checkpoint_curve.py --work-dir work --epochs 24,30,36 --average 3

For every chosen epoch checkpoint of `WORK/checkpoints/` (and the final,
possibly averaged `model.keras`), or the mean of it and the checkpoints
before it (`--average K`: what a run stopped there would have averaged),
translates the same first test pairs as
the run's own test evaluation (beam search as `run.json` records it) and
scores them: sacreBLEU / chrF against the single reference, for Ding also
against every accepted translation and on the full sentences alone. The
minutes of each checkpoint are read from `run.json`'s `curve` (fit's wall
clock). Prints a Markdown table and writes `WORK/checkpoint_curve.json`.

A learning curve in the units users pay for: how much test chrF another
minute of training buys, and how far a budget is from a target (docs/training.md,
"Measured: the default run").
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work-dir", default="work")
    parser.add_argument("--epochs", help="comma-separated epoch numbers (default: --every)")
    parser.add_argument("--every", type=int, default=3, help="every N-th epoch checkpoint")
    parser.add_argument(
        "--average",
        type=int,
        default=1,
        help="score the mean of each chosen checkpoint and the K-1 before it (default 1: alone)",
    )
    parser.add_argument(
        "--test-samples", type=int, help="first N test pairs (default: as the run decoded)"
    )
    parser.add_argument("--ding-path", help="the Ding dictionary file (default: the system's)")
    return parser.parse_args(argv)


def evaluate(translate, test_pairs, accepted=None, sentences=()):
    """Scores of `translate` on `test_pairs` (and, for Ding, all references and sentences)."""
    from keras_transformer.evaluation import score, score_multi

    hypotheses = translate([source for source, _ in test_pairs])
    references = [target for _, target in test_pairs]
    result = {"test": score(hypotheses, references)}
    if accepted is not None:
        result["test_all_references"] = score_multi(hypotheses, accepted)
    if sentences:
        result["test_sentences"] = score(
            [hypotheses[i] for i in sentences], [references[i] for i in sentences]
        )
    return result


def evaluation_set(work_dir, info, split="test", samples=1000, ding_path=None):
    """`(pairs, accepted, sentences)`: the first `samples` pairs of a finished run's split.

    For Ding also every accepted translation of each pair and the indices of
    its full sentences (else None and []); `samples=0`: all.
    """
    from keras_transformer.data import load_translation_data

    name = info["data"]["name"]  # "ding", a TFDS name or "folder:PATH"
    folder = name[len("folder:") :] if name.startswith("folder:") else None
    data = load_translation_data(
        "ding" if folder else name,
        data_dir=folder,
        direction=info["data"].get("direction"),
        tfds_data_dir=os.path.join(work_dir, "tfds"),
        ding_path=ding_path,
    )
    pairs = data.pairs(split, limit=samples or None)
    accepted, sentences = None, []
    if data.info["name"] == "ding":
        from keras_transformer.data import ding

        path = ding_path or ding.DEFAULT_CORPUS_PATH
        accepted = ding.accepted_references(pairs, ding.accepted_translations(path))
        sentences = [i for i, (s, t) in enumerate(pairs) if ding.is_sentence(s, t)]
    return pairs, accepted, sentences


def main(argv=None):
    args = parse_args(argv)
    if args.average < 1:
        raise SystemExit(f"--average must be >= 1. Received: --average {args.average}")
    from keras_transformer import workdir
    from keras_transformer.averaging import average_checkpoints, checkpoint_paths
    from keras_transformer.evaluation import make_translate_fn
    from keras_transformer.training import load_trained

    model, tokenizer, info = load_trained(args.work_dir)
    samples = args.test_samples if args.test_samples is not None else 1000
    test_pairs, accepted, sentences = evaluation_set(
        args.work_dir, info, "test", samples, args.ding_path
    )
    metrics = info["metrics"]
    translate = make_translate_fn(model, tokenizer, workdir.search_of(info))
    steps_per_epoch = info["training"]["steps_per_epoch"]
    minutes = {point["step"]: point["minutes"] for point in info.get("curve", [])}

    paths = checkpoint_paths(args.work_dir)
    if args.epochs:
        wanted = sorted({int(e) for e in args.epochs.split(",")})
    else:
        wanted = list(range(args.every, len(paths) + 1, args.every))
    missing = [epoch for epoch in wanted if not 1 <= epoch <= len(paths)]
    if missing:
        raise SystemExit(f"No checkpoint of epochs {missing}: the run wrote {len(paths)}.")

    rows = []
    final = evaluate(translate, test_pairs, accepted, sentences)  # model.keras first
    for epoch in wanted:
        average_checkpoints(model, paths[max(0, epoch - args.average) : epoch])
        step = epoch * steps_per_epoch
        row = {"epoch": epoch, "step": step, "minutes": minutes.get(step)}
        row["averaged"] = min(args.average, epoch)
        row.update(evaluate(translate, test_pairs, accepted, sentences))
        rows.append(row)
        print(json.dumps(row), flush=True)
    averaging = info.get("averaging") or {}
    rows.append(
        {
            "epoch": "final",
            "step": metrics["train_steps"],
            "minutes": info["timing"]["fit_seconds"] / 60,
            "averaged": averaging.get("chosen", 1),
            **final,
        }
    )
    with open(os.path.join(args.work_dir, "checkpoint_curve.json"), "w") as f:
        json.dump(rows, f, indent=2)
    beam, cpu = metrics["beam_size"], info["cpu"]["summary"]
    print(f"\n{len(test_pairs)} test pairs, beam {beam}, CPU {cpu}\n")
    print("| checkpoint | steps | minutes | chrF | BLEU | chrF, all references | chrF, sentences |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        averaged = f" (average of {row['averaged']})" if row["averaged"] > 1 else ""
        name = f"epoch {row['epoch']}" if row["epoch"] != "final" else "final"
        name += averaged
        multi = row.get("test_all_references", {}).get("chrf")
        sentence = row.get("test_sentences", {}).get("chrf")
        mins = f"{row['minutes']:.1f}" if row["minutes"] is not None else "-"
        print(
            f"| {name} | {row['step']:,} | {mins} | {row['test']['chrf']:.2f} | "
            f"{row['test']['bleu']:.2f} | {multi if multi is None else f'{multi:.2f}'} | "
            f"{sentence if sentence is None else f'{sentence:.2f}'} |"
        )


if __name__ == "__main__":
    main()
