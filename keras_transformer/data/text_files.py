"""Reader for a folder of the user's own parallel text files.

The folder holds one file per split and language, one sentence per line,
line `i` of `train.de` translating line `i` of `train.en`:

    my_corpus/train.de  my_corpus/train.en
    my_corpus/validation.de  my_corpus/validation.en   (or valid.*, or dev.*)
    my_corpus/test.de  my_corpus/test.en               (optional)

The names fairseq, Marian and most corpus releases use are read as they
are: `valid.*` or `dev.*` for the validation split. Without one, a fixed
share of the training pairs (`HELD_OUT_SHARE`, chosen by a hash of their
text, so the same pairs every run) is held out for validation. Without
`test.*`, there is no test split (and no test decoding).
"""

import hashlib
import logging
import os

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
VALIDATION_NAMES = ("validation", "valid", "dev")
HELD_OUT_SHARE = 0.01  # of the training pairs, when the folder has no validation files
MAX_HELD_OUT = 5000


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


def _exists(folder, name, languages):
    return all(os.path.exists(os.path.join(folder, f"{name}.{lang}")) for lang in languages)


def _held_out(pair):
    digest = hashlib.sha1("\t".join(pair).encode("utf-8")).hexdigest()
    return int(digest[:12], 16) / 16.0**12


def read_parallel_folder(folder):
    """Reads every split of `folder`: `(languages, {split: [(text0, text1), ...]})`.

    The validation split is `validation.*`, `valid.*` or `dev.*` (the first
    found), else `HELD_OUT_SHARE` of the training pairs (at most
    `MAX_HELD_OUT`, at least one); the test split is `test.*`, or empty.
    """
    languages = find_languages(folder)
    splits = {"train": read_parallel_split(folder, "train", languages)}
    name = next((n for n in VALIDATION_NAMES if _exists(folder, n, languages)), None)
    if name is not None:
        splits["validation"] = read_parallel_split(folder, name, languages)
        if name != "validation":
            logger.info("Validation split: %s/%s.{%s}", folder, name, ",".join(languages))
    else:
        train = splits["train"]
        count = min(max(int(len(train) * HELD_OUT_SHARE), 1), MAX_HELD_OUT)
        if len(train) < 2:
            raise ValueError(f"{folder}: too few training pairs to hold out a validation split.")
        held = set(sorted(range(len(train)), key=lambda i: _held_out(train[i]))[:count])
        splits["validation"] = [train[i] for i in sorted(held)]
        splits["train"] = [pair for i, pair in enumerate(train) if i not in held]
        logger.info(
            "No validation.*, valid.* or dev.* files in %s: %d training pairs (%.0f%%, chosen "
            "by a hash of their text) held out for validation.",
            folder, count, 100 * count / len(train),
        )  # fmt: skip
    if _exists(folder, "test", languages):
        splits["test"] = read_parallel_split(folder, "test", languages)
    else:
        splits["test"] = []
        logger.info("No test.* files in %s: no test decoding.", folder)
    return languages, splits
