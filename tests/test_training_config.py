"""TrainingConfig: None is the preset's default, a value given is kept (0 included);
the paper's recipe as one call for a user's own `model.fit`."""

import dataclasses
import re

import keras
import numpy as np
import pytest

from keras_transformer import Transformer, compile_with_paper_recipe
from keras_transformer.config import get_preset
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.schedules import TransformerSchedule
from keras_transformer.training.options import TrainingConfig
from keras_transformer.training.presets import COMMON_DEFAULTS, DROPOUT_RAMP, TRAINING_DEFAULTS


@pytest.mark.parametrize("preset", sorted(TRAINING_DEFAULTS))
def test_none_takes_the_presets_default(preset):
    resolved = TrainingConfig(preset=preset).resolved()
    expected = {**COMMON_DEFAULTS, **TRAINING_DEFAULTS[preset]}
    for name, value in expected.items():
        assert getattr(resolved, name) == value, name
    assert resolved.dtype_policy is None  # the machine decides it when the run starts


def test_no_preset_is_cpu_or_the_one_given_to_resolved():
    assert TrainingConfig().resolved().preset == "cpu"
    assert TrainingConfig().resolved(preset="tiny") == TrainingConfig(preset="tiny").resolved()
    assert TrainingConfig(preset="small").resolved(preset="tiny").preset == "small"


def test_zero_means_zero_not_the_default():
    config = TrainingConfig(
        preset="small", dropout=0.0, validation_bleu_every=0, max_train_minutes=0.0,
        test_samples=0, validation_bleu_samples=0,
    ).resolved()  # fmt: skip
    assert config.dropout == 0.0
    assert config.validation_bleu_every == 0
    assert config.max_train_minutes == 0.0
    assert config.test_samples == 0
    assert config.validation_bleu_samples == 0


def test_given_values_survive_resolution_and_config_is_a_value():
    config = TrainingConfig(preset="cpu", epochs=3, max_train_minutes=60.0).resolved()
    assert (config.epochs, config.steps, config.max_train_minutes) == (3, 200, 60.0)
    assert dataclasses.replace(config, seed=7).seed == 7 and config.seed == 1234


@pytest.mark.parametrize(
    "field, value",
    [("epochs", 0), ("steps", -1), ("batch_tokens", 0), ("warmup_steps", 0),
     ("learning_rate_scale", 0.0), ("max_train_minutes", -1.0), ("average_last", 0),
     ("test_samples", -1), ("dtype_policy", "float16"), ("preset", "huge"), ("cooldown", 1.5),
     ("cooldown", -0.1), ("sentence_repeats", 0), ("alpha", -1.0), ("beam_size", 0)],
)  # fmt: skip
def test_bad_values_are_named(field, value):
    with pytest.raises(ValueError, match=field):
        TrainingConfig(**{field: value})


@pytest.mark.multibackend
def test_compile_with_paper_recipe_for_a_users_own_fit():
    model = Transformer.from_preset("tiny", vocab_size=40, dropout=0.0)
    assert compile_with_paper_recipe(model, warmup_steps=100, learning_rate_scale=0.5) is model
    optimizer = model.optimizer
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    schedule = optimizer._learning_rate
    assert isinstance(schedule, TransformerSchedule)
    assert schedule.get_config() == {
        "d_model": 64,
        "warmup_steps": 100,
        "scale": 0.5,
        "batches_per_update": 1,
    }
    assert isinstance(model.loss, LabelSmoothedCrossEntropy)
    assert (model.loss.label_smoothing, model.loss.pad_id) == (0.1, 0)
    # The user's own fit: ({"source_ids", "target_ids"}, labels) batches, padding 0.
    rng = np.random.default_rng(0)
    source = rng.integers(4, 40, (16, 6)).astype("int32")
    source[:, -1] = 3
    target_in = np.concatenate([np.full((16, 1), 2, "int32"), source[:, :-1]], axis=1)
    history = model.fit(
        {"source_ids": source, "target_ids": target_in}, source, batch_size=8, epochs=3,
        verbose=0,
    )  # fmt: skip
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert any(isinstance(m, MaskedAccuracy) for m in _metrics(model))
    assert "accuracy" in history.history
    # The learning rate followed the schedule: 6 updates, so step 7 (counted from 1), in warm-up.
    expected = 0.5 * 64**-0.5 * 7 * 100**-1.5
    np.testing.assert_allclose(float(optimizer.learning_rate), expected, rtol=1e-5)


def _metrics(model):
    found = []
    for metric in model.metrics:
        found.append(metric)
        found.extend(getattr(metric, "metrics", []))
    return found


@pytest.mark.parametrize(
    "preset, passes, given, expected",
    [
        ("cpu", DROPOUT_RAMP[0], None, 0.0),  # the ramp's start: the preset's own 0
        ("cpu", DROPOUT_RAMP[0] + 0.1, None, 0.0),  # 0.0025, rounded to the preset's 0
        ("cpu", DROPOUT_RAMP[0] + 0.3, None, 0.01),  # the first step up: 0.0075
        ("cpu", 7.1, None, 0.03),  # the 30k-pair sample's FFN 1024 trials on one core
        ("cpu", 8.0, None, 0.05),  # the ramp's middle (the step of 2026-11-28)
        ("cpu", 8.1, None, 0.05),  # FFN 512 there
        ("cpu", DROPOUT_RAMP[1] - 0.3, None, 0.09),  # 0.0925
        ("cpu", DROPOUT_RAMP[1], None, 0.1),  # the ramp's end
        ("cpu", 22.6, None, 0.1),  # Ding's full sentences in the default run's budget
        ("cpu", 22.6, 0.0, 0.0),  # --dropout 0 wins over the pick
        ("cpu", 1.9, 0.3, 0.3),  # and over the preset's
        ("small", 1.0, None, 0.1),  # the preset's own, whatever the passes
        ("small", 50.0, None, 0.1),
    ],
)
def test_the_passes_pick_dropout_unless_the_command_line_does(preset, passes, given, expected):
    from keras_transformer.training.presets import corpus_picks, model_config

    config = TrainingConfig(preset=preset, dropout=given).resolved()
    picked = corpus_picks(config, passes)
    made = dataclasses.replace(model_config(config), **picked)
    assert made.dropout == expected
    # What the passes picked (and the log says), never a value the command line replaced.
    assert bool(picked) == (given is None and expected != get_preset(preset).dropout)
    assert corpus_picks(config, passes, finished=object()) == {}  # --init-from keeps its model


def test_the_passes_settle_on_the_measured_step_are_logged_and_kept(caplog, tmp_path):
    import logging

    from keras_transformer.training import budget
    from keras_transformer.training.presets import model_config

    config = TrainingConfig(preset="cpu").resolved()

    def settled(batches_per_pass, work, seconds=None, cfg=config):
        """`(dropout guessed, dropout settled)` of a run in `tmp_path / work`."""
        caplog.clear()
        path = tmp_path / work
        path.mkdir(exist_ok=True)
        preset = model_config(cfg)  # what `prepare_inputs` starts from
        guess = budget.guess(cfg, preset, batches_per_pass, None, str(path))
        with caplog.at_level(logging.INFO, logger="keras_transformer.training.budget"):
            made, changed = budget.settle(cfg, guess, batches_per_pass, None, str(path), seconds)
        assert changed == (made != guess)
        assert made == dataclasses.replace(preset, dropout=made.dropout)
        return guess.dropout, made.dropout

    assert settled(278, "sentences") == (0.1, 0.1)  # Ding's full sentences: 22.6 passes
    assert "about 22.6 passes" in caplog.text and "278 batches each" in caplog.text
    assert "0.21 s a step (the cpu preset's on 2 cores)" in caplog.text
    # 22 minutes at 0.21 s a step are 6,286 steps: 628 batches a pass make 10.01 passes (the
    # ramp's end), 785 make 8.007 (its middle), 1,048 make 5.998 (under its start).
    assert settled(628, "end") == (0.1, 0.1)
    assert settled(785, "middle") == (0.05, 0.05)
    assert "about 8.0 passes" in caplog.text and "{'dropout': 0.05}" in caplog.text
    assert settled(1_048, "start") == (0.0, 0.0)
    assert settled(2_576, "ding", 0.103) == (0.0, 0.0)  # Ding's pairs on a Zen 5: 5.0
    assert not caplog.text  # nothing picked, nothing said
    # The 100k-pair sample on one core in float32 (0.54 s a step): the guess's 9.2 passes
    # are 3.6, so the model is built again without dropout.
    assert settled(680, "sample", 0.54) == (0.08, 0.0)
    assert "about 3.6 passes" in caplog.text and "0.540 s a step measured" in caplog.text
    assert "the preset's own (about 6 passes or fewer; the model built again)" in caplog.text
    assert budget.needs_timing(config, None, str(tmp_path / "new"))
    # A run that resumes or continues the work directory keeps the first run's pick,
    # though a larger budget buys more passes; the command line still overrides it.
    assert not budget.needs_timing(config, None, str(tmp_path / "sample"))
    longer = dataclasses.replace(config, max_train_minutes=120.0)  # 19.6 passes
    assert settled(680, "sample", 0.54, longer) == (0.0, 0.0)
    assert settled(785, "middle", None, longer) == (0.05, 0.05)
    assert "as when the run in this work directory began" in caplog.text
    assert settled(785, "middle", None, dataclasses.replace(config, dropout=0.2)) == (0.2, 0.2)
    # Nothing to time where the rule picks nothing: another preset, --dropout given.
    assert not budget.needs_timing(TrainingConfig(preset="small").resolved(), None, "new")
    assert not budget.needs_timing(dataclasses.replace(config, dropout=0.0), None, "new")


def test_a_run_settles_the_pick_on_its_measured_step_and_records_it(tmp_path):
    """Through `training.run`: the guess at 0.21 s a step buys a 6-second budget about 3
    passes (no dropout), the tiny model's measured step many more, so the model trained
    has dropout 0.1."""
    import json

    from translation_fixtures import write_parallel_folder

    from keras_transformer import training
    from keras_transformer.training.budget import PICKS_FILE

    folder = write_parallel_folder(tmp_path / "numbers", sizes=(300, 20, 20))
    info = training.run(
        preset="cpu", data_dir=str(folder), work_dir=str(tmp_path / "work"), vocab_size=64,
        batch_tokens=512, d_model=32, num_heads=2, d_ff=64, encoder_layers=1,
        decoder_layers=1, max_train_minutes=0.1, test_samples=2, beam_size=1,
        export=False, dtype_policy="float32", jit_compile=False, workers=1,
    )  # fmt: skip
    batches = info["training"]["batches_per_pass"]
    assert 6 / 0.21 / batches < DROPOUT_RAMP[0]  # the guess: no dropout
    record = json.loads((tmp_path / "work" / PICKS_FILE).read_text())
    assert record["passes"] >= DROPOUT_RAMP[1] and record["picked"] == {"dropout": 0.1}
    assert info["config"]["dropout"] == 0.1


@pytest.mark.parametrize(
    "budget, batches_per_pass, expected",
    [
        # The default run: 22 minutes at 0.21 s a step, 6,286 steps.
        (dict(), 278, 22.6),  # Ding's full sentences as one's own corpus
        (dict(), 2_576, 2.44),  # Ding's 377k pairs
        (dict(), 785, 8.0),  # the dropout ramp's middle
        (dict(epochs=2, steps=100), 20, 10.0),  # the steps end before the minutes
        (dict(max_train_minutes=0), 1, 1.0),  # 0 minutes: one step
        (dict(preset="small"), 400, 10.0),  # no time budget: epochs x steps
    ],
)
def test_the_passes_a_budget_buys(budget, batches_per_pass, expected):
    from keras_transformer.training.presets import budget_passes

    config = TrainingConfig(**{"preset": "cpu", **budget}).resolved()
    assert budget_passes(config, batches_per_pass) == pytest.approx(expected, abs=0.05)


def _parser():
    import argparse

    from keras_transformer.training.flags import add_arguments

    return add_arguments(argparse.ArgumentParser())


def test_every_option_is_a_flag_whose_unset_value_is_the_configs_default():
    args = vars(_parser().parse_args([]))
    assert set(args) == {field.name for field in dataclasses.fields(TrainingConfig)}
    assert TrainingConfig(**args) == TrainingConfig()


def test_flags_parse_to_the_fields_types_and_booleans():
    parse = _parser().parse_args
    args = parse(["--max-train-minutes", "1.5", "--epochs", "3", "--dtype-policy", "float32",
                  "--no-pack", "--no-test", "--no-export", "--overwrite", "--jit-compile",
                  "--stopping", "bound", "--init-from", "w"])  # fmt: skip
    config = TrainingConfig(**vars(args))
    assert (config.max_train_minutes, config.epochs, config.dtype_policy) == (1.5, 3, "float32")
    assert (config.pack, config.test, config.export, config.overwrite) == (False,) * 3 + (True,)
    assert (config.jit_compile, config.stopping, config.init_from) == (True, "bound", "w")
    assert parse(["--no-jit-compile"]).jit_compile is False
    assert parse([]).jit_compile is None  # unset: calibration decides
    with pytest.raises(SystemExit):
        parse(["--dtype-policy", "float16"])  # not one of the choices


@pytest.mark.parametrize("field", ["batch_tokens", "max_train_minutes", "alpha", "average_last"])
def test_the_help_states_each_presets_default_from_the_tables(field):
    """The help is made from `TRAINING_DEFAULTS`, so it says what `resolved()` does."""
    action = next(a for a in _parser()._actions if a.dest == field)
    for preset in TRAINING_DEFAULTS:
        value = getattr(TrainingConfig(preset=preset).resolved(), field)
        shown = "none" if value is None else str(value)
        assert re.search(rf"[ /]{preset}\b[^;)]*? {re.escape(shown)}[;)]", action.help), (
            preset,
            action.help,
        )
