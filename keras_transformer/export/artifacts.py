"""Atomic, versioned output directories of the exporters.

Exports land in TF Serving's layout, one integer version per export:

    <output_dir>/<name>/<version>/            SavedModel (TF Serving loads it)
    <output_dir>/<name>/onnx/<version>/       translate.onnx, encoder.onnx,
                                              decoder_step.onnx, vocab.model, config.json

Every directory is written under a hidden temporary name next to its target
and renamed into place, so TF Serving (which polls `<name>/` for integer
directories) never sees a half-written version; the formats of one export
are renamed into place together (`atomic_directories`): a version holds
every format asked for, or none. The work directory they read
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
    with atomic_directories({"target": target}, overwrite=overwrite) as staging:
        yield staging["target"]


@contextlib.contextmanager
def atomic_directories(targets, overwrite=False):
    """Yields `{key: temporary directory}`; when the block succeeds, each becomes
    `targets[key]`, all of them or none.

    Existing targets are refused unless `overwrite=True`, and then replaced.
    If the block raises, the temporary directories are removed and no target
    changes. If a rename fails while they are moved into place, those moved
    so far are removed again and the replaced directories restored, then the
    error is raised.
    """
    targets = {key: os.path.abspath(target) for key, target in targets.items()}
    existing = [t for t in targets.values() if os.path.exists(t)]
    if existing and not overwrite:
        raise FileExistsError(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}. "
            "Pass overwrite=True (`--overwrite`) to replace, or export a new version."
        )
    staging = {}
    try:
        for key, target in targets.items():
            os.makedirs(os.path.dirname(target), exist_ok=True)
            staging[key] = tempfile.mkdtemp(
                prefix=f".{os.path.basename(target)}.tmp-", dir=os.path.dirname(target)
            )
        yield dict(staging)
        _commit(targets, staging)
    finally:
        for path in staging.values():
            shutil.rmtree(path, ignore_errors=True)  # gone already where committed


def _commit(targets, staging):
    """Renames every staging directory to its target; undoes all of it if one fails."""
    replaced, placed = [], []  # (target, where the old one waits), targets renamed into place
    try:
        for key, target in targets.items():
            if os.path.exists(target):
                trash = tempfile.mkdtemp(
                    prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target)
                )
                os.rename(target, os.path.join(trash, "old"))
                replaced.append((target, trash))
            os.rename(staging[key], target)
            placed.append(target)
    except BaseException:
        for target in placed:
            shutil.rmtree(target, ignore_errors=True)
        for target, trash in replaced:
            os.rename(os.path.join(trash, "old"), target)
            os.rmdir(trash)
        raise
    for _, trash in replaced:
        shutil.rmtree(trash)
