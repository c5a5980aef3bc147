"""A glossary on every path: term accuracy, chrF and speed of each steering mode.

Issue 57's measurement. A glossary made from the Ding dictionary and a test set of
the held-out Ding test pairs that hold one of its terms, then each mode on each
path of one trained model:

    python benchmarks/glossary.py prepare --out DIR
    python train.py --work-dir TERM --terminology DIR/train_glossary.tsv --no-export
    python -m keras_transformer.export --work-dir TERM --output-dir EXPORTS --name term
    python benchmarks/glossary.py run --work-dir TERM --export-dir EXPORTS/term \\
        --glossary-dir DIR --out results.jsonl [--plain-work-dir PLAIN]
    python benchmarks/glossary.py report results.jsonl

`prepare` writes
    train_glossary.tsv  every one-word noun entry of the Ding training split (a German
                        word written with a capital, 4+ letters; a lower-case English
                        word of 3+ letters), every sense, in file order: the termbase
                        of `--terminology` (annotation takes the first sense whose
                        translation is in the pair's target)
    test.jsonl          test items: the held-out Ding test pairs of 2 or more German
                        words holding one of those terms whose English reference holds
                        the term's glossary translation (Dinu et al., 2019, built their
                        test sets the same way), one term per item
    test_glossary.tsv   one translation per term (the one most items' references hold;
                        items whose reference holds another are left out), given per
                        call as a customer's glossary would be

`run` translates the test items with each mode on each path, beam 4 (the export's
search), one thread per runtime, each path in its own process (ONNX Runtime's
SentencePiece ops cannot share one with TensorFlow), one after the other:

    keras        Translator.translate: none | soft (glossary=) | hard (constraints=
                 the term's translation: dynamic beam allocation, Keras only) |
                 soft+hard
    saved_model  the SavedModel's serving_default after `terminology.annotate_all`
                 (what the server does): none | soft
    onnx         OnnxTranslator (translate.onnx): none | soft
    onnx_int8    OnnxTranslator(precision="int8"): none | soft
    ctranslate2  CTranslate2Translator (float32): none | soft

and with `--plain-work-dir` (a model trained without --terminology) Keras none | hard.
Per row: term accuracy (the share of outputs holding the term's translation as a
word, casefolded), chrF and BLEU against the pair's own reference (sacrebleu), and
the CPU seconds per sentence (`time.process_time`, best of `--rounds` after a
warm-up) at batch 64 (all items) and batch 1 (the first 32). The CTranslate2 path
is `CTranslate2Translator.translate` as users call it: one `translate_batch` per
output limit within a batch (`exact_limits=True`).
"""

import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_WORD = re.compile(r"^\w+$")
_GERMAN_NOUN = re.compile(r"^[A-ZÄÖÜ][a-zäöüß]{3,}$")
_ENGLISH_WORD = re.compile(r"^[a-z]{3,}$")


def holds(text, term):
    """Whether `term` occurs in `text` as a word (or words), casefolded."""
    return re.search(rf"(?<!\w){re.escape(term.casefold())}(?!\w)", text.casefold()) is not None


def glossary_entries(train_pairs):
    """`[(german, english)]`: the one-word noun entries of the training pairs, every
    sense, in order, without repeats."""
    entries = (
        (german, english)
        for german, english in train_pairs
        if _GERMAN_NOUN.match(german) and _ENGLISH_WORD.match(english)
    )
    return list(dict.fromkeys(entries))


def test_items(test_pairs, entries, limit):
    """`(items, glossary)`: the test pairs of 2+ words holding a term whose reference
    holds its translation, and the one translation per term they were chosen by."""
    senses = collections.defaultdict(list)
    for german, english in entries:
        senses[german.casefold()].append(english)
    candidates = []
    for german, english in test_pairs:
        words = re.findall(r"\w+", german)
        if len(words) < 2:
            continue
        for word in words:
            found = [e for e in senses.get(word.casefold(), ()) if holds(english, e)]
            if found:
                candidates.append((german, english, word, found))
                break
    votes = collections.Counter((w.casefold(), e) for _, _, w, found in candidates for e in found)
    chosen = {}
    for (term, english), _ in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0])):
        chosen.setdefault(term, english)
    items = [
        {
            "source": german,
            "reference": english,
            "term": word,
            "translation": chosen[word.casefold()],
        }  # fmt: skip
        for german, english, word, found in candidates
        if chosen[word.casefold()] in found
    ][:limit]
    used = {item["term"].casefold() for item in items}
    glossary = sorted((term, english) for term, english in chosen.items() if term in used)
    return items, glossary


def prepare(out, limit):
    from keras_transformer.data import ding

    splits, _ = ding.load_ding_splits()
    entries = glossary_entries(splits["train"])
    items, glossary = test_items(splits["test"], entries, limit)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "train_glossary.tsv"), "w", encoding="utf-8") as f:
        f.writelines(f"{german}\t{english}\n" for german, english in entries)
    with open(os.path.join(out, "test_glossary.tsv"), "w", encoding="utf-8") as f:
        f.writelines(f"{german}\t{english}\n" for german, english in glossary)
    with open(os.path.join(out, "test.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
    print(json.dumps({"train_glossary": len(entries), "test_items": len(items),
                      "test_glossary": len(glossary)}))  # fmt: skip


def _newest(directory):
    versions = [int(n) for n in os.listdir(directory) if n.isdigit()]
    if not versions:
        raise FileNotFoundError(f"No version folders in {directory}")
    return os.path.join(directory, str(max(versions)))


SOFT, HARD = {"glossary": True}, {"constraints": True}
# Each path, the modes it runs, and whether its process imports TensorFlow (ONNX
# Runtime's SentencePiece ops cannot share a process with it: one process per path).
PATHS = {
    "keras": {"none": {}, "soft": SOFT, "hard": HARD, "soft+hard": {**SOFT, **HARD}},
    "keras, plain model": {"none": {}, "hard": HARD},
    "saved_model": {"none": {}, "soft": SOFT},
    "onnx": {"none": {}, "soft": SOFT},
    "onnx_int8": {"none": {}, "soft": SOFT},
    "ctranslate2": {"none": {}, "soft": SOFT},
}


def _translate_function(path, work_dir, export_dir, plain_work_dir):
    """`translate(sources, glossary=None, constraints=None)` of one path, one thread."""
    if path in ("onnx", "onnx_int8"):
        from keras_transformer.translators.onnx_translator import OnnxTranslator

        precision = "int8" if path == "onnx_int8" else "float32"
        onnx_dir = _newest(os.path.join(export_dir, "onnx"))
        return OnnxTranslator(onnx_dir, precision=precision, intra_op_num_threads=1,
                              batch_size=64).translate  # fmt: skip
    if path == "ctranslate2":
        from keras_transformer.translators.ctranslate2_translator import CTranslate2Translator

        directory = _newest(os.path.join(export_dir, "ctranslate2"))
        return CTranslate2Translator(directory, intra_threads=1, batch_size=64).translate
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if path.startswith("keras"):
        from keras_transformer.translators.keras_translator import Translator

        directory = plain_work_dir if path == "keras, plain model" else work_dir
        return Translator.load(directory, batch_size=64).translate
    import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)

    from keras_transformer import terminology

    signature = tf.saved_model.load(_newest(export_dir)).signatures["serving_default"]

    def saved_model(sources, glossary=None):  # what the server does before the graph
        sources = tf.constant(terminology.annotate_all(sources, glossary))
        return [t.decode() for t in signature(sentences=sources)["translations"].numpy()]

    return saved_model


def _call(translate, sources, items, options, glossary, batch_size):
    """`translate` of `sources` in batches of `batch_size` with `options` made concrete."""
    kwargs = {}
    if options.get("glossary"):
        kwargs["glossary"] = glossary
    outputs = []
    for start in range(0, len(sources), batch_size):
        if options.get("constraints"):
            batch = items[start : start + batch_size]
            kwargs["constraints"] = [[item["translation"]] for item in batch]
        outputs += translate(sources[start : start + batch_size], **kwargs)
    return outputs


def worker(args):
    """Runs one path's modes (`args.path`) and prints one JSON line per mode."""
    import sacrebleu

    from benchmarks.steering import timed
    from keras_transformer import terminology

    with open(os.path.join(args.glossary_dir, "test.jsonl"), encoding="utf-8") as f:
        items = [json.loads(line) for line in f]
    glossary = terminology.load_glossary(os.path.join(args.glossary_dir, "test_glossary.tsv"))
    sources = [item["source"] for item in items]
    references = [item["reference"] for item in items]
    translate = _translate_function(args.path, args.work_dir, args.export_dir,
                                    args.plain_work_dir)  # fmt: skip
    for mode, options in PATHS[args.path].items():
        line = {"path": args.path, "mode": mode, "items": len(items)}
        for batch_size, count in ((64, len(items)), (1, min(32, len(items)))):
            outputs, cpu, wall = timed(
                lambda b=batch_size, n=count, o=options: _call(
                    translate, sources[:n], items[:n], o, glossary, b
                ),
                args.rounds,
            )  # fmt: skip
            line[f"cpu_s_per_sentence_batch_{batch_size}"] = cpu / count
            line[f"wall_s_per_sentence_batch_{batch_size}"] = wall / count
            if batch_size == 64:
                held = [holds(o, i["translation"]) for o, i in zip(outputs, items, strict=True)]
                line["term_accuracy"] = sum(held) / len(items)
                line["chrf"] = sacrebleu.corpus_chrf(outputs, [references]).score
                line["bleu"] = sacrebleu.corpus_bleu(outputs, [references]).score
                line["outputs"] = outputs
        print("RESULT" + json.dumps(line, ensure_ascii=False), flush=True)


def run(args):
    """Each path in its own process, one after the other; the results to `args.out`."""
    import subprocess

    paths = [p for p in PATHS if p.startswith("keras") or args.export_dir]
    if not args.plain_work_dir:
        paths.remove("keras, plain model")
    lines = []
    for path in paths:
        command = [sys.executable, os.path.abspath(__file__), "worker", "--path", path,
                   "--work-dir", args.work_dir, "--glossary-dir", args.glossary_dir,
                   "--rounds", str(args.rounds)]  # fmt: skip
        for flag, value in (("--export-dir", args.export_dir),
                            ("--plain-work-dir", args.plain_work_dir)):  # fmt: skip
            if value:
                command += [flag, value]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{path} failed:\n{done.stderr[-3000:]}")
        for text in done.stdout.splitlines():
            if text.startswith("RESULT"):
                line = json.loads(text[len("RESULT") :])
                lines.append(line)
                print(json.dumps({k: v for k, v in line.items() if k != "outputs"}), flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


def report(path):
    """A markdown table of `run`'s results file."""
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    base = {line["path"]: line for line in lines if line["mode"] == "none"}
    print("| path | mode | term accuracy | chrF | BLEU | sentences/s, batch 64 | batch 1 |"
          " CPU time / none, batch 64 | batch 1 |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for line in lines:
        none = base[line["path"]]
        rates = [1 / line[f"cpu_s_per_sentence_batch_{b}"] for b in (64, 1)]
        ratios = [line[f"cpu_s_per_sentence_batch_{b}"] / none[f"cpu_s_per_sentence_batch_{b}"]
                  for b in (64, 1)]  # fmt: skip
        print(f"| {line['path']} | {line['mode']} | {100 * line['term_accuracy']:.1f}% | "
              f"{line['chrf']:.2f} | {line['bleu']:.2f} | {rates[0]:.1f} | {rates[1]:.1f} | "
              f"{ratios[0]:.2f}x | {ratios[1]:.2f}x |")  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare")
    p.add_argument("--out", required=True)
    p.add_argument("--limit", type=int, default=500, help="test items at most")
    for name in ("run", "worker"):
        r = commands.add_parser(name)
        r.add_argument("--work-dir", required=True, help="a run trained with --terminology")
        r.add_argument("--export-dir", help="its exports' folder (saved_models/NAME)")
        r.add_argument("--plain-work-dir", help="a run trained without --terminology")
        r.add_argument("--glossary-dir", required=True, help="prepare's --out")
        r.add_argument("--rounds", type=int, default=2)
        if name == "run":
            r.add_argument("--out", required=True, help="JSON lines, one per path and mode")
        else:
            r.add_argument("--path", required=True, choices=sorted(PATHS))
    t = commands.add_parser("report")
    t.add_argument("results")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(args.out, args.limit)
    if args.command == "run":
        return run(args)
    if args.command == "worker":
        return worker(args)
    return report(args.results)


if __name__ == "__main__":
    main()
