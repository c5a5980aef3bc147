"""One entry point for every corpus: the Ding dictionary, a TFDS name, or a folder.

`load_translation_data` returns the `(source, target)` string pairs of the
train, validation and test splits, in the requested direction, as Python
lists: the Ding dictionary and a folder need neither TensorFlow nor TFDS.
"""

import dataclasses
import hashlib
import logging
import os

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass
class TranslationData:
    """Splits of a parallel corpus.

    Attributes:
        source_language, target_language: language codes, e.g. "de", "en".
        splits: dict split name -> list of `(source, target)` strings.
        info: dict, the corpus name and per-split counts (for `run.json`).
    """

    source_language: str
    target_language: str
    splits: dict
    info: dict

    def pairs(self, split, limit=None):
        """The first `limit` pairs of `split`: a list of `(source, target)` strings."""
        pairs = self.splits[split]
        return list(pairs if limit is None and not isinstance(pairs, list) else pairs[:limit])


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
        splits[split] = [
            (x[source].decode("utf-8"), x[target].decode("utf-8")) for x in ds.as_numpy_iterator()
        ]
    info = {
        "name": name,
        "counts": {split: int(builder.info.splits[split].num_examples) for split in SPLITS},
    }
    return TranslationData(source, target, splits, info)


def _from_folder(folder, direction, stream_train=False, mix=()):
    from keras_transformer.data import text_files

    languages, pairs = text_files.read_parallel_folder(folder, stream_train)
    if mix:
        pairs["train"] = _mixed(folder, languages, pairs["train"], mix)
    default = ("de", "en") if set(languages) == {"de", "en"} else languages
    source, target = parse_direction(direction, languages, default)
    if direction is None:
        logger.info(
            "Direction %s -> %s (%s); --direction %s-%s for the other.", source, target,
            "German to English" if default == ("de", "en") else "the suffixes in alphabetical "
            "order", target, source,
        )  # fmt: skip
    flip = (source, target) != languages
    splits = {}
    for split, split_pairs in pairs.items():
        if isinstance(split_pairs, (text_files.TrainStream, text_files.MixedTrainStream)):
            splits[split] = split_pairs.flipped() if flip else split_pairs
        else:
            splits[split] = [(b, a) for a, b in split_pairs] if flip else list(split_pairs)
    info = {
        "name": f"folder:{os.path.abspath(folder)}",
        "counts": {split: len(split_pairs) for split, split_pairs in pairs.items()},
    }
    if mix:
        info["mixture"] = mixture_info(pairs["train"])
    return TranslationData(source, target, splits, info)


def _mixed(folder, languages, train, mix):
    """`--data-dir`'s training pairs (weight 1) and those of each `(folder, weight)`
    of `mix` as one `text_files.MixedTrainStream`; only their `train.*` files are read."""
    from keras_transformer.data import text_files

    if not isinstance(train, text_files.TrainStream):
        raise ValueError("Mixing corpora reads their training pairs as streams (stream_train).")
    parts, weights, names = [train], [1.0], [os.path.abspath(folder)]
    for other, weight in mix:
        found = text_files.find_languages(other)
        if set(found) != set(languages):
            raise ValueError(
                f"--mix {other} holds train.{'/'.join(found)}, but --data-dir {folder} holds "
                f"train.{'/'.join(languages)}: mixed corpora need the same two languages."
            )
        part, _ = text_files.scan_train_split(other, languages, hold_out=False)
        parts.append(part)
        weights.append(float(weight))
        names.append(os.path.abspath(other))
    mixed = text_files.MixedTrainStream(parts, weights, names)
    for entry in mixture_info(mixed):
        logger.info(
            "Corpus %s: %d training pairs, weight %g: %.0f%% of each pass over the data",
            entry["data_dir"], entry["pairs"], entry["weight"], 100 * entry["share"],
        )  # fmt: skip
    return mixed


def mixture_info(train):
    """Each mixed corpus's folder, weight, training pairs and share of a pass (`run.json`)."""
    total = sum(train.weights)
    return [
        {"data_dir": name, "weight": weight, "pairs": size, "share": weight / total}
        for name, weight, size in zip(train.names, train.weights, train.sizes, strict=True)
    ]


def load_translation_data(
    dataset="ding", data_dir=None, direction=None, tfds_data_dir=None, ding_path=None,
    stream_train=False, mix=(),
):  # fmt: skip
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
        stream_train: with `data_dir`, the training split is a
            `text_files.TrainStream`, read from its files when iterated (a
            corpus larger than memory; `data.binarize` tokenizes it in chunks).
        mix: `(folder, weight)` pairs: more corpora whose `train.*` pairs are
            trained on with `data_dir`'s (weight 1), each pass drawing them in
            proportion to the weights (`text_files.MixedTrainStream`; needs
            `stream_train`). Validation and test come from `data_dir`.
    """
    if mix and data_dir is None:
        raise ValueError("Mixing corpora (mix) needs data_dir: the first corpus's folder.")
    if data_dir is not None:
        return _from_folder(data_dir, direction, stream_train, mix)
    if dataset == "ding":
        data = _from_ding(ding_path, direction)
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


def tfds_order(pairs, split):
    """`pairs` in the order TFDS stores the examples `0, 1, ...` of `split`.

    TFDS writes a split sorted by the MD5 of its salt (the split name) and
    each example's key (`tfds.core.hashing.Hasher`); the Ding builder's keys
    are the pairs' indices. Reading Ding in this order keeps the held-out
    sets (the first 1,000 test pairs) those of the TFDS builder
    (`data.ding_builder.DingDeEn`), and so comparable across commits, without TFDS.
    """
    salted = hashlib.md5(split.encode("utf-8"))

    def key_hash(index):
        md5 = salted.copy()
        md5.update(str(index).encode("utf-8"))
        return int(md5.hexdigest(), 16)

    return [pairs[i] for i in sorted(range(len(pairs)), key=key_hash)]


def _from_ding(ding_path, direction):
    from keras_transformer.data import ding

    path = ding_path or ding.DEFAULT_CORPUS_PATH
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"The Ding German-English dictionary was not found at {path}. {ding.INSTALL_HINT}"
        )
    source, target = parse_direction(direction, ("de", "en"), ("de", "en"))
    parsed, _ = ding.load_ding_splits(path)
    splits = {}
    for split in SPLITS:
        pairs = tfds_order(parsed[split], split)
        splits[split] = pairs if source == "de" else [(e, g) for g, e in pairs]
    info = {"name": "ding", "counts": {split: len(splits[split]) for split in SPLITS}}
    return TranslationData(source, target, splits, info)


def _count_sentences(data):
    from keras_transformer.data.ding import is_sentence

    counts = {}
    for split in ("validation", "test"):
        counts[split] = sum(is_sentence(s, t) for s, t in data.pairs(split))
    return counts


def repeat_sentences(pairs, times):
    """`pairs` with its full-sentence pairs (`ding.is_sentence`) `times` times in all.

    The Ding dictionary is mostly phrases: its 18,408 full sentences are 5% of
    the training pairs, and a short run sees each of them about twice.
    Up-sampling them, as a multi-corpus recipe weights a small in-domain
    corpus, trades phrase steps for sentence steps.

    Args:
        pairs: list of `(source, target)` strings.
        times: int >= 1; 1 returns `pairs`.

    Returns:
        `pairs`, then its sentence pairs `times - 1` more times.
    """
    from keras_transformer.data.ding import is_sentence

    if not isinstance(times, int) or isinstance(times, bool) or times < 1:
        raise ValueError(f"times must be an integer >= 1. Received: times={times!r}")
    if times == 1:
        return pairs
    pairs = list(pairs)  # a `text_files.TrainStream` too: repeating needs them all
    sentences = [pair for pair in pairs if is_sentence(*pair)]
    return pairs + sentences * (times - 1)
