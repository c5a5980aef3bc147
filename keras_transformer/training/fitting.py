"""The model a run trains, and `model.fit` with the run's callbacks."""

import dataclasses
import logging
import os

import keras
import numpy as np

from keras_transformer import calibration, workdir
from keras_transformer.callbacks import (
    PhaseTimer,
    ValidationBleu,
    ValidationEpochs,
    training_callbacks,
)
from keras_transformer.distribution import MultiWorkerTransformer, is_multi_worker
from keras_transformer.evaluation import validation_loss
from keras_transformer.model import Transformer
from keras_transformer.recipe import compile_with_paper_recipe
from keras_transformer.schedules import Cooldown, TransformerSchedule

logger = logging.getLogger(__name__)


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
            settable_learning_rate=config.cooldown > 0,  # `Cooldown` sets it
            jit_compile=precision.jit_compile,
        )
        model.optimizer.build(model.trainable_variables)
        if finished is not None:
            # The schedule goes on where the finished run stopped (no second warm-up).
            model.optimizer.iterations.assign(finished.steps)
    return model


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
    cooldown = None
    if config.cooldown:
        schedule = TransformerSchedule(
            inputs.model_config.d_model, config.warmup_steps, config.learning_rate_scale
        )
        cooldown = Cooldown(
            schedule, config.cooldown, minutes=minutes, total_steps=config.epochs * config.steps,
            initial_step=finished.steps if finished is not None else 0,
        )  # fmt: skip
    callbacks, phases = training_callbacks(
        work, validation_bleu, cooldown, minutes, progress.train_seconds
    )
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
    )


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
