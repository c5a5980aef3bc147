"""One entry point for every corpus: the Ding dictionary, a TFDS name, or a folder.

`load_translation_data` returns string datasets of `(source, target)` pairs
for the train, validation and test splits, in the requested direction.
"""

import dataclasses
import logging
import os

import tensorflow as tf

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass
class TranslationData:
    """Splits of a parallel corpus.

    Attributes:
        source_language, target_language: language codes, e.g. "de", "en".
        splits: dict split name -> `tf.data.Dataset` of `(source, target)`
            scalar `tf.string` pairs.
        info: dict, the corpus name and per-split counts (for `run.json`).
    """

    source_language: str
    target_language: str
    splits: dict
    info: dict

    def pairs(self, split, limit=None):
        """The first `limit` pairs of `split` as a list of Python `(source, target)` strings."""
        ds = self.splits[split]
        if limit is not None:
            ds = ds.take(limit)
        return [(s.decode("utf-8"), t.decode("utf-8")) for s, t in ds.as_numpy_iterator()]


def parse_direction(direction, languages, default):
    """`"de-en"` -> `("de", "en")`, checked against the corpus `languages`."""
    if direction is None:
        return default
    parts = tuple(direction.split("-"))
    if len(parts) != 2 or sorted(parts) != sorted(languages):
        raise ValueError(
            f"--direction must be 'src-tgt' with the corpus languages {list(languages)}. "
            f"Received: direction={direction!r}"
        )
    return parts


def _from_tfds_builder(builder, name, direction):
    languages = tuple(builder.info.features.languages)
    default = tuple(builder.info.supervised_keys or languages)
    source, target = parse_direction(direction, languages, default)
    builder.download_and_prepare()
    splits = {}
    for split in SPLITS:
        if split not in builder.info.splits:
            raise ValueError(f"{name} has no {split!r} split. Splits: {list(builder.info.splits)}")
        ds = builder.as_dataset(split=split, shuffle_files=False)
        splits[split] = ds.map(lambda x, s=source, t=target: (x[s], x[t]))
    info = {
        "name": name,
        "counts": {split: int(builder.info.splits[split].num_examples) for split in SPLITS},
    }
    return TranslationData(source, target, splits, info)


def _from_folder(folder, direction):
    from keras_transformer.data import text_files

    languages, pairs = text_files.read_parallel_folder(folder)
    default = ("de", "en") if set(languages) == {"de", "en"} else languages
    source, target = parse_direction(direction, languages, default)
    flip = (source, target) != languages
    splits = {}
    for split, split_pairs in pairs.items():
        first, second = zip(*split_pairs, strict=True)
        sources, targets = (second, first) if flip else (first, second)
        splits[split] = tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))
    info = {
        "name": f"folder:{os.path.abspath(folder)}",
        "counts": {split: len(split_pairs) for split, split_pairs in pairs.items()},
    }
    return TranslationData(source, target, splits, info)


def load_translation_data(
    dataset="ding", data_dir=None, direction=None, tfds_data_dir=None, ding_path=None
):
    """Loads a parallel corpus as `TranslationData`.

    Args:
        dataset: `"ding"` (the local Ding dictionary) or a TFDS translation
            dataset name such as `"wmt14_translate/de-en"` or
            `"ted_hrlr_translate/pt_to_en"` (downloaded by TFDS).
        data_dir: a folder of parallel text files (`train.de`, `train.en`,
            `validation.*`, `test.*`); overrides `dataset`.
        direction: `"src-tgt"`, e.g. `"en-de"`; None keeps the corpus order.
        tfds_data_dir: where TFDS prepares and caches datasets.
        ding_path: the Ding dictionary file (default `/usr/share/trans/de-en`).
    """
    if data_dir is not None:
        return _from_folder(data_dir, direction)
    if dataset == "ding":
        from keras_transformer.data import ding
        from keras_transformer.data.ding_builder import DingDeEn

        builder = DingDeEn(
            corpus_path=ding_path or ding.DEFAULT_CORPUS_PATH, data_dir=tfds_data_dir
        )
        data = _from_tfds_builder(builder, "ding", direction)
        data.info["sentences"] = _count_sentences(data)
        return data
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(dataset, data_dir=tfds_data_dir)
    except Exception as error:  # TFDS raises several types for unknown names
        raise ValueError(
            f"Unknown dataset {dataset!r}: use 'ding', a TFDS translation dataset name "
            f"(e.g. 'wmt14_translate/de-en'), or --data-dir for your own files. ({error})"
        ) from None
    if not hasattr(builder.info.features, "languages"):
        raise ValueError(f"TFDS dataset {dataset!r} is not a translation dataset (no languages).")
    return _from_tfds_builder(builder, dataset, direction)


def _count_sentences(data):
    from keras_transformer.data.ding import is_sentence

    counts = {}
    for split in ("validation", "test"):
        counts[split] = sum(is_sentence(s, t) for s, t in data.pairs(split))
    return counts


def _are_sentences(texts):
    # `ding.is_sentence` for one side, over a batch of strings: capitalized,
    # three words or more, ends in . ! or ?
    words = tf.strings.split(texts).row_lengths()
    return tf.logical_and(words >= 3, tf.strings.regex_full_match(texts, r"(?s)\p{Lu}.*[.!?]"))


def _sentence_pairs(sources, targets):
    keep = tf.logical_and(_are_sentences(sources), _are_sentences(targets))
    return tf.boolean_mask(sources, keep), tf.boolean_mask(targets, keep)


def repeat_sentences(pairs, times):
    """`pairs` with its full-sentence pairs (`ding.is_sentence`) `times` times in all.

    The Ding dictionary is mostly phrases: its 18,408 full sentences are 5% of
    the training pairs, and a short run sees each of them about twice.
    Up-sampling them, as a multi-corpus recipe weights a small in-domain
    corpus, trades phrase steps for sentence steps.

    Args:
        pairs: `tf.data.Dataset` of `(source, target)` scalar strings.
        times: int >= 1; 1 returns `pairs`.
    """
    if not isinstance(times, int) or isinstance(times, bool) or times < 1:
        raise ValueError(f"times must be an integer >= 1. Received: times={times!r}")
    if times == 1:
        return pairs
    # Batched: a per-pair filter took 80 s over Ding's 377k pairs, this about 3 s.
    sentences = pairs.batch(4096).map(_sentence_pairs).unbatch().cache()
    return pairs.concatenate(sentences.repeat(times - 1))
