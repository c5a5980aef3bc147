"""The modules that moved into `keras_transformer.serving` and `keras_transformer.translators`,
still importable by their old names for one release, with a `DeprecationWarning`.

    import keras_transformer.serving_queue   # the module keras_transformer.serving.queue
    python -m keras_transformer.serve ...    # runs keras_transformer.serving.cli

An old name is the new module itself (one object, so `isinstance` and monkeypatching
agree), found by a finder placed last on `sys.meta_path`: a real module of the old
name would still win.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "keras_transformer.serve": "keras_transformer.serving.cli",
    "keras_transformer.serving_engines": "keras_transformer.serving.engines",
    "keras_transformer.serving_metrics": "keras_transformer.serving.metrics",
    "keras_transformer.serving_queue": "keras_transformer.serving.queue",
    "keras_transformer.serving_requests": "keras_transformer.serving.requests",
    "keras_transformer.serving_workers": "keras_transformer.serving.versions",
    "keras_transformer.frontend": "keras_transformer.serving.frontend",
    "keras_transformer.translator": "keras_transformer.translators.keras_translator",
    "keras_transformer.onnx_translator": "keras_transformer.translators.onnx_translator",
    "keras_transformer.ctranslate2_translator": (
        "keras_transformer.translators.ctranslate2_translator"
    ),
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name of `MOVED` as its new module, warning once per name."""

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old name goes in the next release.",
            DeprecationWarning, stacklevel=2,
        )  # fmt: skip
        module = importlib.import_module(new)
        self._spec = module.__spec__  # put back by exec_module (the import sets __spec__)
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec

    def get_code(self, name):
        """The new module's code, for `python -m OLD_NAME` (runpy asks the loader)."""
        new = MOVED[name]
        warnings.warn(f"python -m {name}: use python -m {new}.", DeprecationWarning, stacklevel=2)
        return importlib.util.find_spec(new).loader.get_code(new)

    def is_package(self, name):
        return False


def install():
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
