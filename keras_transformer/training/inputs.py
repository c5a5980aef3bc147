"""A run's inputs: the corpus, the model config it implies, the shared vocabulary,
and the batches `model.fit` reads, each made once per work directory.

One input path on every backend: the corpus is parsed and its pairs
tokenized with the `sentencepiece` package once per work directory
(`data.shards`: a resumed or continued run reads both back), and
`data.Batches` plans and assembles the batches on the host, which
`model.fit` reads as a `tf.data` wrapper under TensorFlow and as a
`keras.utils.PyDataset` under JAX and torch.
"""

import dataclasses
import functools
import logging
import os
import time

from keras_transformer import terminology, workdir
from keras_transformer.data import (
    Batches,
    InputTimer,
    load_translation_data,
    make_dataset,
    shards,
)
from keras_transformer.training import budget, tokens
from keras_transformer.training.presets import COMMON_DEFAULTS
from keras_transformer.training.presets import model_config as make_model_config

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Corpus, model config, vocabulary and the batched splits of one run."""

    data: object  # TranslationData
    model_config: object  # TransformerConfig
    tokenizer: object
    train_batches: object  # data.Batches of the training split
    train_ds: object
    val_ds: object
    batch_stats: dict  # `data.plan_statistics` of the first pass over the training pairs
    input_timer: InputTimer
    tokenize_seconds: float
    terminology: dict | None = None  # the glossary's settings and counts (run.json)


def prepare_inputs(config, machine, work, finished=None):
    """Reads the corpus, claims `work` for it, and makes the vocabulary and the batches.

    Args:
        config: the resolved `TrainingConfig`.
        machine: `machine.Machine` (the replicas a batch is split over; the chief claims).
        work: the `WorkDir` this process writes.
        finished: `lifecycle.FinishedRun` of `--init-from`, or None.

    Returns:
        `Inputs`; None with `--prepare-only` (the corpus, vocabulary and shards are
        written, no batch is planned).
    """
    glossary = _glossary(config)
    data, train_pairs, write_corpus = _corpus(config, work)
    model_config = make_model_config(config, finished)  # the corpus's dropout comes below
    if machine.is_chief:  # before anything is written there
        workdir.claim(work.path, _corpus_identity(data, model_config, config.vocab_sample_size))
    write_corpus()
    tokenizer = tokens.vocabulary(
        work, train_pairs, model_config, finished, glossary is not None, config.vocab_sample_size
    )
    start = time.time()
    pairs = tokens.TrainingPairs(config, data, train_pairs, glossary)
    tokenized, reused = tokens.tokenized(config, work, data, pairs, tokenizer, model_config)
    passes = tokens.sampled(config, work, pairs, tokenizer, model_config)
    tokenize_seconds = time.time() - start
    glossary_record = tokens.terminology_record(glossary, tokenized["train"], tokenizer)
    _report(data, tokenized["train"], tokenizer, work, machine.is_chief)
    if config.prepare_only:  # no batches planned: preparing stays bounded in memory
        logger.info(
            "%s %d train pairs (%d longer than %d dropped) in %.0fs", "Read the tokenized"
            if reused else "Tokenized", len(tokenized["train"]), tokenized["train"].dropped,
            model_config.max_length, tokenize_seconds,
        )  # fmt: skip
        return None
    input_timer = InputTimer()
    train, validation = _batches(config, machine, model_config, tokenized, passes, input_timer)
    stats = train.statistics()  # the plan of the first pass, which training then reads
    _log_batches(config, model_config, tokenized["train"], reused, tokenize_seconds, stats)
    # The corpus's picks at the cpu preset's step time; the runner settles them on this
    # machine's (`budget.settle`).
    model_config = budget.guess(config, model_config, stats["batches"], finished, work.path)
    return Inputs(
        data, model_config, tokenizer, train, make_dataset(train), make_dataset(validation),
        stats, input_timer, tokenize_seconds, glossary_record,
    )  # fmt: skip


def _batches(config, machine, model_config, tokenized, passes, timer):
    """`(train, validation)` `data.Batches`; training passes read `passes` in turn
    (BPE-dropout's sampled copies) where given."""
    common = dict(
        max_length=model_config.max_length,
        batch_tokens=config.batch_tokens,
        num_replicas=machine.num_replicas,
        bos_id=model_config.bos_id,
        eos_id=model_config.eos_id,
        pack=config.pack,
    )
    weights = None
    if config.mixture:
        weights = [1.0] + [weight for _, weight in config.mixture]
    train = Batches(
        tokenized["train"], training=True, seed=config.seed, timer=timer, weights=weights,
        passes=passes, **common,
    )  # fmt: skip
    return train, Batches(tokenized["validation"], training=False, **common)


def _log_batches(config, model_config, train, reused, tokenize_seconds, stats):
    logger.info(
        "%s %d train pairs (full sentences %d times; %d longer than %d dropped) in %.0fs. "
        "Batches of ~%d tokens: %.0f sentences, %.0f source + %.0f target real tokens, padding "
        "share %.1f%%, %d batches per pass over the data",
        "Read the tokenized" if reused else "Tokenized", len(train), config.sentence_repeats,
        train.dropped, model_config.max_length, tokenize_seconds, config.batch_tokens,
        stats["batch_size"], stats["source_tokens"], stats["target_tokens"],
        100 * stats["padding_share"], stats["batches"],
    )  # fmt: skip


def _glossary(config):
    """`(glossary, settings)` of `--terminology` (its settings are what run.json
    records and what names the tokenized pairs), or None."""
    if config.terminology is None:
        return None
    glossary = terminology.load_glossary(config.terminology)
    settings = terminology.settings(
        config.terminology, glossary, config.terminology_rate, config.seed
    )
    return glossary, settings


def _corpus(config, work):
    """`(data, train_pairs, write)`: the corpus, read back from the work directory
    when it was parsed there from the same files (`data.shards.read_corpus`: all
    but its training pairs), else parsed with its splits' digests; `train_pairs()`
    its training pairs, parsed only when a call needs them (a new vocabulary or
    new shards); `write()` keeps a fresh parse there (after the claim)."""
    start = time.time()
    if config.data_dir is not None and not _has_train_files(config.data_dir):
        # The text may go once it is prepared: the shards are all training reads.
        data = shards.read_corpus(work.data, source=None)
        if data is not None and "train" not in data.splits:
            logger.warning(
                "--data-dir %s has no train.* files: training from the corpus prepared in %s "
                "(%s training pairs)", config.data_dir, work.data, data.info["counts"]["train"],
            )  # fmt: skip
            return data, _text_is_gone(config.data_dir), lambda: None
    source = shards.source_identity(
        config.dataset, config.data_dir, config.direction, config.ding_path, config.mixture
    )
    load = functools.partial(
        load_translation_data, config.dataset, data_dir=config.data_dir,
        direction=config.direction, tfds_data_dir=workdir.WorkDir(config.work_dir).tfds,
        ding_path=config.ding_path, stream_train=True, mix=config.mixture,
    )  # fmt: skip
    source["filters"] = list(config.filter_names)  # the training pairs depend on them
    data = shards.read_corpus(work.data, source)
    read_back = data is not None
    if not read_back:
        data = shards.add_digests(_filtered(load(), config.filter_names))
    logger.info(
        "Data %s, %s -> %s: %s (%s in %.0fs)", data.info["name"], data.source_language,
        data.target_language, data.info["counts"],
        "read back" if read_back else "parsed", time.time() - start,
    )  # fmt: skip

    @functools.cache
    def train_pairs():
        # The same files and parser (`source`): the same pairs as when it was written.
        return data.splits["train"] if "train" in data.splits else load().splits["train"]

    def write():
        if not read_back:
            shards.write_corpus(work.data, source, data)

    return data, train_pairs, write


def _report(data, train, tokenizer, work, is_chief):
    """The corpus report with the vocabulary's coverage of the tokenized training
    pairs: logged (summary, warnings, suggestions) and written to `corpus.json`."""
    from keras_transformer.data.report import CorpusReport

    if "report" not in data.info:  # a corpus parsed by an older version
        return
    report = CorpusReport.from_dict(data.info["report"])
    report.read_tokens(train, tokenizer)
    data.info["report"] = report.to_dict()
    for line in report.summary():
        logger.info("Corpus report: %s", line)
    for warning in data.info["report"]["warnings"]:
        logger.warning("Corpus report: %s", warning)
    for suggestion in data.info["report"]["suggestions"]:
        logger.info("Suggested for this corpus: %s", suggestion)
    if is_chief:
        workdir.write_corpus_report(work.path, data.info["report"])


def _filtered(data, filters):
    """`data` with its training pairs measured (`data.report.CorpusReport`, kept in
    `data.info["report"]`) and those the filters drop left out; logged."""
    from keras_transformer.data.report import CorpusReport

    report = CorpusReport({name: data.splits[name] for name in ("validation", "test")})
    train = data.splits["train"]
    dropped = report.read_train(train, filters, empty=getattr(train, "empty", 0))
    if dropped.any():
        if isinstance(train, list):
            train = [pair for pair, drop in zip(train, dropped.tolist(), strict=True) if not drop]
        else:
            train = train.without(dropped)
    info = dict(data.info, counts=dict(data.info["counts"], train=len(train)))
    if "mixture" in info:
        from keras_transformer.data.sources import mixture_info

        info["mixture"] = mixture_info(train)
    info["report"] = report.to_dict()
    return dataclasses.replace(data, splits=dict(data.splits, train=train), info=info)


def _has_train_files(folder):
    return os.path.isdir(folder) and any(name.startswith("train.") for name in os.listdir(folder))


def _text_is_gone(folder):
    def train_pairs():
        raise ValueError(
            f"--data-dir {folder} has no train.* files, and the work directory's prepared "
            "corpus lacks what this run needs (its vocabulary or tokenized pairs)."
        )

    return train_pairs


def _corpus_identity(data, model_config, vocab_sample_size=None):
    """What a work directory belongs to (`workdir.claim`): the corpus, its
    direction, a digest of its training pairs and the vocabulary size, and the
    vocabulary's sample where it is not the default (so that work directories
    made before `--vocab-sample-size` keep their identity)."""
    identity = {
        "corpus": data.info["name"],
        "direction": f"{data.source_language}-{data.target_language}",
        "train_pairs_sha256": data.info["sha256"]["train"],
        "vocab_size": model_config.vocab_size,
    }
    if vocab_sample_size not in (None, COMMON_DEFAULTS["vocab_sample_size"]):
        identity["vocab_sample_size"] = vocab_sample_size
    return identity
