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
import math
import os
import time

import keras
import numpy as np

from keras_transformer.config import get_preset
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.schedules import TransformerSchedule

logger = logging.getLogger(__name__)

# Per-preset training defaults; command-line options override them. `small`
# fits ~15 minutes of training on a 2-core CPU (see README for measured numbers).
TRAINING_DEFAULTS = {
    "small": dict(epochs=6, steps=250, batch_tokens=4096, warmup_steps=400, max_train_minutes=15.0),
    "tiny": dict(epochs=2, steps=20, batch_tokens=512, warmup_steps=50, max_train_minutes=None),
    "base": dict(epochs=100, steps=1000, batch_tokens=25000, warmup_steps=4000, max_train_minutes=None),
    "big": dict(epochs=300, steps=1000, batch_tokens=25000, warmup_steps=4000, max_train_minutes=None),
}


# --------------------------------------------------------------------------- distribution


def _set_logical_cpus(count):
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current is not None and len(current) == count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * count
        )
    except RuntimeError:
        raise RuntimeError(
            f"--logical-devices {count}: TensorFlow is already initialized with "
            f"{len(tf.config.list_logical_devices('CPU'))} CPU device(s); split the CPU "
            "before any TensorFlow op runs."
        ) from None


def make_strategy(logical_devices=None):
    """The distribution for this process; returns `(strategy or None, description)`.

    TensorFlow: `MultiWorkerMirroredStrategy` when `TF_CONFIG` is set,
    otherwise `MirroredStrategy` over all local GPUs (the CPU when there is
    none), or over `logical_devices` logical CPU devices. JAX:
    `keras.distribution.DataParallel` over all devices. torch: none.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        devices = keras.distribution.list_devices()
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        return None, f"jax DataParallel over {len(devices)} device(s)"
    if backend != "tensorflow":
        return None, f"{backend}: single device"
    import tensorflow as tf

    if os.environ.get("TF_CONFIG"):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        return strategy, f"MultiWorkerMirroredStrategy ({strategy.num_replicas_in_sync} replicas)"
    if logical_devices:
        if logical_devices < 1:
            raise ValueError(f"logical_devices must be >= 1. Received: {logical_devices}")
        _set_logical_cpus(logical_devices)
        devices = [f"/cpu:{i}" for i in range(logical_devices)]
        strategy = tf.distribute.MirroredStrategy(devices=devices)
    else:
        strategy = tf.distribute.MirroredStrategy()
    devices = ", ".join(strategy.extended.worker_devices)
    return strategy, f"MirroredStrategy over {strategy.num_replicas_in_sync} device(s): {devices}"


def _is_multi_worker(strategy):
    """True when `strategy` spans several workers (replicas outside this process)."""
    return strategy is not None and strategy.num_replicas_in_sync > len(
        strategy.extended.worker_devices
    )


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiWorkerTransformer(Transformer):
    """`Transformer` whose `fit` and `evaluate` run under `MultiWorkerMirroredStrategy`.

    Keras 3.15's TensorFlow trainer fails there in two places
    (keras-team/keras#20585, tensorflow/tensorflow#72388); both overrides act
    only when the strategy spans several workers:

    1. `fit`/`evaluate` start with `_maybe_symbolic_build`, which averages the
       replicas' first batch with `strategy.reduce("MEAN", batch, axis=None)`
       (keras/src/backend/tensorflow/trainer.py, `_maybe_symbolic_build`).
       Across workers, `CollectiveAllReduce.reduce` calls `convert_to_tensor`
       on the nested batch: "Attempt to convert a value (PerReplica...)".
       Building needs only shapes and dtypes: this process's first replica's
       batch is used instead (which also keeps the ids integer).
    2. `reduce_per_replica(..., "auto")` reduces every log value with
       `strategy.reduce("MEAN", value, axis=0)` in multi-worker mode, and
       metric results are scalars: "Invalid reduction dimension 0 for input
       with 0 dimensions". `train_step`/`test_step` return them with shape
       (1,), so that the mean over axis 0 is the mean over replicas, a scalar.

    Apart from these, it is a `Transformer` (same config and weights); its
    `.keras` file loads where `keras_transformer.training` is imported
    (`load_trained` does).
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self.distribute_strategy
        if iterator is not None and data_batch is None and _is_multi_worker(strategy):
            for _, _, distributed_iterator in iterator:
                data_batch = keras.tree.map_structure(
                    lambda value: strategy.experimental_local_results(value)[0],
                    next(distributed_iterator),
                )
                break
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _logs_as_vectors(self, logs):
        if not _is_multi_worker(self.distribute_strategy):
            return logs
        return keras.tree.map_structure(
            lambda value: keras.ops.reshape(value, (1,)) if len(value.shape) == 0 else value, logs
        )

    def train_step(self, data):
        return self._logs_as_vectors(super().train_step(data))

    def test_step(self, data):
        return self._logs_as_vectors(super().test_step(data))


def _task():
    """`(is_chief, task_id)` from `TF_CONFIG` (chief = worker 0 or the chief task)."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    task_type, task_id = task.get("type", "worker"), int(task.get("index", 0))
    has_chief = "chief" in config.get("cluster", {})
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief)
    return is_chief, f"{task_type}_{task_id}"


# --------------------------------------------------------------------------- translation


def make_translate_fn(model, tokenizer, beam_size=1, alpha=0.6, batch_size=64):
    """`translate(list of str) -> list of str` with the model's key/value cache.

    Uses `keras_transformer.translator.Translator` when present, else
    `decoding.compile_translate_ids` with batching done here.
    """
    try:
        from keras_transformer.translator import Translator
    except ImportError:
        Translator = None
    if Translator is not None:
        translator = Translator(
            model, tokenizer, beam_size=beam_size, alpha=alpha, batch_size=max(8, batch_size // beam_size)
        )
        return translator.translate
    from keras_transformer import decoding

    translate_ids = decoding.compile_translate_ids(model, beam_size=beam_size, alpha=alpha)
    eos_id, pad_id = model.config.eos_id, model.config.pad_id
    max_source = model.config.max_length - 1

    def translate(texts):
        texts = list(texts)
        token_ids = tokenizer(texts)
        if hasattr(token_ids, "to_list"):
            token_ids = token_ids.to_list()
        pieces = [list(ids[:max_source]) + [eos_id] for ids in token_ids]
        order = np.argsort([len(p) for p in pieces], kind="stable")  # less padding
        outputs = [None] * len(texts)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = max(len(pieces[i]) for i in rows)
            batch = np.full((len(rows), width), pad_id, dtype="int32")
            for j, i in enumerate(rows):
                batch[j, : len(pieces[i])] = pieces[i]
            ids = keras.ops.convert_to_numpy(translate_ids(batch))
            ids = np.where(np.cumsum(ids == eos_id, axis=1) > 0, pad_id, ids)  # cut at EOS
            for j, text in enumerate(tokenizer.detokenize(ids)):
                outputs[rows[j]] = _to_str(text)
        return outputs

    return translate


def _to_str(text):
    text = keras.ops.convert_to_numpy(text) if not isinstance(text, (str, bytes)) else text
    if isinstance(text, np.ndarray):
        text = text.item()
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def score(hypotheses, references):
    """sacreBLEU and chrF of `hypotheses` against one reference each."""
    import sacrebleu

    return {
        "bleu": float(sacrebleu.corpus_bleu(hypotheses, [references]).score),
        "chrf": float(sacrebleu.corpus_chrf(hypotheses, [references]).score),
        "segments": len(hypotheses),
    }


# --------------------------------------------------------------------------- callbacks


class ValidationBleu(keras.callbacks.Callback):
    """Greedy-decodes a fixed validation sample after each epoch; logs `val_bleu`, `val_chrf`.

    Put it before `TensorBoard` in the callback list so that TensorBoard
    sees the values it adds to `logs`.
    """

    def __init__(self, pairs, tokenizer, every=1):
        super().__init__()
        self.sources = [s for s, _ in pairs]
        self.references = [t for _, t in pairs]
        self.tokenizer = tokenizer
        self.every = every
        self._translate = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not self.sources or (epoch + 1) % self.every:
            return
        if self._translate is None:
            self._translate = make_translate_fn(self.model, self.tokenizer, beam_size=1)
        start = time.time()
        metrics = score(self._translate(self.sources), self.references)
        logs["val_bleu"], logs["val_chrf"] = metrics["bleu"], metrics["chrf"]
        logger.info(
            "epoch %d: validation BLEU %.2f chrF %.2f on %d sentences (greedy, %.0fs)",
            epoch + 1, metrics["bleu"], metrics["chrf"], metrics["segments"], time.time() - start,
        )  # fmt: skip


class LearningRateLogger(keras.callbacks.Callback):
    """Adds the current learning rate to `logs` (for TensorBoard and the history)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            optimizer = self.model.optimizer
            logs["learning_rate"] = float(
                keras.ops.convert_to_numpy(optimizer.learning_rate)
            )


class TerminateOnNaN(keras.callbacks.TerminateOnNaN):
    """`TerminateOnNaN` that says what to try next."""

    def on_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            logger.error(
                "Batch %d: the loss is %s; training stops. Try a lower learning rate (larger "
                "--warmup-steps), fewer --batch-tokens, or --preset with norm_first=True.",
                batch, loss,
            )  # fmt: skip
        super().on_batch_end(batch, logs)


class TimeBudget(keras.callbacks.Callback):
    """Stops training after the first step that ends past `minutes` of training.

    Keras still runs that epoch's validation and `on_epoch_end` callbacks.
    """

    def __init__(self, minutes):
        super().__init__()
        self.seconds = minutes * 60.0
        self.start = None
        self.stopped = False

    def on_train_begin(self, logs=None):
        self.start = time.time()

    def on_train_batch_end(self, batch, logs=None):
        if not self.stopped and time.time() - self.start >= self.seconds:
            self.stopped = True
            self.model.stop_training = True
            logger.info("Time budget of %.1f minutes reached; training stops.", self.seconds / 60)


class WallTime(keras.callbacks.Callback):
    """Measures the time spent in training steps (validation excluded) and the steps run."""

    def __init__(self):
        super().__init__()
        self.seconds, self.steps, self._start = 0.0, 0, None

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.time()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds += time.time() - self._start
        self.steps += 1


# --------------------------------------------------------------------------- the run


def _build(model, config):
    """Builds the model eagerly with int ids (under MirroredStrategy Keras would
    otherwise build it from an averaged, float first batch)."""
    ids = np.array([[5, 6, config.eos_id]], dtype="int32")
    model({"source_ids": ids, "target_ids": ids}, training=False)


def export_after_training(work_dir, run_info):
    """Hook: exports the trained model when `keras_transformer.export` provides
    `export_after_training(work_dir, run_info)`; otherwise does nothing."""
    try:
        from keras_transformer import export
    except ImportError:
        return None
    hook = getattr(export, "export_after_training", None)
    if hook is None:
        logger.info("keras_transformer.export has no export_after_training(); skipping export.")
        return None
    return hook(work_dir, run_info)


def run(
    preset="small",
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
    max_train_minutes=None,
    validation_bleu_samples=300,
    test_samples=None,
    beam_size=4,
    alpha=0.6,
    ding_path=None,
    export=True,
):
    """Trains a Transformer, evaluates it on the test split and writes `work_dir`.

    Args:
        preset: a `config.PRESETS` name; `small` is the CPU default.
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
        max_train_minutes: stop after the first epoch that ends past this budget.
        validation_bleu_samples: validation pairs decoded (greedy) after each epoch.
        test_samples: test pairs decoded (beam search) at the end; None: all.
        beam_size, alpha: beam search of the final test evaluation.
        ding_path: the Ding dictionary file.
        export: call `export_after_training` at the end.

    Returns:
        dict: the contents of `run.json`.
    """
    from keras_transformer.data import (
        batch_statistics,
        get_tokenizer,
        load_translation_data,
        make_dataset,
    )

    wall_start = time.time()
    defaults = TRAINING_DEFAULTS.get(preset, TRAINING_DEFAULTS["small"])
    epochs = epochs or defaults["epochs"]
    steps = steps or defaults["steps"]
    batch_tokens = batch_tokens or defaults["batch_tokens"]
    warmup_steps = warmup_steps or defaults["warmup_steps"]
    if max_train_minutes is None:
        max_train_minutes = defaults["max_train_minutes"]
    keras.utils.set_random_seed(seed)

    strategy, strategy_description = make_strategy(logical_devices)
    num_replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    logger.info("Distribution: %s", strategy_description)

    is_chief, task_name = _task()
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
    overrides = {"vocab_size": vocab_size} if vocab_size else {}
    config = get_preset(preset, **overrides)
    tokenizer = get_tokenizer(
        os.path.join(out_dir, "vocab.model"), data.splits["train"], config.vocab_size
    )

    common = dict(max_length=config.max_length, batch_tokens=batch_tokens, num_replicas=num_replicas)
    train_ds = make_dataset(data.splits["train"], tokenizer, training=True, seed=seed, **common)
    val_ds = make_dataset(data.splits["validation"], tokenizer, training=False, **common)
    batch_stats = batch_statistics(train_ds, num_batches=20)
    logger.info(
        "Batches of ~%d tokens: %.0f sentences, %.0f source + %.0f target real tokens, "
        "padding share %.1f%%",
        batch_tokens, batch_stats["batch_size"], batch_stats["source_tokens"],
        batch_stats["target_tokens"], 100 * batch_stats["padding_share"],
    )  # fmt: skip

    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model_class = MultiWorkerTransformer if _is_multi_worker(strategy) else Transformer
        model = model_class(**dataclasses.asdict(config))
        _build(model, config)
        schedule = TransformerSchedule(config.d_model, warmup_steps=warmup_steps)
        optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
        model.compile(
            optimizer=optimizer,
            loss=LabelSmoothedCrossEntropy(label_smoothing=0.1, pad_id=config.pad_id),
            metrics=[MaskedAccuracy(pad_id=config.pad_id)],
            jit_compile=False,  # XLA fails under MirroredStrategy on logical CPU devices
        )
    logger.info("Model: preset %s, %s parameters", preset, f"{model.count_params():,}")

    validation_pairs = data.pairs("validation", limit=validation_bleu_samples)
    wall_time = WallTime()
    time_budget = TimeBudget(max_train_minutes) if max_train_minutes else None
    callbacks = [
        keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")),
        TerminateOnNaN(),
        wall_time,
        LearningRateLogger(),
        ValidationBleu(validation_pairs, tokenizer),
        keras.callbacks.ModelCheckpoint(
            os.path.join(out_dir, "checkpoints", "epoch_{epoch:03d}.weights.h5"),
            save_weights_only=True,
        ),
    ]
    if keras.backend.backend() != "tensorflow" or importlib.util.find_spec("tensorboard"):
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(out_dir, "logs")))
    else:
        logger.warning("TensorBoard is not installed (`pip install tensorboard`); no logs/ written.")
    if time_budget is not None:
        callbacks.append(time_budget)
    history = model.fit(
        train_ds,
        epochs=epochs,
        steps_per_epoch=steps,
        validation_data=val_ds,
        callbacks=callbacks,
        verbose=1 if os.isatty(1) else 2,
    )
    train_seconds = wall_time.seconds
    history = {key: [float(v) for v in values] for key, values in history.history.items()}

    # Final evaluation: beam search on the test split, all pairs and full sentences.
    test_pairs = data.pairs("test", limit=test_samples)
    translate = make_translate_fn(model, tokenizer, beam_size=beam_size, alpha=alpha)
    eval_start = time.time()
    hypotheses = translate([s for s, _ in test_pairs])
    eval_seconds = time.time() - eval_start
    references = [t for _, t in test_pairs]
    metrics = {"test": score(hypotheses, references)}
    from keras_transformer.data.ding import is_sentence

    sentences = [i for i, (s, t) in enumerate(test_pairs) if is_sentence(s, t)]
    if sentences:
        metrics["test_sentences"] = score(
            [hypotheses[i] for i in sentences], [references[i] for i in sentences]
        )
    samples = [
        {"source": test_pairs[i][0], "reference": references[i], "translation": hypotheses[i]}
        for i in (sentences or range(len(test_pairs)))[:8]
    ]
    tokens_per_step = batch_stats["source_tokens"] + batch_stats["target_tokens"]
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
            "max_train_minutes": max_train_minutes,
            "seed": seed,
            "distribution": strategy_description,
            "num_replicas": num_replicas,
            "backend": keras.backend.backend(),
            "padding_share": batch_stats["padding_share"],
            "mean_batch_size": batch_stats["batch_size"],
        },
        "metrics": {
            **metrics,
            "val_loss": history["val_loss"][-1] if history.get("val_loss") else None,
            "val_bleu_greedy": history["val_bleu"][-1] if history.get("val_bleu") else None,
            "train_loss": history["loss"][-1] if history.get("loss") else None,
            "train_seconds": train_seconds,
            "train_steps": wall_time.steps,
            # Real (non-pad) source + target tokens per second, from the mean batch.
            "tokens_per_second": tokens_per_step * wall_time.steps / max(train_seconds, 1e-9),
            "test_decode_seconds": eval_seconds,
            "wall_seconds": time.time() - wall_start,
            "beam_size": beam_size,
            "alpha": alpha,
        },
        "history": history,
        "samples": samples,
    }
    if is_chief:
        model.save(os.path.join(out_dir, "model.keras"))
        with open(os.path.join(out_dir, "run.json"), "w", encoding="utf-8") as f:
            json.dump(run_info, f, indent=2, ensure_ascii=False)
    _report(run_info)
    if export and is_chief:
        export_after_training(out_dir, run_info)
    return run_info


def _report(run_info):
    metrics = run_info["metrics"]
    lines = [
        f"Test ({metrics['test']['segments']} pairs, beam {metrics['beam_size']}): "
        f"BLEU {metrics['test']['bleu']:.2f}  chrF {metrics['test']['chrf']:.2f}",
    ]
    if "test_sentences" in metrics:
        m = metrics["test_sentences"]
        lines.append(f"Test, full sentences only ({m['segments']}): BLEU {m['bleu']:.2f}  chrF {m['chrf']:.2f}")
    if metrics["val_loss"] is not None:
        lines.append(f"Final validation loss {metrics['val_loss']:.3f}")
    lines.append(
        f"Training {metrics['train_seconds'] / 60:.1f} min, {metrics['train_steps']} steps, "
        f"{metrics['tokens_per_second']:.0f} tokens/s; whole run {metrics['wall_seconds'] / 60:.1f} min"
    )
    for sample in run_info["samples"]:
        lines.append(
            f"  {sample['source']}\n    -> {sample['translation']}\n    (reference: {sample['reference']})"
        )
    print("\n".join(lines), flush=True)


def load_trained(work_dir):
    """`(model, tokenizer, run_info)` from a work directory written by `run()`."""
    import keras_transformer  # noqa: F401  (registers the serializable classes)
    from keras_transformer.data import load_tokenizer

    path = os.path.join(work_dir, "model.keras")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No trained model at {path}; run `python train.py --work-dir {work_dir}`.")
    model = keras.saving.load_model(path, compile=False)
    tokenizer = load_tokenizer(os.path.join(work_dir, "vocab.model"))
    with open(os.path.join(work_dir, "run.json"), encoding="utf-8") as f:
        run_info = json.load(f)
    return model, tokenizer, run_info
