"""Export a trained work directory for serving: a SavedModel for TF Serving, ONNX graphs
and a CTranslate2 model.

    from keras_transformer.export import export_all
    export_all("work", output_dir="saved_models", name="transformer")

writes, in TF Serving's layout, with one new integer version per call:

    saved_models/transformer/<version>/        SavedModel, text in / text out
    saved_models/transformer/onnx/<version>/   translate.onnx (text in / text out),
                                               translate_int8.onnx, translate_steered.onnx,
                                               encoder.onnx, decoder_step.onnx,
                                               vocab.model, config.json
    saved_models/transformer/ctranslate2/<version>/  model.bin, shared_vocabulary.json,
                                               config.json, vocab.model,
                                               keras_transformer.json

TensorFlow is imported by the exporters (the model must be loaded under
`KERAS_BACKEND=tensorflow`); tf2onnx only by the ONNX exporter.
"""

import logging
import os

from keras_transformer import workdir
from keras_transformer.export.artifacts import (
    atomic_directories,
    check_version,
    check_work_dir,
    next_version,
)
from keras_transformer.search import PAPER, SearchConfig

logger = logging.getLogger(__name__)

DEFAULT_SEARCH = PAPER  # the search baked into the exports unless `search` says otherwise
FORMATS = ("saved_model", "onnx", "ctranslate2")
_TITLES = {"saved_model": "SavedModel", "onnx": "ONNX graphs", "ctranslate2": "CTranslate2 model"}


def load_work_dir(work_dir):
    """`(model, tokenizer, run_info)` of a finished work directory, with clear errors;
    the tokenizer is keras-hub's (TF Text ops), which the SavedModel's graph holds."""
    from keras_transformer.data.vocabulary import load_keras_hub_tokenizer

    run_info = workdir.check(work_dir, finished=True)
    tokenizer = load_keras_hub_tokenizer(workdir.WorkDir(work_dir).vocabulary)
    return workdir.load_model(work_dir), tokenizer, run_info


def _paths(output_dir, name, version):
    model_dir = os.path.join(output_dir, name)
    return {
        "saved_model": os.path.join(model_dir, str(version)),
        "onnx": os.path.join(model_dir, "onnx", str(version)),
        "ctranslate2": os.path.join(model_dir, "ctranslate2", str(version)),
    }


def new_version(output_dir, name):
    """The next version number of `name`, one for every format."""
    model_dir = os.path.join(output_dir, name)
    return max(
        next_version(model_dir),
        next_version(os.path.join(model_dir, "onnx")),
        next_version(os.path.join(model_dir, "ctranslate2")),
    )


def export_all(
    work_dir, output_dir="saved_models", name="transformer", version=None, overwrite=False,
    formats=FORMATS, search=None, opset=None,
):  # fmt: skip
    """Exports the trained model in `work_dir` as a SavedModel and as ONNX graphs.

    Args:
        work_dir: a finished training run (`vocab.model`, `model.keras`, `run.json`).
        output_dir: root of the exports (`saved_models/`).
        name: model name: TF Serving's `<name>` and the REST path `/v1/models/<name>`.
        version: positive int. Defaults to one more than the newest version
            in `output_dir/name`. An existing version is refused unless
            `overwrite=True`.
        overwrite: replace an existing version.
        formats: any of `"saved_model"`, `"onnx"`, `"ctranslate2"`.
        search: a `SearchConfig`, or a dict of the settings that replace
            `DEFAULT_SEARCH`'s (`beam_size`, `alpha`, `max_extra_length`):
            baked into the SavedModel, the defaults of translate.onnx.
        opset: ONNX opset (default `onnx_graphs.DEFAULT_OPSET`, at most 18).

    Returns:
        dict format -> the directory written.
    """
    _check_request(formats, name)
    search = SearchConfig.from_dict(search)
    check_work_dir(work_dir)  # fail before any slow import
    if version is None:  # one new version number for every format
        version = new_version(output_dir, name)
    version = check_version(version)
    paths = {f: p for f, p in _paths(output_dir, name, version).items() if f in formats}
    if not overwrite:
        existing = [p for p in paths.values() if os.path.exists(p)]
        if existing:
            raise FileExistsError(
                f"Version {version} of {name!r} already exists: {existing}. "
                "Pass overwrite=True (`--overwrite`) to replace it, or leave `version` unset "
                "to export a new version."
            )
    model, tokenizer, _ = load_work_dir(work_dir)
    vocabulary = workdir.WorkDir(work_dir).vocabulary
    with atomic_directories(paths, overwrite=overwrite) as staging:  # every format or none
        _write(staging, model, tokenizer, vocabulary, search.to_dict(), opset)
    for format_name, path in paths.items():
        logger.info("%s written to %s", _TITLES[format_name], path)
    return paths


def _check_request(formats, name):
    """`ValueError` for unknown formats, a name that is no plain folder name, or the
    ctranslate2 format without its package, before anything slow is imported."""
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}. Received: {formats}")
    if not name or os.sep in name or name.startswith("."):
        raise ValueError(f"name must be a plain directory name. Received: name={name!r}")
    if "ctranslate2" in formats:
        import importlib.util

        if importlib.util.find_spec("ctranslate2") is None:
            raise ValueError(
                "The ctranslate2 format needs the ctranslate2 package: "
                "`pip install -e '.[ctranslate2]'` in the clone (or `pip install ctranslate2`)."
            )


def _write(staging, model, tokenizer, vocabulary, search, opset):
    """Each format of `staging` (format -> folder) written there."""
    # ONNX first: tf2onnx's conversion is the export's peak; run first, it does not
    # sit on what the SavedModel's tracing leaves behind.
    if "onnx" in staging:
        from keras_transformer.export.onnx_graphs import DEFAULT_OPSET, export_onnx

        export_onnx(model, vocabulary, staging["onnx"], opset=opset or DEFAULT_OPSET,
                    search=search)  # fmt: skip
    if "saved_model" in staging:
        from keras_transformer.export.saved_model import export_saved_model

        export_saved_model(model, tokenizer, staging["saved_model"], **search)
    if "ctranslate2" in staging:
        from keras_transformer.export.ctranslate2 import export as export_ctranslate2

        export_ctranslate2(model, vocabulary, staging["ctranslate2"], search=search)


def default_name(run_info):
    """`transformer_de_en` for a German-to-English run (TF Serving's model name)."""
    direction = (run_info.get("data") or {}).get("direction")
    return "transformer_" + direction.replace("-", "_") if direction else "transformer"


def installed_formats():
    """`FORMATS` less `"ctranslate2"` where the ctranslate2 package is not installed
    (an optional extra: `pip install -e '.[ctranslate2]'` in the clone), with a log line."""
    import importlib.util

    if importlib.util.find_spec("ctranslate2") is not None:
        return FORMATS
    logger.info(
        "No CTranslate2 export: the ctranslate2 package is not installed "
        "(pip install -e '.[ctranslate2]' in the clone)."
    )
    return tuple(f for f in FORMATS if f != "ctranslate2")


def export_after_training(work_dir, run_info, output_dir="saved_models", formats=None,
                          name=None):  # fmt: skip
    """What `training.run()` calls at the end: `export_all` with the run's name and search
    (`workdir.search_of`).

    The exporters run in a `KERAS_BACKEND=tensorflow` subprocess (`python -m
    keras_transformer.export`), whatever the training's backend: they trace
    the model with TensorFlow, and their memory (tf2onnx's conversion) is
    then their own, given back when they end, instead of adding to what the
    training process holds. The version is chosen here and passed to it, so
    the paths written are known without reading its output; its log goes to
    this process's stderr.

    Args:
        formats: of `FORMATS`; None: `installed_formats()`.
        name: the folder under `output_dir` (`train.py --export-name`); None:
            `default_name(run_info)`, `transformer_<src>_<tgt>`.

    Returns:
        dict format -> the directory written.
    """
    import subprocess
    import sys

    formats = installed_formats() if formats is None else formats
    name = name or default_name(run_info)
    check_work_dir(work_dir)
    version = new_version(output_dir, name)
    command = [
        sys.executable, "-m", "keras_transformer.export", "--work-dir", work_dir,
        "--output-dir", output_dir, "--name", name, "--version", str(version),
        "--formats", ",".join(formats),  # the search: run.json's, as here
    ]  # fmt: skip
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run(command, env=env, stdout=subprocess.DEVNULL)  # stdout: the paths
    if result.returncode:
        raise RuntimeError(
            f"Export in a TensorFlow subprocess failed (exit {result.returncode}; its log is "
            f"above): {' '.join(command)}"
        )
    return {f: p for f, p in _paths(output_dir, name, version).items() if f in formats}


__all__ = [
    "DEFAULT_SEARCH",
    "default_name",
    "export_after_training",
    "export_all",
    "installed_formats",
    "load_work_dir",
    "new_version",
]
