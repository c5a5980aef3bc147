"""Strings in, strings out: tokenize, batch by length, search, detokenize."""

import logging

import keras
import numpy as np

from keras_transformer import terminology
from keras_transformer.decoding import compile_translate_ids
from keras_transformer.sampling import sampler
from keras_transformer.search import PAPER
from keras_transformer.serving import frontend
from keras_transformer.serving.frontend import steering_seeds

logger = logging.getLogger(__name__)


def _as_lists(token_ids):
    """A tokenizer's output (ragged tensor, array or nested list) -> list of lists of int."""
    if hasattr(token_ids, "to_list"):  # tf.RaggedTensor
        token_ids = token_ids.to_list()
    elif hasattr(token_ids, "numpy"):
        token_ids = token_ids.numpy().tolist()
    elif isinstance(token_ids, np.ndarray):
        token_ids = token_ids.tolist()
    return [[int(t) for t in ids] for ids in token_ids]


def _as_text(value):
    if hasattr(value, "numpy"):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        value = value.item()
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _phrases_array(phrases, batch, pad_id):
    """`(len(batch), N, L)` int32 of the piece-id lists of the sentences `batch`
    (`pad_id` after each, N and L at least 1), or a `(len(batch), 1, 1)` of `pad_id`."""
    rows = [phrases[i] for i in batch] if phrases is not None else [[] for _ in batch]
    count = max([len(row) for row in rows] + [1])
    width = max([len(ids) for row in rows for ids in row] + [1])
    array = np.full((len(batch), count, width), pad_id, dtype="int32")
    for r, row in enumerate(rows):
        for n, ids in enumerate(row):
            array[r, n, : len(ids)] = ids
    return array


def _sampling(sampling_topk, sampling_temperature, num_hypotheses, return_scores):
    """`(temperature, top-k)` of `Translator.translate`'s sampling, checked; None
    for a search (`sampling_topk=1`)."""
    if sampling_topk == 1:
        return None
    if num_hypotheses is not None or return_scores:
        raise ValueError(
            "Sampling draws one output per sentence, without scores: leave "
            "num_hypotheses and return_scores out with sampling_topk != 1."
        )
    sampling = (float(sampling_temperature), sampling_topk)
    sampler(None, *sampling)  # checks the two settings
    return sampling


class Translator:
    """Translates sentences with a `Transformer` and its SentencePiece tokenizer.

    Source ids are the tokenizer's pieces followed by EOS (no BOS); the
    search starts from `config.bos_id` and stops at `config.eos_id`
    (`decoding.translate_ids`, compiled once per backend). Sentences are
    sorted by length and decoded `batch_size` at a time, each batch padded
    to a multiple of 8 tokens (so JAX compiles for a few shapes only), then
    returned in input order.

    Bad input: an empty (or all-whitespace) string translates to `""`
    without running the model; a sentence longer than the model's positional
    range is cut to `config.max_length - 1` pieces plus EOS, with a warning;
    a non-string raises `TypeError` naming its type.

    Args:
        model: a `Transformer`.
        tokenizer: a `keras_hub.tokenizers.SentencePieceTokenizer` (or any
            tokenizer with `tokenize(list of str)` and `detokenize(ids)`).
        beam_size, alpha, max_extra_length: the search settings
            (`keras_transformer.search.SearchConfig`: 1 runs greedy search;
            the paper's 4, 0.6 and 50 by default). None: `search`'s.
        batch_size: int. Sentences decoded together (times `beam_size`
            hypotheses).
        jit_compile: bool. XLA for the TensorFlow `tf.function`.
        search: a `SearchConfig` whose settings the three above replace
            where given (default `search.PAPER`). `translator.search` is
            the one in use.

    Example, with `model` and `tokenizer` from a trained work directory
    (`keras_transformer.translate.load("work")`); what comes out depends on
    the training, so no output is shown:

        translator = Translator(model, tokenizer)  # the paper's beam 4, alpha 0.6
        translator("Guten Morgen.")  # one string -> its translation, a string
        translator(["Guten Morgen.", "Danke!"])  # a list -> a list, in input order
        translator(["", "  "])  # -> ["", ""]: blank input does not run the model
    """

    def __init__(
        self,
        model,
        tokenizer,
        beam_size=None,
        alpha=None,
        batch_size=32,
        max_extra_length=None,
        jit_compile=False,
        search=PAPER,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"batch_size must be a positive integer. Received: batch_size={batch_size!r}"
            )
        self.search = search.replace(
            beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
        )
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        self.batch_size = batch_size
        if not model.built:
            model.build()
        self.jit_compile = jit_compile
        self._translate_ids = compile_translate_ids(
            model, **self.search.to_dict(), jit_compile=jit_compile
        )
        self._n_best = {}  # num_hypotheses -> its compiled search

    @classmethod
    def load(cls, work_dir, **kwargs):
        """The `Translator` of a trained work directory (`from_preset`); named as
        `OnnxTranslator.load(export_dir)` is, for the ONNX export."""
        return cls.from_preset(work_dir, **kwargs)

    @classmethod
    def from_preset(cls, work_dir, **kwargs):
        """The `Translator` of a trained work directory: its model and its tokenizer.

        `Translator.from_preset("work", beam_size=4)`; `kwargs` go to
        `Translator` (search and batching). The search defaults to the run's
        (`workdir.search_of`: its test decode's beam and alpha), as the
        exports do. Architecture presets have no
        tokenizer and no weights: use `Transformer.from_preset(name)` for them.
        """
        from keras_transformer import workdir
        from keras_transformer.config import PRESETS

        if not workdir.is_work_dir(work_dir):
            if work_dir in PRESETS:
                raise ValueError(
                    f"{work_dir!r} is an architecture preset: random weights and no tokenizer. "
                    "Translator.from_preset takes a trained work directory (`python train.py "
                    "--work-dir DIR`). Received: work_dir={work_dir!r}"
                )
            workdir.check(work_dir, finished=False)  # names what is missing
        kwargs.setdefault("search", workdir.read_search(work_dir))
        return cls(workdir.load_model(work_dir), workdir.load_tokenizer(work_dir), **kwargs)

    def __call__(self, sentences, progress=False):
        """A string -> its translation; a list of strings -> a list of translations."""
        if isinstance(sentences, str):
            return self.translate([sentences], progress=progress)[0]
        return self.translate(sentences, progress=progress)

    def encode(self, sentences):
        """Strings -> lists of source ids ending with EOS ([] for a blank string)."""
        sentences = frontend.check_sentences(sentences, "Translator")
        config = self.config
        kept = frontend.max_source_pieces(config.max_length)
        token_ids = _as_lists(self.tokenizer.tokenize(sentences)) if sentences else []
        source_ids = []
        for sentence, ids in zip(sentences, token_ids, strict=True):
            if frontend.is_blank(sentence):
                source_ids.append([])
                continue
            if len(ids) > kept:
                logger.warning(
                    "A sentence of %d pieces exceeds the model's max_length=%d; translating "
                    "its first %d pieces: %.60s...",
                    len(ids), config.max_length, kept, sentence,
                )  # fmt: skip
                ids = ids[:kept]
            source_ids.append(ids + [config.eos_id])
        return source_ids

    def decode(self, output_ids):
        """Output ids -> strings: cut at the first EOS; padding and BOS removed."""
        config = self.config
        pieces = []
        for ids in output_ids:
            ids = [int(t) for t in ids]
            if config.eos_id in ids:
                ids = ids[: ids.index(config.eos_id)]
            pieces.append([t for t in ids if t not in (config.pad_id, config.bos_id)])
        if not pieces:
            return []
        texts = self.tokenizer.detokenize(pieces)
        return [_as_text(text) for text in texts]

    def _padded(self, source_ids, batch):
        """`(len(batch), W)` int32 of the sources `batch` (longest first), padded
        to W, the longest rounded up to 8 (so JAX compiles for a few shapes)."""
        width = -(-len(source_ids[batch[0]]) // 8) * 8
        padded = np.full((len(batch), width), self.config.pad_id, dtype="int32")
        for row, i in enumerate(batch):
            padded[row, : len(source_ids[i])] = source_ids[i]
        return padded

    def translate_ids(self, source_ids, progress=False):
        """Lists of source ids -> lists of output ids, batched by length ([] -> [])."""
        outputs = [[] for _ in source_ids]

        def run(batch):
            ids = keras.ops.convert_to_numpy(self._translate_ids(self._padded(source_ids, batch)))
            for row, i in enumerate(batch):
                outputs[i] = ids[row].tolist()

        batches = frontend.batches_by_length([len(ids) for ids in source_ids], self.batch_size)
        frontend.run_batches(batches, run, progress)
        return outputs

    def translate(
        self, sentences, progress=False, num_hypotheses=None, return_scores=False,
        target_prefix=None, sampling_topk=1, sampling_temperature=1.0, seed=None,
        glossary=None, banned=None, constraints=None,
    ):  # fmt: skip
        """A list of strings -> a list of translations, in the same order.

        Args:
            sentences: list of str.
            progress: bool. Show a progress bar (tqdm, on stderr).
            num_hypotheses: None, or int N <= the beam size: the N best
                hypotheses of the beam search, best first, for each sentence.
            return_scores: bool. Pair each translation with its score, the
                length-penalized log-probability the beam ranks by (with
                beam size 1, a beam of one).
            target_prefix: None, a str every translation starts with, or a
                list of one str per sentence ("" for none): the outputs begin
                with these pieces and the search goes on from them
                (CTranslate2's `target_prefix`; a domain or language tag, an
                interactive translator's accepted words). The scores leave
                the prefix's probability out.
            sampling_topk: 1 (default) searches; K > 1 draws each token among the
                K most likely, 0 among all (back-translation: Edunov et al.,
                2018), one output per sentence, without the beam.
            sampling_temperature: float > 0: the logits are divided by it.
            seed: int, the draws of `sampling_topk`: the same sentences and
                seed give the same outputs, in any batch; None draws a seed.
                A list of ints is one seed per sentence, used as it is (what
                the exports take: `steering_seeds(seed, count)` gives an int's).
            banned: None, or words and phrases no translation may hold (a
                negative constraint, in the search): a list of str for every
                sentence, or a list of such lists, one per sentence. Each is
                banned as the pieces SentencePiece gives it alone, its
                word-initial form ("Haus" bans "▁Haus", not "Haus" inside
                "Rathaus"); list other forms and casings you need.
            constraints: None, or words and phrases every translation must
                hold (positive lexical constraints), given as `banned` is:
                dynamic beam allocation (Post & Vilar, 2018) in the beam
                search; not with sampling; Keras only.
            glossary: None, or terms and their required translations (a dict
                `{source: target}`, `(source, target)` pairs, a tab-separated
                file's path or a `terminology.Glossary`): each term found in a
                sentence is followed by its translation between tags
                (`terminology.annotate`), which a model trained with
                `--terminology` copies into its output (a soft constraint).

        Returns:
            list of str; with `num_hypotheses`, a list of lists of N; with
            `return_scores`, `(translation, score)` tuples in their place.
            A blank sentence gives "" (N times) with score 0.0.
        """
        if glossary is not None:
            sentences = self._annotated(sentences, glossary)
        sampling = _sampling(sampling_topk, sampling_temperature, num_hypotheses, return_scores)
        source_ids = self.encode(sentences)
        extras = self._extras(source_ids, sampling, target_prefix, banned, constraints, seed)
        return self._translations(source_ids, extras, num_hypotheses, return_scores, progress)

    def _extras(self, source_ids, sampling, target_prefix, banned, constraints, seed):
        """`_search_with`'s `(sampling, prefixes, seeds, banned, constraints)`, the
        prefixes and phrases as piece ids; None where none is asked for."""
        prefixes = self._prefix_ids(target_prefix, len(source_ids))
        if constraints is not None and sampling is not None:
            raise ValueError("Positive constraints need a search: leave out sampling_topk.")
        phrases = [
            self._phrase_ids(value, len(source_ids), name)
            for name, value in (("banned", banned), ("constraints", constraints))
        ]
        if sampling is not None or prefixes is not None or any(p is not None for p in phrases):
            seeds = steering_seeds(seed, len(source_ids))
            return (sampling, prefixes, seeds, *phrases)
        return None

    def _translations(self, source_ids, extras, num_hypotheses, return_scores, progress):
        """`translate`'s outputs for the source ids: strings, or lists of N and/or
        `(translation, score)` tuples (`extras`: `_extras`'s)."""
        if num_hypotheses is None and not return_scores:
            if extras is None:
                return self.decode(self.translate_ids(source_ids, progress=progress))
            ids = self._search_with(source_ids, None, extras, progress)
            return self.decode([hypotheses[0][0] if hypotheses[0] else [] for hypotheses in ids])
        n = 1 if num_hypotheses is None else num_hypotheses
        if extras is None:
            hypotheses = self.translate_n_best(source_ids, n, progress)
        else:
            hypotheses = self._search_with(source_ids, n, extras, progress)
        results = []
        for ids, scores in hypotheses:
            texts = self.decode(ids) if ids else [""] * n
            entry = list(zip(texts, scores, strict=True)) if return_scores else texts
            results.append(entry if num_hypotheses is not None else entry[0])
        return results

    def _annotated(self, sentences, glossary):
        """`sentences` with `glossary`'s terms annotated (`terminology.annotate_all`),
        once the vocabulary is known to hold the tags."""
        sentences = frontend.check_sentences(sentences, "Translator")
        tags = _as_lists(self.tokenizer.tokenize(list(terminology.TAGS)))
        terminology.check_tags(terminology.tokenizer_has_tags(tags), "Translator")
        return terminology.annotate_all(sentences, glossary)

    def _prefix_ids(self, target_prefix, count):
        """`target_prefix` as a list of piece-id lists (None: no prefix)."""
        if target_prefix is None:
            return None
        target_prefix = frontend.per_sentence(target_prefix, count, "target_prefix")
        pieces = _as_lists(self.tokenizer.tokenize(target_prefix))
        return [ids if text.strip() else [] for text, ids in zip(target_prefix, pieces,
                                                                  strict=True)]  # fmt: skip

    def _phrase_ids(self, phrases, count, name):
        """`banned` or `constraints` as one list of piece-id lists per sentence (None: none)."""
        rows = frontend.per_sentence(phrases, count, name)
        if rows is None:
            return None
        flat = [p for row in rows for p in row if not frontend.is_blank(p)]
        pieces = iter(_as_lists(self.tokenizer.tokenize(flat)) if flat else [])
        return [[next(pieces) for p in row if not frontend.is_blank(p)] for row in rows]

    def _search_with(self, source_ids, num_hypotheses, extras, progress):
        """`translate_n_best`'s `(ids lists, scores)` per sentence with a forced
        prefix, sampling, bans and/or positive constraints (`extras`: `(sampling,
        prefixes, seeds, banned, constraints)`); without `num_hypotheses` the
        scores are absent (`(ids, None)`)."""
        sampling, prefixes, seeds, banned, constraints = extras
        search = self.search
        if sampling is not None:
            search = search.replace(beam_size=1)
        key = (num_hypotheses, sampling, prefixes is not None, banned is not None,
               constraints is not None)  # fmt: skip
        if key not in self._n_best:
            self._n_best[key] = compile_translate_ids(
                self.model, **search.to_dict(), jit_compile=self.jit_compile,
                num_hypotheses=num_hypotheses, sampling=sampling, prefix=prefixes is not None,
                bans=banned is not None, constrained=constraints is not None,
            )  # fmt: skip
        run_search = self._n_best[key]
        n = num_hypotheses or 1
        outputs = [([], [0.0] * n) for _ in source_ids]

        def run(batch):
            pad = self.config.pad_id
            width = max([len(prefixes[i]) for i in batch] if prefixes else [1])
            padded = np.full((len(batch), -(-max(width, 1) // 8) * 8), pad, dtype="int32")
            for row, i in enumerate(batch):
                if prefixes:
                    padded[row, : len(prefixes[i])] = prefixes[i]
            result = run_search(
                self._padded(source_ids, batch), seeds[batch].astype("int32"), padded,
                _phrases_array(banned, batch, pad), _phrases_array(constraints, batch, pad),
            )  # fmt: skip
            if num_hypotheses is None:
                ids, scores = keras.ops.convert_to_numpy(result)[:, None], None
            else:
                ids, scores = (keras.ops.convert_to_numpy(x) for x in result)
            for row, i in enumerate(batch):
                outputs[i] = (
                    ids[row].tolist(),
                    None if scores is None else [float(x) for x in scores[row]],
                )

        batches = frontend.batches_by_length([len(ids) for ids in source_ids], self.batch_size)
        frontend.run_batches(batches, run, progress)
        return outputs

    def translate_n_best(self, source_ids, num_hypotheses, progress=False):
        """Lists of source ids -> `(N output id lists, N scores)` per sentence
        (`([], [0.0] * N)` for an empty source), from `decoding.translate_ids`."""
        search = self.search
        if not isinstance(num_hypotheses, int) or not 1 <= num_hypotheses <= search.beam_size:
            raise ValueError(
                f"num_hypotheses must be between 1 and the beam size {search.beam_size}. "
                f"Received: num_hypotheses={num_hypotheses!r}"
            )
        if num_hypotheses not in self._n_best:
            self._n_best[num_hypotheses] = compile_translate_ids(
                self.model, **search.to_dict(), jit_compile=self.jit_compile,
                num_hypotheses=num_hypotheses,
            )  # fmt: skip
        run_search = self._n_best[num_hypotheses]
        outputs = [([], [0.0] * num_hypotheses) for _ in source_ids]

        def run(batch):
            ids, scores = run_search(self._padded(source_ids, batch))
            ids, scores = keras.ops.convert_to_numpy(ids), keras.ops.convert_to_numpy(scores)
            for row, i in enumerate(batch):
                outputs[i] = (ids[row].tolist(), [float(x) for x in scores[row]])

        batches = frontend.batches_by_length([len(ids) for ids in source_ids], self.batch_size)
        frontend.run_batches(batches, run, progress)
        return outputs
