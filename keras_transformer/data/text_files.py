"""Reader for a folder of the user's own parallel text files.

The folder holds one file per split and language, one sentence per line,
line `i` of `train.de` translating line `i` of `train.en`:

    my_corpus/train.de  my_corpus/train.en
    my_corpus/validation.de  my_corpus/validation.en
    my_corpus/test.de  my_corpus/test.en
"""

import logging
import os

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


def find_languages(folder):
    """The two language suffixes of `folder/train.*`, e.g. `("de", "en")`, sorted."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--data-dir {folder} is not a directory.")
    languages = sorted(
        name.split(".", 1)[1] for name in os.listdir(folder) if name.startswith("train.")
    )
    if len(languages) != 2:
        raise ValueError(
            f"{folder} must hold exactly two training files train.<src> and train.<tgt>, "
            f"one per language. Found: {['train.' + lang for lang in languages]}"
        )
    return tuple(languages)


def read_lines(path):
    """The lines of `path` without line breaks; fails on the first line that is not UTF-8."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Missing parallel text file {path}")
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                lines.append(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: not valid UTF-8 ({error.reason} at byte "
                    f"{error.start}): {raw[:80]!r}"
                ) from None
    return lines


def read_parallel_split(folder, split, languages):
    """Reads `split.<lang>` for both languages into a list of aligned pairs.

    Pairs where either side is empty (after stripping spaces) are skipped and
    counted in the log.

    Returns:
        list of `(text in languages[0], text in languages[1])`.
    """
    paths = [os.path.join(folder, f"{split}.{lang}") for lang in languages]
    first, second = (read_lines(path) for path in paths)
    if len(first) != len(second):
        raise ValueError(
            f"Parallel files have different line counts: {paths[0]} has {len(first)} lines, "
            f"{paths[1]} has {len(second)} lines."
        )
    pairs = [(a.strip(), b.strip()) for a, b in zip(first, second, strict=True)]
    kept = [(a, b) for a, b in pairs if a and b]
    if len(kept) != len(pairs):
        logger.warning(
            "%s/%s.{%s}: skipped %d of %d line pairs with an empty side.",
            folder,
            split,
            ",".join(languages),
            len(pairs) - len(kept),
            len(pairs),
        )
    if not kept:
        raise ValueError(f"{paths[0]} and {paths[1]} hold no non-empty line pairs.")
    return kept


def read_parallel_folder(folder):
    """Reads every split of `folder`: `(languages, {split: [(text0, text1), ...]})`."""
    languages = find_languages(folder)
    return languages, {split: read_parallel_split(folder, split, languages) for split in SPLITS}
