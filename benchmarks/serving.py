"""Serving benchmark: the SavedModel (TensorFlow) vs translate.onnx (ONNX Runtime), side by side.

Both exports of one model translate the same sentences with greedy search
and beam 4, at batch sizes 1, 8 and 64, text in and text out (tokenizer,
search and detokenizer inside each graph). Each runtime runs in its own
worker process (onnxruntime-extensions' ops crash a process that has
imported TensorFlow, and the ONNX worker shows that serving needs neither
TensorFlow nor Keras); the parent alternates the two for `--rounds`
rounds, each warmed up before it is timed, with the same number of
compute threads (`--threads`, default 1).

Reported per point: CPU seconds of the worker per batch (user + system,
`time.process_time`: what the work costs, and stable on a shared machine
where wall time also measures the neighbours), wall seconds per batch,
both as the median over rounds, and whether the two runtimes gave the
same translations.

    # an export written by `python train.py` (its newest versions):
    python benchmarks/serving.py --model-dir saved_models/transformer_de_en
    # no trained model yet: a random-weight preset, exported to a temp dir
    python benchmarks/serving.py --random-preset cpu

With random weights no hypothesis ends early, so every sentence decodes to
its length limit (source length + 50, at most max_length) on both paths:
the comparison is per decoding step, not a forecast of a trained model's
latency. Sentences are German phrases of the Ding dictionary (3-20 words).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SEARCHES = {"greedy": 1, "beam 4": 4}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", help="saved_models/<name>: its newest SavedModel and ONNX")
    source.add_argument("--random-preset", help="benchmark a random-weight preset (e.g. cpu)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per runtime")
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--sentences", type=int, default=64,
                        help="sentences per point and round (at least one batch)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", default="/usr/share/trans/de-en")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", choices=("saved_model", "onnx"), help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def ding_sentences(path, count, seed, side=0):
    """`count` distinct phrases of 3-20 words from one side of the Ding dictionary."""
    from keras_transformer.data.ding import read_entries

    phrases = sorted(
        {pair[side] for entry in read_entries(path) for pair in entry.pairs
         if 3 <= len(pair[side].split()) <= 20}
    )  # fmt: skip
    return random.Random(seed).sample(phrases, count)


def random_export(preset, corpus, root):
    """A random-weight preset with a SentencePiece vocabulary of the corpus, exported to `root`."""
    import dataclasses

    import sentencepiece as spm

    from keras_transformer import Transformer, get_preset
    from keras_transformer.export import export_all

    work_dir = os.path.join(root, "work")
    os.makedirs(work_dir)
    config = get_preset(preset)
    text = ding_sentences(corpus, 40_000, seed=1) + ding_sentences(corpus, 40_000, 1, side=1)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_prefix=os.path.join(work_dir, "vocab"),
        vocab_size=config.vocab_size, model_type="bpe", pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        minloglevel=2,
    )  # fmt: skip
    model = Transformer(**dataclasses.asdict(dataclasses.replace(config, dropout=0.0)))
    model.build()
    model.save(os.path.join(work_dir, "model.keras"))
    with open(os.path.join(work_dir, "run.json"), "w") as f:
        info = {"config": dataclasses.asdict(config), "metrics": {"random_weights": True}}
        json.dump(info, f)
    return os.path.dirname(export_all(work_dir, os.path.join(root, "saved_models"))["saved_model"])


def newest(directory):
    versions = [int(n) for n in os.listdir(directory) if n.isdigit()]
    if not versions:
        raise FileNotFoundError(f"No version directories in {directory}")
    return os.path.join(directory, str(max(versions)))


def _saved_model_translate(export_dir, threads):
    """`translate(batch, search) -> list of str` with the SavedModel's text signatures."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (SentencePiece ops of the SavedModel)

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    loaded = tf.saved_model.load(export_dir)
    signatures = {"greedy": "translate_greedy", "beam 4": "serving_default"}

    def translate(batch, search):
        function = loaded.signatures[signatures[search]]
        out = function(sentences=tf.constant(batch))["translations"].numpy()
        return [t.decode("utf-8") for t in out]

    translate.keep = loaded  # the variables live as long as the function
    return translate


def _onnx_translate(export_dir, threads):
    """`translate(batch, search) -> list of str`: one translate.onnx run per batch."""
    from keras_transformer.onnx_translator import OnnxTranslator

    translator = OnnxTranslator(export_dir, intra_op_num_threads=threads)
    return lambda batch, search: translator.run(batch, beam_size=SEARCHES[search])


def worker(runtime, plan):
    """Times every point of `plan` once (after a warm-up) and prints the results as JSON."""
    make = _saved_model_translate if runtime == "saved_model" else _onnx_translate
    translate = make(plan["exports"][runtime], plan["threads"])
    results = {}
    for search in SEARCHES:
        for batch_size in plan["batch_sizes"]:
            sentences = plan["sentences"]
            batches = [sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size)]
            translate(batches[0], search)  # warm-up: graph instantiation, allocator
            outputs = []
            wall, cpu = time.perf_counter(), time.process_time()
            for batch in batches:
                outputs += translate(batch, search)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            results[f"{search}|{batch_size}"] = {
                "cpu_s_per_batch": cpu / len(batches),
                "wall_s_per_batch": wall / len(batches),
                "outputs": outputs,
            }
    print("RESULTS" + json.dumps(results))


def _run_worker(runtime, plan_path):
    command = [sys.executable, os.path.abspath(__file__), "--random-preset", "unused",
               "--worker", runtime, "--plan", plan_path]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{runtime} worker failed:\n{completed.stderr[-3000:]}")
    line = [x for x in completed.stdout.splitlines() if x.startswith("RESULTS")][-1]
    return json.loads(line[len("RESULTS") :])


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        with open(args.plan) as f:
            return worker(args.worker, json.load(f))
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    count = max(args.sentences, max(batch_sizes))
    with tempfile.TemporaryDirectory() as root:
        if args.random_preset:
            model_dir = random_export(args.random_preset, args.corpus, root)
        else:
            model_dir = args.model_dir
        name = os.path.basename(os.path.normpath(model_dir))
        onnx_dir = newest(os.path.join(model_dir, "onnx"))
        exports = {"saved_model": newest(model_dir), "onnx": onnx_dir}
        side = 1 if name.endswith("_en_de") else 0
        plan = {
            "exports": exports,
            "threads": args.threads,
            "batch_sizes": batch_sizes,
            "sentences": ding_sentences(args.corpus, count, args.seed, side),
        }
        plan_path = os.path.join(root, "plan.json")
        with open(plan_path, "w") as f:
            json.dump(plan, f)
        rounds = {"saved_model": [], "onnx": []}
        for round_index in range(args.rounds):
            for runtime in ("saved_model", "onnx"):
                rounds[runtime].append(_run_worker(runtime, plan_path))
            print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        with open(os.path.join(exports["onnx"], "config.json")) as f:
            model_config = json.load(f)["model"]

    print(f"\nModel {name}: {model_config['num_layers']} layers, "
          f"d_model {model_config['d_model']}, vocab {model_config['vocab_size']}; "
          f"threads per runtime: {args.threads}; "
          f"{args.rounds} rounds, medians")  # fmt: skip
    print(
        "| search | batch | SavedModel CPU s/batch | ONNX CPU s/batch | ONNX speed-up (CPU) "
        "| SavedModel wall s/batch | ONNX wall s/batch | ONNX speed-up (wall) | same outputs |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = {}
    for search in SEARCHES:
        for batch_size in batch_sizes:
            key = f"{search}|{batch_size}"
            row = {}
            for runtime in rounds:
                for clock in ("cpu", "wall"):
                    times = [r[key][f"{clock}_s_per_batch"] for r in rounds[runtime]]
                    row[f"{runtime}_{clock}_s"] = statistics.median(times)
            pairs = zip(rounds["saved_model"][0][key]["outputs"], rounds["onnx"][0][key]["outputs"],
                        strict=True)  # fmt: skip
            same = [a == b for a, b in pairs]
            row["same_outputs"] = sum(same) / len(same)
            row["speedup_cpu"] = row["saved_model_cpu_s"] / row["onnx_cpu_s"]
            row["speedup_wall"] = row["saved_model_wall_s"] / row["onnx_wall_s"]
            summary[key] = row
            print(f"| {search} | {batch_size} | {row['saved_model_cpu_s']:.3f} "
                  f"| {row['onnx_cpu_s']:.3f} | {row['speedup_cpu']:.2f}x "
                  f"| {row['saved_model_wall_s']:.3f} | {row['onnx_wall_s']:.3f} "
                  f"| {row['speedup_wall']:.2f}x | {100 * row['same_outputs']:.0f}% |")  # fmt: skip
    print(json.dumps({"model": name, "threads": args.threads, "results": summary}))
    return summary


if __name__ == "__main__":
    main()
