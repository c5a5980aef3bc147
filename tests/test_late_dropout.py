"""`schedules.LateDropout` (`--dropout-start`) on a small Transformer, on every backend
and compiled as `train.py` compiles it: no dropout until its share of the budget, then
the model's rates, in a step traced before it began (as the calibration's timing traces
it); attention dropout on throughout; a resumed run keeps its place in the budget."""

import keras
import numpy as np
import pytest

from keras_transformer.model import Transformer
from keras_transformer.recipe import compile_with_paper_recipe
from keras_transformer.schedules import LateDropout

pytestmark = pytest.mark.multibackend

STEPS = 4  # batches of one pass; the step budget of the tests
# `train.py`'s compiled step: XLA under TensorFlow, `jax.jit`; torch runs eagerly.
JIT = keras.backend.backend() != "torch"


def _batches():
    rng = np.random.default_rng(0)
    source = rng.integers(4, 60, size=(STEPS * 8, 7)).astype("int32")
    target = rng.integers(4, 60, size=(STEPS * 8, 6)).astype("int32")
    return {"source_ids": source, "target_ids": target[:, :-1]}, target[:, 1:]


def _model(dropout, weights=None, attention_dropout=0.0, traced=False, jit_compile=JIT):
    """A small Transformer from `weights`, compiled as `train.py` compiles it (where the
    test reads no weights, `jit_compile=False` saves a compilation); `traced`: its
    training step traced and run once first (its optimizer reset after), as the
    calibration's timing leaves `train.py`'s model."""
    keras.utils.set_random_seed(1)
    model = Transformer(
        vocab_size=64, num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=dropout,
        attention_dropout=attention_dropout,
    )  # fmt: skip
    ids = np.array([[5, 6, 3]], dtype="int32")
    model({"source_ids": ids, "target_ids": ids})
    compile_with_paper_recipe(model, warmup_steps=2, jit_compile=jit_compile)
    model.optimizer.build(model.trainable_variables)
    if traced:
        _fit(model, 1)  # traced at the rates the model was built with
        for variable in model.optimizer.variables:
            variable.assign(np.zeros(variable.shape, variable.dtype))  # step 0, no moments
    if weights is not None:  # a layer with dropout draws a seed: the same start for all
        model.set_weights(weights)
    return model


def _is_dropout(layer):
    return isinstance(layer, keras.layers.Dropout)


def _rates_of(model):
    return [layer.rate for layer in model._flatten_layers() if _is_dropout(layer)]


class _Steps(keras.callbacks.Callback):
    """At each step's start, after `LateDropout`'s: the dropout layers' rates, and the
    weights (under JAX `self.model` syncs them from the training state)."""

    def __init__(self):
        super().__init__()
        self.rates, self.weights = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(sorted(_rates_of(self.model)))
        self.weights.append(self.model.get_weights())


def _fit(model, steps, callbacks=()):
    x, y = _batches()
    x = {key: value[: steps * 8] for key, value in x.items()}
    model.fit(x, y[: steps * 8], batch_size=8, shuffle=False, verbose=0, callbacks=list(callbacks))


def _same(a, b):
    return all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


def test_no_dropout_until_the_share_then_the_models_rates():
    start = _model(0.0).get_weights()
    without, seen_without = _model(0.0, start), _Steps()
    _fit(without, STEPS, [seen_without])
    # Half of a 4-step budget, in a step traced before with dropout: the first 2 steps
    # are those of the model without dropout, bit for bit; the last 2 are not.
    late, seen = _model(0.3, start, traced=True), _Steps()
    built_with = _rates_of(late)
    late_dropout = LateDropout(0.5, total_steps=STEPS)
    _fit(late, STEPS, [late_dropout, seen])
    assert [max(rates) for rates in seen.rates] == [0.0, 0.0, 0.3, 0.3]
    assert late_dropout.on_step == 2
    assert _same(seen.weights[2], seen_without.weights[2])
    assert not _same(late.get_weights(), without.get_weights())
    # With dropout from the first step, the first 2 steps differ: the check can fail.
    always = _model(0.3, start)
    _fit(always, 2)
    assert not _same(always.get_weights(), seen_without.weights[2])
    # The model leaves `fit` with its own rates.
    assert _rates_of(late) == built_with and 0.3 in built_with

    # Attention dropout stays on: every step began with the others at 0 and it at 0.2.
    with_attention = _model(0.3, start, attention_dropout=0.2, jit_compile=False)
    seen = _Steps()
    late_dropout = LateDropout(0.5, total_steps=STEPS)
    _fit(with_attention, 2, [late_dropout, seen])
    assert [set(rates) for rates in seen.rates] == [{0.0, 0.2}] * 2, seen.rates
    assert late_dropout.on_step is None  # the budget's second half never came


def test_a_resumed_run_keeps_its_place_in_the_budget():
    # 40 of 60 seconds spent by the run's earlier processes: past a start at a half.
    model, seen = _model(0.3, jit_compile=False), _Steps()
    late_dropout = LateDropout(0.5, minutes=1.0, spent_seconds=40.0)
    _fit(model, 2, [late_dropout, seen])
    assert [max(rates) for rates in seen.rates] == [0.3, 0.3]
    assert late_dropout.on_step == 0  # on from this process's first step
    # The optimizer restored at step 1 of a 4-step budget (`BackupAndRestore`): off for
    # one step, on from step 2; at step 3, on from the first.
    for restored, expected, on_step in ((1, [0.0, 0.3], 2), (3, [0.3, 0.3], 3)):
        model, seen = _model(0.3, jit_compile=False), _Steps()
        model.optimizer.iterations.assign(restored)
        late_dropout = LateDropout(0.5, total_steps=STEPS)
        _fit(model, 2, [late_dropout, seen])
        assert [max(rates) for rates in seen.rates] == expected
        assert late_dropout.on_step == on_step


def test_late_dropout_refuses_a_share_outside_0_1_and_no_budget():
    for start in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match=r"start must be in \(0, 1\)"):
            LateDropout(start, total_steps=4)
    with pytest.raises(ValueError, match="needs a budget"):
        LateDropout(0.5)


def test_train_py_starts_it_on_one_clock_only():
    """Workers stepping together would each switch at their own clock: `train.py` refuses a
    time budget there and takes a step budget; with `--dropout 0` there is nothing to do."""
    import dataclasses
    from types import SimpleNamespace

    from keras_transformer.training import runner
    from keras_transformer.training.options import TrainingConfig

    config = TrainingConfig(preset="tiny", dropout_start=0.5, max_train_minutes=5.0).resolved()
    inputs = SimpleNamespace(model_config=SimpleNamespace(dropout=0.1, d_model=64))
    with pytest.raises(ValueError, match="needs a step budget"):
        runner._budget_schedules(config, inputs, None, 5.0, 0.0, several_workers=True)
    _, alone = runner._budget_schedules(config, inputs, None, 5.0, 30.0, several_workers=False)
    assert (alone.seconds, alone.spent_seconds, alone.start_share) == (300.0, 30.0, 0.5)
    steps = dataclasses.replace(config, max_train_minutes=None)
    _, late = runner._budget_schedules(steps, inputs, None, None, 0.0, several_workers=True)
    assert late.seconds is None and late.total_steps == config.epochs * config.steps
    inputs.model_config.dropout = 0.0
    assert runner._budget_schedules(steps, inputs, None, None, 0.0, False) == (None, None)
