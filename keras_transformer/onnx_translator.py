"""Translation with `translate.onnx` on ONNX Runtime: strings in, strings out.

`translate.onnx` (written by `keras_transformer.export`) holds the
SentencePiece tokenizer, the package's own greedy and beam search and the
detokenizer, so this module only batches strings and runs the graph. It
imports `onnxruntime`, `onnxruntime_extensions` (the SentencePiece ops) and
numpy, never Keras or TensorFlow: creating a session with the extensions'
ops in a process that has imported TensorFlow crashes (their bundled
protobuf libraries clash), so keep the two in separate processes.

Example:

    translator = OnnxTranslator("saved_models/transformer_de_en/onnx/1")
    translator("Das Haus ist klein.")                       # beam 4, alpha 0.6
    translator.translate(["Das Haus ist klein."], beam_size=1)  # greedy
"""

import json
import os
import sys

import numpy as np

GRAPH = "translate.onnx"


def _as_text(sentence, index):
    """str, or UTF-8 bytes with invalid sequences replaced by U+FFFD (as the SavedModel does)."""
    if isinstance(sentence, bytes):
        return sentence.decode("utf-8", errors="replace")
    if isinstance(sentence, str):
        return sentence
    raise TypeError(
        f"OnnxTranslator expects str or bytes; sentence {index} is a {type(sentence).__name__}: "
        f"{sentence!r:.80}"
    )


class OnnxTranslator:
    """Translates sentences with an ONNX export's `translate.onnx` on ONNX Runtime.

    The same contract as `Translator`: a string gives its translation, a
    list gives a list in the same order; sentences are sorted by length
    and run `batch_size` at a time; a blank string translates to "" (the
    graph does the same for callers in other languages); a sentence longer
    than the model's positional range is cut to `max_length - 1` pieces
    (in the graph, as the SavedModel does); a non-string raises
    `TypeError`. UTF-8 bytes are accepted, invalid sequences replaced by
    U+FFFD.

    Args:
        export_dir: an ONNX export (`translate.onnx`, `config.json`), e.g.
            `saved_models/<name>/onnx/<version>`.
        beam_size: int, 1 for greedy search; one of config.json's
            `translate.beam_sizes`. None: the export's default.
        alpha: float >= 0, the length-penalty exponent. None: the default.
        max_extra_length: int >= 0, output tokens allowed beyond the source
            length. None: the default.
        batch_size: sentences per graph run.
        providers: onnxruntime execution providers (default CPU).
        intra_op_num_threads: onnxruntime threads (0 = one per core).
    """

    def __init__(
        self,
        export_dir,
        beam_size=None,
        alpha=None,
        max_extra_length=None,
        batch_size=32,
        providers=("CPUExecutionProvider",),
        intra_op_num_threads=0,
    ):
        path = os.path.join(export_dir, GRAPH)
        config_path = os.path.join(export_dir, "config.json")
        missing = [p for p in (path, config_path) if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(
                f"{export_dir!r} is not an ONNX export with {GRAPH}: missing {missing}. "
                "Export one with `python export/onnx_model.py --work-dir work`."
            )
        with open(config_path) as f:
            config = json.load(f)
        self.config = config["model"]
        self.beam_sizes = tuple(config["translate"]["beam_sizes"])
        self.defaults = dict(config["translate"]["defaults"])
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer. Received: {batch_size!r}")
        self.batch_size = batch_size
        self.beam_size = self.defaults["beam_size"] if beam_size is None else beam_size
        self.alpha = self.defaults["alpha"] if alpha is None else alpha
        self.max_extra_length = (
            self.defaults["max_extra_length"] if max_extra_length is None else max_extra_length
        )
        self._feeds()  # checks the settings before the session is built
        if "tensorflow" in sys.modules:
            raise RuntimeError(
                "OnnxTranslator cannot run in a process that has imported TensorFlow: "
                "onnxruntime-extensions' SentencePiece ops crash there (their bundled "
                "protobuf clashes with TensorFlow's). Run it in a separate process."
            )
        import onnxruntime as ort
        import onnxruntime_extensions

        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_num_threads
        # The search settings are initializers that callers may override; ONNX Runtime
        # warns about each on every session. Errors are still reported.
        options.log_severity_level = 3
        options.register_custom_ops_library(onnxruntime_extensions.get_library_path())
        self.session = ort.InferenceSession(path, options, providers=list(providers))

    def _feeds(self, beam_size=None, alpha=None, max_extra_length=None):
        """The graph's optional inputs, checked; None takes the translator's setting."""
        beam_size = self.beam_size if beam_size is None else beam_size
        alpha = self.alpha if alpha is None else alpha
        max_extra_length = self.max_extra_length if max_extra_length is None else max_extra_length
        if beam_size not in self.beam_sizes:
            raise ValueError(
                f"beam_size must be one of the exported beam sizes {self.beam_sizes}. "
                f"Received: beam_size={beam_size!r}"
            )
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0. Received: alpha={alpha}")
        if not isinstance(max_extra_length, int) or max_extra_length < 0:
            raise ValueError(
                "max_extra_length must be an integer >= 0. "
                f"Received: max_extra_length={max_extra_length!r}"
            )
        return {
            "beam_size": np.array(beam_size, np.int32),
            "alpha": np.array(alpha, np.float32),
            "max_extra_length": np.array(max_extra_length, np.int32),
        }

    def __call__(self, sentences, progress=False):
        """A string -> its translation; a list of strings -> a list of translations."""
        if isinstance(sentences, (str, bytes)):
            return self.translate([sentences], progress=progress)[0]
        return self.translate(sentences, progress=progress)

    def run(self, sentences, beam_size=None, alpha=None, max_extra_length=None):
        """One graph run: `(B,)` strings -> `(B,)` translations, no batching or host checks.

        What a caller in another language does; the graph itself gives ""
        for blank sentences and `[]` for an empty batch.
        """
        feeds = self._feeds(beam_size, alpha, max_extra_length)
        feeds["sentences"] = np.array(sentences, dtype=object).reshape(-1)
        (translations,) = self.session.run(["translations"], feeds)
        return [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in translations]

    def translate(self, sentences, progress=False, beam_size=None, alpha=None,
                  max_extra_length=None):  # fmt: skip
        """A list of strings -> a list of translations, in the same order.

        Args:
            sentences: list of str (or UTF-8 bytes).
            progress: bool. Show a progress bar (tqdm, on stderr).
            beam_size, alpha, max_extra_length: this call's search settings
                (None: the translator's).
        """
        if isinstance(sentences, (str, bytes)):
            raise TypeError(
                "translate() expects a list of strings; use translator(text) for one. "
                f"Received: {sentences!r:.80}"
            )
        texts = [_as_text(s, i) for i, s in enumerate(sentences)]
        settings = dict(beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length)
        self._feeds(**settings)  # fail before any batch runs
        # Blank sentences translate to "" (the graph agrees) without taking a batch slot.
        order = sorted((i for i, t in enumerate(texts) if t.strip()), key=lambda i: -len(texts[i]))
        outputs = [""] * len(texts)
        bar = _progress_bar(len(order)) if progress else None
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            translations = self.run([texts[i] for i in batch], **settings)
            for i, translation in zip(batch, translations, strict=True):
                outputs[i] = translation
            if bar is not None:
                bar.update(len(batch))
        if bar is not None:
            bar.close()
        return outputs


def _progress_bar(total):
    from tqdm import tqdm

    return tqdm(total=total, unit="sentence", desc="translate", leave=False)
