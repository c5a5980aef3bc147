"""Counts a search's work: loop steps and rows computed per step, on the same sentences.

The cost of a cached search is about the rows it feeds the decoder, summed
over its steps (rows x steps). This runs the package's search eagerly on a
trained work directory, with a step function that records how many rows
each step computes, for each search setting, with finished rows dropped
(what TensorFlow, the SavedModel and translate.onnx run) and kept (the
fixed-shape search: JAX, and every path before the search dropped them).
It reports rows x steps per sentence and the floor no search can beat,
`K x` the steps each sentence needed by its rule; CTranslate2, which drops
finished sentences and stops a beam once K hypotheses ended, works at
about the `k_finished` floor.

    python benchmarks/search_work.py --work-dir work --test-set 1000 --batch-size 64

Sentences: the first N pairs of the fixed Ding test split (`--test-set`),
batched by length as `Translator` batches them.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SEARCHES = {
    "greedy": dict(beam_size=1),
    "beam 4, bound": dict(beam_size=4, stopping="bound"),
    "beam 4, k_finished": dict(beam_size=4, stopping="k_finished", patience=1.0),
    "beam 4, k_finished, patience 2": dict(beam_size=4, stopping="k_finished", patience=2.0),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="work")
    parser.add_argument("--test-set", type=int, default=1000, metavar="N")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--corpus", default="/usr/share/trans/de-en")
    parser.add_argument("--alpha", type=float, default=None, help="default: the run's")
    parser.add_argument("--max-extra-length", type=int, default=None, help="default: the run's")
    parser.add_argument("--output", help="write the JSON results here too")
    return parser.parse_args(argv)


class CountingModel:
    """A `Transformer` whose `decode_step` records the rows of every step."""

    def __init__(self, model):
        self.model, self.config, self.built = model, model.config, model.built
        self.SOURCE_CACHE = model.SOURCE_CACHE
        self.rows = []

    def init_cache(self, source_ids, max_length):
        return self.model.init_cache(source_ids, max_length)

    def decode_step(self, token_ids, cache):
        self.rows.append(int(token_ids.shape[0]))
        return self.model.decode_step(token_ids, cache)


def count(model, batches, search, drop):
    """`(outputs, per-batch rows-per-step lists)` of one search setting."""
    from keras import ops

    from keras_transformer import decoding

    outputs, work = [], []
    for ids in batches:
        counting = CountingModel(model)
        out = decoding.translate_ids(counting, ids, **search.to_dict(), drop_finished=drop)
        outputs.append(ops.convert_to_numpy(out))
        work.append(counting.rows)
    return outputs, work


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    from serving import test_set

    from keras_transformer import workdir
    from keras_transformer.serving import frontend
    from keras_transformer.training import load_trained
    from keras_transformer.translators.keras_translator import Translator

    model, tokenizer, info = load_trained(args.work_dir)
    run_search = workdir.search_of(info).replace(
        alpha=args.alpha, max_extra_length=args.max_extra_length
    )
    pairs, _ = test_set(args.corpus, args.test_set, 0)
    translator = Translator(model, tokenizer)
    source_ids = translator.encode([s for s, _ in pairs])
    lengths = [len(ids) for ids in source_ids]
    batches = []
    for batch in frontend.batches_by_length(lengths, args.batch_size):
        rows = [source_ids[i] for i in batch]
        ids = np.zeros((len(rows), max(map(len, rows))), "int32")
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        batches.append(ids)
    print(f"{len(pairs)} Ding test pairs in {len(batches)} batches of up to {args.batch_size}; "
          f"alpha {run_search.alpha}, max_extra_length {run_search.max_extra_length}")  # fmt: skip
    print("| search | finished rows | loop steps | rows x steps | per sentence | mean output "
          "tokens | outputs cut at the limit | same output as kept |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---|")
    results = {}
    for name, settings in SEARCHES.items():
        search = run_search.replace(**settings)
        kept_outputs = None
        for drop in (False, True):
            outputs, work = count(model, batches, search, drop)
            total = sum(sum(rows) for rows in work)
            steps = sum(len(rows) for rows in work)
            tokens = np.mean(np.concatenate([np.sum(o != 0, axis=1) for o in outputs]))
            eos = model.config.eos_id
            at_limit = sum(int(np.sum(~np.any(o == eos, axis=1))) for o in outputs)
            same = "" if kept_outputs is None else str(
                all(np.array_equal(a, b) for a, b in zip(outputs, kept_outputs, strict=True))
            )  # fmt: skip
            kept_outputs = kept_outputs or outputs
            label = "dropped" if drop else "kept"
            results[f"{name}|{label}"] = dict(
                loop_steps=steps, rows_x_steps=total, per_sentence=total / len(pairs),
                mean_output_tokens=float(tokens), outputs_at_limit=at_limit,
            )  # fmt: skip
            print(f"| {name} | {label} | {steps} | {total} | {total / len(pairs):.1f} | "
                  f"{tokens:.2f} | {at_limit} | {same} |")  # fmt: skip
    print(json.dumps(results))
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"search": run_search.to_dict(), "results": results}, f, indent=2)
    return results


if __name__ == "__main__":
    main()
