"""A run's place in time: new, resumed, continued or started from a finished run
(`--init-from`), and the work directory it writes."""

import dataclasses
import logging
import os

from keras_transformer import workdir

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    """A finished work directory that `--init-from` starts from."""

    work: workdir.WorkDir
    run_info: dict

    @property
    def preset(self):
        return self.run_info["preset"]

    @property
    def steps(self):
        """Optimizer updates behind its weights (its own, and those it started from)."""
        metrics = self.run_info["metrics"]
        if "optimizer_steps" in metrics:
            return int(metrics["optimizer_steps"])
        previous = (self.run_info.get("init_from") or {}).get("initial_step", 0)
        return previous + int(metrics["train_steps"])

    @property
    def val_loss(self):
        """Validation loss of its saved weights (averaged, when averaging was kept)."""
        averaging = self.run_info.get("averaging")
        if averaging:
            return averaging["val_loss"][str(averaging["chosen"])]
        return self.run_info["metrics"]["val_loss"]


@dataclasses.dataclass(frozen=True)
class RunProgress:
    """What a work directory held when this run began.

    `kind`: "new"; "resumed" (a killed run: its backup, no run.json); or
    "continued" (a finished run run again with a larger budget: its backup
    and run.json). `epochs` and `train_seconds` are what came before.
    """

    kind: str
    epochs: int = 0
    train_seconds: float = 0.0

    def to_dict(self):
        return dataclasses.asdict(self)


def finished_run(config):
    """The `FinishedRun` that `config.init_from` names (checked), or None."""
    if not config.init_from:
        return None
    finished = FinishedRun(
        workdir.WorkDir(config.init_from), workdir.check(config.init_from, finished=True)
    )
    if config.preset is not None and config.preset != finished.preset:
        raise ValueError(
            f"--init-from {config.init_from} trained preset {finished.preset!r}; "
            f"its architecture is kept. Received: preset={config.preset!r}"
        )
    if os.path.abspath(config.init_from) == os.path.abspath(config.work_dir):
        raise ValueError(
            f"--init-from needs a new --work-dir; {config.work_dir!r} is the finished run "
            "(rerun without --init-from to resume an unfinished run there)."
        )
    return finished


def open_work_dir(config, machine):
    """The folder this process writes: `--work-dir`, or in a multi-worker run a
    worker's beside it (so that checkpoints and backups never collide);
    `--overwrite` clears it first (on the chief)."""
    work = workdir.WorkDir(config.work_dir)
    if config.overwrite and machine.is_chief:
        workdir.clear(work.path)
        logger.info("--overwrite: cleared %s", work.path)
    out = work if machine.is_chief else work.worker(machine.task_name)
    os.makedirs(out.path, exist_ok=True)
    return out


def run_progress(config, work):
    """Whether this run is new, resumes a killed run or continues a finished one
    (`RunProgress`), logged; a finished run with nothing left to train is refused."""
    epochs = workdir.backup_epochs(work.path)
    finished = os.path.isfile(work.run_record)
    if epochs is None:
        if finished:
            raise ValueError(
                f"{work.path} holds a finished run without its backup (written by an older "
                f"version); train it longer with --init-from {work.path} --work-dir NEW, or "
                "start again there with --overwrite."
            )
        logger.info("Run: new, in %s", work.path)
        return RunProgress("new")
    seconds = workdir.read_progress(work.path)
    progress = RunProgress("continued" if finished else "resumed", epochs, seconds)
    minutes = config.max_train_minutes
    if finished and (epochs >= config.epochs or (minutes is not None and seconds >= 60 * minutes)):
        budget = f"--epochs {config.epochs}" + (
            f" and --max-train-minutes {minutes:g}" if minutes is not None else ""
        )
        raise ValueError(
            f"{work.path} holds a finished run ({epochs} epochs, {seconds / 60:.1f} "
            f"training minutes): nothing is left of {budget}. Raise them to continue it; "
            "--overwrite starts again there, a new --work-dir keeps it."
        )
    logger.info(
        "Run: %s, after %d epochs and %.1f training minutes in %s",
        progress.kind, epochs, seconds / 60, work.path,
    )  # fmt: skip
    return progress
