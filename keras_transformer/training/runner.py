"""The run behind `python train.py`, as one sequence of stages."""

import functools
import logging
import time

from keras_transformer import calibration, run_record, workdir
from keras_transformer.recipe import paper_loss
from keras_transformer.training import lifecycle
from keras_transformer.training.finishing import export, finish
from keras_transformer.training.fitting import build_model, calibration_key, fit
from keras_transformer.training.inputs import prepare_inputs
from keras_transformer.training.machine import set_up_machine

logger = logging.getLogger(__name__)


def run(config=None, /, **options):
    """Trains a Transformer, evaluates it on the test split and writes its work directory.

    Args:
        config: a `TrainingConfig` (or a preset name); `options` replace its
            fields. `run(preset="tiny", epochs=1)` is `run(TrainingConfig(preset="tiny",
            epochs=1))`. None means the preset's default (`TRAINING_DEFAULTS`).

    Returns:
        dict: the contents of `run.json` (with `prepare_only`: `{"prepared": work_dir}`).
    """
    started = time.time()
    config, finished = lifecycle.resolve(config, options)
    machine = set_up_machine(config.seed, config.logical_devices)
    work = lifecycle.open_work_dir(config, machine)
    inputs = prepare_inputs(config, machine, work, finished)
    if config.prepare_only:
        logger.info(
            "--prepare-only: the vocabulary and the tokenized splits are in %s; the same "
            "command without it trains from them", work.path,
        )  # fmt: skip
        return {"prepared": work.path}
    progress = lifecycle.run_progress(config, work)

    candidates = calibration.run_candidates(config, machine)
    model, calibrated = calibration.calibrated_model(
        functools.partial(build_model, config, machine, inputs.model_config, finished),
        candidates, inputs.train_batches, inputs.train_ds,
        paper_loss(inputs.model_config.pad_id),
        calibration_key(config, machine, inputs.model_config, candidates), config.seed,
    )  # fmt: skip
    logger.info("Model: preset %s, %s parameters", config.preset, f"{model.count_params():,}")
    fitted = fit(model, config, work, inputs, finished, progress, calibrated, time.time() - started)

    model, evaluated = finish(model, config, work, inputs, machine.is_chief)
    run_info = run_record.build(
        config, machine, inputs, calibrated, fitted, evaluated, time.time() - started
    )
    if machine.is_chief:
        model.save(work.model)
        work.write_run_record(run_info)
    run_record.report(run_info)
    if config.export and machine.is_chief:
        export(work, run_info, started)
    return run_info


def load_trained(work_dir):
    """`(model, tokenizer, run_info)` from a work directory written by `run()`
    (`keras_transformer.workdir.load`)."""
    return workdir.load(work_dir)
