"""The corpus's defaults by the passes over its training pairs that the budget buys
(`presets.corpus_defaults`), settled on this machine's step time.

`prepare_inputs` guesses them from the batches a pass takes at the `cpu` preset's
2-core step time (`presets.CPU_STEP_SECONDS`), so that the model the calibration
builds is usually the one trained. Once the step the run trains with is timed
(`calibration.step_seconds`), `settle` estimates again and rebuilds the model where
the estimate picks otherwise: one core in float32 steps about 2.6 times slower than
the guess, a 2-core Zen 5 about twice as fast. The first run in a work directory
writes what it picked there (`PICKS_FILE`); the runs that resume or continue it
keep that, so a larger budget does not change the model halfway.
"""

import dataclasses
import json
import logging
import os

from keras_transformer.training.presets import (
    CPU_STEP_SECONDS,
    DROPOUT_RAMP,
    budget_passes,
    corpus_picks,
    model_overrides,
)
from keras_transformer.training.presets import model_config as unpicked_config

logger = logging.getLogger(__name__)

PICKS_FILE = "corpus_picks.json"


def _kept(config, work_path):
    """What the run that began in `work_path` picked (less what the command line now
    sets), or None where no run began there."""
    path = os.path.join(work_path, PICKS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    given = model_overrides(config)
    return {k: v for k, v in record["picked"].items() if k not in given}, record["passes"]


def guess(config, model_config, batches_per_pass, finished, work_path):
    """`model_config` with the picks of the run that began in `work_path`, or with
    those the passes at the `cpu` preset's 2-core step time buy (`settle` checks them)."""
    kept = _kept(config, work_path)
    passes = budget_passes(config, batches_per_pass, CPU_STEP_SECONDS)
    picked = kept[0] if kept else corpus_picks(config, passes, finished)
    return dataclasses.replace(model_config, **picked)


def needs_timing(config, finished, work_path):
    """Whether `settle` needs this run's step time: the passes may pick something, and
    no run that began in `work_path` has picked already."""
    return _kept(config, work_path) is None and bool(corpus_picks(config, float("inf"), finished))


def settle(config, model_config, batches_per_pass, finished, work_path, step_seconds):
    """`(model_config, changed)`: the config trained, with the picks the passes at
    `step_seconds` a step buy (or those kept in `work_path`), logged and written
    there; `changed` where that differs from `model_config` (the model is built again).

    Args:
        model_config: `guess`'s.
        batches_per_pass: the training pairs' batches in a pass.
        finished: `lifecycle.FinishedRun` of `--init-from`, or None.
        work_path: the work directory this process writes.
        step_seconds: this run's measured seconds a step, or None (the guess's stands).
    """
    kept = _kept(config, work_path)
    if kept:
        picked, passes = kept
        how = "as when the run in this work directory began"
    else:
        passes = budget_passes(config, batches_per_pass, step_seconds or CPU_STEP_SECONDS)
        picked = corpus_picks(config, passes, finished)
        how = _budget(config, step_seconds)
        with open(os.path.join(work_path, PICKS_FILE), "w", encoding="utf-8") as f:
            json.dump({"passes": round(passes, 3), "picked": picked}, f)
    settled = dataclasses.replace(unpicked_config(config, finished), **picked)
    changed = settled != model_config
    if picked or changed:  # what was picked, or that the guess's pick was dropped
        logger.info(
            "The budget buys about %.1f passes over the training pairs (%d batches each, "
            "%s): %s (docs/data.md, \"Your own data\"; --dropout overrides)",
            passes, batches_per_pass, how,
            picked or f"the preset's own (about {DROPOUT_RAMP[0]:g} passes or fewer; "
            "the model built again)",
        )  # fmt: skip
    return settled, changed


def _budget(config, step_seconds):
    steps = f"{config.epochs * config.steps:,} steps"
    if config.max_train_minutes is None:
        return steps
    seconds = (
        f"{step_seconds:.3f} s a step measured"
        if step_seconds
        else f"{CPU_STEP_SECONDS} s a step (the cpu preset's on 2 cores)"
    )
    return f"{config.max_train_minutes:g} minutes at {seconds}, at most {steps}"
