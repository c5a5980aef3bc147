"""The package's modules import each other without a cycle (a static check, imports
inside functions included: a lazy import only hides a cycle until it runs)."""

import ast
import os

import keras_transformer

PACKAGE_DIR = os.path.dirname(keras_transformer.__file__)


def _modules():
    """`{module name: file path}` of every module in the package."""
    modules = {}
    for folder, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if not name.endswith(".py"):
                continue
            relative = os.path.relpath(os.path.join(folder, name), os.path.dirname(PACKAGE_DIR))
            parts = relative[: -len(".py")].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = os.path.join(folder, name)
    return modules


def import_graph():
    """`{module: set of package modules it imports}`, anywhere in its code."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        targets = set()
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                # `from a import b` imports the module a.b when there is one, else a.
                names = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            else:
                continue
            targets.update(name for name in names if name in modules and name != module)
        graph[module] = targets
    return graph


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    state = {}  # 1: on the current path, 2: done

    def visit(module, path):
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target, path + [target])
                if cycle:
                    return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    # The check sees the edges that used to form a cycle.
    assert "keras_transformer.workdir" in graph["keras_transformer.export"]
    assert "keras_transformer.export" in graph["keras_transformer.training.finishing"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_work_directory_layout_is_written_in_one_module():
    """Only workdir.py spells out the files of a work directory. (`vocab.model` is
    also a file of the ONNX export directory, whose layout the ONNX exporter owns.)"""
    names = ('"model.keras"', '"model.last.keras"', '"run.json"', '"tfds"', '"workers"')
    for module, path in sorted(_modules().items()):
        if module == "keras_transformer.workdir":
            continue
        with open(path, encoding="utf-8") as f:
            code = f.read()
        for name in names:
            assert name not in code, f"{path} spells out {name}: use keras_transformer.workdir"
