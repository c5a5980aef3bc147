"""`train.py` under process-level settings (environment variables), side by side.

    python benchmarks/process_env.py --minutes 2 --rounds 2 \\
        --variant default: --variant bfc:TF_CPU_ALLOCATOR_USE_BFC=true

Each variant is `name:VAR=value,VAR=value` (nothing after the colon: train.py
as users run it). Every round runs every variant once, one after the other
(the order alternates between rounds), as

    train.py --work-dir OUT/<name>-<round> --max-train-minutes M --no-test \\
        --no-export --average-last 1 [--data-dir DIR] [--preset P]

with the same vocabulary (`--vocab`, copied into each work dir, so no
variant trains one) and seed. It prints one Markdown table: steps in the
budget, steps per second of step time (`run.json` `timing`, the first
step, which traces, left out), user and
kernel CPU seconds of the whole process and its minor page faults (from
`wait4`), with the ratio of each variant's steps/s to the first's. Run it
with nothing else on the machine.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_variant(text):
    name, _, assignments = text.partition(":")
    env = {}
    for item in filter(None, assignments.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{item!r} in --variant {text!r} is not VAR=value")
        env[key] = value
    if not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r} has no name before ':'")
    return name, env


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", action="append", type=parse_variant, required=True)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--vocab", help="vocab.model to reuse (default: trained by round 1)")
    parser.add_argument("--out-dir", default="runs/process_env")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--data-dir")
    parser.add_argument("train_args", nargs="*", help="more train.py options, after --")
    return parser.parse_args(argv)


def run_variant(args, name, env, work_dir):
    os.makedirs(work_dir, exist_ok=True)
    if args.vocab:
        shutil.copyfile(args.vocab, os.path.join(work_dir, "vocab.model"))
    command = [
        sys.executable, os.path.join(ROOT, "train.py"), "--work-dir", work_dir,
        "--preset", args.preset, "--max-train-minutes", str(args.minutes),
        "--no-test", "--no-export", "--average-last", "1", *args.train_args,
    ]  # fmt: skip
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    start = time.perf_counter()
    with open(os.path.join(work_dir, "train.log"), "w") as log:
        process = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(process.pid, 0)
    if status:
        raise RuntimeError(f"{name}: train.py failed; see {work_dir}/train.log")
    with open(os.path.join(work_dir, "run.json")) as f:
        run = json.load(f)
    timing = run["timing"]
    steps = run["metrics"]["train_steps"]
    step_seconds = timing["train_steps_seconds"] - timing["first_step_seconds"]
    return {
        "variant": name,
        "env": env,
        "steps": steps,
        "steps_per_second": (steps - 1) / step_seconds,  # the first step traces
        "fit_seconds": timing["fit_seconds"],
        "user_seconds": usage.ru_utime,
        "system_seconds": usage.ru_stime,
        "minor_faults": usage.ru_minflt,
        "wall_seconds": time.perf_counter() - start,
        "cpu": run["cpu"]["summary"],
    }


def main(argv=None):
    args = parse_args(argv)
    results = []
    for round_index in range(args.rounds):
        variants = args.variant if round_index % 2 == 0 else args.variant[::-1]
        for name, env in variants:
            work_dir = os.path.join(args.out_dir, f"{name}-{round_index}")
            shutil.rmtree(work_dir, ignore_errors=True)
            result = run_variant(args, name, env, work_dir)
            if not args.vocab:  # the first run's vocabulary serves the others
                args.vocab = os.path.join(work_dir, "vocab.model")
            print(json.dumps(result), flush=True)
            results.append(result)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    first = args.variant[0][0]
    reference = [r["steps_per_second"] for r in results if r["variant"] == first]
    baseline = sum(reference) / len(reference)
    print(f"\nCPU: {results[0]['cpu']}; {args.minutes:g}-minute budgets, preset {args.preset}\n")
    print("| variant | round | steps | steps/s | vs " + first + " | user s | kernel s | "
          "kernel share | minor faults |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(results):
        cpu = r["user_seconds"] + r["system_seconds"]
        print(
            f"| {r['variant']} | {i // len(args.variant)} | {r['steps']} | "
            f"{r['steps_per_second']:.3f} | {r['steps_per_second'] / baseline:.2f}x | "
            f"{r['user_seconds']:.0f} | {r['system_seconds']:.0f} | "
            f"{r['system_seconds'] / cpu:.0%} | {r['minor_faults']:,} |"
        )


if __name__ == "__main__":
    main()
