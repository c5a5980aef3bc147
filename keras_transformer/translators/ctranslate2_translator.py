"""Strings in, strings out with CTranslate2: the CTranslate2 export behind the package's front end.

Imports neither Keras nor TensorFlow: `ctranslate2`, `sentencepiece` and
numpy are all it needs, as `OnnxTranslator` needs onnxruntime.

    translator = CTranslate2Translator.load("saved_models/transformer_de_en/ctranslate2/1")
    translator("Guten Morgen.")
    translator(["Guten Morgen.", "Danke!"], beam_size=1)

The front end is `keras_transformer.serving.frontend`'s, the one `Translator` and
`OnnxTranslator` follow: blank sentences give "" without a batch slot, a
sentence is cut to `max_length - 1` pieces plus EOS, a non-string is a
`TypeError` naming its index, invalid UTF-8 bytes are decoded with U+FFFD.

The search: greedy is the package's greedy search exactly (the same
per-sentence length limit, EOS barred as the first token, padding and BOS
never produced). Beam search is CTranslate2's: its length penalty divides
the log-probability by `length ** alpha`, where the package's (the paper's,
GNMT's) divides by `((5 + length) / 6) ** alpha` (the length counts EOS on
both sides); it stops a sentence once `round(beam_size * patience)`
hypotheses have finished (the package's `k_finished` rounds up), and with
`alpha=0` as soon as its best continuation ends; it normalizes its first
step's scores after barring EOS (ours before). Where outputs differ and why:
tests/test_shipped_search.py.
"""

import json
import logging
import os
import platform
import sys

from keras_transformer import terminology
from keras_transformer.search import SearchConfig, output_limit
from keras_transformer.serving import frontend

logger = logging.getLogger(__name__)


def int8_pairs_saturate(cpuinfo_path="/proc/cpuinfo"):
    """True on x86 CPUs whose int8 GEMM, under CTranslate2's default backend there, can
    saturate: AVX2 without VNNI (AVX512-VNNI or AVX-VNNI), from a vendor other than
    Intel (where CTranslate2 uses MKL anyway). False where it cannot tell (no
    /proc/cpuinfo) or on other machines."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not os.path.isfile(cpuinfo_path):
        return False
    flags, vendor = set(), ""
    with open(cpuinfo_path) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                flags = set(value.split())
            elif key.strip() == "vendor_id":
                vendor = value.strip()
            if flags and vendor:
                break
    return "avx2" in flags and not flags & {"avx512_vnni", "avx_vnni"} and vendor != "GenuineIntel"


def import_ctranslate2():
    """`ctranslate2`, imported with an int8 GEMM that adds its products in 32 bits.

    CTranslate2 picks its CPU backend when it is imported: Intel MKL on Intel
    CPUs, oneDNN elsewhere. On AVX2 without VNNI (AMD before Zen 4), oneDNN's
    uint8 x int8 GEMM adds pairs of products in 16 bits and saturates them: on
    a Zen 3 the test fixture's int8 greedy outputs were float32's for 40 of 100
    sentences (chrF 64.5 against them), and with MKL for 84 (chrF 91.2). So there,
    unless `CT2_USE_MKL` is set, it is set to 1 before the first import (the
    wheels hold MKL). Imported earlier by other code, CTranslate2 keeps its
    choice: `CTranslate2Translator` warns when int8 is asked for then.
    """
    if "ctranslate2" not in sys.modules and "CT2_USE_MKL" not in os.environ:
        if int8_pairs_saturate():
            os.environ["CT2_USE_MKL"] = "1"
    import ctranslate2

    return ctranslate2


def _search_settings(
    beam_size, alpha, patience, num_hypotheses, sampling_topk, sampling_temperature
):
    """`translate_batch`'s search options; sampling runs with `beam_size=1`, and
    `num_hypotheses` (checked against that beam size) asks for scores too."""
    settings = dict(
        beam_size=beam_size,
        length_penalty=alpha,
        patience=patience,
        min_decoding_length=1,
        max_input_length=0,
    )
    if sampling_topk != 1:
        settings.update(beam_size=1, sampling_topk=sampling_topk,
                        sampling_temperature=sampling_temperature)  # fmt: skip
        beam_size = 1
    if num_hypotheses is not None:
        if not isinstance(num_hypotheses, int) or not 1 <= num_hypotheses <= beam_size:
            raise ValueError(
                f"num_hypotheses must be between 1 and beam_size={beam_size}. "
                f"Received: num_hypotheses={num_hypotheses!r}"
            )
        settings.update(num_hypotheses=num_hypotheses, return_scores=True)
    return settings


def _call_groups(limits, banned, one_call):
    """`{(limit, bans): source indices}`: the sources that can share one
    `translate_batch` call (the longest limit for all with `one_call`)."""
    bans = [()] * len(limits) if banned is None else [tuple(map(tuple, b)) for b in banned]
    groups = {}
    for i, limit in enumerate(limits):
        groups.setdefault((max(limits) if one_call else limit, bans[i]), []).append(i)
    return groups


class CTranslate2Translator:
    """Translates with a CTranslate2 export (`python -m keras_transformer.export --formats
    ctranslate2`).

    Args:
        export_dir: the export's folder (`model.bin`, `vocab.model`, `keras_transformer.json`).
        beam_size, alpha, max_extra_length: the search (default: the run's, from the
            export, else 4, 0.6 and 50); each call can override them.
        batch_size: int. Sentences per `translate_batch` call.
        compute_type: CTranslate2's, e.g. "float32" (default, the export's weights),
            "int8", "int8_float32".
        intra_threads: int. CPU threads of one translation (0: CTranslate2's default).
        device: "cpu" or "cuda".
    """

    def __init__(
        self,
        export_dir,
        beam_size=None,
        alpha=None,
        max_extra_length=None,
        batch_size=32,
        compute_type="float32",
        intra_threads=0,
        device="cpu",
    ):
        import sentencepiece

        ctranslate2 = import_ctranslate2()
        export_dir = frontend.newest_version(export_dir)  # .../ctranslate2: the newest version
        info_path = os.path.join(export_dir, "keras_transformer.json")
        if not os.path.isfile(info_path):
            raise FileNotFoundError(
                f"{export_dir} is not a CTranslate2 export of this package (no "
                "keras_transformer.json); write one with `python -m keras_transformer.export "
                "--work-dir WORK --formats ctranslate2`."
            )
        with open(info_path) as f:
            self.info = json.load(f)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"batch_size must be a positive integer. Received: batch_size={batch_size!r}"
            )
        # The export's settings (the run's), replaced by those given; checked by SearchConfig.
        self.search = SearchConfig.from_dict(self.info["search"]).replace(
            beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
        )
        self.batch_size = batch_size
        self.processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(export_dir, "vocab.model")
        )
        self.translator = ctranslate2.Translator(
            export_dir, device=device, compute_type=compute_type, intra_threads=intra_threads
        )
        if (
            "int8" in self.translator.compute_type
            and device == "cpu"
            and os.environ.get("CT2_USE_MKL") != "1"
            and int8_pairs_saturate()
        ):
            logger.warning(
                "compute_type=%r on a CPU with AVX2 but no VNNI: CTranslate2's oneDNN int8 "
                "GEMM saturates there and translations drift from float32's. Set "
                "CT2_USE_MKL=1 before ctranslate2 is first imported (import_ctranslate2 "
                "does), or use compute_type='float32'.", compute_type,
            )  # fmt: skip
        ids = self.info
        self._pieces = [
            self.processor.id_to_piece(i) for i in range(self.processor.get_piece_size())
        ]
        self._suppressed = [[self._pieces[ids["pad_id"]]], [self._pieces[ids["bos_id"]]]]

    @classmethod
    def load(cls, export_dir, **kwargs):
        """`CTranslate2Translator(export_dir, **kwargs)`, named as `OnnxTranslator.load` is."""
        return cls(export_dir, **kwargs)

    def __call__(self, sentences, progress=False, **search):
        """A string -> its translation; a list of strings -> a list of translations."""
        if isinstance(sentences, (str, bytes)):
            return self.translate([sentences], progress=progress, **search)[0]
        return self.translate(sentences, progress=progress, **search)

    def _pieces_of(self, text):
        """A prefix's or a banned word's pieces ([] for blank text), as `Translator` has them."""
        if frontend.is_blank(text):
            return []
        return [self._pieces[i] for i in self.processor.encode(text, out_type=int)]

    def encode(self, texts):
        """Non-blank strings -> their source pieces, cut to the model's range, then EOS."""
        kept = frontend.max_source_pieces(self.info["max_length"])
        eos = self._pieces[self.info["eos_id"]]
        sources = []
        for text, ids in zip(texts, self.processor.encode(texts, out_type=int), strict=True):
            if len(ids) > kept:
                logger.warning(
                    "A sentence of %d pieces exceeds the model's max_length=%d; translating "
                    "its first %d pieces: %.60s...",
                    len(ids), self.info["max_length"], kept, text,
                )  # fmt: skip
                ids = ids[:kept]
            sources.append([self._pieces[i] for i in ids] + [eos])
        return sources

    def translate_pieces(self, sources, beam_size, alpha, max_extra_length, stopping="k_finished",
                         patience=1.0, exact_limits=True, num_hypotheses=None,
                         length_ratio=1.0, target_prefix=None, banned=None, sampling_topk=1,
                         sampling_temperature=1.0):  # fmt: skip
        """Source pieces (EOS included) -> output piece lists (before EOS); with
        `num_hypotheses=N` (<= `beam_size`), `(N piece lists, N scores)` per
        source, best first: CTranslate2's scores (log-probability over its
        length penalty, `length ** alpha`).

        `exact_limits=False` runs a beam batch in one call with the longest
        limit (outputs cut to their own): how CTranslate2 is usually run,
        and what benchmarks/serving.py times; a beam output may then depend
        on the other sentences of its batch.

        CTranslate2 stops a sentence's beam once `round(beam_size * patience)`
        hypotheses have finished: the package's `stopping="k_finished"` (which rounds up)
        (with CTranslate2's own length penalty, `length ** alpha`). It has
        no `"bound"` rule, so that setting searches as `"k_finished"` here.

        `target_prefix` (a piece list per source), `banned` (a list of piece
        lists per source) and `sampling_topk`/`sampling_temperature` are
        CTranslate2's `target_prefix`, `suppress_sequences` (one list per
        call: sources with different lists run in different calls) and
        sampling options.
        """
        # The package's limit: ceil(length_ratio x source length) + max_extra_length
        # tokens, EOS included on both sides, at most max_length (`search.output_limit`).
        limits = [min(output_limit(len(s), length_ratio, max_extra_length),
                      self.info["max_length"]) for s in sources]  # fmt: skip
        settings = _search_settings(beam_size, alpha, patience, num_hypotheses, sampling_topk,
                                    sampling_temperature)  # fmt: skip
        # One limit per call in CTranslate2. Greedy: the prefix does not depend on it,
        # so one call and each output cut to its own limit give the package's output.
        # Beam: a limit changes the search, so each limit gets its own call and an
        # output never depends on the other sentences of its batch.
        one_call = settings["beam_size"] == 1 or not exact_limits
        groups = _call_groups(limits, banned, one_call)
        return self._translate_groups(sources, limits, groups, settings, target_prefix)

    def _translate_groups(self, sources, limits, groups, settings, target_prefix):
        """One `translate_batch` call per group of `_call_groups`, each output cut to
        its own limit: piece lists, or `(piece lists, scores)` where `settings`
        (`_search_settings`'s) ask for `num_hypotheses`."""
        num_hypotheses = settings.get("num_hypotheses")
        outputs = [None] * len(sources)
        for (limit, ban), members in groups.items():
            extra = {}
            if target_prefix is not None:
                extra["target_prefix"] = [list(target_prefix[i]) or None for i in members]
            results = self.translator.translate_batch(
                [sources[i] for i in members], max_decoding_length=limit,
                suppress_sequences=self._suppressed + [list(b) for b in ban], **settings,
                **extra,
            )  # fmt: skip
            for i, result in zip(members, results, strict=True):
                if num_hypotheses is None:
                    outputs[i] = result.hypotheses[0][: limits[i]]
                else:
                    hypotheses = [h[: limits[i]] for h in result.hypotheses]
                    outputs[i] = (hypotheses, [float(x) for x in result.scores])
        return outputs

    def translate(self, sentences, progress=False, beam_size=None, alpha=None,
                  max_extra_length=None, exact_limits=True, num_hypotheses=None,
                  glossary=None, target_prefix=None, banned=None, sampling_topk=1,
                  sampling_temperature=1.0, seed=None):  # fmt: skip
        """A list of strings (or UTF-8 bytes) -> a list of translations, in order;
        with `num_hypotheses=N`, a list of N `(translation, score)` per sentence,
        best first (`translate_pieces`; a blank sentence: N times `("", 0.0)`).
        `glossary`: terms and their translations, annotated in the text before
        tokenizing (`Translator.translate`'s argument; `terminology.annotate`).
        `target_prefix`, `banned`, `sampling_topk`, `sampling_temperature`:
        `Translator.translate`'s, on CTranslate2's own options (a banned word
        bans its pieces alone, as in `Translator`); `seed` (an int) seeds
        CTranslate2's generator (`ctranslate2.set_random_seed`): its draws are
        its own, not `Translator`'s, and two calls with one seed drew
        differently on the test fixture."""
        texts = frontend.check_sentences(sentences, "CTranslate2Translator", accept_bytes=True)
        frontend.check_sampling(sampling_topk, sampling_temperature)
        prefixes = frontend.per_sentence(target_prefix, len(texts), "target_prefix")
        banned = frontend.per_sentence(banned, len(texts), "banned")
        steering = dict(sampling_topk=sampling_topk, sampling_temperature=sampling_temperature)
        if sampling_topk != 1 and seed is not None:
            import_ctranslate2().set_random_seed(int(seed))
        if glossary is not None:
            tags = self.processor.encode(list(terminology.TAGS))
            terminology.check_tags(terminology.tokenizer_has_tags(tags), "CTranslate2Translator")
            texts = terminology.annotate_all(texts, glossary)
        search = self.search.replace(
            beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
        ).to_dict()
        lengths = [0 if frontend.is_blank(t) else len(t) for t in texts]
        n = num_hypotheses
        outputs = [""] * len(texts) if n is None else [[("", 0.0)] * n for _ in texts]

        def run(batch):
            if prefixes is not None:
                steering["target_prefix"] = [self._pieces_of(prefixes[i]) for i in batch]
            if banned is not None:
                steering["banned"] = [[self._pieces_of(word) for word in banned[i]
                                       if not frontend.is_blank(word)] for i in batch]  # fmt: skip
            pieces = self.translate_pieces(
                self.encode([texts[i] for i in batch]), **search, exact_limits=exact_limits,
                num_hypotheses=n, **steering,
            )  # fmt: skip
            if n is not None:
                for i, (hypotheses, scores) in zip(batch, pieces, strict=True):
                    ids = [[self.processor.piece_to_id(p) for p in h] for h in hypotheses]
                    outputs[i] = list(zip(self.processor.decode(ids), scores, strict=True))
                return
            ids = [[self.processor.piece_to_id(p) for p in row] for row in pieces]
            for i, text in zip(batch, self.processor.decode(ids), strict=True):
                outputs[i] = text

        frontend.run_batches(frontend.batches_by_length(lengths, self.batch_size), run, progress)
        return outputs
