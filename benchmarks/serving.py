"""Serving benchmark: the SavedModel (TensorFlow) vs the ONNX graphs (ONNX Runtime), side by side.

Both exports of one model translate the same sentences in one process:
latency at batch 1 (median and p90 over `--latency-sentences` calls) and
throughput at batch 64 (sentences per second over `--throughput-batches`
batches), greedy and beam 4. Both runtimes get the same number of compute
threads (`--threads`, default 1: stable numbers on a shared 2-core machine).

    # an export written by `python train.py` (latest version):
    python benchmarks/serving.py --model-dir saved_models/transformer_de_en
    # no trained model yet: a random-weight "small" preset, exported to a temp dir
    python benchmarks/serving.py --random-preset small

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
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", help="saved_models/<name>: its newest SavedModel and ONNX")
    source.add_argument("--random-preset", help="benchmark a random-weight preset (e.g. small)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per runtime")
    parser.add_argument("--latency-sentences", type=int, default=20)
    parser.add_argument("--throughput-batches", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--corpus", default="/usr/share/trans/de-en")
    parser.add_argument("--seed", type=int, default=0)
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


def measure(translate, sentences, batch_size, latency_sentences, throughput_batches):
    """`translate(list of str) -> list of str` timed at batch 1 and at `batch_size`."""
    translate(sentences[:1])  # warm-up: function instantiation, allocator
    translate(sentences[:batch_size])
    latencies = []
    for sentence in sentences[:latency_sentences]:
        start = time.perf_counter()
        translate([sentence])
        latencies.append(time.perf_counter() - start)
    batches = [sentences[i * batch_size : (i + 1) * batch_size] for i in range(throughput_batches)]
    start = time.perf_counter()
    outputs = [t for batch in batches for t in translate(batch)]
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "latency_ms_median": 1000 * statistics.median(latencies),
        "latency_ms_p90": 1000 * latencies[int(0.9 * (len(latencies) - 1))],
        "throughput_sentences_per_s": len(outputs) / elapsed,
        "outputs": outputs,
    }


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (SentencePiece ops of the SavedModel)

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)

    from keras_transformer.onnx_translator import OnnxTranslator

    with tempfile.TemporaryDirectory() as root:
        if args.random_preset:
            model_dir = random_export(args.random_preset, args.corpus, root)
        else:
            model_dir = args.model_dir
        saved_model_dir, onnx_dir = newest(model_dir), newest(os.path.join(model_dir, "onnx"))
        loaded = tf.saved_model.load(saved_model_dir)
        onnx = OnnxTranslator(onnx_dir, intra_op_num_threads=args.threads)
        name = os.path.basename(os.path.normpath(model_dir))
        side = 1 if name.endswith("_en_de") else 0
        count = max(args.latency_sentences, args.batch_size * args.throughput_batches)
        sentences = ding_sentences(args.corpus, count, args.seed, side)

        def saved_model(signature):
            function = loaded.signatures[signature]

            def translate(batch):
                out = function(sentences=tf.constant(batch))["translations"].numpy()
                return [t.decode("utf-8") for t in out]

            return translate

        runs = {
            ("SavedModel", "greedy"): saved_model("translate_greedy"),
            ("ONNX Runtime", "greedy"): lambda batch: onnx.translate(batch, beam_size=1),
            ("SavedModel", "beam 4"): saved_model("serving_default"),
            ("ONNX Runtime", "beam 4"): lambda batch: onnx.translate(batch, beam_size=4),
        }
        results = {}
        for (runtime, search), translate in runs.items():
            results[runtime, search] = measure(
                translate, sentences, args.batch_size, args.latency_sentences,
                args.throughput_batches,
            )  # fmt: skip
            r = results[runtime, search]
            print(f"{runtime:12s} {search:6s}  batch 1: {r['latency_ms_median']:8.1f} ms median "
                  f"({r['latency_ms_p90']:.1f} p90)   batch {args.batch_size}: "
                  f"{r['throughput_sentences_per_s']:7.1f} sentences/s", flush=True)  # fmt: skip

    print(f"\nModel {name}: {onnx.config['num_layers']} layers, d_model {onnx.config['d_model']}, "
          f"vocab {onnx.config['vocab_size']}; threads per runtime: {args.threads}")  # fmt: skip
    print(
        "| search | SavedModel b=1 ms | ORT b=1 ms | ORT speed-up | SavedModel b=64 sent/s "
        "| ORT b=64 sent/s | ORT speed-up | same outputs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for search in ("greedy", "beam 4"):
        tf_r, ort_r = results["SavedModel", search], results["ONNX Runtime", search]
        latency_ratio = tf_r["latency_ms_median"] / ort_r["latency_ms_median"]
        throughput_ratio = ort_r["throughput_sentences_per_s"] / tf_r["throughput_sentences_per_s"]
        pairs = zip(tf_r["outputs"], ort_r["outputs"], strict=True)
        same = sum(a == b for a, b in pairs) / len(tf_r["outputs"])
        print(f"| {search} | {tf_r['latency_ms_median']:.1f} | {ort_r['latency_ms_median']:.1f} "
              f"| {latency_ratio:.2f}x | {tf_r['throughput_sentences_per_s']:.1f} "
              f"| {ort_r['throughput_sentences_per_s']:.1f} | {throughput_ratio:.2f}x "
              f"| {100 * same:.0f}% |")  # fmt: skip
        summary[search] = {
            "saved_model": {k: v for k, v in tf_r.items() if k != "outputs"},
            "onnxruntime": {k: v for k, v in ort_r.items() if k != "outputs"},
            "ort_latency_speedup": latency_ratio,
            "ort_throughput_speedup": throughput_ratio,
            "same_outputs": same,
        }
    print(json.dumps({"model": name, "threads": args.threads, "results": summary}))
    return summary


if __name__ == "__main__":
    main()
