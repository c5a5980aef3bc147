"""A run's vocabulary and tokenized training pairs (`inputs.prepare_inputs`' rooms):
the shared vocabulary, the training pairs as trained on, their tokenized splits
(`data.shards`), and with BPE-dropout their sampled segmentations."""

import logging
import os
import shutil
import time

from keras_transformer import terminology
from keras_transformer.data import get_tokenizer, repeat_sentences, shards

logger = logging.getLogger(__name__)


class TrainingPairs:
    """The training pairs as trained on: full sentences repeated and, with a glossary,
    annotated (`terminology`): a call gives a fresh iterable of them; `identity`
    names them (the corpus's digests and the glossary's settings) with the
    validation pairs."""

    def __init__(self, config, data, train_pairs, glossary=None):
        self.config, self.train_pairs, self.glossary = config, train_pairs, glossary
        self.identity = {
            "train": data.info["sha256"]["train"],
            "validation": data.info["sha256"]["validation"],
            "sentence_repeats": config.sentence_repeats,
        }
        if glossary is not None:
            # Its content, not where it lies: a glossary moved elsewhere names the same pairs.
            self.identity["terminology"] = {k: v for k, v in glossary[1].items() if k != "path"}

    def __call__(self):
        # The vocabulary is the corpus's; repeated sentences only weigh the batches.
        config = self.config
        pairs = repeat_sentences(self.train_pairs(), config.sentence_repeats)
        if self.glossary is None:
            return pairs
        return terminology.annotate_training_pairs(
            pairs, self.glossary[0], config.terminology_rate, config.seed
        )


def tokenized(config, work, data, pairs, tokenizer, model_config):
    """`(tokenized, reused)` (`data.shards.tokenized_splits`) of the training pairs
    (`TrainingPairs`) and the validation pairs (never annotated)."""
    splits = {"train": pairs, "validation": data.splits["validation"]}
    return shards.tokenized_splits(
        work.data, splits, tokenizer, model_config.max_length, model_config.eos_id,
        workers=config.workers, pairs_identity=pairs.identity,
    )  # fmt: skip


def sampled(config, work, pairs, tokenizer, model_config):
    """BPE-dropout's sampled segmentations of the training pairs
    (`data.shards.sampled_copies`), or None without `--bpe-dropout`."""
    if not config.bpe_dropout:
        return None
    start = time.time()
    copies = shards.sampled_copies(
        work.data, pairs, tokenizer, model_config.max_length, model_config.eos_id,
        config.bpe_dropout, config.bpe_dropout_copies, pairs.identity, workers=config.workers,
    )  # fmt: skip
    logger.info(
        "BPE-dropout %g: %d sampled segmentations of the training pairs (%s longer than %d "
        "dropped), read by the passes over the data in turn, in %.0fs",
        config.bpe_dropout, len(copies), "/".join(str(c.dropped) for c in copies),
        model_config.max_length, time.time() - start,
    )  # fmt: skip
    return copies


def terminology_record(glossary, train, tokenizer):
    """run.json's `terminology`: the glossary's settings, and how many training
    pairs and terms carry the tags, counted in the tokenized pairs trained on."""
    if glossary is None:
        return None
    import numpy as np

    tag = tokenizer.processor.piece_to_id(terminology.SRC_TERM_START)
    positions = np.flatnonzero(np.asarray(train.source) == tag)
    pairs = np.unique(np.searchsorted(train.source_offsets, positions, side="right") - 1)
    _, settings = glossary
    return dict(settings, annotated_pairs=int(pairs.size), annotated_terms=int(positions.size),
                train_pairs=len(train))  # fmt: skip


def vocabulary(work, train_pairs, model_config, finished, tags=False, sample_lines=300_000):
    """The shared vocabulary: trained on the corpus (its first `sample_lines` lines), or
    `--init-from`'s, copied once; with `tags`, the glossary tags of `--terminology` are
    pieces of it."""
    if finished is not None:
        source = finished.work.vocabulary
        if not os.path.exists(work.vocabulary):
            shutil.copyfile(source, work.vocabulary)
        else:
            with open(source, "rb") as a, open(work.vocabulary, "rb") as b:
                if a.read() != b.read():
                    raise ValueError(
                        f"{work.vocabulary} is not the vocabulary of --init-from {source}; "
                        "use a new --work-dir."
                    )
        logger.info("Vocabulary and weights of %s", finished.work.path)
    pairs = () if os.path.exists(work.vocabulary) else train_pairs()
    symbols = terminology.TAGS if tags else ()
    return get_tokenizer(work.vocabulary, pairs, model_config.vocab_size, symbols, sample_lines)
