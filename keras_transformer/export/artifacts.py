"""Atomic, versioned output directories of the exporters.

Exports land in TF Serving's layout, one integer version per export:

    <output_dir>/<name>/<version>/            SavedModel (TF Serving loads it)
    <output_dir>/<name>/onnx/<version>/       translate.onnx, encoder.onnx,
                                              decoder_step.onnx, vocab.model, config.json

Every directory is written under a hidden temporary name next to its target
and renamed into place, so TF Serving (which polls `<name>/` for integer
directories) never sees a half-written version. The work directory they read
is `keras_transformer.workdir`'s.
"""

import contextlib
import os
import shutil
import tempfile

from keras_transformer import workdir


def check_work_dir(work_dir):
    """Raises a clear error unless `work_dir` holds a finished run; returns run.json's dict."""
    return workdir.check(work_dir, finished=True)


def next_version(model_dir):
    """1 + the largest integer version directory in `model_dir` (1 when there is none)."""
    if not os.path.isdir(model_dir):
        return 1
    versions = [int(n) for n in os.listdir(model_dir) if n.isdigit()]
    return max(versions, default=0) + 1


def check_version(version):
    if isinstance(version, str) and version.isdigit():
        version = int(version)
    if isinstance(version, bool) or not isinstance(version, int) or version <= 0:
        raise ValueError(
            f"version must be a positive integer (TF Serving's version directories). "
            f"Received: version={version!r}"
        )
    return version


@contextlib.contextmanager
def atomic_directory(target, overwrite=False):
    """Yields a temporary directory that becomes `target` when the block succeeds.

    Refuses an existing `target` unless `overwrite=True`; on error the
    temporary directory is removed and `target` is left untouched.
    """
    target = os.path.abspath(target)
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(
            f"{target} already exists. Pass overwrite=True (`--overwrite`) to replace it, "
            "or export a new version."
        )
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    name = os.path.basename(target)
    staging = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        yield staging
        if os.path.exists(target):
            trash = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
            os.rename(target, os.path.join(trash, name))
            os.rename(staging, target)
            shutil.rmtree(trash)
        else:
            os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
