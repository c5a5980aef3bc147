"""Every function fits in a reader's head: at most 60 lines in `keras_transformer/` and 80
in `benchmarks/`, measured from the AST (the `def` line to the last line, docstring
included; a nested function counts on its own and within its parent).

A long function is doing several jobs (STYLE.md: "a runner is a list of named steps");
ruff's `C901` (pyproject.toml) bounds the branches of each the same way.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMITS = {"keras_transformer": 60, "benchmarks": 80}


def long_functions(folder, limit):
    """`[(path, line, name, lines)]` of the functions of `folder` over `limit` lines
    (`benchmarks/results/` keeps scripts as they ran: left out)."""
    found = []
    for parent, dirs, files in os.walk(os.path.join(ROOT, folder)):
        dirs[:] = [d for d in dirs if d not in ("results", "__pycache__")]
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(parent, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit:
                        found.append((os.path.relpath(path, ROOT), node.lineno, node.name, lines))
    return found


@pytest.mark.parametrize("folder", sorted(LIMITS))
def test_no_function_is_longer_than_a_reader_can_hold(folder):
    assert long_functions(folder, LIMITS[folder]) == []


def test_the_measure_counts_nested_functions_within_their_parent(tmp_path, monkeypatch):
    """The check can fail: a 40-line function holding a 30-line one is 71 lines."""
    package = tmp_path / "keras_transformer"
    package.mkdir()
    inner = "    def inner():\n" + "        x = 1\n" * 29
    (package / "m.py").write_text("def outer():\n" + inner + "    y = 2\n" * 40)
    monkeypatch.setattr(__import__(__name__), "ROOT", str(tmp_path))
    assert [(p, n, lines) for p, _, n, lines in long_functions("keras_transformer", 60)] == [
        (os.path.join("keras_transformer", "m.py"), "outer", 71)
    ]
