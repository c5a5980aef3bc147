"""The run behind `python train.py`: `run()`, its stages as one sequence, then the
training stage's parts (the model built and compiled, `model.fit` with its callbacks)."""

import dataclasses
import functools
import logging
import os
import time

import keras
import numpy as np

from keras_transformer import calibration, run_record, workdir
from keras_transformer.callbacks import (
    EarlyStopping,
    PhaseTimer,
    ValidationBleu,
    ValidationEpochs,
    training_callbacks,
)
from keras_transformer.distribution import (
    MultiWorkerTransformer,
    is_multi_worker,
    process_share,
)
from keras_transformer.evaluation import validation_loss
from keras_transformer.model import Transformer
from keras_transformer.recipe import compile_with_paper_recipe, paper_loss
from keras_transformer.schedules import Cooldown, LateDropout, TransformerSchedule
from keras_transformer.training import budget, lifecycle
from keras_transformer.training.finishing import export, finish
from keras_transformer.training.inputs import prepare_inputs
from keras_transformer.training.machine import set_up_machine
from keras_transformer.training.options import config_from

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
    config = config_from(config, options)
    finished = lifecycle.finished_run(config)  # --init-from's
    config = config.resolved(finished.preset if finished else None)
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
    loss = paper_loss(inputs.model_config.pad_id, config.label_smoothing)
    model, calibrated = calibration.calibrated_model(
        functools.partial(build_model, config, machine, inputs.model_config, finished),
        candidates, inputs.train_batches, inputs.train_ds, loss,
        calibration_key(config, machine, inputs.model_config, candidates), config.seed,
    )  # fmt: skip
    model, inputs = settle_corpus_picks(
        model, calibrated, config, machine, inputs, finished, work, loss
    )
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
        export(work, run_info, started, config.export_name)
    return run_info


def load_trained(work_dir):
    """`(model, tokenizer, run_info)` from a work directory written by `run()`
    (`keras_transformer.workdir.load`)."""
    return workdir.load(work_dir)


# --------------------------------------------------------------------------- training


@dataclasses.dataclass(frozen=True)
class Fitted:
    """What `model.fit` leaves behind, for the run record."""

    history: dict
    phases: PhaseTimer
    validation_bleu: ValidationBleu
    startup_seconds: float
    train_seconds: float
    init_from: dict | None
    optimizer_steps: int
    progress: dict  # `lifecycle.RunProgress.to_dict()`
    dropout_on_step: int | None  # `--dropout-start`: the step dropout came on at


def build_model(config, machine, model_config, finished, precision):
    """The model, built (with `--init-from`'s weights) and compiled with the paper's
    recipe and `precision` (a `calibration.Candidate`), its optimizer built."""
    with machine.scope():
        model_class = MultiWorkerTransformer if is_multi_worker(machine.strategy) else Transformer
        model = model_class(**dataclasses.asdict(model_config), dtype=precision.dtype_policy)
        # Built eagerly from int ids: under MirroredStrategy Keras would build it
        # from an averaged, float first batch.
        ids = np.array([[5, 6, model_config.eos_id]], dtype="int32")
        model({"source_ids": ids, "target_ids": ids}, training=False)
        if finished is not None:
            model.set_weights(workdir.load_model(finished.work.path).get_weights())
        compile_with_paper_recipe(
            model,
            warmup_steps=config.warmup_steps,
            learning_rate_scale=config.learning_rate_scale,
            label_smoothing=config.label_smoothing,
            settable_learning_rate=config.cooldown > 0,  # `Cooldown` sets it
            accumulation_steps=config.accumulate_steps,
            ema_momentum=config.ema or None,  # 0: off
            jit_compile=precision.jit_compile,
        )
        model.optimizer.build(model.trainable_variables)
        if finished is not None:
            # The schedule goes on where the finished run stopped (no second warm-up).
            # With accumulation `iterations` is computed from the batch count, which
            # is the variable to set (Keras's `_iterations`).
            batches = model.optimizer._iterations
            batches.assign(finished.steps * config.accumulate_steps)
    return model


def settle_corpus_picks(model, calibrated, config, machine, inputs, finished, work, loss):
    """`(model, inputs)` with the corpus's picks settled on the step time of the model
    the calibration chose (`budget.settle`); the model is built again, from the same
    seed, where they change its config. In a multi-worker run every worker keeps the
    guess, so that all train one model."""
    seconds = None
    if budget.needs_timing(config, finished, work.path) and not is_multi_worker(machine.strategy):
        seconds = calibration.step_seconds(
            model, calibrated, inputs.train_batches, inputs.train_ds, loss
        )
    model_config, changed = budget.settle(
        config, inputs.model_config, inputs.batch_stats["batches"], finished, work.path, seconds
    )
    if changed:
        keras.utils.set_random_seed(config.seed)
        model = build_model(config, machine, model_config, finished, calibrated.choice)
    return model, dataclasses.replace(inputs, model_config=model_config)


def calibration_key(config, machine, model_config, candidates):
    """What the calibration's choice depends on (`calibration.machine_key`)."""
    return calibration.machine_key(
        cpu=machine.cpu["model"], cores=machine.cpu["cores"], gpu=machine.gpu_name,
        backend=keras.backend.backend(), replicas=machine.num_replicas,
        model=dataclasses.asdict(model_config), batch_tokens=config.batch_tokens,
        pack=config.pack, candidates=[c.name for c in candidates],
    )  # fmt: skip


def fit(model, config, work, inputs, finished, progress, calibrated, startup_seconds):
    """`model.fit` with the run's callbacks; returns what the run record needs.

    Args:
        work: the `WorkDir` this process writes.
        finished: `lifecycle.FinishedRun` of `--init-from`, or None.
        progress: `lifecycle.RunProgress`.
        calibrated: `calibration.Calibration` (what its timing cost comes off the budget).
        startup_seconds: from the run's start to this call.
    """
    minutes = _minutes_left(config.max_train_minutes, progress.train_seconds + calibrated.seconds)
    validation_pairs = []
    if config.validation_bleu_every:
        validation_pairs = inputs.data.pairs("validation", limit=config.validation_bleu_samples)
    validation_bleu = ValidationBleu(
        validation_pairs, inputs.tokenizer, every=config.validation_bleu_every
    )
    several_workers = isinstance(model, MultiWorkerTransformer) or process_share()[1] > 1
    cooldown, late_dropout = _budget_schedules(
        config, inputs, finished, minutes, progress.train_seconds + calibrated.seconds,
        several_workers,
    )  # fmt: skip
    early_stopping = None
    if config.early_stopping:
        early_stopping = EarlyStopping(config.early_stopping_metric, config.early_stopping)
    callbacks, phases = training_callbacks(
        work, validation_bleu, cooldown, minutes, progress.train_seconds, early_stopping,
        late_dropout,
    )  # fmt: skip
    init_from = _starting_point(model, inputs, finished) if finished is not None else None
    history = model.fit(
        inputs.train_ds,
        epochs=config.epochs,
        steps_per_epoch=config.steps,
        validation_data=inputs.val_ds,
        validation_steps=inputs.val_ds.num_batches,
        validation_freq=ValidationEpochs(config.validation_every, config.epochs).attach(model),
        callbacks=callbacks,
        shuffle=False,  # the pipeline shuffles; Keras would warn that it cannot
        verbose=1 if os.isatty(1) else 2,
    )
    return Fitted(
        history={key: [float(v) for v in values] for key, values in history.history.items()},
        phases=phases,
        validation_bleu=validation_bleu,
        startup_seconds=startup_seconds,
        train_seconds=phases.first_step_seconds + phases.step_seconds,
        init_from=init_from,
        optimizer_steps=int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        progress=progress.to_dict(),
        dropout_on_step=late_dropout.on_step if late_dropout is not None else None,
    )


def _budget_schedules(config, inputs, finished, minutes, spent_seconds, several_workers):
    """`(cooldown, late_dropout)`: the `Cooldown` of `--cooldown` and the `LateDropout`
    of `--dropout-start` over the run's budget, each None where it is off.

    Args:
        minutes: the time budget of this process's `fit` (`_minutes_left`), or None.
        spent_seconds: what the run's earlier processes and this calibration took.
        several_workers: True where workers (or JAX processes) step together: each
            would switch dropout on at its own clock, tracing a new step apart.
    """
    total_steps = config.epochs * config.steps
    initial_step = finished.steps if finished is not None else 0
    cooldown = late_dropout = None
    if config.cooldown:
        schedule = TransformerSchedule(
            inputs.model_config.d_model, config.warmup_steps, config.learning_rate_scale
        )
        cooldown = Cooldown(
            schedule, config.cooldown, minutes=minutes, total_steps=total_steps,
            initial_step=initial_step,
        )  # fmt: skip
    if config.dropout_start:
        if several_workers and config.max_train_minutes is not None:
            raise ValueError(
                "--dropout-start over several workers needs a step budget (--epochs x "
                "--steps), not --max-train-minutes: each worker would switch dropout on "
                "at its own clock."
            )
        if not inputs.model_config.dropout:
            logger.warning(
                "--dropout-start %g: the model has no dropout to start (--dropout 0).",
                config.dropout_start,
            )
        else:
            late_dropout = LateDropout(
                config.dropout_start, minutes=config.max_train_minutes, total_steps=total_steps,
                spent_seconds=spent_seconds, initial_step=initial_step,
            )  # fmt: skip
    return cooldown, late_dropout


def _minutes_left(max_train_minutes, spent_seconds):
    """The time budget of this process's `fit`: `--max-train-minutes`, less the
    training time of the run's earlier processes and what this run's calibration
    took (so that a first run on a machine ends when later ones do); None: none."""
    if max_train_minutes is None:
        return None
    return max(max_train_minutes - spent_seconds / 60.0, 0.0)


def _starting_point(model, inputs, finished):
    """`run.json`'s `init_from`: the finished run, its step, and its weights'
    validation loss there and here (the same weights on this run's validation pairs)."""
    start = {
        "work_dir": finished.work.path,
        "initial_step": finished.steps,
        "finished_val_loss": finished.val_loss,
        "val_loss": validation_loss(model, inputs.val_ds.evaluation(), inputs.model_config.pad_id),
    }
    logger.info(
        "Starting from %s: validation loss %.4f (the finished run's: %.4f), step %d",
        finished.work.path, start["val_loss"], finished.val_loss, finished.steps,
    )  # fmt: skip
    return start
