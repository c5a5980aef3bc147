"""Small corpora written by tests: a Ding-format dictionary and parallel text files."""

import random

GERMAN = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"]
ENGLISH = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def number_pairs(count, seed=0, max_words=6):
    """German and English number-word sequences that translate word by word."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        digits = [rng.randrange(10) for _ in range(rng.randint(1, max_words))]
        pairs.append((" ".join(GERMAN[d] for d in digits), " ".join(ENGLISH[d] for d in digits)))
    return pairs


def write_parallel_folder(folder, sizes=(400, 40, 40), seed=0):
    """Writes train/validation/test .de/.en files of number sentences into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for offset, (split, size) in enumerate(
        zip(("train", "validation", "test"), sizes, strict=True)
    ):
        pairs = number_pairs(size, seed=seed + offset)
        (folder / f"{split}.de").write_text("".join(g + "\n" for g, _ in pairs), encoding="utf-8")
        (folder / f"{split}.en").write_text("".join(e + "\n" for _, e in pairs), encoding="utf-8")
    return folder


def write_splits(folder, splits):
    """Writes `{split: [(de, en), ...]}` as `split.de` / `split.en` files into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        for side, language in ((0, "de"), (1, "en")):
            text = "".join(pair[side] + "\n" for pair in pairs)
            (folder / f"{split}.{language}").write_text(text, encoding="utf-8")
    return folder
