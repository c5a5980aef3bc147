"""Serving on a GPU: what runs there, and how fast, on one trained work directory.

The lent GPU machine has neither TensorFlow nor room for a GPU build of
ONNX Runtime (onnxruntime-gpu's CUDA provider alone is 220 MB packed; one
call carries 64 MiB), so this script first records what each engine can do
there, then times what can run:

    keras     this package's own search (`Translator`, `decoding/`: the search
              the SavedModel and translate.onnx carry in their graphs) under
              Keras's backend (JAX on the GPU), jit-compiled per padded shape;
    ct2       the CTranslate2 export of the same weights on CUDA, where the
              ctranslate2 wheel and the CUDA 12 cuBLAS it loads are both there
              (`--ct2-device cuda`), else skipped with the reason.

    KERAS_BACKEND=jax python benchmarks/gpu_serving.py --work-dir .gpu/ding_small \
        --corpus .corpus/de-en --json gpu_results/serving_gpu.json

Sentences: German phrases of the Ding dictionary (3-20 words, as
`benchmarks/serving.py` draws them); each (engine, search, batch size) point
is warmed up on every sentence once (the compilations) and then timed for
`--rounds` rounds; sentences per second is the median. A time cap
(`--max-seconds`) stops before the next point and keeps what was measured.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", required=True, help="a trained work directory")
    parser.add_argument("--corpus", default="/usr/share/trans/de-en")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,64")
    parser.add_argument("--beam-sizes", default="4", help="comma-separated; 1 is greedy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default="keras,ct2")
    parser.add_argument("--ct2-device", default="cuda")
    parser.add_argument("--max-seconds", type=float, default=240.0)
    parser.add_argument("--json", required=True)
    return parser.parse_args(argv)


def probe():
    """What the machine offers each engine: devices, providers, libraries."""
    import ctypes

    found = {}
    try:
        import onnxruntime

        found["onnxruntime"] = onnxruntime.__version__
        found["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError as error:
        found["onnxruntime"] = f"not importable: {error}"
    try:
        import ctranslate2

        found["ctranslate2"] = ctranslate2.__version__
        found["ctranslate2_cuda_devices"] = ctranslate2.get_cuda_device_count()
    except ImportError as error:
        found["ctranslate2"] = f"not importable: {error}"
    for library in ("libcublas.so.12", "libcublas.so.13"):
        try:
            ctypes.CDLL(library)
            found[library] = "loads"
        except OSError as error:
            found[library] = f"does not load: {error}"
    import keras

    found["keras_backend"] = keras.backend.backend()
    if keras.backend.backend() == "jax":
        import jax

        found["jax_devices"] = [str(d) for d in jax.devices()]
    return found


def time_point(translate, sentences, batch_size, rounds):
    """Median sentences/s of `translate(list) -> list` over `rounds`, after a warm-up."""
    batches = [sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size)]
    outputs = [out for batch in batches for out in translate(batch)]  # warm-up: compiles
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for batch in batches:
            translate(batch)
        times.append(time.perf_counter() - start)
    rates = sorted(len(sentences) / t for t in times)
    return {"sentences_per_second": statistics.median(rates), "range": [rates[0], rates[-1]],
            "outputs": outputs}  # fmt: skip


def _keras_engine(args):
    """`(beam_size, batch_size) -> translate`: `Translator` over the work directory."""
    from keras_transformer import Translator

    def keras_engine(beam_size, batch_size):
        translator = Translator.load(args.work_dir, beam_size=beam_size, batch_size=batch_size)
        return translator.translate

    return keras_engine


def _ct2_unavailable(args, probe):
    """Why CTranslate2 cannot run here (None: it can)."""
    if not isinstance(probe.get("ctranslate2_cuda_devices"), int):
        return f"ctranslate2: {probe.get('ctranslate2')}"
    if args.ct2_device == "cuda" and probe["ctranslate2_cuda_devices"] < 1:
        return "ctranslate2 sees no CUDA device"
    if args.ct2_device == "cuda" and "does not" in probe["libcublas.so.12"]:
        return "CTranslate2 4.8's CUDA build loads libcublas.so.12; not on this machine"
    return None


def _ct2_engine(args):
    """`(beam_size, batch_size) -> translate`: CTranslate2 over the work directory's
    export (written once to /tmp/ct2_export)."""
    from keras_transformer import CTranslate2Translator, workdir
    from keras_transformer.export.ctranslate2 import export

    ct2_dir = os.path.join("/tmp", "ct2_export")
    if not os.path.isdir(ct2_dir):
        export(workdir.load_model(args.work_dir),
               os.path.join(args.work_dir, "vocab.model"), ct2_dir,
               search=workdir.read_search(args.work_dir).to_dict())  # fmt: skip

    def ct2_engine(beam_size, batch_size):
        translator = CTranslate2Translator(
            ct2_dir, beam_size=beam_size, batch_size=batch_size, device=args.ct2_device
        )
        return translator.translate

    return ct2_engine


def main(argv=None):
    args = parse_args(argv)
    deadline = time.monotonic() + args.max_seconds
    from benchmarks.serving import ding_sentences

    result = {"probe": probe(), "points": [], "skipped": []}
    print(json.dumps(result["probe"], indent=1), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)

    def save():
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

    sentences = ding_sentences(args.corpus, args.sentences, seed=0)
    engines = {}
    if "keras" in args.engines.split(","):
        engines["keras"] = _keras_engine(args)
    if "ct2" in args.engines.split(","):
        reason = _ct2_unavailable(args, result["probe"])
        if reason:
            result["skipped"].append({"engine": "ct2", "why": reason})
        else:
            engines["ct2"] = _ct2_engine(args)
    save()
    reference = {}
    for beam_size in [int(b) for b in args.beam_sizes.split(",")]:
        for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
            for name, make in engines.items():
                if time.monotonic() > deadline:
                    result["skipped"].append(
                        {"engine": name, "beam_size": beam_size, "batch_size": batch_size,
                         "why": "time cap"}
                    )  # fmt: skip
                    continue
                start = time.monotonic()
                point = time_point(make(beam_size, batch_size), sentences, batch_size, args.rounds)
                outputs = point.pop("outputs")
                key = (beam_size, batch_size)
                reference.setdefault(key, outputs)
                same = sum(a == b for a, b in zip(outputs, reference[key], strict=True))
                point.update(engine=name, beam_size=beam_size, batch_size=batch_size,
                             seconds=time.monotonic() - start,
                             same_as_first_engine=same / len(outputs))  # fmt: skip
                result["points"].append(point)
                print(json.dumps(point), flush=True)
                save()
    save()


if __name__ == "__main__":
    main()
