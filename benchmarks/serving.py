"""Serving benchmark: SavedModel, translate.onnx and CTranslate2 (float32, int8) side by side.

Every export of one model translates the same sentences with greedy search
and beam 4, at batch sizes 1, 8 and 64, text in and text out. Each runtime
runs in its own worker process (onnxruntime-extensions' ops crash a process
that has imported TensorFlow; the ONNX and CTranslate2 workers show that
serving needs neither TensorFlow nor Keras); the parent alternates the
runtimes for `--rounds` rounds, each warmed up before it is timed, with the
same number of compute threads (`--threads`, default 1).

    saved_model       the SavedModel's text signatures (TensorFlow)
    onnx              translate.onnx (ONNX Runtime; search in the graph)
    onnx_int8         translate_int8.onnx: the same with int8 matrix products (per-row scales)
    ctranslate2       the CTranslate2 export, compute_type float32 (C++ search)
    ctranslate2_int8  the same, compute_type int8 (weights quantized at load)

Reported per point: sentences per second (wall clock; the median, and the
slowest and fastest round in brackets), CPU seconds of the worker per
batch (user + system, `time.process_time`: stable on a shared machine),
both medians over rounds; the share of each runtime's outputs equal to
translate.onnx's; and the chrF of each runtime on the sentences' Ding
references. With batch 1 and a larger batch: the share of sentences that
translate the same alone and inside the largest batch (what a server that
batches requests needs; `onnx_int8` and CTranslate2's int8 quantize each
row on its own; CTranslate2's beam batch runs at its longest sentence's
limit here, which can change an output too). `--test-set N` translates the
first N pairs of the fixed Ding test split instead (the pairs `train.py`
scores; 1,000 there) and adds chrF and BLEU on them and on their full
sentences: the quality cost of int8. Greedy outputs of float32 paths are
the same model's greedy search and should agree exactly; beam search
differs by design in CTranslate2 (its length penalty is length ** alpha,
the package's the paper's ((5 + length) / 6) ** alpha).

    # the newest exports in saved_models/transformer_de_en (ONNX and CTranslate2 too):
    python benchmarks/serving.py --model-dir saved_models/transformer_de_en
    # the quality of each path on the test pairs train.py scores (one round, batch 64)
    python benchmarks/serving.py --model-dir saved_models/transformer_de_en \
        --test-set 1000 --rounds 1 --batch-sizes 64
    # no trained model yet: a random-weight preset, exported to a temp dir
    python benchmarks/serving.py --random-preset cpu

With random weights no hypothesis ends early, so every sentence decodes to
its length limit (source length + 50, at most max_length) on every path:
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
RUNTIMES = ("saved_model", "onnx", "onnx_int8", "ctranslate2", "ctranslate2_int8")


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
    parser.add_argument("--test-set", type=int, default=0, metavar="N",
                        help="the first N Ding test pairs instead of random phrases")  # fmt: skip
    parser.add_argument("--corpus", default="/usr/share/trans/de-en")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runtimes", default=",".join(RUNTIMES), help="of " + ",".join(RUNTIMES))
    parser.add_argument("--worker", choices=RUNTIMES, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def ding_pairs(path, count, seed, side=0):
    """`count` distinct (phrase of 3-20 words, its Ding translation) pairs."""
    from keras_transformer.data.ding import read_entries

    pairs = sorted(
        {(pair[side], pair[1 - side]) for entry in read_entries(path) for pair in entry.pairs
         if 3 <= len(pair[side].split()) <= 20}
    )  # fmt: skip
    return random.Random(seed).sample(pairs, count)


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


def _onnx_translate(export_dir, threads, precision):
    """`translate(batch, search) -> list of str`: one translate.onnx run per batch."""
    from keras_transformer.translators.onnx_translator import OnnxTranslator

    translator = OnnxTranslator(export_dir, intra_op_num_threads=threads, precision=precision)
    return lambda batch, search: translator.run(batch, beam_size=SEARCHES[search])


def _ctranslate2_translate(export_dir, threads, compute_type):
    """`translate(batch, search) -> list of str`: one `translate_batch` call per batch."""
    from keras_transformer.translators.ctranslate2_translator import CTranslate2Translator

    translator = CTranslate2Translator(
        export_dir, batch_size=1 << 20, compute_type=compute_type, intra_threads=threads
    )
    # One call per batch, as CTranslate2 is usually run (not one per output limit).
    return lambda batch, search: translator.translate(
        batch, beam_size=SEARCHES[search], exact_limits=False
    )


def _precision(runtime):
    return "int8" if runtime.endswith("_int8") else "float32"


def test_set(corpus, count, side):
    """The first `count` pairs of the fixed Ding test split, and the indices of the full
    sentences among them (as `train.py` scores them)."""
    from keras_transformer.data import ding
    from keras_transformer.data.sources import load_translation_data

    direction = "en-de" if side else "de-en"
    pairs = load_translation_data("ding", direction=direction, ding_path=corpus).pairs(
        "test", limit=count
    )
    german = [(t, s) if side else (s, t) for s, t in pairs]
    return pairs, [i for i, (g, e) in enumerate(german) if ding.is_sentence(g, e)]


def worker(runtime, plan):
    """Times every point of `plan` once (after a warm-up) and prints the results as JSON."""
    export_dir, threads = plan["exports"][runtime], plan["threads"]
    if runtime == "saved_model":
        translate = _saved_model_translate(export_dir, threads)
    elif runtime.startswith("onnx"):
        translate = _onnx_translate(export_dir, threads, _precision(runtime))
    else:
        translate = _ctranslate2_translate(export_dir, threads, _precision(runtime))
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
        runtimes = args.runtimes.split(",")
        unknown = sorted(set(runtimes) - set(RUNTIMES))
        if unknown or "onnx" not in runtimes:
            raise SystemExit(f"--runtimes: of {RUNTIMES}, onnx included. Received: {unknown}")
        places = {"saved_model": model_dir}
        places["onnx"] = places["onnx_int8"] = os.path.join(model_dir, "onnx")
        places["ctranslate2"] = places["ctranslate2_int8"] = os.path.join(model_dir, "ctranslate2")
        exports = {runtime: newest(places[runtime]) for runtime in runtimes}
        side = 1 if name.endswith("_en_de") else 0
        sentences = []
        if args.test_set:
            pairs, sentences = test_set(args.corpus, args.test_set, side)
        else:
            pairs = ding_pairs(args.corpus, count, args.seed, side)
        plan = {
            "exports": exports,
            "threads": args.threads,
            "batch_sizes": batch_sizes,
            "sentences": [source for source, _ in pairs],
        }
        plan_path = os.path.join(root, "plan.json")
        with open(plan_path, "w") as f:
            json.dump(plan, f)
        rounds = {runtime: [] for runtime in runtimes}
        for round_index in range(args.rounds):
            for runtime in runtimes:
                rounds[runtime].append(_run_worker(runtime, plan_path))
            print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        with open(os.path.join(exports["onnx"], "config.json")) as f:
            model_config = json.load(f)["model"]
    return report(args, name, model_config, runtimes, batch_sizes, rounds, pairs, sentences)


def report(args, name, model_config, runtimes, batch_sizes, rounds, pairs, sentences=()):
    """Prints the table (sentences/s, CPU s/batch, agreement with ONNX, chrF) and its JSON."""
    import sacrebleu

    references = [reference for _, reference in pairs]
    print(f"\nModel {name}: {model_config['num_layers']} layers, "
          f"d_model {model_config['d_model']}, vocab {model_config['vocab_size']}; "
          f"threads per runtime: {args.threads}; {args.rounds} rounds, medians; "
          f"{len(references)} Ding {'test pairs' if args.test_set else 'phrases'}")  # fmt: skip
    header = ["search", "batch"] + [f"{r} sent/s" for r in runtimes]
    header += [f"{r} CPU s/batch" for r in runtimes]
    header += [f"{r} = onnx" for r in runtimes if r != "onnx"]
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * (len(header) - 1))
    summary = {}
    for search in SEARCHES:
        for batch_size in batch_sizes:
            key = f"{search}|{batch_size}"
            row = {}
            for runtime in runtimes:
                first = rounds[runtime][0][key]
                wall = statistics.median(r[key]["wall_s_per_batch"] for r in rounds[runtime])
                cpu = statistics.median(r[key]["cpu_s_per_batch"] for r in rounds[runtime])
                onnx = rounds["onnx"][0][key]["outputs"]
                same = sum(a == b for a, b in zip(first["outputs"], onnx, strict=True))
                outputs = first["outputs"]
                per_round = [batch_size / r[key]["wall_s_per_batch"] for r in rounds[runtime]]
                row[runtime] = {
                    "sentences_per_s": batch_size / wall,
                    "sentences_per_s_min_max": [min(per_round), max(per_round)],
                    "cpu_s_per_batch": cpu,
                    "same_as_onnx": same / len(onnx),
                    "chrf": sacrebleu.corpus_chrf(outputs, [references]).score,
                    "bleu": sacrebleu.corpus_bleu(outputs, [references]).score,
                }
                if sentences:
                    picked = [outputs[i] for i in sentences], [[references[i] for i in sentences]]
                    row[runtime]["sentences_chrf"] = sacrebleu.corpus_chrf(*picked).score
                    row[runtime]["sentences_bleu"] = sacrebleu.corpus_bleu(*picked).score
            summary[key] = row
            cells = [search, str(batch_size)]
            cells += [
                "{:.1f} ({:.1f}-{:.1f})".format(
                    row[r]["sentences_per_s"], *row[r]["sentences_per_s_min_max"]
                )
                for r in runtimes
            ]
            cells += [f"{row[r]['cpu_s_per_batch']:.3f}" for r in runtimes]
            cells += [f"{100 * row[r]['same_as_onnx']:.0f}%" for r in runtimes if r != "onnx"]
            print("| " + " | ".join(cells) + " |")
    print("\nchrF / BLEU on the Ding references (every batch size translates the same sentences):")
    for search in SEARCHES:
        key = f"{search}|{batch_sizes[-1]}"
        print(
            f"  {search}: "
            + ", ".join(
                f"{r} {summary[key][r]['chrf']:.2f} / {summary[key][r]['bleu']:.2f}"
                for r in runtimes
            )
        )
        if sentences:
            print(f"    its {len(sentences)} full sentences: " + ", ".join(
                f"{r} {summary[key][r]['sentences_chrf']:.2f} / "
                f"{summary[key][r]['sentences_bleu']:.2f}" for r in runtimes))  # fmt: skip
    neighbours = alone_in_batch(runtimes, batch_sizes, rounds)
    if neighbours:
        print(f"\nThe same output alone (batch 1) and in a batch of {max(batch_sizes)}:")
        for search, shares in neighbours.items():
            print(f"  {search}: " + ", ".join(f"{r} {100 * shares[r]:.0f}%" for r in runtimes))
    print(json.dumps({"model": name, "threads": args.threads, "results": summary,
                      "alone_in_batch": neighbours}))  # fmt: skip
    return summary


def alone_in_batch(runtimes, batch_sizes, rounds):
    """`{search: {runtime: share}}`: the sentences whose output at batch 1 is their output
    inside the largest batch (the first round's), per runtime; {} without both sizes."""
    if 1 not in batch_sizes or max(batch_sizes) == 1:
        return {}
    shares = {}
    for search in SEARCHES:
        shares[search] = {}
        for runtime in runtimes:
            alone = rounds[runtime][0][f"{search}|1"]["outputs"]
            batched = rounds[runtime][0][f"{search}|{max(batch_sizes)}"]["outputs"]
            shares[search][runtime] = sum(
                a == b for a, b in zip(alone, batched, strict=True)
            ) / len(alone)
    return shares


if __name__ == "__main__":
    main()
