"""The run record (`run.json`) of a training run, and the summary printed at its end.

`build()` is the one place that names run.json's keys; `report()` prints the
results table and sample translations from a record.
"""

import dataclasses

import keras

from keras_transformer.workdir import SEARCH_KEYS


def build(config, machine, inputs, calibrated, fitted, evaluated, wall_seconds):
    """The contents of `run.json`, from the results of the run's stages.

    Args:
        config: the resolved `TrainingConfig`.
        machine: `training.machine.Machine` (CPU, threads, distribution).
        inputs: `training.inputs.Inputs` (corpus, model config, batch statistics, input timing).
        calibrated: `calibration.Calibration` (precision and XLA trained with).
        fitted: `training.runner.Fitted` (history, phases, validation BLEU, timings).
        evaluated: `training.finishing.Evaluated` (averaging, test metrics and samples).
        wall_seconds: since the run began.
    """
    data = inputs.data
    return {
        "preset": config.preset,
        "config": dataclasses.asdict(inputs.model_config),
        "data": dict(
            data.info,
            source_language=data.source_language,
            target_language=data.target_language,
            direction=f"{data.source_language}-{data.target_language}",
        ),
        "training": _training(config, machine, inputs.batch_stats, calibrated, fitted),
        "cpu": machine.cpu,
        "timing": _timing(inputs, fitted, evaluated),
        "curve": fitted.phases.curve,
        "metrics": _metrics(config, inputs.batch_stats, fitted, evaluated, wall_seconds),
        "history": fitted.history,
        "averaging": evaluated.averaging,
        "samples": evaluated.samples,
        "init_from": fitted.init_from,
        "run": fitted.progress,
        # --terminology: the glossary (path, digest, entries), the rate, the seed, the
        # tags, and the training pairs and terms annotated; None without one.
        "terminology": inputs.terminology,
    }


def _training(config, machine, stats, calibrated, fitted):
    """How it trained: the options, the machine's distribution, precision, batches."""
    precision, steps = calibrated.choice, fitted.phases.steps
    return {
        "epochs": config.epochs,
        "epochs_run": len(fitted.history.get("loss", [])),
        "steps_per_epoch": config.steps,
        "batch_tokens": config.batch_tokens,
        "warmup_steps": config.warmup_steps,
        "learning_rate_scale": config.learning_rate_scale,
        "cooldown": config.cooldown,
        "dropout_start": config.dropout_start,
        # --dropout-start: the step dropout came on at (a resumed run's first step where
        # it was on from there); None where it did not come on, or was on from the start.
        "dropout_on_step": fitted.dropout_on_step,
        "sentence_repeats": config.sentence_repeats,
        "label_smoothing": config.label_smoothing,
        "vocab_sample_size": config.vocab_sample_size,
        # BPE-dropout: the merge-drop probability and the sampled copies read in turn.
        "bpe_dropout": config.bpe_dropout,
        "bpe_dropout_copies": config.bpe_dropout_copies if config.bpe_dropout else None,
        "dtype_policy": precision.dtype_policy,
        "max_train_minutes": config.max_train_minutes,
        "seed": config.seed,
        "distribution": machine.strategy_description,
        "jit_compile": precision.jit_compile,
        "calibration": calibrated.to_dict() if calibrated.measured else None,
        "packed_rows": config.pack,
        "num_replicas": machine.num_replicas,
        "backend": keras.backend.backend(),
        "padding_share": stats["padding_share"],
        "mean_batch_size": stats["batch_size"],
        "batches_per_pass": stats["batches"],
        "passes_over_data": steps / max(stats["batches"], 1),
        "threads": machine.threads,
    }


def _timing(inputs, fitted, evaluated):
    """Where the run's seconds went."""
    phases = fitted.phases
    return {
        "startup_seconds": fitted.startup_seconds,
        "tokenize_seconds": inputs.tokenize_seconds,
        "fit_seconds": phases.fit_seconds,
        "first_step_seconds": phases.first_step_seconds,
        "train_steps_seconds": fitted.train_seconds,
        "input_seconds": inputs.input_timer.seconds,
        # Of the training loop, waiting for a batch assembled ahead (JAX, torch).
        "input_wait_seconds": getattr(inputs.train_ds, "input_wait_seconds", None),
        "validation_seconds": phases.validation_seconds,
        "validation_bleu_seconds": fitted.validation_bleu.seconds,
        "epoch_end_seconds": phases.epoch_end_seconds,
        "checkpoint_seconds": phases.epoch_end_seconds - fitted.validation_bleu.seconds,
        # The rest of fit: between steps (Keras's bookkeeping, iterator resets).
        "other_fit_seconds": phases.fit_seconds
        - fitted.train_seconds
        - phases.validation_seconds
        - phases.epoch_end_seconds,
        "test_decode_seconds": evaluated.test_seconds,
    }


def _metrics(config, stats, fitted, evaluated, wall_seconds):
    """The scores, the final losses and the training throughput."""
    history, steps = fitted.history, fitted.phases.steps
    per_second = steps / max(fitted.train_seconds, 1e-9)
    return {
        **evaluated.test_metrics,
        "val_loss": history["val_loss"][-1] if history.get("val_loss") else None,
        "val_bleu_greedy": history["val_bleu"][-1] if history.get("val_bleu") else None,
        "train_loss": history["loss"][-1] if history.get("loss") else None,
        "train_seconds": fitted.train_seconds,
        "train_steps": steps,  # of this process
        # The optimizer's updates behind the final weights: those of earlier
        # processes of a resumed or continued run, and --init-from's.
        "optimizer_steps": fitted.optimizer_steps,
        # Real (non-pad) tokens per second of the training steps, from the
        # mean batch of a pass over the data (target: with EOS).
        "tokens_per_second": per_second * (stats["source_tokens"] + stats["target_tokens"]),
        "target_tokens_per_second": per_second * stats["target_tokens"],
        "source_tokens_per_second": per_second * stats["source_tokens"],
        "sentences_per_second": per_second * stats["batch_size"],
        "test_decode_seconds": evaluated.test_seconds,
        "wall_seconds": wall_seconds,
        # The test decode's search (`workdir.SEARCH_KEYS`): the exports' default.
        **{key: getattr(evaluated.search, key) for key in SEARCH_KEYS},
    }


def report(run_info):
    """Prints the results table, the time accounting and the sample translations."""
    metrics, timing = run_info["metrics"], run_info["timing"]
    lines = []
    if "test" in metrics:
        lines.append(
            f"Test ({metrics['test']['segments']} pairs, beam {metrics['beam_size']}): "
            f"BLEU {metrics['test']['bleu']:.2f}  chrF {metrics['test']['chrf']:.2f}"
        )
    if "test_sentences" in metrics:
        m = metrics["test_sentences"]
        lines.append(
            f"Test, full sentences only ({m['segments']}): "
            f"BLEU {m['bleu']:.2f}  chrF {m['chrf']:.2f}"
        )
    if "test_phrases_all_references" in metrics:
        m = metrics["test_phrases_all_references"]
        lines.append(
            f"Test, phrases against every accepted translation ({m['segments']}, "
            f"{m['references_per_segment']:.2f} references each): BLEU {m['bleu']:.2f}  "
            f"chrF {m['chrf']:.2f}  exact match {100 * m['exact_match']:.1f}% "
            f"(single reference: chrF {m['chrf_single']:.2f}, "
            f"exact {100 * m['exact_match_first']:.1f}%)"
        )
    if "outputs_at_limit" in metrics:
        lines.append(
            f"Outputs that reached their length limit (ceil({metrics['length_ratio']:g} x source)"
            f" + {metrics['max_extra_length']}): {metrics['outputs_at_limit']}"
        )
    if metrics["val_loss"] is not None:
        lines.append(f"Final validation loss {metrics['val_loss']:.3f}")
    lines.append(
        f"Training {metrics['train_seconds'] / 60:.1f} min, {metrics['train_steps']} steps, "
        f"{metrics['tokens_per_second']:.0f} tokens/s; "
        f"whole run {metrics['wall_seconds'] / 60:.1f} min"
    )
    fit = max(timing["fit_seconds"], 1e-9)
    lines.append(
        f"Of fit's {fit:.0f}s: steps {100 * timing['train_steps_seconds'] / fit:.0f}%, "
        f"validation {100 * timing['validation_seconds'] / fit:.0f}%, "
        f"epoch-end callbacks {100 * timing['epoch_end_seconds'] / fit:.0f}%, "
        f"other {100 * timing['other_fit_seconds'] / fit:.0f}%; "
        f"start-up {timing['startup_seconds']:.0f}s, test decoding "
        f"{timing['test_decode_seconds']:.0f}s ({run_info['cpu']['summary']})"
    )
    for sample in run_info["samples"]:
        lines.append(f"  {sample['source']}")
        lines.append(f"    -> {sample['translation']}")
        lines.append(f"    (reference: {sample['reference']})")
    print("\n".join(lines), flush=True)
