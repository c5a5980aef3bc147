"""Work-directory checks and atomic, versioned output directories.

Layout of a trained work directory (written by `keras_transformer.training`):

    <work_dir>/vocab.model   SentencePiece model (pad=0 unk=1 bos=2 eos=3)
    <work_dir>/model.keras   the trained `Transformer`
    <work_dir>/run.json      config, data, training options, final metrics

Exports land in TF Serving's layout, one integer version per export:

    <output_dir>/<name>/<version>/            SavedModel (TF Serving loads it)
    <output_dir>/<name>/onnx/<version>/       encoder.onnx, decoder_step.onnx,
                                              vocab.model, config.json

Every directory is written under a hidden temporary name next to its target
and renamed into place, so TF Serving (which polls `<name>/` for integer
directories) never sees a half-written version.
"""

import contextlib
import json
import os
import shutil
import tempfile

WORK_DIR_FILES = ("vocab.model", "model.keras", "run.json")


def check_work_dir(work_dir):
    """Raises a clear error unless `work_dir` holds a trained model; returns run.json's dict."""
    if not os.path.isdir(work_dir):
        raise FileNotFoundError(
            f"Work directory {work_dir!r} does not exist. Train a model first: "
            f"`python train.py --work-dir {work_dir}`."
        )
    missing = [f for f in WORK_DIR_FILES if not os.path.isfile(os.path.join(work_dir, f))]
    if missing:
        raise FileNotFoundError(
            f"Work directory {work_dir!r} holds no trained model: missing {missing}. "
            f"Train a model first (`python train.py --work-dir {work_dir}`) or pass the "
            "work directory of a finished run."
        )
    with open(os.path.join(work_dir, "run.json")) as f:
        try:
            run_info = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{work_dir}/run.json is not valid JSON: {error}") from None
    if not isinstance(run_info, dict):
        raise ValueError(
            f"{work_dir}/run.json must hold a JSON object. Received: {run_info!r:.200}"
        )
    if not run_info.get("metrics"):
        raise ValueError(
            f"{work_dir}/run.json has no final metrics: the training run did not finish. "
            f"Finish it (`python train.py --work-dir {work_dir}` resumes) before exporting."
        )
    return run_info


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
