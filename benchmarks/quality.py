"""Quality in a fixed time: `train.py` against a careful keras-hub training loop, side by side.

    python benchmarks/quality.py                      # Ding, cpu preset, 15 minutes each
    python benchmarks/quality.py --minutes 5 --no-decode
    python benchmarks/quality.py --data-dir DIR --preset tiny --vocab-size 64 --minutes 1

Runs, one after the other, each in its own process (this one never imports
TensorFlow):

1. `python train.py --work-dir OUT/keras_transformer --max-train-minutes M
   --no-export --no-test --average-last 1`: this package, as a user runs it
   but keeping its last weights, as the loop does (no checkpoint averaging
   on either side); it writes `run.json` and the shared `vocab.model`.
2. (unless `--no-decode`) this package's model, loaded with
   `training.load_trained`, translates the held-out sentences with beam 4
   (`evaluation.make_translate_fn`, alpha 0.6): for Ding, the full sentences
   of the test split (`ding.is_sentence`), in order; for other corpora every
   test pair; `--sentences N` keeps the first N. Both sides decode the
   sentences twice and time the second pass, so neither pays for tracing.
3. `benchmarks/keras_hub_loop.py` (the reference: keras-hub layers and a plain
   `tf.function` loop, nothing else of this package) on the same corpus with
   the same `vocab.model`, preset, dropout and its placement (keras-hub's
   blocks would also drop attention probabilities; they are given train.py's
   attention dropout), dtype policy, batch tokens, warm-up, seed and
   minutes, all read back from `run.json`; its learning-rate scale is its
   own (`--keras-hub-lr-scale`, default the paper's 1.0). It decodes the
   same sentences with `keras_hub.samplers.BeamSampler(num_beams=4)`.

Prints Markdown tables (throughput, validation loss at 1/3, 2/3 and 3/3 of
the budget, sacreBLEU / chrF of the held-out sentences, train.py's wall
clock) and writes them with every number and hypothesis to `OUT/quality.json`.
Logs of the three processes are in `OUT/*.log`.

What the minutes count: train.py's `--max-train-minutes` is `fit`'s wall
clock (validation and checkpoints at epoch ends included; its curve is
against the same clock); the reference pauses its clock while it measures
the validation loss, so its minutes are training-loop minutes. "End to end"
is the real target tokens each moved divided by the same budget.

Both sides run with the allocator settings train.py sets on itself
(`keras_transformer.hardware.ALLOCATOR_ENV`; `--reference-env train`, the
default), so the comparison is of the training code, not of malloc.
`--reference-env plain` runs the reference as a keras-hub user runs it
out of the box (TensorFlow's own allocators), to show what they are worth.
"""

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common  # noqa: E402

BUILDS = ("keras_transformer", "keras_hub")
FRACTIONS = (1 / 3, 2 / 3, 1.0)
THROUGHPUT = (
    "steps",
    "budget_target_tokens_per_second",
    "target_tokens_per_second",
    "tokens_per_second",
    "sentences_per_second",
)
# What a previous run of train.py left in its work dir (BackupAndRestore would resume from it).
STALE = ("backup", "checkpoints", "logs", "workers", "model.keras", "run.json", "vocab.model")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=15.0, help="training budget of each")
    parser.add_argument("--dataset", default="ding", help="'ding' or a TFDS translation dataset")
    parser.add_argument("--data-dir", help="folder of train.xx/train.yy, validation.*, test.*")
    parser.add_argument("--direction", help="e.g. de-en (default: the corpus order)")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--vocab-size", type=int, help="(default: the preset's)")
    parser.add_argument("--batch-tokens", type=int, help="(default: train.py's for the preset)")
    parser.add_argument("--warmup-steps", type=int, help="(default: train.py's for the preset)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--keras-hub-lr-scale",
        type=float,
        default=1.0,
        help="scale of the paper's learning-rate schedule in the keras-hub loop (default 1.0, "
        "the paper's; train.py uses its own preset default)",
    )
    parser.add_argument(
        "--eval-minutes", type=float, help="keras-hub loop: validation loss every this many "
        "training minutes (default: a sixth of --minutes)"
    )  # fmt: skip
    parser.add_argument(
        "--reference-env",
        choices=("plain", "train"),
        default="train",
        help="the keras-hub loop's process environment: 'train' (default), with train.py's "
        "allocator settings; 'plain', as a keras-hub user runs it (TensorFlow's allocators)",
    )
    parser.add_argument("--no-decode", dest="decode", action="store_false", help="throughput only")
    parser.add_argument("--sentences", type=int, help="decode the first N held-out sentences")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty of both")
    parser.add_argument("--train-args", default="", help="more arguments for train.py, quoted")
    parser.add_argument("--out-dir", default=os.path.join("runs", "quality"))
    parser.add_argument("--worker", choices=["decode"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- processes


def _env(process_settings=True):
    """The children's environment; with `process_settings`, train.py's allocator settings
    (`keras_transformer.hardware.ALLOCATOR_ENV`, which train.py sets on itself anyway)."""
    env = {**(_common.allocator_env() if process_settings else {}), **os.environ}
    env.update(KERAS_BACKEND="tensorflow", PYTHONUNBUFFERED="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def _run(command, log_path, timeout, process_settings=True):
    """Runs `command` from the repository root, its output in `log_path`; raises on failure."""
    print(f"$ {shlex.join(command)}\n  (log: {log_path})", file=sys.stderr, flush=True)
    start = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        result = subprocess.run(
            command,
            cwd=ROOT,
            env=_env(process_settings),
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
    if result.returncode != 0:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            tail = "".join(f.readlines()[-30:])
        raise RuntimeError(f"{command[1]} failed (rc={result.returncode}):\n{tail}")
    print(f"  done in {time.time() - start:.0f}s", file=sys.stderr, flush=True)


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _data_args(args):
    return ["--data-dir", os.path.abspath(args.data_dir)] if args.data_dir else [
        "--dataset", args.dataset
    ]  # fmt: skip


def run_train_py(args, work_dir):
    for name in STALE:
        path = os.path.join(work_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    command = [
        sys.executable, os.path.join(ROOT, "train.py"), "--work-dir", work_dir,
        "--max-train-minutes", str(args.minutes), "--no-export", "--no-test",
        # Enough epochs that the budget, not the preset's step count, ends training.
        "--epochs", "1000000", "--preset", args.preset, "--seed", str(args.seed),
        # The last weights, as the loop's: no checkpoint averaging on either side.
        "--average-last", "1",
        *_data_args(args),
    ]  # fmt: skip
    for option in ("direction", "vocab_size", "batch_tokens", "warmup_steps"):
        if getattr(args, option) is not None:
            command += ["--" + option.replace("_", "-"), str(getattr(args, option))]
    command += shlex.split(args.train_args)
    _run(command, work_dir + ".log", timeout=240 * args.minutes + 3600)
    return _read_json(os.path.join(work_dir, "run.json"))


def run_decode_worker(args, work_dir, out_dir, direction):
    command = [
        sys.executable, os.path.abspath(__file__), "--worker", "decode", "--out-dir", out_dir,
        "--beam-size", str(args.beam_size), "--alpha", str(args.alpha), *_data_args(args),
    ]  # fmt: skip
    if args.sentences:
        command += ["--sentences", str(args.sentences)]
    if direction:
        command += ["--direction", direction]
    _run(command, work_dir + "_decode.log", timeout=7200)
    return _read_json(os.path.join(work_dir, "hypotheses.json"))


def run_keras_hub_loop(args, run_info, ours_dir, work_dir, heldout_path):
    from benchmarks.keras_hub_loop import RESULT_FILE  # imports no TensorFlow

    os.makedirs(work_dir, exist_ok=True)
    result_path = os.path.join(work_dir, RESULT_FILE)
    if os.path.exists(result_path):
        os.remove(result_path)
    shutil.copy(os.path.join(ours_dir, "vocab.model"), os.path.join(work_dir, "vocab.model"))
    training = run_info["training"]
    dtype_policy = training.get("dtype_policy", "float32")
    command = [
        sys.executable, os.path.join(ROOT, "benchmarks", "keras_hub_loop.py"),
        "--work-dir", work_dir, *_data_args(args),
        "--tfds-data-dir", os.path.join(ours_dir, "tfds"),
        "--preset", run_info["preset"], "--vocab-size", str(run_info["config"]["vocab_size"]),
        "--dropout", str(run_info["config"]["dropout"]),
        # train.py's placement: keras-hub's layers would also drop attention probabilities.
        "--attention-dropout", str(run_info["config"].get("attention_dropout", 0.0)),
        "--dtype-policy", dtype_policy, "--batch-tokens", str(training["batch_tokens"]),
        "--warmup-steps", str(training["warmup_steps"]), "--lr-scale", str(args.keras_hub_lr_scale),
        "--minutes", str(args.minutes), "--seed", str(training.get("seed", args.seed)),
        "--beam-size", str(args.beam_size), "--alpha", str(args.alpha),
    ]  # fmt: skip
    direction = run_info.get("data", {}).get("direction")
    if direction:
        command += ["--direction", direction]
    if args.eval_minutes:
        command += ["--eval-minutes", str(args.eval_minutes)]
    if heldout_path:
        command += ["--decode-file", heldout_path]
    _run(
        command,
        work_dir + ".log",
        timeout=240 * args.minutes + 7200,
        process_settings=args.reference_env == "train",
    )
    return _read_json(result_path)


# --------------------------------------------------------------------------- the decode worker


def held_out_pairs(data, limit=None):
    """The test pairs both builds translate: Ding's full sentences, else every test pair."""
    if data.info["name"] == "ding":
        from keras_transformer.data.ding import is_sentence

        pairs = [(s, t) for s, t in data.pairs("test") if is_sentence(s, t)]
        selection = "Ding test split, full sentences (ding.is_sentence), in order"
    else:
        pairs = data.pairs("test")
        selection = f"{data.info['name']} test split, all pairs, in order"
    if limit:
        pairs, selection = pairs[:limit], f"{selection}, first {limit}"
    return pairs, selection


def decode_worker(args):
    """Selects the held-out sentences (`OUT/heldout.json`) and translates them with train.py's
    model (`OUT/keras_transformer/hypotheses.json`); prints one JSON line."""
    from keras_transformer.hardware import configure_threads

    configure_threads()  # before TensorFlow runs its first op
    from keras_transformer import workdir
    from keras_transformer.data import load_translation_data
    from keras_transformer.evaluation import make_translate_fn
    from keras_transformer.training import load_trained

    work_dir = os.path.join(args.out_dir, "keras_transformer")
    data = load_translation_data(
        args.dataset,
        data_dir=args.data_dir,
        direction=args.direction,
        tfds_data_dir=os.path.join(work_dir, "tfds"),
    )
    pairs, selection = held_out_pairs(data, args.sentences)
    heldout = {
        "selection": selection,
        "sources": [s for s, _ in pairs],
        "references": [t for _, t in pairs],
    }
    with open(os.path.join(args.out_dir, "heldout.json"), "w", encoding="utf-8") as f:
        json.dump(heldout, f, indent=1, ensure_ascii=False)
    model, tokenizer, info = load_trained(work_dir)
    # The run's output limit (fitted on its corpus), the benchmark's beam and alpha.
    search = workdir.search_of(info).replace(beam_size=args.beam_size, alpha=args.alpha)
    translate = make_translate_fn(model, tokenizer, search)
    translate(heldout["sources"])  # untimed, as the loop's first pass: traces excluded on both
    start = time.time()
    hypotheses = translate(heldout["sources"])
    result = {
        "decode_seconds": time.time() - start,
        "sentences": len(hypotheses),
        "params": int(model.count_params()),
    }
    with open(os.path.join(work_dir, "hypotheses.json"), "w", encoding="utf-8") as f:
        json.dump(dict(result, hypotheses=hypotheses), f, indent=1, ensure_ascii=False)
    print(json.dumps(result))


# --------------------------------------------------------------------------- results


def interpolate(curve, minutes, key="val_loss"):
    """`key` at `minutes`, linear between the curve's points; None outside them."""
    points = [p for p in curve if p.get(key) is not None and p.get("minutes") is not None]
    for left, right in zip(points, points[1:], strict=False):
        if left["minutes"] <= minutes <= right["minutes"]:
            span = right["minutes"] - left["minutes"]
            weight = (minutes - left["minutes"]) / span if span else 1.0
            return left[key] + weight * (right[key] - left[key])
    if len(points) == 1 and math.isclose(points[0]["minutes"], minutes):
        return points[0][key]
    return None


def ours_summary(run_info, decoded):
    """The numbers of train.py's run.json (keys read defensively: None when missing)."""
    metrics, training = run_info.get("metrics", {}), run_info.get("training", {})
    timing = dict(run_info.get("timing") or {})
    averaging = run_info.get("averaging") or {}
    if averaging.get("seconds") is not None:
        timing["checkpoint_averaging_seconds"] = averaging["seconds"]
    train_seconds = timing.get("train_steps_seconds", metrics.get("train_seconds"))
    return {
        "steps": metrics.get("train_steps"),
        "train_seconds": train_seconds,
        "target_tokens": _product(metrics.get("target_tokens_per_second"), train_seconds),
        "tokens": _product(metrics.get("tokens_per_second"), train_seconds),
        "target_tokens_per_second": metrics.get("target_tokens_per_second"),
        "tokens_per_second": metrics.get("tokens_per_second"),
        "sentences_per_second": metrics.get("sentences_per_second"),
        "final_val_loss": metrics.get("val_loss"),
        # Keras's val_loss weights each batch's per-token mean by its sentences;
        # train.py's averaging step measures the final weights per real token
        # (k = 1), the loop's definition.
        "token_val_loss": (averaging.get("val_loss") or {}).get("1"),
        # train.py then averages the last k checkpoints (k chosen by validation loss):
        # the model it saves, and that translates here, is the average.
        "averaged_checkpoints": averaging.get("chosen"),
        "averaged_val_loss": (averaging.get("val_loss") or {}).get(str(averaging.get("chosen"))),
        "passes_over_data": training.get("passes_over_data"),
        "padding_share": training.get("padding_share"),
        "learning_rate_scale": training.get("learning_rate_scale"),
        "warmup_steps": training.get("warmup_steps"),
        "batch_tokens": training.get("batch_tokens"),
        "dtype_policy": training.get("dtype_policy"),
        "params": decoded.get("params"),
        # Epochs without a validation pass (`--validation-every`) have val_loss None.
        "curve": [p for p in run_info.get("curve", []) if p.get("val_loss") is not None],
        "timing": timing,
        "wall_seconds": metrics.get("wall_seconds"),
        "decode_seconds": decoded.get("decode_seconds"),
        "hypotheses": decoded.get("hypotheses"),
    }


def _product(a, b):
    return a * b if a is not None and b is not None else None


def hub_summary(result):
    settings = result["settings"]
    return {
        **{
            key: result.get(key)
            for key in (
                "steps",
                "train_seconds",
                "target_tokens",
                "target_tokens_per_second",
                "tokens_per_second",
                "sentences_per_second",
                "final_val_loss",
                "passes_over_data",
                "padding_share",
                "params",
                "curve",
                "wall_seconds",
                "decode_seconds",
                "hypotheses",
            )
        },  # fmt: skip
        "token_val_loss": result.get("final_val_loss"),  # the loop's is per real token
        "learning_rate_scale": settings["learning_rate_scale"],
        "warmup_steps": settings["warmup_steps"],
        "batch_tokens": settings["batch_tokens"],
        "dtype_policy": settings["dtype_policy"],
        "timing": {
            key: result.get(key)
            for key in (
                "startup_seconds",
                "tokenize_seconds",
                "train_seconds",
                "first_step_seconds",
                "eval_seconds",
                "decode_seconds",
                "wall_seconds",
            )
        },  # fmt: skip
        "diverged": result.get("diverged"),
    }


def _fmt(value, spec=",.0f"):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)


def _ratio(ours, hub):
    return f"{ours / hub:.2f}x" if ours and hub else "n/a"


# (label, key, format spec, with the ours / keras-hub ratio) of the training table's rows.
TRAINING_ROWS = (
    ("steps", "steps", ",.0f", True),
    ("training seconds", "train_seconds", ",.1f", False),
    (
        "real target tokens per second of the budget (end to end)",
        "budget_target_tokens_per_second",
        ",.0f",
        True,
    ),
    (
        "real target tokens per second of training steps",
        "target_tokens_per_second",
        ",.0f",
        True,
    ),
    (
        "real source+target tokens per second of training steps",
        "tokens_per_second",
        ",.0f",
        True,
    ),
    ("sentences/s", "sentences_per_second", ",.1f", True),
    (
        "final validation loss per real token (one definition for both)",
        "token_val_loss",
        ".3f",
        False,
    ),
    ("final validation loss as logged (see below)", "final_val_loss", ".3f", False),
    ("validation loss after checkpoint averaging", "averaged_val_loss", ".3f", False),
    ("checkpoints averaged", "averaged_checkpoints", ",.0f", False),
    ("passes over the training data", "passes_over_data", ".2f", False),
    ("padding share", "padding_share", ".1%", False),
    ("parameters", "params", ",.0f", False),
    ("learning-rate scale", "learning_rate_scale", "g", False),
    ("warm-up steps", "warmup_steps", ",.0f", False),
    ("batch tokens", "batch_tokens", ",.0f", False),
)


def _training_table(report, ours, hub):
    """The header lines and the table of throughput, losses and settings, side by side."""
    lines = [
        f"CPU: {report['cpu']}",
        f"Command: `{report['command']}`",
        "",
        f"Training, {report['minutes']:g} minutes each ({report['corpus']}); the keras-hub "
        f"loop's process environment: {report.get('reference_env', 'train')} "
        "(`--reference-env`):",
        "",
        "| | keras_transformer (train.py) | keras-hub loop | ours / keras-hub |",
        "|---|---:|---:|---:|",
    ]
    for label, key, spec, ratio in TRAINING_ROWS:
        lines.append(
            f"| {label} | {_fmt(ours.get(key), spec)} | {_fmt(hub.get(key), spec)} | "
            f"{_ratio(ours.get(key), hub.get(key)) if ratio else ''} |"
        )
    lines.append(f"| dtype policy | {ours.get('dtype_policy')} | {hub.get('dtype_policy')} | |")
    return lines


def _curve_table(report):
    """The validation loss of both builds at the report's minutes and at the end."""
    lines = [
        "",
        "Validation loss (label-smoothed, whole validation split) at matching minutes "
        "(interpolated; step in parentheses). As each build logs it: train.py's is "
        "Keras's `val_loss`, the mean of each batch's per-token loss weighted by the "
        "batch's rows (a packed row holds several sentences); the loop's is per real "
        "token. Compare curves within a build; across builds, the per-token row above:",
        "",
        "| minutes | keras_transformer | keras-hub loop |",
        "|---:|---:|---:|",
    ]
    for point in report["curve_at"]:
        cells = [
            f"{_fmt(point[name]['val_loss'], '.3f')} ({_fmt(point[name]['step'], ',.0f')})"
            for name in BUILDS
        ]
        lines.append(f"| {point['minutes']:.2f} | {cells[0]} | {cells[1]} |")
    ends = [report["builds"][name]["curve"][-1:] for name in BUILDS]
    cells = [
        f"{_fmt(end[0]['val_loss'], '.3f')} ({_fmt(end[0]['step'], ',.0f')}, "
        f"at {_fmt(end[0]['minutes'], '.2f')})"
        if end
        else "n/a"
        for end in ends
    ]
    lines.append(f"| end of training | {cells[0]} | {cells[1]} |")
    return lines


def _heldout_table(report, ours, hub):
    """sacreBLEU, chrF and decoding seconds of the held-out sentences (none without)."""
    heldout = report.get("heldout")
    if not heldout:
        return []
    return [
        "",
        f"Held-out translation: {heldout['count']} sentences ({heldout['selection']}), "
        f"beam {report['beam_size']}, alpha {report['alpha']}:",
        "",
        "| | keras_transformer | keras-hub loop |",
        "|---|---:|---:|",
        f"| sacreBLEU | {_fmt(ours.get('bleu'), '.2f')} | {_fmt(hub.get('bleu'), '.2f')} |",
        f"| chrF | {_fmt(ours.get('chrf'), '.2f')} | {_fmt(hub.get('chrf'), '.2f')} |",
        f"| decoding seconds | {_fmt(ours.get('decode_seconds'), ',.1f')} | "
        f"{_fmt(hub.get('decode_seconds'), ',.1f')} |",
    ]


def _wall_clock_tables(report):
    """Each build's wall clock by phase, with each phase's share of the whole."""
    lines = []
    for name, title in (("keras_transformer", "train.py"), ("keras_hub", "keras-hub loop")):
        timing = report["builds"][name].get("timing") or {}
        wall = timing.get("wall_seconds") or report["builds"][name].get("wall_seconds")
        lines += ["", f"Wall clock of {title} (seconds):", "", "| phase | seconds | share |"]
        lines.append("|---|---:|---:|")
        if not timing:
            lines.append("| n/a | n/a | |")
        for key, value in timing.items():
            share = _fmt(value / wall, ".0%") if wall and isinstance(value, int | float) else ""
            lines.append(f"| {key.removesuffix('_seconds')} | {_fmt(value, ',.1f')} | {share} |")
        if "wall_seconds" not in timing and wall:
            lines.append(f"| wall | {_fmt(wall, ',.1f')} | 100% |")
    return lines


def tables(report):
    """The Markdown tables of `quality.json`'s report."""
    ours, hub = (report["builds"][name] for name in BUILDS)
    lines = _training_table(report, ours, hub)
    lines += _curve_table(report)
    lines += _heldout_table(report, ours, hub)
    lines += _wall_clock_tables(report)
    return "\n".join(lines)


def build_report(args, run_info, hub_result, decoded, heldout):
    builds = {
        "keras_transformer": ours_summary(run_info, decoded),
        "keras_hub": hub_summary(hub_result),
    }
    ours, hub = builds["keras_transformer"], builds["keras_hub"]
    # End to end: what each moved in the same minutes (train.py's are fit's wall
    # clock, validation and checkpoints included; the reference's its loop's).
    for build in builds.values():
        tokens = build.get("target_tokens")
        build["budget_target_tokens_per_second"] = (
            tokens / (60.0 * args.minutes) if tokens is not None else None
        )
    if heldout:
        import sacrebleu

        for build in builds.values():
            hypotheses = build["hypotheses"]
            build["bleu"] = sacrebleu.corpus_bleu(hypotheses, [heldout["references"]]).score
            build["chrf"] = sacrebleu.corpus_chrf(hypotheses, [heldout["references"]]).score
    if hub_result.get("config") != run_info.get("config"):
        print(
            f"WARNING: the keras-hub loop's config {hub_result.get('config')} differs from "
            f"train.py's {run_info.get('config')}",
            file=sys.stderr,
        )
    cpu = run_info.get("cpu") or {}
    corpus = run_info.get("data", {}).get("name", args.data_dir or args.dataset)
    return {
        "command": shlex.join(["python", *sys.argv]),
        "cpu": cpu.get("summary") or cpu.get("model") or "n/a",
        "cpu_details": cpu,
        "corpus": corpus,
        "minutes": args.minutes,
        "reference_env": args.reference_env,
        "beam_size": args.beam_size,
        "alpha": args.alpha,
        "builds": builds,
        "ratios": {
            key: ours[key] / hub[key] if ours[key] and hub[key] else None for key in THROUGHPUT
        },
        "curve_at": [
            {
                "minutes": fraction * args.minutes,
                **{
                    name: {
                        key: interpolate(build["curve"], fraction * args.minutes, key)
                        for key in ("val_loss", "step")
                    }
                    for name, build in builds.items()
                },
            }
            for fraction in FRACTIONS
        ],
        "heldout": dict(heldout, count=len(heldout["sources"])) if heldout else None,
        "train_py_run": run_info,
    }


def main(argv=None):
    args = parse_args(argv)
    out_dir = os.path.abspath(args.out_dir)
    if args.worker == "decode":
        return decode_worker(args)
    os.makedirs(out_dir, exist_ok=True)
    ours_dir = os.path.join(out_dir, "keras_transformer")
    hub_dir = os.path.join(out_dir, "keras_hub")
    heldout_path = os.path.join(out_dir, "heldout.json")
    run_info = run_train_py(args, ours_dir)
    decoded, heldout = {}, None
    if args.decode:
        decoded = run_decode_worker(
            args, ours_dir, out_dir, run_info.get("data", {}).get("direction")
        )
        heldout = _read_json(heldout_path)
    hub_result = run_keras_hub_loop(
        args, run_info, ours_dir, hub_dir, heldout_path if args.decode else None
    )
    report = build_report(args, run_info, hub_result, decoded, heldout)
    report["tables"] = tables(report)
    with open(os.path.join(out_dir, "quality.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    print(report["tables"])


if __name__ == "__main__":
    main()
