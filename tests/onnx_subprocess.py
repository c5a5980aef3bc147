"""Runs `OnnxTranslator` jobs in a process where TensorFlow and Keras cannot be imported.

    python tests/onnx_subprocess.py EXPORT_DIR < jobs.json   # prints RESULTS{...}

Two reasons for a separate process: it shows that the ONNX path needs only
onnxruntime and onnxruntime-extensions (importing tensorflow, keras,
tf2onnx, jax or torch raises here), and onnxruntime-extensions' ops crash a
process that has imported TensorFlow (see test_vocabulary.py).

A job is `{"name", "call", "sentences", "kwargs"}`; `call` is `translate`
(`OnnxTranslator.translate`), `run` (one graph run, no host-side batching
or blank handling), `session` (the raw onnxruntime session, `sentences`
given as a nested list of any rank, `kwargs` its optional inputs) or `construct` (`OnnxTranslator(**kwargs)`).
A job's optional `"translator"` dict holds `OnnxTranslator` arguments (e.g.
`{"precision": "int8", "batch_size": 64}`; default batch size 32, one thread);
jobs without it share the default translator.
A sentence `{"bytes": "<latin-1 text>"}` stands for raw bytes. Each result is
`{"value": ...}` or `{"error": "<type>: <message>"}`.
"""

import importlib.abc
import json
import sys

BLOCKED = ("tensorflow", "keras", "tf2onnx", "jax", "torch")


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this process")
        return None


def _sentence(value):
    if isinstance(value, dict):
        return value["bytes"].encode("latin-1")
    if isinstance(value, list):
        return [_sentence(v) for v in value]
    return value


def main():
    sys.meta_path.insert(0, _Blocker())
    import numpy as np

    from keras_transformer import OnnxTranslator  # the one import, with Keras and TF blocked

    export_dir = sys.argv[1]
    translators = {}
    results = {}
    for job in json.load(sys.stdin):
        options = job.get("translator", {})
        key = json.dumps(options, sort_keys=True)
        if key not in translators and job["call"] != "construct":
            settings = {"batch_size": 32, "intra_op_num_threads": 1, **options}
            translators[key] = OnnxTranslator.load(export_dir, **settings)
        translator = translators.get(key)
        sentences = _sentence(job.get("sentences"))
        kwargs = job.get("kwargs", {})
        try:
            if job["call"] == "translate":
                value = translator.translate(sentences, **kwargs)
            elif job["call"] == "run":
                value = translator.run(sentences, **kwargs)
            elif job["call"] == "session":
                feeds = {"sentences": np.array(sentences, dtype=object)}
                for name, setting in kwargs.items():  # the graph's optional inputs
                    feeds[name] = np.array(setting, np.float32 if name == "alpha" else np.int32)
                value = translator.session.run(None, feeds)[0].tolist()
            elif job["call"] == "construct":
                OnnxTranslator(**kwargs)
                value = None
            else:
                raise ValueError(f"Unknown call {job['call']!r}")
            results[job["name"]] = {"value": value}
        except Exception as error:  # reported to the test, which checks type and message
            results[job["name"]] = {"error": f"{type(error).__name__}: {error}"}
    results["modules"] = {"value": sorted(m for m in BLOCKED if m in sys.modules)}
    print("RESULTS" + json.dumps(results))


if __name__ == "__main__":
    main()
