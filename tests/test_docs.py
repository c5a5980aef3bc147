"""The documentation is true: every Python block of README.md and docs/ runs, every link
resolves.

Python blocks run one per fresh interpreter (an ONNX Runtime block must not
share a process with TensorFlow), in a folder where `work/` is a tiny trained
work directory and `saved_models/` its exports (`export_fixtures.exported`),
so a snippet that names the default run's outputs runs on a tiny model. A
block that calls `.fit(` runs with `keras.Model.fit` checked (`FIT_CHECK`): every
loss and metric of its history must be finite, so an example that trains to NaN
fails. A block that cannot run says why on the line before it:

    <!-- docs-test: skip (needs your own tf.data datasets) -->

Links: every relative link names a file of the repository, and its `#anchor`
a heading of that file (GitHub's anchor rule). Links to other sites are not
fetched (CI has no internet); they are listed in the test's output.
"""

import os
import re
import subprocess
import sys

import pytest
from export_fixtures import exported

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", "benchmarks/README.md", "saved_models/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md")
)  # fmt: skip
PYTHON_PAGES = ["README.md"] + [p for p in PAGES if p.startswith("docs/")]
SKIP = re.compile(r"<!-- docs-test: skip \((?P<reason>[^)]+)\) -->")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _read(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def python_blocks(text):
    """`[(line number, code, skip reason or None)]` of the ```python blocks of `text`."""
    blocks, lines = [], text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = lines.index("```", start)
            before = lines[i - 1] if i else ""
            match = SKIP.search(before)
            blocks.append((start, "\n".join(lines[start:end]), match and match["reason"]))
            i = end
        i += 1
    return blocks


def _outside_code(text):
    """`text` with fenced and inline code removed: links in code are not links."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text):
    """GitHub's anchors of the headings of `text`: lower case, punctuation dropped,
    spaces to hyphens, repeats numbered."""
    seen, result = {}, set()
    for line in re.sub(r"```.*?```", "", text, flags=re.S).split("\n"):
        match = re.match(r"#{1,6} (.*)", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match[1].strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def test_the_link_rules_and_block_parser():
    """The checker itself: it must be able to fail."""
    assert anchors("# One GPU: this package, the keras-hub build\n## A b\n## A b") == {
        "one-gpu-this-package-the-keras-hub-build", "a-b", "a-b-1"
    }  # fmt: skip
    text = "x [a](b.md#c) `[d](e.md)` ![img](f.png)\n```\n[g](h.md)\n```\n"
    assert LINK.findall(_outside_code(text)) == ["b.md#c"]
    (block,) = python_blocks("<!-- docs-test: skip (why) -->\n```python\nx = 1\n```\n")
    assert block == (2, "x = 1", "why")


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve(page):
    text = _read(page)
    broken, external = [], []
    for target in LINK.findall(_outside_code(text)):
        if re.match(r"[a-z]+:", target):
            external.append(target)
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(ROOT, resolved)):
            broken.append(f"{target}: no file {resolved}")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(_read(resolved)):
            broken.append(f"{target}: no heading #{anchor} in {resolved}")
    print(f"{page}: {len(external)} links to other sites, not fetched")
    assert not broken, f"{page}: " + "; ".join(broken)


def _blocks():
    return [
        pytest.param(page, line, code, reason, id=f"{page}:{line}")
        for page in PYTHON_PAGES
        for line, code, reason in python_blocks(_read(page))
    ]


@pytest.fixture(scope="module")
def playground(tmp_path_factory):
    """A folder with `work/` (a tiny trained run) and `saved_models/` (its exports)."""
    work_dir, paths = exported(tmp_path_factory)
    folder = tmp_path_factory.mktemp("docs")
    os.symlink(work_dir, folder / "work")
    saved_models = os.path.dirname(os.path.dirname(paths["saved_model"]))
    os.symlink(saved_models, folder / "saved_models")
    return folder


# Run before a block that calls `.fit(` (only there: importing Keras imports TensorFlow,
# which an ONNX Runtime block must not share a process with), then the block itself.
FIT_CHECK = """
import math, sys, keras

_fit = keras.Model.fit


def _checked_fit(self, *args, **kwargs):
    history = _fit(self, *args, **kwargs)
    for name, values in history.history.items():
        bad = [v for v in values if not math.isfinite(float(v))]
        assert not bad, f"model.fit's {name} is not finite: {values}"
    return history


keras.Model.fit = _checked_fit
exec(compile(sys.argv.pop(1), "<docs block>", "exec"))  # in __main__, as `python -c` runs it
"""


def run_block(code, cwd):
    """Runs a docs block in a fresh interpreter in `cwd`; its `CompletedProcess`."""
    env = dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    args = ["-c", FIT_CHECK, code] if ".fit(" in code else ["-c", code]
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
@pytest.mark.parametrize("page, line, code, reason", _blocks())
def test_python_block_runs(page, line, code, reason, playground):
    if reason:
        pytest.skip(f"{page}:{line} says: {reason}")
    completed = run_block(code, playground)
    assert completed.returncode == 0, f"{page}:{line}\n{code}\n{completed.stderr[-3000:]}"


@pytest.mark.slow
def test_a_block_whose_fit_trains_to_nan_fails(tmp_path):
    """The mutation the fit check is for: a `model.fit` example whose loss is NaN
    exits 0 by itself (the old test passed it); checked, it fails."""
    block = (
        "import keras, numpy as np\n"
        "x = np.full((8, 2), np.nan, 'float32')\n"
        "model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
        "model.compile(optimizer='sgd', loss='mse')\n"
        "history = model.fit(x, np.ones((8, 1)), epochs=1, verbose=0)\n"
        "print('trained, loss', history.history['loss'])\n"
    )
    completed = run_block(block, tmp_path)
    assert "trained, loss" not in completed.stdout, completed.stdout
    assert completed.returncode != 0, completed.stderr[-2000:]
    assert "model.fit's loss is not finite: [nan]" in completed.stderr, completed.stderr[-2000:]


def test_the_option_reference_is_what_the_parsers_generate():
    """docs/options.md cannot drift from the commands: it is their parsers' help."""
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.command_line"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == _read("docs/options.md"), (
        "docs/options.md is stale: python -m keras_transformer.command_line > docs/options.md"
    )
