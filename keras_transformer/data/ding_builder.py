"""A tensorflow-datasets builder for the Ding German-English dictionary."""

import os

import tensorflow_datasets as tfds

from keras_transformer.data import ding


class DingDeEn(tfds.core.GeneratorBasedBuilder):
    """German-English phrase and sentence pairs from the Ding dictionary.

    Parsed at `download_and_prepare` time from the local dictionary file
    (`/usr/share/trans/de-en`, Debian package `trans-de-en`); nothing is
    downloaded. Splits are leakage-free; see `ding.split_entries`.

    Args:
        corpus_path: path of the dictionary file.
        synonyms: `"first"` or `"product"`; see `ding.parse_line`.
        **kwargs: `tfds.core.GeneratorBasedBuilder` arguments (`data_dir`).

    Example:

    >>> builder = DingDeEn(data_dir="work/tfds")
    >>> builder.download_and_prepare()
    >>> ds = builder.as_dataset(split="test")  # {"de": str, "en": str}
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Headword-hashed splits, sentence-enriched validation and test."}

    def __init__(self, *, corpus_path=ding.DEFAULT_CORPUS_PATH, synonyms="first", **kwargs):
        self._corpus_path = os.fspath(corpus_path)
        self._synonyms = synonyms
        if not os.path.exists(self._corpus_path):
            raise FileNotFoundError(
                f"The Ding German-English dictionary was not found at {self._corpus_path}. "
                f"{ding.INSTALL_HINT}"
            )
        super().__init__(**kwargs)

    def _info(self):
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.Translation(languages=("de", "en")),
            supervised_keys=("de", "en"),
            homepage="https://dict.tu-chemnitz.de/",
            license="GPL-2.0-or-later",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # the dictionary is a local file
        splits, _ = ding.load_ding_splits(self._corpus_path, self._synonyms)
        return {name: self._generate_examples(pairs) for name, pairs in splits.items()}

    def _generate_examples(self, pairs):
        for index, (german, english) in enumerate(pairs):
            yield index, {"de": german, "en": english}
