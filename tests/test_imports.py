"""The package's modules import each other without a cycle (a static check, imports
inside functions included: a lazy import only hides a cycle until it runs)."""

import ast
import os
import subprocess
import sys

import pytest

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


PUBLIC_LAYERS = [
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TokenEmbedding",
]

# Imports one public layer first, in a fresh process, before Keras; then loads a
# `.keras` file holding every layer, and reads the registry.
_IMPORT_FIRST = """
import sys
{statement}
assert "keras" in sys.modules  # the layer's module imported Keras
import keras
model = keras.saving.load_model(sys.argv[1])
names = ["Transformer", "TransformerSchedule", "LabelSmoothedCrossEntropy", "MaskedAccuracy"]
missing = [n for n in {layers} + names if keras.saving.get_registered_object(
    "keras_transformer>" + n) is None]
assert not missing, missing
print("loaded", sorted(type(layer).__name__ for layer in model.layers)[:3])
"""


@pytest.fixture(scope="module")
def every_layer_file(tmp_path_factory):
    """A `.keras` file of a model built from every public layer."""
    import keras

    from keras_transformer import layers

    source = keras.Input((None,), dtype="int32")
    target = keras.Input((None,), dtype="int32")
    embedding = layers.TokenEmbedding(20, 8)
    x = layers.PositionalEncoding()(embedding(source))
    x = layers.EncoderLayer(8, 2, 16)(x)
    x = layers.MultiHeadAttention(num_heads=2, key_dim=4)(x, x)
    y = layers.DecoderLayer(8, 2, 16)(layers.PositionalEncoding()(embedding(target)), x)
    model = keras.Model([source, target], layers.FeedForward(8, 16)(y))
    path = str(tmp_path_factory.mktemp("layers") / "every_layer.keras")
    model.save(path)
    return path


IMPORTS_FIRST = [f"from keras_transformer import {name}" for name in PUBLIC_LAYERS] + [
    "from keras_transformer.layers import EncoderLayer",
    "import keras_transformer.layers.attention",
]


def test_importing_a_layer_first_registers_every_class_without_a_warning(every_layer_file):
    """Issue 51: `from keras_transformer import DecoderLayer` before Keras printed a
    warning about a partially initialized module (the classes were registered while
    `keras_transformer.layers` was half imported) and left them unregistered. One
    fresh process per import, run side by side."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=root)
    processes = {
        statement: subprocess.Popen(
            [sys.executable, "-c", _IMPORT_FIRST.replace("{statement}", statement).replace(
                "{layers}", repr(PUBLIC_LAYERS)), every_layer_file],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=root,
        )
        for statement in IMPORTS_FIRST
    }  # fmt: skip
    failures = []
    for statement, process in processes.items():
        output, _ = process.communicate(timeout=300)
        loaded = "loaded ['DecoderLayer', 'EncoderLayer', 'FeedForward']" in output
        warned = [w for w in ("not registered", "circular import", "partially initialized")
                  if w in output]  # fmt: skip
        if process.returncode or not loaded or warned:
            failures.append(f"{statement}: {warned or output[-1500:]}")
    assert not failures, "\n".join(failures)


def test_a_moved_module_imports_by_its_old_name_with_a_deprecation_warning():
    """One release of grace: each old name is the new module itself, with a warning
    (one process for all of them)."""
    from keras_transformer._moved import MOVED

    code = (
        "import importlib, warnings\n"
        f"for old, new in {sorted(MOVED.items())!r}:\n"
        "    module = importlib.import_module(new)\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        assert importlib.import_module(old) is module, old\n"
        "    assert module.__spec__.name == new, old\n"
        "    print('warned:', *[str(w.message) for w in caught\n"
        "                       if issubclass(w.category, DeprecationWarning)])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, KERAS_BACKEND="numpy"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    for old, new in MOVED.items():
        assert f"warned: {old} moved to {new}" in result.stdout, result.stdout


def test_the_old_module_of_the_server_still_runs_as_a_command():
    result = subprocess.run([sys.executable, "-W", "ignore", "-m", "keras_transformer.serve",
                             "--help"], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0 and "keras-transformer-serve" in result.stdout, result.stderr
