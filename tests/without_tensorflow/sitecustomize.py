"""Makes TensorFlow, TensorFlow Text and TFDS look uninstalled in this process.

On `PYTHONPATH`, Python imports this file at start-up. The path finder
then finds none of `HIDDEN` (`importlib.util.find_spec` returns None and an
import raises `ModuleNotFoundError`, as where they were never installed), so
a test runs a command as on a machine without TensorFlow (the GPU machine's
JAX or torch install), though this one has it.
"""

import sys
from importlib.machinery import PathFinder

HIDDEN = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "tf2onnx", "tf_keras")


class _PathFinderWithout:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return PathFinder.find_spec(name, path, target)

    @staticmethod
    def invalidate_caches():
        PathFinder.invalidate_caches()


sys.meta_path[:] = [_PathFinderWithout if f is PathFinder else f for f in sys.meta_path]
