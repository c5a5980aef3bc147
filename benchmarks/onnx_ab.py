"""Two `translate.onnx` files side by side: CPU seconds per call at batch 1.

For graph passes (`keras_transformer/export/onnx_passes.py`): export the
same trained model before and after a change, then

    python benchmarks/onnx_ab.py OLD/translate.onnx NEW/translate.onnx --beam-size 1

Both sessions live in one process with one compute thread and are
alternated for `--rounds` rounds over the same sentences (Ding phrases of
3-20 words, or `--sentences-file`, one per line), each call timed with
`time.process_time`; medians per call, and whether the outputs agree. It
imports onnxruntime and onnxruntime-extensions only: the extensions' ops
crash a process that has imported TensorFlow, so the Ding phrases are read
by a child process.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def _session(path, threads):
    import onnxruntime as ort
    import onnxruntime_extensions

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.register_custom_ops_library(onnxruntime_extensions.get_library_path())
    return ort.InferenceSession(path, options, ["CPUExecutionProvider"])


def _pass(session, sentences, beam_size):
    outputs = []
    start = time.process_time()
    for sentence in sentences:
        feeds = {
            "sentences": np.array([sentence], object),
            "beam_size": np.array(beam_size, np.int32),
        }
        outputs.append(session.run(None, feeds)[0][0])
    return (time.process_time() - start) / len(sentences), outputs


def _ding_phrases(path, count):
    """`serving.ding_sentences` (which imports the package, and so TensorFlow), in a child."""
    code = (
        "import json, sys; from serving import ding_sentences; "
        f"print(json.dumps(ding_sentences({path!r}, {count}, seed=0)))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.path.dirname(here)])}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(result.stdout.splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sentences-file")
    parser.add_argument("--ding", default="/usr/share/trans/de-en")
    args = parser.parse_args(argv)
    if args.sentences_file:
        with open(args.sentences_file, encoding="utf-8") as f:
            sentences = [line.rstrip("\n") for line in f][: args.count]
    else:
        sentences = _ding_phrases(args.ding, args.count)
    sessions = [_session(path, args.threads) for path in (args.a, args.b)]
    times = [[], []]
    outputs = [None, None]
    for session in sessions:
        _pass(session, sentences, args.beam_size)  # warm-up
    for _ in range(args.rounds):
        for i, session in enumerate(sessions):
            seconds, outputs[i] = _pass(session, sentences, args.beam_size)
            times[i].append(seconds)
    a, b = (statistics.median(t) * 1000 for t in times)
    same = np.mean([x == y for x, y in zip(*outputs, strict=True)])
    print(
        f"beam {args.beam_size}, {len(sentences)} sentences, {args.rounds} rounds: "
        f"A {a:.2f} ms, B {b:.2f} ms per call, A/B {a / b:.2f}x; same outputs {same:.0%}"
    )


if __name__ == "__main__":
    main()
