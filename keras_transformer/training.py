"""Training runner: `run()` is what `python train.py` calls, a list of named steps.

    config   TrainingConfig: options, per-preset defaults   (training_config.py)
    machine  threads, CPU, dtype policy, distribution, which folder this task writes
    data     corpus, model config, shared vocabulary, tokenized splits, batches
    model    built (from --init-from's weights), compiled with the paper's recipe
    fit      callbacks and `model.fit`
    finish   float32 copy, checkpoint averaging, test decoding, run.json, export

It writes the work directory (layout: `keras_transformer.workdir`) that
export, translation, averaging and attention plots read back.
"""

import contextlib
import dataclasses
import logging
import os
import shutil
import time

import keras
import numpy as np

from keras_transformer import calibration, run_record, workdir
from keras_transformer.callbacks import (
    Cooldown,
    LearningRateLogger,
    PhaseTimer,
    TerminateOnNaN,
    TimeBudget,
    ValidationBleu,
    ValidationEpochs,
)
from keras_transformer.config import get_preset
from keras_transformer.distribution import (
    MultiWorkerTransformer,
    is_chief_task,
    is_multi_worker,
    make_strategy,
)
from keras_transformer.evaluation import make_translate_fn, score, score_multi
from keras_transformer.hardware import (
    configure_threads,
    default_dtype_policy,
    describe_cpu,
    importable,
)
from keras_transformer.model import Transformer
from keras_transformer.recipe import compile_with_paper_recipe, paper_loss
from keras_transformer.schedules import TransformerSchedule
from keras_transformer.training_config import (  # noqa: F401  (re-exported)
    DTYPE_POLICIES,
    TRAINING_DEFAULTS,
    TrainingConfig,
    corpus_defaults,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Machine:
    """Where this process trains and what it writes."""

    cpu: dict
    threads: dict
    dtype_policy: str
    strategy: object  # a tf.distribute strategy, or None
    strategy_description: str
    num_replicas: int
    is_chief: bool
    out: workdir.WorkDir  # the work directory, or a worker's beside it
    jit_compile: bool | None  # the training step compiled with XLA; None: to calibrate
    has_gpu: bool = False
    candidates: tuple = ()  # `calibration.Candidate`s to time when more than one
    calibration: dict | None = None  # what `calibrate` measured or read (run.json)


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Corpus, vocabulary and the batched splits of one run."""

    data: object  # TranslationData
    model_config: object  # TransformerConfig
    tokenizer: object
    train_batches: object  # data.Batches of the training split
    train_ds: object
    val_ds: object
    batch_stats: dict
    input_timer: object
    tokenize_seconds: float


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
    progress: dict  # `RunProgress.to_dict()`


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


@dataclasses.dataclass(frozen=True)
class TestResult:
    metrics: dict
    samples: list
    seconds: float


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    """A finished work directory that `--init-from` starts from."""

    work: workdir.WorkDir
    run_info: dict

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


# --------------------------------------------------------------------------- the run


def run(config=None, /, **options):
    """Trains a Transformer, evaluates it on the test split and writes its work directory.

    Args:
        config: a `TrainingConfig` (or a preset name); `options` replace its
            fields. `run(preset="tiny", epochs=1)` is `run(TrainingConfig(preset="tiny",
            epochs=1))`. None means the preset's default (`TRAINING_DEFAULTS`).

    Returns:
        dict: the contents of `run.json` (with `prepare_only`: `{"prepared": work_dir}`).
    """
    wall_start = time.time()
    config, finished = _training_config(config, options)
    machine = set_up_machine(config)
    inputs = prepare_inputs(config, machine, finished)
    if config.prepare_only:
        logger.info(
            "--prepare-only: the vocabulary and the tokenized splits are in %s; the same "
            "command without it trains from them", machine.out.path,
        )  # fmt: skip
        return {"prepared": machine.out.path}
    progress = run_progress(config, machine)
    model, machine = calibrated_model(config, machine, inputs, finished)
    fitted = fit(model, config, machine, inputs, finished, wall_start, progress)
    model = _plain_float32(model)
    averaging = average_checkpoints_by_validation(model, config, machine, inputs)
    test = evaluate_test(model, config, inputs)
    run_info = run_record.build(
        config, machine, inputs.data, inputs.model_config, inputs, fitted, averaging, test,
        wall_start,
    )  # fmt: skip
    if machine.is_chief:
        model.save(machine.out.model)
        machine.out.write_run_record(run_info)
    run_record.report(run_info)
    if config.export and machine.is_chief:
        export(machine.out, run_info, wall_start)
    return run_info


def _training_config(config, options):
    """The resolved `TrainingConfig`, and the `FinishedRun` of `init_from` (or None)."""
    if isinstance(config, str):
        options = {"preset": config, **options}
        config = None
    config = dataclasses.replace(config, **options) if config else TrainingConfig(**options)
    finished = None
    if config.init_from:
        finished = FinishedRun(
            workdir.WorkDir(config.init_from), workdir.check(config.init_from, finished=True)
        )
        if config.preset is not None and config.preset != finished.run_info["preset"]:
            raise ValueError(
                f"--init-from {config.init_from} trained preset {finished.run_info['preset']!r}; "
                f"its architecture is kept. Received: preset={config.preset!r}"
            )
        if os.path.abspath(config.init_from) == os.path.abspath(config.work_dir):
            raise ValueError(
                f"--init-from needs a new --work-dir; {config.work_dir!r} is the finished run "
                "(rerun without --init-from to resume an unfinished run there)."
            )
    return config.resolved(finished.run_info["preset"] if finished else None), finished


# --------------------------------------------------------------------------- machine


def set_up_machine(config):
    """Threads, CPU, dtype policy, seed, distribution and this task's folder."""
    cpu = describe_cpu()
    threads, has_gpu = {}, False
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        threads = configure_threads()  # before TensorFlow runs its first op
        has_gpu = bool(tf.config.list_physical_devices("GPU"))
        logger.info("CPU: %s; TensorFlow threads: %s", cpu["summary"], threads)
    else:
        has_gpu = _has_gpu()
        logger.info("CPU: %s; %s backend", cpu["summary"], keras.backend.backend())
    keras.utils.set_random_seed(config.seed)

    strategy, strategy_description = make_strategy(config.logical_devices)
    logger.info("Distribution: %s", strategy_description)
    is_chief, task_name = is_chief_task()
    # In a multi-worker run only the chief writes `work_dir`; the others write
    # beside it so that their checkpoints and backups never collide.
    work = workdir.WorkDir(config.work_dir)
    out = work if is_chief else work.worker(task_name)
    if config.overwrite and is_chief:
        workdir.clear(work.path)
        logger.info("--overwrite: cleared %s", work.path)
    os.makedirs(out.path, exist_ok=True)
    options = calibration.candidates(
        keras.backend.backend(), cpu, has_gpu, multi_device=strategy is not None,
        pack=config.pack, dtype_policy=config.dtype_policy, jit_compile=config.jit_compile,
    )  # fmt: skip
    if len(options) > 1 and is_multi_worker(strategy):
        # Every worker must train alike; each timing its own steps could disagree.
        dtype_policy = config.dtype_policy or ("float32" if has_gpu else default_dtype_policy(cpu))
        jit_compile = bool(config.jit_compile)
        options = [calibration.Candidate(dtype_policy, jit_compile)]
    dtype_policy = jit_compile = None
    if len(options) == 1:
        dtype_policy, jit_compile = options[0].dtype_policy, options[0].jit_compile
        logger.info("Precision %s, XLA (jit_compile) %s", dtype_policy, jit_compile)
    return Machine(
        cpu=cpu,
        threads=threads,
        dtype_policy=dtype_policy,
        strategy=strategy,
        strategy_description=strategy_description,
        num_replicas=strategy.num_replicas_in_sync if strategy is not None else 1,
        is_chief=is_chief,
        out=out,
        jit_compile=jit_compile,
        has_gpu=has_gpu,
        candidates=tuple(options),
    )


def _has_gpu():
    """Whether the JAX or torch backend runs on a GPU."""
    if keras.backend.backend() == "jax":
        import jax

        return jax.default_backend() == "gpu"
    if keras.backend.backend() == "torch":
        import torch

        return torch.cuda.is_available()
    return False


# --------------------------------------------------------------------------- data


def prepare_inputs(config, machine, finished=None):
    """Corpus, model config, vocabulary, tokenized splits and their batched datasets.

    One input path on every backend: the pairs are tokenized once per work
    directory with the `sentencepiece` package (`data.shards`, reused by a
    resumed or continued run), and `data.Batches` plans and assembles the
    batches on the host, which `model.fit` reads as a `tf.data` wrapper under
    TensorFlow and as a `keras.utils.PyDataset` under JAX and torch.
    """
    from keras_transformer.data import (
        Batches,
        InputTimer,
        load_translation_data,
        make_dataset,
        plan_statistics,
        repeat_sentences,
    )
    from keras_transformer.data.shards import tokenized_splits

    data = load_translation_data(
        config.dataset,
        data_dir=config.data_dir,
        direction=config.direction,
        tfds_data_dir=workdir.WorkDir(config.work_dir).tfds,
        ding_path=config.ding_path,
    )
    logger.info(
        "Data %s, %s -> %s: %s",
        data.info["name"], data.source_language, data.target_language, data.info["counts"],
    )  # fmt: skip
    model_config = _model_config(config, data, finished)
    if machine.is_chief:  # before anything is written there
        workdir.claim(machine.out.path, _corpus_identity(data, model_config))
    tokenizer = _vocabulary(machine.out, data, model_config, finished)

    tokenize_start = time.time()
    # The vocabulary is the corpus's; repeated sentences only weigh the batches.
    splits = {
        "train": repeat_sentences(data.splits["train"], config.sentence_repeats),
        "validation": data.splits["validation"],
    }
    tokenized, reused = tokenized_splits(
        machine.out.data, splits, tokenizer, model_config.max_length, model_config.eos_id
    )
    tokenize_seconds = time.time() - tokenize_start
    input_timer = InputTimer()
    common = dict(
        max_length=model_config.max_length,
        batch_tokens=config.batch_tokens,
        num_replicas=machine.num_replicas,
        bos_id=model_config.bos_id,
        eos_id=model_config.eos_id,
        pack=config.pack,
    )
    train_batches = Batches(
        tokenized["train"], training=True, seed=config.seed, timer=input_timer, **common
    )
    train_ds = make_dataset(train_batches)
    val_ds = make_dataset(Batches(tokenized["validation"], training=False, **common))
    stats = plan_statistics(
        tokenized["train"], config.batch_tokens, machine.num_replicas, seed=config.seed,
        pack=config.pack,
    )  # fmt: skip
    logger.info(
        "%s %d train pairs (full sentences %d times; %d longer than %d dropped) in %.0fs. "
        "Batches of ~%d tokens: %.0f sentences, %.0f source + %.0f target real tokens, padding "
        "share %.1f%%, %d batches per pass over the data",
        "Read the tokenized" if reused else "Tokenized", len(tokenized["train"]),
        config.sentence_repeats, tokenized["train"].dropped, model_config.max_length,
        tokenize_seconds, config.batch_tokens, stats["batch_size"], stats["source_tokens"],
        stats["target_tokens"], 100 * stats["padding_share"], stats["batches"],
    )  # fmt: skip
    return Inputs(
        data, model_config, tokenizer, train_batches, train_ds, val_ds, stats, input_timer,
        tokenize_seconds,
    )  # fmt: skip


def _corpus_identity(data, model_config):
    """What a work directory belongs to (`workdir.claim`): the corpus, its
    direction, a digest of its training pairs and the vocabulary size."""
    from keras_transformer.data.shards import digest_pairs

    return {
        "corpus": data.info["name"],
        "direction": f"{data.source_language}-{data.target_language}",
        "train_pairs_sha256": digest_pairs(data.splits["train"]),
        "vocab_size": model_config.vocab_size,
    }


def run_progress(config, machine):
    """Whether this run is new, resumes a killed run or continues a finished one
    (`RunProgress`), logged; a finished run with nothing left to train is refused."""
    work = machine.out
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
    if finished:
        minutes = config.max_train_minutes
        if epochs >= config.epochs or (minutes is not None and seconds >= 60 * minutes):
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


def _model_config(config, data, finished):
    """The preset's `TransformerConfig` with the corpus's and the options' overrides,
    or `--init-from`'s (whose architecture and vocabulary are kept)."""
    if finished is not None:
        saved = get_preset(config.preset, **finished.run_info["config"])
        if config.vocab_size is not None and config.vocab_size != saved.vocab_size:
            raise ValueError(
                f"--init-from {finished.work.path} keeps its {saved.vocab_size}-piece vocabulary. "
                f"Received: vocab_size={config.vocab_size}"
            )
        changes = {
            name: value
            for name, value in (
                ("dropout", config.dropout),
                ("attention_dropout", config.attention_dropout),
                ("use_fused_attention", config.fused_attention),
            )
            if value is not None
        }
        return dataclasses.replace(saved, **changes)
    overrides = {}
    if data.info["name"] != "ding":  # the presets' defaults are measured on Ding
        picked = corpus_defaults(data.info["counts"]["train"], config.preset)
        # What the command line sets is not picked (nor said to be).
        overrides = {k: v for k, v in picked.items() if getattr(config, k, None) is None}
        if overrides:
            logger.info(
                "A corpus of %d training pairs: %s (docs/data.md, \"Your own data\"; "
                "--dropout overrides)", data.info["counts"]["train"], overrides,
            )  # fmt: skip
    if config.vocab_size is not None:
        overrides["vocab_size"] = config.vocab_size
    if config.dropout is not None:
        overrides["dropout"] = config.dropout
    if config.attention_dropout is not None:
        overrides["attention_dropout"] = config.attention_dropout
    if config.fused_attention is not None:
        overrides["use_fused_attention"] = config.fused_attention
    return get_preset(config.preset, **overrides)


def _vocabulary(out, data, model_config, finished):
    """The shared vocabulary: trained on the corpus, or `--init-from`'s, copied once."""
    from keras_transformer.data import get_tokenizer

    if finished is not None:
        source = finished.work.vocabulary
        if not os.path.exists(out.vocabulary):
            shutil.copyfile(source, out.vocabulary)
        else:
            with open(source, "rb") as a, open(out.vocabulary, "rb") as b:
                if a.read() != b.read():
                    raise ValueError(
                        f"{out.vocabulary} is not the vocabulary of --init-from {source}; "
                        "use a new --work-dir."
                    )
        logger.info("Vocabulary and weights of %s", finished.work.path)
    return get_tokenizer(out.vocabulary, data.splits["train"], model_config.vocab_size)


# --------------------------------------------------------------------------- model


def _build(model, config):
    """Builds the model eagerly with int ids (under MirroredStrategy Keras would
    otherwise build it from an averaged, float first batch)."""
    ids = np.array([[5, 6, config.eos_id]], dtype="int32")
    model({"source_ids": ids, "target_ids": ids}, training=False)


def build_model(config, machine, model_config, finished=None, log=True):
    """The model, built (with `--init-from`'s weights) and compiled with the paper's recipe."""
    scope = machine.strategy.scope() if machine.strategy else contextlib.nullcontext()
    with scope:
        model_class = MultiWorkerTransformer if is_multi_worker(machine.strategy) else Transformer
        model = model_class(**dataclasses.asdict(model_config), dtype=machine.dtype_policy)
        _build(model, model_config)
        if finished is not None:
            model.set_weights(workdir.load_model(finished.work.path).get_weights())
        compile_with_paper_recipe(
            model,
            warmup_steps=config.warmup_steps,
            learning_rate_scale=config.learning_rate_scale,
            settable_learning_rate=config.cooldown > 0,  # `Cooldown` sets it
            jit_compile=machine.jit_compile,
        )
        if finished is not None:
            # The schedule goes on where the finished run stopped (no second warm-up).
            model.optimizer.iterations.assign(finished.steps)
    if log:
        logger.info("Model: preset %s, %s parameters", config.preset, f"{model.count_params():,}")
    return model


def calibrated_model(config, machine, inputs, finished=None, timed_steps=6):
    """The compiled model, with the precision and XLA setting that trains fastest here.

    With one candidate (`--dtype-policy` and `--jit-compile` given, or
    nothing to choose on this machine) it is built as is. Otherwise each
    candidate is built from the same initial weights, checked on the first
    batch against float32's loss, and timed over `timed_steps` steps after
    two untimed ones (`calibration.choose`); the fastest is kept, its weights
    and optimizer put back to where they started, and its traced step is the
    one `fit` then runs. The choice is cached per machine, model and batch
    shape (`calibration.cache_path()`).

    Returns:
        `(model, machine)`, the machine with the chosen `dtype_policy` and
        `jit_compile` and what was measured in `calibration`.
    """
    if len(machine.candidates) <= 1:
        return build_model(config, machine, inputs.model_config, finished), machine
    key = calibration.machine_key(
        cpu=machine.cpu["model"], cores=machine.cpu["cores"], gpu=_gpu_name(machine),
        backend=keras.backend.backend(), replicas=machine.num_replicas,
        model=dataclasses.asdict(inputs.model_config), batch_tokens=config.batch_tokens,
        pack=config.pack, candidates=[c.name for c in machine.candidates],
    )  # fmt: skip
    result = calibration.read_cache(key)
    models = {}
    if result is None:

        def measure(candidate):
            keras.utils.set_random_seed(config.seed)  # the same initial weights for all
            trial = dataclasses.replace(
                machine, dtype_policy=candidate.dtype_policy, jit_compile=candidate.jit_compile
            )
            model = build_model(config, trial, inputs.model_config, finished, log=False)
            start_state = _training_state(model, machine)
            models[candidate.name] = (model, start_state)
            return _measure_steps(model, inputs, timed_steps)

        result = calibration.choose(list(machine.candidates), measure)
        calibration.write_cache(key, result)
    logger.info("Calibration: %s", result.summary())
    machine = dataclasses.replace(
        machine,
        dtype_policy=result.choice.dtype_policy,
        jit_compile=result.choice.jit_compile,
        calibration=result.to_dict(),
    )
    if result.choice.name in models:
        model, start_state = models[result.choice.name]
        _restore_training_state(model, start_state)
        logger.info("Model: preset %s, %s parameters", config.preset, f"{model.count_params():,}")
    else:
        keras.utils.set_random_seed(config.seed)
        model = build_model(config, machine, inputs.model_config, finished)
    return model, machine


def _gpu_name(machine):
    if not machine.has_gpu:
        return None
    if keras.backend.backend() == "jax":
        import jax

        return jax.devices()[0].device_kind
    if keras.backend.backend() == "torch":
        import torch

        return torch.cuda.get_device_name()
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")


def _training_state(model, machine):
    """The weights and optimizer variables of a compiled model, as numpy arrays."""
    scope = machine.strategy.scope() if machine.strategy else contextlib.nullcontext()
    with scope:
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
    optimizer = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
    return model.get_weights(), optimizer


def _restore_training_state(model, state):
    weights, optimizer = state
    model.set_weights(weights)
    for variable, value in zip(model.optimizer.variables, optimizer, strict=True):
        variable.assign(value)


class _StepClock(keras.callbacks.Callback):
    """Seconds of each training step; reads the loss at every step's end, so that
    a backend that dispatches asynchronously (JAX) has finished the step."""

    def __init__(self):
        super().__init__()
        self.seconds = []
        self._start = None

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        float(keras.ops.convert_to_numpy(logs["loss"]))
        self.seconds.append(time.perf_counter() - self._start)


def _measure_steps(model, inputs, timed_steps, warmup_steps=2):
    """`calibration.Measurement`: the median seconds of `timed_steps` training steps
    after `warmup_steps` (the trace and compile), and the loss of the first batch
    with the initial weights (no dropout)."""
    features, labels = inputs.train_batches.batch(0)
    logits = model(features, training=False)  # eager: no trace of a predict function
    loss = float(paper_loss(inputs.model_config.pad_id)(labels, logits))
    clock = _StepClock()
    model.fit(
        inputs.train_ds, epochs=1, steps_per_epoch=warmup_steps + timed_steps, verbose=0,
        callbacks=[clock], shuffle=False,
    )  # fmt: skip
    return calibration.Measurement(float(np.median(clock.seconds[warmup_steps:])), loss)


# --------------------------------------------------------------------------- fit


def make_callbacks(config, machine, inputs, initial_step=0, progress=None):
    """`(callbacks, phases, validation_bleu)`: the callbacks of `fit`, in their order.

    `initial_step`: the optimizer's step when this run began (`--init-from`'s last).
    """
    validation_pairs = []
    if config.validation_bleu_every:
        validation_pairs = inputs.data.pairs("validation", limit=config.validation_bleu_samples)
    phases = PhaseTimer()  # first: it times what the others do at epoch end
    validation_bleu = ValidationBleu(
        validation_pairs, inputs.tokenizer, every=config.validation_bleu_every
    )
    out = machine.out
    spent = progress.train_seconds if progress is not None else 0.0
    backup = keras.callbacks.BackupAndRestore(out.backup, delete_checkpoint=False)
    checkpoint = keras.callbacks.ModelCheckpoint(out.checkpoint_pattern, save_weights_only=True)
    for callback in (backup, checkpoint):
        # They save per epoch (save_freq="epoch"): their batch-end hooks do nothing, and
        # without this Keras would wait for every step before it dispatches the next.
        callback.async_safe = True
    callbacks = [
        phases,
        backup,  # kept after training: the same command with a larger budget continues from it
        TrainingClock(out.path, spent),  # after the backup it accounts for
        TerminateOnNaN(),
    ]
    if config.cooldown:  # after BackupAndRestore: it reads the restored step
        schedule = TransformerSchedule(
            inputs.model_config.d_model, config.warmup_steps, config.learning_rate_scale
        )
        callbacks.append(
            Cooldown(
                schedule,
                config.cooldown,
                minutes=_training_minutes(config, machine, spent),
                total_steps=config.epochs * config.steps,
                initial_step=initial_step,
            )
        )
    callbacks += [
        LearningRateLogger(),
        validation_bleu,  # before TensorBoard, which then logs its values
        checkpoint,
    ]
    # Keras's TensorBoard callback writes with `tf.summary` on every backend.
    if not importable("tensorflow"):
        logger.info("No TensorBoard logs without TensorFlow; the curves are in run.json.")
    elif importable("tensorboard"):  # tf.summary needs it, on every backend
        tensorboard = keras.callbacks.TensorBoard(out.logs)  # update_freq="epoch"
        # Per epoch its batch-end hook writes nothing (no writer is pushed), as the
        # checkpoints' above; it only matters where Keras dispatches asynchronously,
        # under JAX and torch (not TensorFlow, whose Keras backend is not thread-safe).
        tensorboard.async_safe = True
        callbacks.append(tensorboard)
    else:
        logger.warning(
            "TensorBoard is not installed (`pip install tensorboard`); no logs/ written."
        )
    if config.max_train_minutes is not None:
        callbacks.append(TimeBudget(_training_minutes(config, machine, spent)))
    callbacks.append(phases.end_marker)  # last
    return callbacks, phases, validation_bleu


def _training_minutes(config, machine, spent_seconds=0.0):
    """The time budget of `fit`: `--max-train-minutes`, less the training time of
    the earlier processes of a resumed or continued run (`spent_seconds`) and
    what this run's calibration took (so that a first run on a machine ends when
    others do)."""
    if config.max_train_minutes is None:
        return None
    spent = spent_seconds + (machine.calibration or {}).get("seconds", 0.0)
    return max(config.max_train_minutes - spent / 60.0, 0.0)


class TrainingClock(keras.callbacks.Callback):
    """Writes the run's training seconds, earlier processes' included, at every
    epoch end (`workdir.write_progress`), beside the backup taken then."""

    def __init__(self, work_dir, spent_seconds=0.0):
        super().__init__()
        self.work_dir = work_dir
        self.spent_seconds = spent_seconds
        self._start = None

    def on_train_begin(self, logs=None):
        self._start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        workdir.write_progress(self.work_dir, self.spent_seconds + time.time() - self._start)


def fit(model, config, machine, inputs, finished, wall_start, progress=None):
    """`model.fit` with the run's callbacks; returns what the run record needs."""
    progress = progress or RunProgress("new")
    initial_step = finished.steps if finished is not None else 0
    callbacks, phases, validation_bleu = make_callbacks(
        config, machine, inputs, initial_step, progress
    )
    init_from = None
    if finished is not None:
        init_from = {
            "work_dir": finished.work.path,
            "initial_step": finished.steps,
            "finished_val_loss": finished.val_loss,
            "val_loss": validation_loss(
                model, inputs.val_ds.evaluation(), inputs.model_config.pad_id
            ),
        }
        logger.info(
            "Starting from %s: validation loss %.4f (the finished run's: %.4f), step %d",
            finished.work.path, init_from["val_loss"], finished.val_loss, finished.steps,
        )  # fmt: skip
    startup_seconds = time.time() - wall_start
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


# --------------------------------------------------------------------------- finish


def _plain_float32(model):
    """The trained model as a plain float32 `Transformer` (same config and weights),
    for evaluation, saving and export; `model` itself when it already is one."""
    if type(model) is Transformer and model.dtype_policy.name == "float32":
        return model
    plain = Transformer.from_config(dict(model.get_config(), dtype="float32"))
    plain.build()
    plain.set_weights(model.get_weights())
    return plain


def validation_loss(model, batches, pad_id):
    """Token-weighted label-smoothed loss over `batches`, whole validation passes
    (`val_ds.evaluation()`); the model's compile state is left alone."""
    loss_fn = paper_loss(pad_id)
    total = tokens = 0.0
    for features, labels in batches:
        real = float(keras.ops.sum(keras.ops.cast(labels != pad_id, "float32")))
        # The compiled forward pass: eager calls took 43 s per pass of Ding's
        # validation split, 3 to 4 passes per run (docs/training.md, "Measured: the
        # default run").
        logits = model.predict_on_batch(features)
        total += float(loss_fn(labels, logits)) * real
        tokens += real
    return total / tokens


def average_checkpoints_by_validation(model, config, machine, inputs):
    """Averages the last k checkpoints into `model` for the k with the lowest validation loss.

    Runs on the chief when `average_last >= 1` (with 1 it only measures the
    last weights' validation loss per real token, which `benchmarks/quality.py`
    compares). Returns None otherwise, else a dict: `chosen` k, `val_loss` of
    every k tried (1 = the last weights), `seconds`.
    """
    if config.average_last < 1 or not machine.is_chief:
        return None
    from keras_transformer.averaging import average_checkpoints, checkpoint_paths

    start = time.time()
    try:
        paths = checkpoint_paths(machine.out.path)
    except (FileNotFoundError, ValueError):
        paths = []
    pad_id = inputs.model_config.pad_id
    batches = inputs.val_ds.evaluation()
    results = {1: validation_loss(model, batches, pad_id)}
    best_k, best_weights = 1, model.get_weights()
    for k in (2, 3, 5, 8, 13, 21):
        if k > min(config.average_last, len(paths)):
            break
        average_checkpoints(model, paths[-k:])
        results[k] = validation_loss(model, batches, pad_id)
        if results[k] < results[best_k]:
            best_k, best_weights = k, model.get_weights()
    model.set_weights(best_weights)
    logger.info(
        "Checkpoint averaging: validation loss by number of last checkpoints averaged %s; "
        "keeping %d", {k: round(v, 4) for k, v in results.items()}, best_k,
    )  # fmt: skip
    return {
        "chosen": best_k,
        "val_loss": {str(k): v for k, v in results.items()},
        "seconds": time.time() - start,
    }


def evaluate_test(model, config, inputs):
    """Beam search on the test split: scores, and a few samples to print."""
    data = inputs.data
    if not config.test or not data.splits["test"]:
        return TestResult({}, [], 0.0)
    test_pairs = data.pairs("test", limit=config.test_samples or None)
    translate = make_translate_fn(model, inputs.tokenizer, config.search)
    start = time.time()
    hypotheses = translate([s for s, _ in test_pairs])
    seconds = time.time() - start
    references = [t for _, t in test_pairs]
    metrics = {"test": score(hypotheses, references)}
    sentences = []
    if data.info["name"] == "ding":  # the dictionary's own structure
        sentences = _score_ding(metrics, test_pairs, hypotheses, config.ding_path)
    if sentences:
        metrics["test_sentences"] = score(
            [hypotheses[i] for i in sentences], [references[i] for i in sentences]
        )
    samples = [
        {"source": test_pairs[i][0], "reference": references[i], "translation": hypotheses[i]}
        for i in _sample_indices(len(test_pairs), sentences)
    ]
    return TestResult(metrics, samples, seconds)


def _score_ding(metrics, test_pairs, hypotheses, ding_path):
    """Adds the multi-reference scores of the Ding dictionary; returns its sentence indices."""
    from keras_transformer.data import ding

    sentences = [i for i, (s, t) in enumerate(test_pairs) if ding.is_sentence(s, t)]
    # A Ding entry often accepts several translations (`;` synonyms, other senses).
    accepted = ding.accepted_references(
        test_pairs, ding.accepted_translations(ding_path or ding.DEFAULT_CORPUS_PATH)
    )
    sentence_set = set(sentences)
    phrases = [i for i in range(len(test_pairs)) if i not in sentence_set]
    metrics["test_all_references"] = score_multi(hypotheses, accepted)
    if phrases:
        metrics["test_phrases_all_references"] = score_multi(
            [hypotheses[i] for i in phrases], [accepted[i] for i in phrases]
        )
    return sentences


def _sample_indices(count, sentences, per_kind=4):
    """Indices of the printed samples: the first few phrase pairs, then full sentences."""
    sentence_set = set(sentences)
    phrases = [i for i in range(count) if i not in sentence_set]
    return phrases[: per_kind if sentences else 2 * per_kind] + list(sentences[:per_kind])


def export(work, run_info, wall_start):
    """SavedModel, ONNX and (where installed) CTranslate2 exports of the finished run
    (`export.export_after_training`); the export time goes into run.json."""
    from keras_transformer.export import export_after_training

    if not (importable("tensorflow") and importable("tensorflow_text")):
        logger.warning(
            "No export: the SavedModel and ONNX exporters trace the model with TensorFlow "
            "and TensorFlow Text, which are not installed here. On a machine that has them: "
            "python -m keras_transformer.export --work-dir %s", work.path,
        )  # fmt: skip
        return
    export_start = time.time()
    export_after_training(work.path, run_info)
    run_info["timing"]["export_seconds"] = time.time() - export_start
    run_info["metrics"]["wall_seconds"] = time.time() - wall_start
    work.write_run_record(run_info)


def load_trained(work_dir):
    """`(model, tokenizer, run_info)` from a work directory written by `run()`
    (`keras_transformer.workdir.load`)."""
    return workdir.load(work_dir)
