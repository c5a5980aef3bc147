"""The work directory of a training run: the one place that knows its layout.

`training.run()` writes it; export, translation, averaging, attention plots
and `--init-from` read it, all through this module:

    <work_dir>/vocab.model     shared SentencePiece BPE model (pad 0, unk 1, bos 2, eos 3)
    <work_dir>/model.keras     the trained model, saved at the end
    <work_dir>/run.json        model config, data, options, final metrics (the run record)
    <work_dir>/checkpoints/    one checkpoint per epoch: epoch_NNN.weights.h5
    <work_dir>/backup/         BackupAndRestore state: a killed run resumes from here
    <work_dir>/logs/           TensorBoard (loss, learning rate, validation BLEU)
    <work_dir>/data/           tokenized splits (a folder each), held-out text, digests
    <work_dir>/tfds/           TFDS-prepared corpora
    <work_dir>/workers/<task>/ what worker <task> of a multi-worker run writes

A finished work directory is a preset in keras-hub's sense:
`Transformer.from_preset(work_dir)` loads its model,
`Translator.from_preset(work_dir)` its model and tokenizer.

This module imports only the standard library at its top; Keras and the
tokenizer are imported by the functions that load them.
"""

import dataclasses
import json
import logging
import os
import re

VOCABULARY = "vocab.model"
MODEL = "model.keras"
UNAVERAGED_MODEL = "model.last.keras"  # kept by `keras-transformer-average`
RUN_RECORD = "run.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PATTERN = "epoch_{epoch:03d}.weights.h5"  # ModelCheckpoint's file name
CHECKPOINT_NAME = re.compile(r"^epoch_(\d+)\.weights\.h5$")  # 3 digits or more
BACKUP = "backup"
LOGS = "logs"
TFDS = "tfds"
DATA = "data"
CORPUS = "corpus.json"  # what the work directory was trained on (`claim`)
PROGRESS = "progress.json"  # training seconds behind the backup (`callbacks.TrainingClock`)
WORKERS = "workers"

# What a trained work directory must hold to be loaded or exported.
TRAINED_FILES = (VOCABULARY, MODEL, RUN_RECORD)


@dataclasses.dataclass(frozen=True)
class WorkDir:
    """Paths of one work directory. `WorkDir("work").model == "work/model.keras"`."""

    path: str

    def __post_init__(self):
        object.__setattr__(self, "path", os.fspath(self.path))

    def _join(self, name):
        return os.path.join(self.path, name)

    @property
    def vocabulary(self):
        return self._join(VOCABULARY)

    @property
    def model(self):
        return self._join(MODEL)

    @property
    def unaveraged_model(self):
        return self._join(UNAVERAGED_MODEL)

    @property
    def run_record(self):
        return self._join(RUN_RECORD)

    @property
    def checkpoints(self):
        return self._join(CHECKPOINTS)

    @property
    def checkpoint_pattern(self):
        """`ModelCheckpoint`'s `filepath`: `<work_dir>/checkpoints/epoch_{epoch:03d}.weights.h5`."""
        return os.path.join(self.checkpoints, CHECKPOINT_PATTERN)

    @property
    def backup(self):
        return self._join(BACKUP)

    @property
    def logs(self):
        return self._join(LOGS)

    @property
    def corpus(self):
        return self._join(CORPUS)

    @property
    def progress(self):
        return self._join(PROGRESS)

    @property
    def data(self):
        """The tokenized splits of the run (`data.shards`)."""
        return self._join(DATA)

    @property
    def tfds(self):
        return self._join(TFDS)

    def worker(self, task_name):
        """The work directory of one non-chief worker: `<work_dir>/workers/<task_name>`."""
        return WorkDir(os.path.join(self.path, WORKERS, task_name))

    def write_run_record(self, run_info):
        """Writes `run.json` (indented, UTF-8), replacing it atomically."""
        temporary = f"{self.run_record}.tmp{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(run_info, f, indent=2, ensure_ascii=False)
        os.replace(temporary, self.run_record)

    def read_run_record(self):
        """`run.json` as a dict, with errors that name the file."""
        try:
            with open(self.run_record, encoding="utf-8") as f:
                run_info = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{self.run_record} is not valid JSON: {error}") from None
        if not isinstance(run_info, dict):
            raise ValueError(
                f"{self.run_record} must hold a JSON object. Received: {run_info!r:.200}"
            )
        return run_info


def is_work_dir(path):
    """True when `path` is a directory holding a model file (not a preset name)."""
    return isinstance(path, str | os.PathLike) and os.path.isfile(WorkDir(path).model)


def check(work_dir, finished=True):
    """Raises a clear error unless `work_dir` holds a trained model; returns run.json's dict.

    Args:
        work_dir: str or path.
        finished: also require the final metrics in run.json, which a run
            writes only once it is done (export wants them; translation does not).
    """
    work = WorkDir(work_dir)
    if not os.path.isdir(work.path):
        raise FileNotFoundError(
            f"Work directory {work.path!r} does not exist. Train a model first: "
            f"`python train.py --work-dir {work.path}`."
        )
    missing = [f for f in TRAINED_FILES if not os.path.isfile(os.path.join(work.path, f))]
    if missing:
        raise FileNotFoundError(
            f"Work directory {work.path!r} holds no trained model: missing {missing}. "
            f"Train a model first (`python train.py --work-dir {work.path}`) or pass the "
            "work directory of a finished run."
        )
    run_info = work.read_run_record()
    if finished and not run_info.get("metrics"):
        raise ValueError(
            f"{work.run_record} has no final metrics: the training run did not finish. "
            f"Finish it (`python train.py --work-dir {work.path}` resumes) first."
        )
    return run_info


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path, value):
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, ensure_ascii=False)
    os.replace(temporary, path)


def claim(work_dir, corpus):
    """Makes `work_dir` the work directory of `corpus`, or refuses if it holds another's.

    A work directory belongs to one corpus, direction and vocabulary size
    (`corpus`, a dict written to `corpus.json` by the first run there). A
    run of another one stops before it writes anything, with one line that
    says what differs and what to do. A directory only prepared
    (`--prepare-only`: no checkpoint, backup, model or run record yet) is
    prepared again for the new corpus, with a log line: its vocabulary is
    removed, and its shards are remade since their manifest no longer matches.

    Raises:
        ValueError: naming what differs.
    """
    work = WorkDir(work_dir)
    recorded = _read_json(work.corpus)
    if recorded is None:
        written = [name for name in (VOCABULARY, MODEL, RUN_RECORD, BACKUP)
                   if os.path.exists(work._join(name))]  # fmt: skip
        if written:
            raise ValueError(
                f"{work.path} already holds {', '.join(written)} of a run that did not record "
                f"its corpus; use a new --work-dir, or --overwrite to start again there."
            )
        os.makedirs(work.path, exist_ok=True)
        _write_json(work.corpus, corpus)
        return

    def short(value):
        return f"{value[:12]}..." if isinstance(value, str) and len(value) > 40 else value

    # A key on one side only differs too (`--vocab-sample-size` is recorded where it
    # is not the default); "report" is not identity (`write_corpus_report`).
    def shown(identity, key):
        return repr(short(identity[key])) if key in identity else "the default"

    differences = [
        f"{key} {shown(recorded, key)} there, {shown(corpus, key)} here"
        for key in [*corpus, *(k for k in recorded if k not in corpus and k != "report")]
        if recorded.get(key) != corpus.get(key)
    ]
    trained = [name for name in (MODEL, RUN_RECORD, BACKUP, CHECKPOINTS)
               if os.path.exists(work._join(name))]  # fmt: skip
    if differences and not trained:
        logging.getLogger(__name__).warning(
            "%s was prepared for other data (%s): preparing it again.",
            work.path, "; ".join(differences),
        )  # fmt: skip
        if os.path.exists(work.vocabulary):
            os.remove(work.vocabulary)
        _write_json(work.corpus, corpus)
        return
    if differences:
        raise ValueError(
            f"{work.path} belongs to another run's data ({'; '.join(differences)}); use a new "
            "--work-dir, or --overwrite to start again there."
        )


def write_corpus_report(work_dir, report):
    """Adds the corpus report (`data.report.CorpusReport.to_dict`) to `corpus.json`
    under "report" (`claim` reads the other keys only)."""
    work = WorkDir(work_dir)
    recorded = _read_json(work.corpus) or {}
    _write_json(work.corpus, dict(recorded, report=report))


def clear(work_dir):
    """Removes what runs wrote in `work_dir` (`--overwrite`); a TFDS cache stays."""
    import shutil

    work = WorkDir(work_dir)
    if not os.path.isdir(work.path):
        return
    for name in os.listdir(work.path):
        if name == TFDS:
            continue
        path = work._join(name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def backup_epochs(work_dir):
    """Epochs behind the run's backup (`keras.callbacks.BackupAndRestore`'s
    `training_metadata.json`), or None when there is no backup."""
    metadata = _read_json(os.path.join(WorkDir(work_dir).backup, "training_metadata.json"))
    return None if metadata is None else int(metadata.get("epoch", 0))


def read_progress(work_dir):
    """Training seconds of the earlier processes of this run (0.0 for a new one)."""
    progress = _read_json(WorkDir(work_dir).progress) or {}
    return float(progress.get("train_seconds", 0.0))


def write_progress(work_dir, train_seconds):
    _write_json(WorkDir(work_dir).progress, {"train_seconds": train_seconds})


# The search settings `run.json` records with the test decode's metrics.
SEARCH_KEYS = ("beam_size", "alpha", "stopping", "patience", "length_ratio", "max_extra_length")


def search_of(run_info):
    """The run's search: the settings of its test decode (`run.json` `metrics`,
    `SEARCH_KEYS`), else the paper's. What the exports bake in as their defaults
    and what `Translator.from_preset(work_dir)` and the translate command use,
    so every path translates a work directory alike."""
    from keras_transformer.search import PAPER

    metrics = (run_info or {}).get("metrics") or {}
    return PAPER.replace(**{key: metrics.get(key) for key in SEARCH_KEYS})


def read_search(work_dir):
    """`search_of` the run record of `work_dir`; the paper's search where it has none."""
    work = WorkDir(work_dir)
    return search_of(work.read_run_record() if os.path.isfile(work.run_record) else None)


def load_model(work_dir):
    """The trained `Transformer` of `work_dir` (`model.keras`, loaded uncompiled)."""
    import keras

    from keras_transformer import register_keras_classes

    path = WorkDir(work_dir).model
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"No trained model at {path}; run `python train.py --work-dir {work_dir}`."
        )
    register_keras_classes()  # load_model needs them
    return keras.saving.load_model(path, compile=False)


def load_tokenizer(work_dir):
    """The `data.vocabulary.SentencePieceTokenizer` of `work_dir`'s `vocab.model`
    (the `sentencepiece` package: no TensorFlow needed)."""
    from keras_transformer.data.vocabulary import SentencePieceTokenizer

    return SentencePieceTokenizer(WorkDir(work_dir).vocabulary)


def load(work_dir, finished=False):
    """`(model, tokenizer, run_info)` of a work directory written by `training.run()`.

    Args:
        finished: require run.json's final metrics (`check`).
    """
    run_info = check(work_dir, finished=finished)
    return load_model(work_dir), load_tokenizer(work_dir), run_info
