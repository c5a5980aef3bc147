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
    translator.translate(["Das Haus ist klein."], target_prefix="The", banned=["little"])
    translator.translate(["Das Haus ist klein."], sampling_topk=10, seed=1)  # Translator's draws
    OnnxTranslator("saved_models/transformer_de_en/onnx/1", precision="int8")  # int8 products
"""

import json
import os
import sys

import numpy as np

from keras_transformer import terminology
from keras_transformer.search import SearchConfig
from keras_transformer.serving import frontend

GRAPH = "translate.onnx"
PRECISIONS = ("float32", "int8")


def _read_export(export_dir, precision):
    """`(config.json's contents, path of the graph to run)` of the ONNX export
    `export_dir`: translate.onnx, or its int8 graph for `precision="int8"`."""
    config_path = os.path.join(export_dir, "config.json")
    path = os.path.join(export_dir, GRAPH)
    missing = [p for p in (path, config_path) if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(
            f"{export_dir!r} is not an ONNX export with {GRAPH}: missing {missing}. "
            "Export one with `python export/onnx_model.py --work-dir work`."
        )
    with open(config_path) as f:
        config = json.load(f)
    if precision == "int8":
        int8 = config["translate"].get("int8")
        if int8 is None or not os.path.isfile(os.path.join(export_dir, int8["graph"])):
            raise FileNotFoundError(
                f"{export_dir!r} has no int8 graph (translate_int8.onnx): it was exported "
                "by an older version. Export the work directory again."
            )
        path = os.path.join(export_dir, int8["graph"])
    return config, path


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
            The settings in use are `translator.search`, a `SearchConfig`:
            the export's defaults (config.json) with these three replaced.
        batch_size: sentences per graph run.
        providers: onnxruntime execution providers (default CPU).
        intra_op_num_threads: onnxruntime threads (0 = one per core).
        precision: "float32" runs translate.onnx; "int8" the same graph with
            int8 matrix products (translate_int8.onnx, written by the export
            beside it; each row of activations quantized on its own, so a
            sentence translates the same alone and in any batch): faster on
            CPUs, slightly different outputs.
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
        precision="float32",
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}. Received: {precision!r}")
        export_dir = frontend.newest_version(export_dir)  # saved_models/NAME/onnx: the newest
        config, path = _read_export(export_dir, precision)
        self.precision = precision
        self.vocabulary = os.path.join(export_dir, "vocab.model")  # where the glossary tags are
        self.config = config["model"]
        self.beam_sizes = tuple(config["translate"]["beam_sizes"])
        self.defaults = dict(config["translate"]["defaults"])
        # translate_steered.onnx, for `target_prefix`, `banned` and sampling (float32 only;
        # None for older exports, which take text only).
        self.steering = config["translate"].get("steering")
        self._steered_path = None
        if self.steering is not None:
            self._steered_path = os.path.join(export_dir, self.steering["graph"])
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer. Received: {batch_size!r}")
        self.batch_size = batch_size
        # The export's defaults (config.json), replaced by the settings given.
        # The stopping rule and the length ratio are baked into the graph (config.json "search").
        rule = {key: config.get("search", {}).get(key)
                for key in ("stopping", "patience", "length_ratio")}  # fmt: skip
        self.search = SearchConfig.from_dict({**self.defaults, **rule}).replace(
            beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
        )
        self._feeds()  # checks the beam size before the session is built
        self._create_session(path, providers, intra_op_num_threads)

    def _create_session(self, path, providers, intra_op_num_threads):
        """Creates the ONNX Runtime session of the graph at `path`, with the SentencePiece ops;
        the steered graph's session is created at its first use (`steered_session`)."""
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
        self._session_settings = (options, list(providers))
        self._steered_session = None

    def steered_session(self):
        """The session of translate_steered.onnx, created at the first steered call."""
        if self._steered_session is None:
            import onnxruntime as ort

            options, providers = self._session_settings
            self._steered_session = ort.InferenceSession(self._steered_path, options,
                                                         providers=providers)  # fmt: skip
        return self._steered_session

    @classmethod
    def load(cls, export_dir, **kwargs):
        """The `OnnxTranslator` of an ONNX export (`OnnxTranslator(export_dir, **kwargs)`),
        named as `Translator.load(work_dir)` is."""
        return cls(export_dir, **kwargs)

    def _feeds(self, beam_size=None, alpha=None, max_extra_length=None):
        """The graph's optional inputs, checked; None takes the translator's setting."""
        search = self.search.replace(
            beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
        )
        if search.beam_size not in self.beam_sizes:
            raise ValueError(
                f"beam_size must be one of the exported beam sizes {self.beam_sizes}. "
                f"Received: beam_size={search.beam_size!r}"
            )
        return {
            "beam_size": np.array(search.beam_size, np.int32),
            "alpha": np.array(search.alpha, np.float32),
            "max_extra_length": np.array(search.max_extra_length, np.int32),
        }

    def __call__(self, sentences, progress=False):
        """A string -> its translation; a list of strings -> a list of translations."""
        if isinstance(sentences, (str, bytes)):
            return self.translate([sentences], progress=progress)[0]
        return self.translate(sentences, progress=progress)

    def run(self, sentences, beam_size=None, alpha=None, max_extra_length=None, **steering):
        """One graph run: `(B,)` strings -> `(B,)` translations, no batching or host checks.

        What a caller in another language does; the graph itself gives ""
        for blank sentences and `[]` for an empty batch. `steering`: any of
        translate_steered.onnx's optional `target_prefix` (B,), `banned`
        (B, N), `seeds` (B,), `sampling_topk` and `sampling_temperature` (the
        module docstring of `export.onnx_graphs`), fed as they are to that
        graph (float32, also for `precision="int8"`).
        """
        feeds = self._feeds(beam_size, alpha, max_extra_length)
        steering = self._steering_feeds(**steering)
        feeds.update(steering)
        feeds["sentences"] = np.array(sentences, dtype=object).reshape(-1)
        session = self.steered_session() if steering else self.session
        (translations,) = session.run(["translations"], feeds)
        return [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in translations]

    def _steering_feeds(self, target_prefix=None, banned=None, seeds=None, sampling_topk=None,
                        sampling_temperature=None):  # fmt: skip
        """translate.onnx's steering inputs that are given, as arrays."""
        given = dict(
            target_prefix=target_prefix,
            banned=banned,
            seeds=seeds,
            sampling_topk=sampling_topk,
            sampling_temperature=sampling_temperature,
        )
        self._check_steering([name for name, value in given.items() if value is not None])
        feeds = {}
        if target_prefix is not None:
            feeds["target_prefix"] = np.array(target_prefix, dtype=object).reshape(-1)
        if banned is not None:
            width = max([len(row) for row in banned] + [0])
            rows = [list(row) + [""] * (width - len(row)) for row in banned]
            feeds["banned"] = np.array(rows, dtype=object).reshape(len(rows), width)
        if seeds is not None:
            feeds["seeds"] = np.asarray(seeds, np.int32).reshape(-1)
        if sampling_topk is not None:
            feeds["sampling_topk"] = np.array(sampling_topk, np.int32)
        if sampling_temperature is not None:
            feeds["sampling_temperature"] = np.array(sampling_temperature, np.float32)
        return feeds

    def _check_steering(self, names):
        if names and self.steering is None:
            raise ValueError(
                f"This export has no translate_steered.onnx for {sorted(names)}: it was "
                "exported by an older version. Export the work directory again."
            )

    def translate(self, sentences, progress=False, beam_size=None, alpha=None,
                  max_extra_length=None, glossary=None, target_prefix=None, banned=None,
                  sampling_topk=1, sampling_temperature=1.0, seed=None):  # fmt: skip
        """A list of strings -> a list of translations, in the same order.

        Args:
            sentences: list of str (or UTF-8 bytes).
            progress: bool. Show a progress bar (tqdm, on stderr).
            beam_size, alpha, max_extra_length: this call's search settings
                (None: the translator's).
            glossary: None, or terms and their translations (`Translator.translate`'s
                argument): annotated in the text here, before the graph
                (`terminology.annotate`).
            target_prefix, banned, sampling_topk, sampling_temperature, seed:
                as `Translator.translate`, run in translate_steered.onnx (its
                optional inputs; float32), with `Translator`'s outputs for the
                same seed.
        """
        texts = frontend.check_sentences(sentences, "OnnxTranslator", accept_bytes=True)
        if glossary is not None:
            terminology.check_tags(terminology.file_has_tags(self.vocabulary), "OnnxTranslator")
            texts = terminology.annotate_all(texts, glossary)
        settings = dict(beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length)
        self._feeds(**settings)  # fail before any batch runs
        frontend.check_sampling(sampling_topk, sampling_temperature)
        prefixes = frontend.per_sentence(target_prefix, len(texts), "target_prefix")
        banned = frontend.per_sentence(banned, len(texts), "banned")
        seeds = None
        if sampling_topk != 1:
            seeds = frontend.steering_seeds(seed, len(texts))
            settings.update(sampling_topk=sampling_topk, sampling_temperature=sampling_temperature)
        given = dict(target_prefix=prefixes, banned=banned, seeds=seeds)
        self._check_steering([name for name, value in given.items() if value is not None])
        # Blank sentences translate to "" (the graph agrees) without taking a batch slot.
        lengths = [0 if frontend.is_blank(t) else len(t) for t in texts]
        outputs = [""] * len(texts)

        def run(batch):
            steering = {}
            if prefixes is not None:
                steering["target_prefix"] = [prefixes[i] for i in batch]
            if banned is not None:
                steering["banned"] = [banned[i] for i in batch]
            if seeds is not None:
                steering["seeds"] = seeds[batch]
            translations = self.run([texts[i] for i in batch], **settings, **steering)
            for i, translation in zip(batch, translations, strict=True):
                outputs[i] = translation

        frontend.run_batches(frontend.batches_by_length(lengths, self.batch_size), run, progress)
        return outputs
