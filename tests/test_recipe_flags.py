"""The flags a recipe study sets (issue 54): the model's shape, its length limit, label
smoothing, the vocabulary's sample, BPE-dropout and late dropout. Each reaches the run (run.json,
the model, the loss, the vocabulary's training) and a bad value is one line, exit 2,
before TensorFlow loads."""

import os
import re
import subprocess
import sys

import pytest
from translation_fixtures import write_parallel_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDE_TENSORFLOW = os.path.join(ROOT, "tests", "without_tensorflow")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--encoder-layers", "0"], "encoder_layers must be a positive integer"),
        (["--decoder-layers", "-1"], "decoder_layers must be a positive integer"),
        (["--d-model", "30"], "d_model=30 must be divisible by num_heads=4"),
        (["--num-heads", "3", "--preset", "tiny"], "d_model=64 must be divisible by num_heads=3"),
        (["--d-ff", "0"], "d_ff must be a positive integer"),
        (["--max-length", "0"], "max_length must be a positive integer"),
        (["--label-smoothing", "1"], r"label_smoothing must be in \[0, 1\)"),
        (["--vocab-sample-size", "0"], "vocab_sample_size must be a positive integer"),
        (["--bpe-dropout", "-0.1"], r"bpe_dropout must be in \[0, 1\)"),
        (["--bpe-dropout-copies", "0"], "bpe_dropout_copies must be a positive integer"),
        (["--dropout-start", "1"], r"dropout_start must be in \[0, 1\)"),
        (["--dropout-start", "0.5", "--accumulate-steps", "2"],
         "accumulate_steps > 1 with dropout_start is not supported yet"),
        (["--init-from", "w", "--d-model", "128"], "keeps its model's shape; leave out --d-model"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_line_before_tensorflow_loads(flags, message):
    """Run where TensorFlow cannot be imported: the error comes before anything needs it."""
    env = dict(os.environ, PYTHONPATH=HIDE_TENSORFLOW)
    result = subprocess.run(
        [sys.executable, "train.py", *flags], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: "), result.stderr
    assert re.search(message, lines[0]), lines[0]


@pytest.mark.slow
def test_every_recipe_flag_reaches_the_run(tmp_path, monkeypatch):
    from keras_transformer import training, workdir
    from keras_transformer.data import vocabulary
    from keras_transformer.training import runner

    corpus = write_parallel_folder(tmp_path / "numbers", sizes=(300, 20, 20))
    sample_sizes, smoothing = [], []
    train_vocabulary = vocabulary.train_vocabulary

    def recorded_vocabulary(pairs, path, vocab_size, max_sentences=300_000, **kwargs):
        sample_sizes.append(max_sentences)
        return train_vocabulary(pairs, path, vocab_size, max_sentences, **kwargs)

    def recorded_compile(model, **kwargs):
        smoothing.append(kwargs["label_smoothing"])
        return compile_with_paper_recipe(model, **kwargs)

    compile_with_paper_recipe = runner.compile_with_paper_recipe
    monkeypatch.setattr(vocabulary, "train_vocabulary", recorded_vocabulary)
    monkeypatch.setattr(runner, "compile_with_paper_recipe", recorded_compile)
    shape = dict(encoder_layers=3, decoder_layers=1, d_model=32, num_heads=2, d_ff=48,
                 max_length=40)  # fmt: skip
    options = dict(
        preset="tiny", data_dir=str(corpus), work_dir=str(tmp_path / "work"), vocab_size=64,
        batch_tokens=256, epochs=1, steps=6, validation_bleu_every=0, test_samples=4,
        beam_size=1, export=False, dtype_policy="float32", jit_compile=False, workers=1,
        label_smoothing=0.2, bpe_dropout=0.1, bpe_dropout_copies=2, dropout=0.1,
        dropout_start=0.5, **shape,
    )  # fmt: skip
    info = training.run(**options, vocab_sample_size=500)
    assert {name: info["config"][name] for name in shape} == shape
    model, _, _ = workdir.load(str(tmp_path / "work"))
    assert (len(model.encoder_layers), len(model.decoder_layers)) == (3, 1)
    assert (model.config.d_model, model.config.d_ff, model.config.max_length) == (32, 48, 40)
    recorded = info["training"]
    assert (recorded["label_smoothing"], recorded["vocab_sample_size"]) == (0.2, 500)
    assert (recorded["bpe_dropout"], recorded["bpe_dropout_copies"]) == (0.1, 2)
    # Late dropout: on at half of the 6 steps' budget (the epochs x steps of this run).
    assert (recorded["dropout_start"], recorded["dropout_on_step"]) == (0.5, 3)
    assert smoothing and set(smoothing) == {0.2}  # the compiled loss's
    assert sample_sizes == [500]  # the vocabulary trained on the first 500 lines
    copies = os.listdir(tmp_path / "work" / "data" / "train_sampled")
    assert {"0", "1"} <= set(copies)
    # The work directory's vocabulary was trained on that sample: another is refused.
    with pytest.raises(ValueError, match="vocab_sample_size 500 there, the default here"):
        training.run(**dict(options, epochs=2))


@pytest.mark.parametrize("field", ["encoder_layers", "decoder_layers", "d_model", "d_ff"])
def test_the_shape_flags_help_states_each_presets_model(field):
    """The help is made from the model presets, so it says what `model_config` builds; the
    option itself stays None (the preset's) through `resolved()`."""
    import argparse

    from keras_transformer.config import PRESETS, get_preset
    from keras_transformer.training.flags import MODEL_DEFAULTS, add_arguments
    from keras_transformer.training.options import TrainingConfig
    from keras_transformer.training.presets import model_config

    action = next(a for a in add_arguments(argparse.ArgumentParser())._actions if a.dest == field)
    for preset, config in PRESETS.items():
        value = getattr(config, MODEL_DEFAULTS[field])
        assert re.search(rf"[ /]{preset}\b[^;)]*? {value}[;)]", action.help), (preset, action.help)
        resolved = TrainingConfig(preset=preset).resolved()
        assert getattr(resolved, field) is None
        made = model_config(resolved)
        assert made == get_preset(preset)
