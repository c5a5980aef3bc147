"""Training: `run()` is what `python train.py` calls. Its rooms, in the order a run uses them:

    options.py    TrainingConfig: every option once (type, default, help)
    checks.py     its values checked, a function per group of options
    flags.py      train.py's flags, made from TrainingConfig's fields
    presets.py    what an option left unset means per preset; the corpus's defaults by passes
    machine.py    the hardware and the distribution, set up once and frozen
    lifecycle.py  new, resumed, continued or --init-from; the work directory; the budget
    inputs.py     corpus, model config, vocabulary and batches, made once per work directory
    tokens.py     the vocabulary and the tokenized training pairs (BPE-dropout's copies too)
    budget.py     the corpus's defaults guessed, then settled on the measured step
    runner.py     `run()`: the stages as one sequence; the model built and compiled,
                  and `model.fit` with the run's callbacks and time budget
    finishing.py  float32 copy, checkpoint averaging, test decode, exports

and beside them, shared with other commands: `calibration` (precision and XLA
by timing), `callbacks` (`fit`'s callbacks and their order), `averaging`,
`evaluation`, `run_record` (run.json) and `workdir` (the folder's layout).

The names below load on first use (PEP 562), so that `options` is read
without Keras or TensorFlow (train.py parses its flags before either loads).
"""

import importlib

_EXPORTS = {
    "run": "runner",
    "load_trained": "runner",
    "TrainingConfig": "options",
    "TRAINING_DEFAULTS": "presets",
    "COMMON_DEFAULTS": "presets",
    "DTYPE_POLICIES": "options",
    "corpus_defaults": "presets",
    "Machine": "machine",
    "set_up_machine": "machine",
    "FinishedRun": "lifecycle",
    "RunProgress": "lifecycle",
    "run_progress": "lifecycle",
    "finished_run": "lifecycle",
    "Inputs": "inputs",
    "prepare_inputs": "inputs",
    "Fitted": "runner",
    "build_model": "runner",
    "fit": "runner",
    "export": "finishing",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
