"""Every table of measured figures in README.md and docs/ says where its figures come from.

The convention (docs/development.md, "Figures"): a table of measured figures
is followed, on its next non-blank line, by a line that begins with
`Source:` and names the machine (a CPU or GPU), the date (YYYY-MM-DD) and
at least one raw result under `benchmarks/results/` that exists:

    | build | step ms |
    |---|---:|
    | keras_transformer | 53.4 |

    Source: one NVIDIA H100 80GB HBM3, 2026-11-27, `benchmarks/results/h100_2026-11-27/`.

A table whose numbers are settings or counts rather than measurements (a
preset's dimensions, a corpus's pair counts) says so on the line before it:

    <!-- figures: not measured (the presets' settings) -->

A table is "of figures" when one of its columns after the first is mostly
numbers (3.4, 1,225,704, 0.75x, 17.9%, 53.4 ms). Tables written before the
convention and not yet sourced are listed in `tests/docs_unsourced.txt`
(page and header line); that list may only shrink: an entry whose table is
gone or now sourced fails too, so that it is removed.
"""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", "benchmarks/README.md", "saved_models/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md") and name != "options.md"  # generated from the parsers
)  # fmt: skip
LEGACY = os.path.join(ROOT, "tests", "docs_unsourced.txt")

NUMBER = re.compile(
    r"^[~<>≈+\-]?\d[\d,]*(\.\d+)?\s*(x|%|ms|s|min|h|GB|GiB|MB|MiB|M|k)?(\s*\(.*\))?$"
)
DELIMITER = re.compile(r"^\s*\|[\s:\-|]+\|\s*$")
NOT_MEASURED = re.compile(r"<!-- figures: not measured \([^)]+\) -->")
MACHINE = re.compile(r"\b(CPU|GPU|Zen ?\d|EPYC|Xeon|H100|H200|cores?)\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
RAW = re.compile(r"benchmarks/results/[\w./\-]+")


def _cells(line):
    return [cell.strip().strip("*`").strip() for cell in line.strip().strip("|").split("|")]


def tables(text):
    """`[(line index of the header, index after the last row, rows)]` outside code fences."""
    lines, found, fenced, i = text.split("\n"), [], False, 0
    while i < len(lines):
        if lines[i].startswith("```"):
            fenced = not fenced
        elif (not fenced and lines[i].lstrip().startswith("|") and i + 1 < len(lines)
              and DELIMITER.match(lines[i + 1])):  # fmt: skip
            end = i + 2
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                end += 1
            found.append((i, end, lines[i:end]))
            i = end
            continue
        i += 1
    return found


def is_figures(rows):
    """A column after the first whose filled cells are at least 60% numbers."""
    body = [_cells(row) for row in rows[2:]]
    for column in range(1, max((len(r) for r in body), default=0)):
        values = [r[column] for r in body if column < len(r) and r[column] not in ("", "-")]
        if values and sum(bool(NUMBER.match(v)) for v in values) >= 0.6 * len(values):
            return True
    return False


def source_problems(line, root=ROOT):
    """What the `Source:` line `line` lacks (empty: it is complete)."""
    if not line.startswith("Source:"):
        return ["no `Source:` line after the table"]
    problems = []
    if not MACHINE.search(line):
        problems.append("no machine (a CPU or GPU)")
    if not DATE.search(line):
        problems.append("no date (YYYY-MM-DD)")
    paths = [p.rstrip(".,") for p in RAW.findall(line)]
    if not paths:
        problems.append("no raw result under benchmarks/results/")
    problems += [f"{p} does not exist" for p in paths if not os.path.exists(os.path.join(root, p))]
    return problems


def unsourced(text, root=ROOT):
    """`[(header line, problems)]` of the figure tables of `text` that break the convention."""
    lines, bad = text.split("\n"), []
    for start, end, rows in tables(text):
        if not is_figures(rows) or (start and NOT_MEASURED.search(lines[start - 1])):
            continue
        after = next((line.strip() for line in lines[end:] if line.strip()), "")
        problems = source_problems(after, root)
        if problems:
            bad.append((rows[0].strip(), problems))
    return bad


def _legacy():
    with open(LEGACY, encoding="utf-8") as f:
        entries = [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]
    return {tuple(entry.split(": ", 1)) for entry in entries}


def test_the_convention_checker_can_fail(tmp_path):
    """Planted defects: no source, a source without a date, a raw file that does not exist."""
    (tmp_path / "benchmarks" / "results" / "x_2026-11-27").mkdir(parents=True)
    table = "| build | step ms |\n|---|---:|\n| a | 53.4 |\n| b | 1,225,704 |\n"
    assert unsourced(table, tmp_path) == [
        ("| build | step ms |", ["no `Source:` line after the table"])
    ]
    undated = table + "\nSource: one NVIDIA H100, `benchmarks/results/x_2026-11-27/`.\n"
    assert unsourced(undated, tmp_path)[0][1] == ["no date (YYYY-MM-DD)"]
    missing = table + "\nSource: one H100, 2026-11-27, `benchmarks/results/y/`.\n"
    assert unsourced(missing, tmp_path)[0][1] == ["benchmarks/results/y/ does not exist"]
    good = table + "\nSource: one H100, 2026-11-27, `benchmarks/results/x_2026-11-27/`.\n"
    assert unsourced(good, tmp_path) == []
    marked = "<!-- figures: not measured (settings) -->\n" + table
    assert unsourced(marked, tmp_path) == []
    words = "| option | what |\n|---|---|\n| --a | this |\n| --b | that |\n"
    assert unsourced(words, tmp_path) == []  # not a table of figures
    fenced = "```\n" + table + "```\n"
    assert unsourced(fenced, tmp_path) == []  # a table in a code block is code


@pytest.mark.parametrize("page", PAGES)
def test_every_table_of_figures_names_its_machine_date_and_raw_result(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        bad = unsourced(f.read())
    legacy = _legacy()
    new = [(header, problems) for header, problems in bad if (page, header) not in legacy]
    assert not new, (
        f"{page}: tables of figures without their source (docs/development.md, 'Figures'): "
        + "; ".join(f"{header} -> {', '.join(problems)}" for header, problems in new)
    )


def test_the_list_of_unsourced_tables_only_shrinks():
    """Each entry of tests/docs_unsourced.txt is still a table that breaks the convention."""
    still = set()
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            still |= {(page, header) for header, _ in unsourced(f.read())}
    stale = sorted(_legacy() - still)
    assert not stale, f"remove from tests/docs_unsourced.txt (sourced, changed or gone): {stale}"
