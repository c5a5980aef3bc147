"""Training runner: data, vocabulary, distribution, `model.fit`, evaluation, results.

`run()` is what `python train.py` calls. It writes the work directory that
exporters and the translate command read back with `load_trained()`:

    <work_dir>/vocab.model     shared SentencePiece BPE model (pad 0, unk 1, bos 2, eos 3)
    <work_dir>/model.keras     the trained model, saved at the end
    <work_dir>/run.json        model config, data, options, final metrics
    <work_dir>/checkpoints/    one checkpoint per epoch (ModelCheckpoint)
    <work_dir>/backup/         BackupAndRestore state: a killed run resumes from here
    <work_dir>/logs/           TensorBoard (loss, learning rate, validation BLEU)
    <work_dir>/tfds/           TFDS-prepared corpora (the parsed Ding dictionary)
"""

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import time

import keras
import numpy as np

from keras_transformer.callbacks import (
    LearningRateLogger,
    PhaseTimer,
    TerminateOnNaN,
    TimeBudget,
    ValidationBleu,
)
from keras_transformer.config import get_preset
from keras_transformer.distribution import (
    MultiWorkerTransformer,
    is_chief_task,
    is_multi_worker,
    make_strategy,
)
from keras_transformer.evaluation import make_translate_fn, score, score_multi
from keras_transformer.hardware import configure_threads, default_dtype_policy, describe_cpu
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.schedules import TransformerSchedule

logger = logging.getLogger(__name__)

DTYPE_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")

# Per-preset training defaults; command-line options override them.
TRAINING_DEFAULTS = {
    # The default run: 18 minutes of training on a 2-core CPU, then beam search on
    # the first 1,000 test pairs (`--test-samples 0`: all), within 30 minutes in
    # all (README, "Measured: the default run"). Small batches and a short
    # warm-up: in 18 minutes the number of updates is what limits learning.
    "cpu": dict(
        epochs=200,
        steps=200,  # an epoch is a checkpoint: enough of them to average
        batch_tokens=1024,
        warmup_steps=300,
        learning_rate_scale=0.5,  # peak 1.8e-3; 1.0 learned slower
        max_train_minutes=18.0,
        test_samples=1000,
        validation_bleu_every=0,  # the test decode at the end measures quality
        # Averaging the last 2 of 200-step checkpoints won in both measured default
        # runs (validation loss 4.516 -> 4.472); 5 and 8 lost (README).
        average_last=3,
    ),  # fmt: skip
    "small": dict(
        epochs=10,
        steps=400,
        batch_tokens=2048,
        warmup_steps=500,
        max_train_minutes=None,
    ),  # fmt: skip
    "tiny": dict(epochs=2, steps=20, batch_tokens=512, warmup_steps=50, max_train_minutes=None),
    "base": dict(
        epochs=100, steps=1000, batch_tokens=25000, warmup_steps=4000, max_train_minutes=None
    ),
    "big": dict(
        epochs=300, steps=1000, batch_tokens=25000, warmup_steps=4000, max_train_minutes=None
    ),
}


def corpus_defaults(train_pairs, preset):
    """Config overrides for a corpus of `train_pairs` training pairs (README, "Your own data").

    The presets' own values suit their corpora: `cpu` sees less than one pass
    over Ding's 377k pairs in its 18 minutes and trains without dropout. A
    smaller corpus is seen many times in the same budget, and overfits
    without regularization; the published small-data recipes (fairseq's
    IWSLT'14 at 160k pairs, the Multi30k Transformer at 29k) train with
    dropout 0.3. Not yet measured here (README, "Your own data").

    Returns:
        dict of `TransformerConfig` fields (possibly empty).
    """
    overrides = {}
    if train_pairs < 200_000 and preset in ("cpu", "small", "tiny"):
        overrides["dropout"] = 0.3
    return overrides


# --------------------------------------------------------------------------- the run


def _plain_float32(model):
    """The trained model as a plain float32 `Transformer` (same config and weights),
    for evaluation, saving and export; `model` itself when it already is one."""
    if type(model) is Transformer and model.dtype_policy.name == "float32":
        return model
    plain = Transformer.from_config(dict(model.get_config(), dtype="float32"))
    plain.build()
    plain.set_weights(model.get_weights())
    return plain


def _build(model, config):
    """Builds the model eagerly with int ids (under MirroredStrategy Keras would
    otherwise build it from an averaged, float first batch)."""
    ids = np.array([[5, 6, config.eos_id]], dtype="int32")
    model({"source_ids": ids, "target_ids": ids}, training=False)


def run(
    preset="cpu",
    dataset="ding",
    data_dir=None,
    direction=None,
    epochs=None,
    steps=None,
    batch_tokens=None,
    work_dir="work",
    seed=1234,
    vocab_size=None,
    logical_devices=None,
    warmup_steps=None,
    learning_rate_scale=None,
    dtype_policy=None,
    max_train_minutes=None,
    validation_bleu_samples=300,
    validation_bleu_every=None,
    test_samples=None,
    test=True,
    beam_size=4,
    alpha=0.6,
    ding_path=None,
    export=True,
    average_last=None,
    dropout=None,
):
    """Trains a Transformer, evaluates it on the test split and writes `work_dir`.

    Args:
        preset: a `config.PRESETS` name; `cpu` is the default.
        dataset: `"ding"` or a TFDS translation dataset name.
        data_dir: folder of parallel text files (overrides `dataset`).
        direction: `"de-en"`, `"en-de"`...; None: the corpus order.
        epochs, steps: epochs and steps per epoch (None: `TRAINING_DEFAULTS`).
        batch_tokens: about this many tokens per batch and side.
        work_dir: output folder (layout in the module docstring).
        seed: random seed of Keras, NumPy and shuffling.
        vocab_size: size of the shared BPE vocabulary (None: the preset's).
        logical_devices: split the CPU into this many devices for MirroredStrategy.
        warmup_steps: of `TransformerSchedule`.
        learning_rate_scale: `scale` of `TransformerSchedule` (1.0 in the paper).
        dtype_policy: Keras dtype policy of training: `"float32"`, `"mixed_bfloat16"`
            or `"mixed_float16"` (Keras then scales the loss). Variables stay
            float32; the saved and exported model computes in float32. None:
            `mixed_bfloat16` where the CPU has native bf16 (AMX or
            AVX512-BF16) and there is no GPU, float32 otherwise.
        max_train_minutes: stop at the first step that ends past this many minutes.
        validation_bleu_samples: validation pairs decoded (greedy) by `ValidationBleu`.
        validation_bleu_every: decode them every this many epochs; 0: never;
            None: the preset's default (every epoch but for `cpu`).
        test_samples: test pairs decoded (beam search) at the end; None: the
            preset's default (all but for `cpu`), 0: all.
        test: decode the test pairs at the end (False: benchmarks that decode their own).
        beam_size, alpha: beam search of the final test evaluation.
        ding_path: the Ding dictionary file.
        export: call `export_after_training` at the end.
        average_last: at the end, average the last k epoch checkpoints for k in
            1, 2, 3, 5, 8... up to this many, and keep the k with the lowest
            validation loss (1: the last weights as they are; None: the preset's).
        dropout: of the model (None: the preset's, or `corpus_defaults` for a
            corpus other than Ding).

    Returns:
        dict: the contents of `run.json`.
    """
    from keras_transformer.data import (
        InputTimer,
        get_tokenizer,
        load_translation_data,
        make_dataset,
        plan_statistics,
        tokenize_split,
    )

    wall_start = time.time()
    threads = configure_threads()  # before TensorFlow runs its first op
    cpu = describe_cpu()
    logger.info("CPU: %s; TensorFlow threads: %s", cpu["summary"], threads)
    defaults = TRAINING_DEFAULTS.get(preset, TRAINING_DEFAULTS["cpu"])
    epochs = epochs or defaults["epochs"]
    steps = steps or defaults["steps"]
    batch_tokens = batch_tokens or defaults["batch_tokens"]
    warmup_steps = warmup_steps or defaults["warmup_steps"]
    learning_rate_scale = learning_rate_scale or defaults.get("learning_rate_scale", 1.0)
    if average_last is None:
        average_last = defaults.get("average_last", 8)
    if validation_bleu_every is None:
        validation_bleu_every = defaults.get("validation_bleu_every", 1)
    if dtype_policy is None:
        import tensorflow as tf

        has_gpu = keras.backend.backend() == "tensorflow" and tf.config.list_physical_devices("GPU")
        dtype_policy = "float32" if has_gpu else default_dtype_policy(cpu)
    if dtype_policy not in DTYPE_POLICIES:
        raise ValueError(
            f"dtype_policy must be one of {DTYPE_POLICIES}. Received: dtype_policy={dtype_policy!r}"
        )
    if max_train_minutes is None:
        max_train_minutes = defaults["max_train_minutes"]
    keras.utils.set_random_seed(seed)

    strategy, strategy_description = make_strategy(logical_devices)
    num_replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    logger.info("Distribution: %s", strategy_description)

    is_chief, task_name = is_chief_task()
    # In a multi-worker run only the chief writes `work_dir`; the others write
    # beside it so that their checkpoints and backups never collide.
    out_dir = work_dir if is_chief else os.path.join(work_dir, "workers", task_name)
    os.makedirs(out_dir, exist_ok=True)

    data = load_translation_data(
        dataset,
        data_dir=data_dir,
        direction=direction,
        tfds_data_dir=os.path.join(work_dir, "tfds"),
        ding_path=ding_path,
    )
    logger.info(
        "Data %s, %s -> %s: %s",
        data.info["name"], data.source_language, data.target_language, data.info["counts"],
    )  # fmt: skip
    overrides = {}
    if data.info["name"] != "ding":  # the presets' defaults are measured on Ding
        overrides = corpus_defaults(data.info["counts"]["train"], preset)
        if overrides:
            logger.info(
                "A corpus of %d training pairs: %s (README, \"Your own data\"; "
                "--dropout overrides)", data.info["counts"]["train"], overrides,
            )  # fmt: skip
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    if dropout is not None:
        overrides["dropout"] = dropout
    config = get_preset(preset, **overrides)
    tokenizer = get_tokenizer(
        os.path.join(out_dir, "vocab.model"), data.splits["train"], config.vocab_size
    )

    # Every split is tokenized once; batches are assembled on the host.
    tokenize_start = time.time()
    tokenized = {
        split: tokenize_split(
            data.splits[split], tokenizer, config.max_length, eos_id=config.eos_id
        )
        for split in ("train", "validation")
    }
    tokenize_seconds = time.time() - tokenize_start
    input_timer = InputTimer()
    common = dict(
        max_length=config.max_length,
        batch_tokens=batch_tokens,
        num_replicas=num_replicas,
        bos_id=config.bos_id,
        eos_id=config.eos_id,
    )
    train_ds = make_dataset(
        tokenized["train"], tokenizer, training=True, seed=seed, timer=input_timer, **common
    )
    val_ds = make_dataset(tokenized["validation"], tokenizer, training=False, **common)
    batch_stats = plan_statistics(tokenized["train"], batch_tokens, num_replicas, seed=seed)
    logger.info(
        "Tokenized %d train pairs (%d longer than %d dropped) in %.0fs. Batches of ~%d tokens: "
        "%.0f sentences, %.0f source + %.0f target real tokens, padding share %.1f%%, "
        "%d batches per pass over the data",
        len(tokenized["train"]), tokenized["train"].dropped, config.max_length,
        tokenize_seconds, batch_tokens, batch_stats["batch_size"], batch_stats["source_tokens"],
        batch_stats["target_tokens"], 100 * batch_stats["padding_share"], batch_stats["batches"],
    )  # fmt: skip

    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model_class = MultiWorkerTransformer if is_multi_worker(strategy) else Transformer
        model = model_class(**dataclasses.asdict(config), dtype=dtype_policy)
        _build(model, config)
        schedule = TransformerSchedule(
            config.d_model, warmup_steps=warmup_steps, scale=learning_rate_scale
        )
        optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
        model.compile(
            optimizer=optimizer,
            loss=LabelSmoothedCrossEntropy(label_smoothing=0.1, pad_id=config.pad_id),
            metrics=[MaskedAccuracy(pad_id=config.pad_id)],
            jit_compile=False,  # XLA fails under MirroredStrategy on logical CPU devices
        )
    logger.info("Model: preset %s, %s parameters", preset, f"{model.count_params():,}")

    validation_pairs = (
        data.pairs("validation", limit=validation_bleu_samples) if validation_bleu_every else []
    )
    phases = PhaseTimer()
    time_budget = TimeBudget(max_train_minutes) if max_train_minutes else None
    validation_bleu = ValidationBleu(validation_pairs, tokenizer, every=validation_bleu_every)
    callbacks = [
        phases,
        keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")),
        TerminateOnNaN(),
        LearningRateLogger(),
        validation_bleu,
        keras.callbacks.ModelCheckpoint(
            os.path.join(out_dir, "checkpoints", "epoch_{epoch:03d}.weights.h5"),
            save_weights_only=True,
        ),
    ]
    if keras.backend.backend() != "tensorflow" or importlib.util.find_spec("tensorboard"):
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(out_dir, "logs")))
    else:
        logger.warning(
            "TensorBoard is not installed (`pip install tensorboard`); no logs/ written."
        )
    if time_budget is not None:
        callbacks.append(time_budget)
    callbacks.append(phases.end_marker)
    startup_seconds = time.time() - wall_start
    history = model.fit(
        train_ds,
        epochs=epochs,
        steps_per_epoch=steps,
        validation_data=val_ds,
        validation_steps=val_ds.num_batches,
        callbacks=callbacks,
        verbose=1 if os.isatty(1) else 2,
    )
    train_seconds = phases.first_step_seconds + phases.step_seconds
    model = _plain_float32(model)
    averaging = None
    if average_last > 1 and is_chief:
        averaging_start = time.time()
        averaging = _average_best(model, out_dir, average_last, val_ds, config)
        averaging["seconds"] = time.time() - averaging_start
    history = {key: [float(v) for v in values] for key, values in history.history.items()}

    # Final evaluation: beam search on the test split, all pairs and full sentences.
    if test_samples is None:
        test_samples = defaults.get("test_samples")
    metrics, samples, eval_seconds = {}, [], 0.0
    if test:
        test_pairs = data.pairs("test", limit=test_samples or None)
        translate = make_translate_fn(model, tokenizer, beam_size=beam_size, alpha=alpha)
        eval_start = time.time()
        hypotheses = translate([s for s, _ in test_pairs])
        eval_seconds = time.time() - eval_start
        references = [t for _, t in test_pairs]
        metrics["test"] = score(hypotheses, references)
        sentences = []
        if data.info["name"] == "ding":  # the dictionary's own structure
            from keras_transformer.data import ding

            sentences = [i for i, (s, t) in enumerate(test_pairs) if ding.is_sentence(s, t)]
            # A Ding entry often accepts several translations (`;` synonyms, other senses).
            accepted = ding.accepted_references(
                test_pairs, ding.accepted_translations(ding_path or ding.DEFAULT_CORPUS_PATH)
            )
            phrases = [i for i in range(len(test_pairs)) if i not in set(sentences)]
            metrics["test_all_references"] = score_multi(hypotheses, accepted)
            if phrases:
                metrics["test_phrases_all_references"] = score_multi(
                    [hypotheses[i] for i in phrases], [accepted[i] for i in phrases]
                )
        if sentences:
            metrics["test_sentences"] = score(
                [hypotheses[i] for i in sentences], [references[i] for i in sentences]
            )
        samples = [
            {"source": test_pairs[i][0], "reference": references[i], "translation": hypotheses[i]}
            for i in _sample_indices(len(test_pairs), sentences)
        ]
    steps_run = phases.steps
    per_second = steps_run / max(train_seconds, 1e-9)
    run_info = {
        "preset": preset,
        "config": dataclasses.asdict(config),
        "data": dict(
            data.info,
            source_language=data.source_language,
            target_language=data.target_language,
            direction=f"{data.source_language}-{data.target_language}",
        ),
        "training": {
            "epochs": epochs,
            "epochs_run": len(history.get("loss", [])),
            "steps_per_epoch": steps,
            "batch_tokens": batch_tokens,
            "warmup_steps": warmup_steps,
            "learning_rate_scale": learning_rate_scale,
            "dtype_policy": dtype_policy,
            "max_train_minutes": max_train_minutes,
            "seed": seed,
            "distribution": strategy_description,
            "num_replicas": num_replicas,
            "backend": keras.backend.backend(),
            "padding_share": batch_stats["padding_share"],
            "mean_batch_size": batch_stats["batch_size"],
            "batches_per_pass": batch_stats["batches"],
            "passes_over_data": steps_run / max(batch_stats["batches"], 1),
            "threads": threads,
        },
        "cpu": cpu,
        "timing": {
            "startup_seconds": startup_seconds,
            "tokenize_seconds": tokenize_seconds,
            "fit_seconds": phases.fit_seconds,
            "first_step_seconds": phases.first_step_seconds,
            "train_steps_seconds": train_seconds,
            "input_seconds": input_timer.seconds,
            "validation_seconds": phases.validation_seconds,
            "validation_bleu_seconds": validation_bleu.seconds,
            "epoch_end_seconds": phases.epoch_end_seconds,
            "checkpoint_seconds": phases.epoch_end_seconds - validation_bleu.seconds,
            "test_decode_seconds": eval_seconds,
        },
        "curve": phases.curve,
        "metrics": {
            **metrics,
            "val_loss": history["val_loss"][-1] if history.get("val_loss") else None,
            "val_bleu_greedy": history["val_bleu"][-1] if history.get("val_bleu") else None,
            "train_loss": history["loss"][-1] if history.get("loss") else None,
            "train_seconds": train_seconds,
            "train_steps": steps_run,
            # Real (non-pad) tokens per second of the training steps, from the
            # mean batch of a pass over the data (target: with EOS).
            "tokens_per_second": per_second
            * (batch_stats["source_tokens"] + batch_stats["target_tokens"]),
            "target_tokens_per_second": per_second * batch_stats["target_tokens"],
            "source_tokens_per_second": per_second * batch_stats["source_tokens"],
            "sentences_per_second": per_second * batch_stats["batch_size"],
            "test_decode_seconds": eval_seconds,
            "wall_seconds": time.time() - wall_start,
            "beam_size": beam_size,
            "alpha": alpha,
        },
        "history": history,
        "averaging": averaging,
        "samples": samples,
    }
    if is_chief:
        model.save(os.path.join(out_dir, "model.keras"))
        _write_run_info(out_dir, run_info)
    _report(run_info)
    if export and is_chief:
        from keras_transformer.export import export_after_training

        export_start = time.time()
        export_after_training(out_dir, run_info)
        run_info["timing"]["export_seconds"] = time.time() - export_start
        run_info["metrics"]["wall_seconds"] = time.time() - wall_start
        _write_run_info(out_dir, run_info)
    return run_info


def _write_run_info(out_dir, run_info):
    with open(os.path.join(out_dir, "run.json"), "w", encoding="utf-8") as f:
        json.dump(run_info, f, indent=2, ensure_ascii=False)


def _average_best(model, work_dir, average_last, val_ds, config):
    """Averages the last k checkpoints into `model` for the k with the lowest validation loss.

    Returns:
        dict: `chosen` k, and `val_loss` of every k tried (1 = the last weights).
    """
    from keras_transformer.averaging import average_checkpoints, checkpoint_paths

    try:
        paths = checkpoint_paths(work_dir)
    except (FileNotFoundError, ValueError):
        paths = []
    loss_fn = LabelSmoothedCrossEntropy(label_smoothing=0.1, pad_id=config.pad_id)
    batches = list(val_ds.take(val_ds.num_batches))
    last_weights = model.get_weights()

    def validation_loss():
        """Token-weighted over the whole split; the model's compile state is left alone."""
        total = tokens = 0.0
        for features, labels in batches:
            real = float(keras.ops.sum(keras.ops.cast(labels != config.pad_id, "float32")))
            total += float(loss_fn(labels, model(features, training=False))) * real
            tokens += real
        return total / tokens

    results = {1: validation_loss()}
    best_k, best_weights = 1, last_weights
    for k in (2, 3, 5, 8, 13, 21):
        if k > min(average_last, len(paths)):
            break
        average_checkpoints(model, paths[-k:])
        results[k] = validation_loss()
        if results[k] < results[best_k]:
            best_k, best_weights = k, model.get_weights()
    model.set_weights(best_weights)
    logger.info(
        "Checkpoint averaging: validation loss by number of last checkpoints averaged %s; "
        "keeping %d", {k: round(v, 4) for k, v in results.items()}, best_k,
    )  # fmt: skip
    return {"chosen": best_k, "val_loss": {str(k): v for k, v in results.items()}}


def _sample_indices(count, sentences, per_kind=4):
    """Indices of the printed samples: the first few phrase pairs, then full sentences."""
    sentence_set = set(sentences)
    phrases = [i for i in range(count) if i not in sentence_set]
    return phrases[: per_kind if sentences else 2 * per_kind] + list(sentences[:per_kind])


def _report(run_info):
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
        f"epoch-end callbacks {100 * timing['epoch_end_seconds'] / fit:.0f}%; "
        f"start-up {timing['startup_seconds']:.0f}s, test decoding "
        f"{timing['test_decode_seconds']:.0f}s ({run_info['cpu']['summary']})"
    )
    for sample in run_info["samples"]:
        lines.append(f"  {sample['source']}")
        lines.append(f"    -> {sample['translation']}")
        lines.append(f"    (reference: {sample['reference']})")
    print("\n".join(lines), flush=True)


def load_trained(work_dir):
    """`(model, tokenizer, run_info)` from a work directory written by `run()`."""
    import keras_transformer  # noqa: F401  (registers the serializable classes)
    from keras_transformer.data import load_tokenizer

    path = os.path.join(work_dir, "model.keras")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"No trained model at {path}; run `python train.py --work-dir {work_dir}`."
        )
    model = keras.saving.load_model(path, compile=False)
    tokenizer = load_tokenizer(os.path.join(work_dir, "vocab.model"))
    with open(os.path.join(work_dir, "run.json"), encoding="utf-8") as f:
        run_info = json.load(f)
    return model, tokenizer, run_info
