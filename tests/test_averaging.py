"""Checkpoint averaging: the mean of the files, epoch order, the command, bad files."""

import dataclasses
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_transformer import averaging
from keras_transformer.averaging import average_checkpoints, checkpoint_paths
from keras_transformer.config import get_preset
from keras_transformer.model import Transformer


def _tiny(dtype=None, **overrides):
    config = get_preset("tiny", **overrides)
    model = Transformer(**dataclasses.asdict(config), dtype=dtype)
    ids = np.array([[5, 6, config.eos_id]], dtype="int32")
    model({"source_ids": ids, "target_ids": ids}, training=False)  # builds it, as training does
    return model


@pytest.fixture(scope="module")
def tiny():
    """One built tiny `Transformer` for the module; each test sets its weights."""
    return _tiny()


def _random_weights(model, rng):
    return [rng.normal(size=w.shape).astype("float32") for w in model.weights]


def _write_checkpoints(model, work_dir, epochs, rng):
    """Saves one random set of weights per epoch; returns them, by epoch."""
    os.makedirs(work_dir / "checkpoints", exist_ok=True)
    saved = {}
    for epoch in epochs:
        saved[epoch] = _random_weights(model, rng)
        model.set_weights(saved[epoch])
        model.save_weights(str(work_dir / "checkpoints" / f"epoch_{epoch:03d}.weights.h5"))
    return saved


def _mean(*checkpoints):
    """The float64 mean of lists of weights, weight by weight."""
    return [
        np.mean(np.stack(values).astype("float64"), axis=0)
        for values in zip(*checkpoints, strict=True)
    ]


def _assert_weights(model, expected, atol):
    assert len(model.weights) == len(expected)
    for weight, value in zip(model.weights, expected, strict=True):
        actual = keras.ops.convert_to_numpy(weight)
        np.testing.assert_allclose(actual, value, rtol=0, atol=atol, err_msg=weight.path)


def test_average_of_last_two_checkpoints_is_their_mean(tmp_path, tiny):
    model = tiny
    saved = _write_checkpoints(model, tmp_path, epochs=(1, 2, 3), rng=np.random.default_rng(0))
    paths = checkpoint_paths(tmp_path, last=2)
    assert [os.path.basename(p) for p in paths] == ["epoch_002.weights.h5", "epoch_003.weights.h5"]

    assert average_checkpoints(model, paths) is model
    _assert_weights(model, _mean(saved[2], saved[3]), atol=1e-6)
    # Not vacuous: the mean is far from the last checkpoint, which the model held.
    assert np.abs(keras.ops.convert_to_numpy(model.weights[0]) - saved[3][0]).max() > 0.1

    average_checkpoints(model, checkpoint_paths(tmp_path, last=1))
    _assert_weights(model, saved[3], atol=0)  # one checkpoint: exactly itself
    average_checkpoints(model, [paths[0]])
    _assert_weights(model, saved[2], atol=0)


def test_mixed_precision_checkpoints_average_into_a_float32_model(tmp_path):
    # Training under mixed_bfloat16 checkpoints its float32 variables; the saved
    # model is a plain float32 Transformer.
    mixed = _tiny(dtype="mixed_bfloat16")
    saved = _write_checkpoints(mixed, tmp_path, epochs=(1, 2), rng=np.random.default_rng(1))
    model = average_checkpoints(_tiny(), checkpoint_paths(tmp_path))
    assert {w.dtype for w in model.weights} == {"float32"}
    _assert_weights(model, _mean(saved[1], saved[2]), atol=1e-6)


class _Counter(keras.layers.Layer):
    """A float kernel and an integer step counter, both saved in the weights file."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(3,), initializer="zeros")
        self.step = self.add_weight(shape=(), dtype="int32", initializer="zeros", trainable=False)

    def call(self, x):
        return x * self.kernel


def test_integer_weights_take_the_last_checkpoint(tmp_path):
    model = keras.Sequential([keras.Input((3,)), _Counter()])
    layer = model.layers[0]
    paths = []
    for i, (kernel, step) in enumerate([([1.0, 2.0, 3.0], 10), ([3.0, 4.0, 8.0], 25)]):
        layer.kernel.assign(np.array(kernel, "float32"))
        layer.step.assign(step)
        paths.append(str(tmp_path / f"{i}.weights.h5"))
        model.save_weights(paths[-1])
    average_checkpoints(model, paths)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.kernel), [2.0, 3.0, 5.5])
    assert int(keras.ops.convert_to_numpy(layer.step)) == 25
    assert layer.step.dtype == "int32"


def test_checkpoint_paths_sorts_by_epoch_number_and_counts_what_exists(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    for name in ("epoch_100.weights.h5", "epoch_002.weights.h5", "epoch_010.weights.h5"):
        (directory / name).write_bytes(b"")
    (directory / "notes.txt").write_text("not a checkpoint")
    (directory / "epoch_004.weights.h5.tmp").write_bytes(b"")

    names = [os.path.basename(p) for p in checkpoint_paths(tmp_path)]
    assert names == ["epoch_002.weights.h5", "epoch_010.weights.h5", "epoch_100.weights.h5"]
    assert checkpoint_paths(str(tmp_path), last=2) == [
        os.path.join(str(directory), "epoch_010.weights.h5"),
        os.path.join(str(directory), "epoch_100.weights.h5"),
    ]
    assert len(checkpoint_paths(tmp_path, last=3)) == 3

    with pytest.raises(ValueError, match=r"last 4 checkpoints.*holds only 3") as error:
        checkpoint_paths(tmp_path, last=4)
    assert str(directory) in str(error.value)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=rf"last={bad!r}"):
            checkpoint_paths(tmp_path, last=bad)


def test_checkpoint_paths_errors_name_the_directory_and_what_it_holds(tmp_path):
    with pytest.raises(FileNotFoundError, match="No checkpoint directory") as error:
        checkpoint_paths(tmp_path)
    assert str(tmp_path / "checkpoints") in str(error.value)

    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="holds 0 other entries"):
        checkpoint_paths(tmp_path)
    (tmp_path / "checkpoints" / "model.weights.h5").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"1 other entries: model\.weights\.h5"):
        checkpoint_paths(tmp_path, last=1)


@pytest.mark.parametrize(
    "overrides",
    [dict(d_model=32), dict(num_layers=3), dict(vocab_size=500)],
    ids=["narrower", "deeper", "other_vocab"],
)
def test_a_weights_file_of_another_model_is_named_in_the_error(tmp_path, tiny, overrides):
    model = tiny
    good = str(tmp_path / "good.weights.h5")
    model.save_weights(good)
    bad = str(tmp_path / "other.weights.h5")
    _tiny(**overrides).save_weights(bad)  # a deeper model's file would load silently
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]

    with pytest.raises(ValueError, match="does not match the model") as error:
        average_checkpoints(model, [good, bad])
    assert bad in str(error.value)
    _assert_weights(model, before, atol=0)  # layouts are checked before anything loads

    with pytest.raises(FileNotFoundError, match="missing.weights.h5"):
        average_checkpoints(model, [good, str(tmp_path / "missing.weights.h5")])
    (tmp_path / "junk.weights.h5").write_text("not hdf5")
    with pytest.raises(ValueError, match="junk.weights.h5.*not a Keras weights file"):
        average_checkpoints(model, [str(tmp_path / "junk.weights.h5")])
    with pytest.raises(ValueError, match="No weights files"):
        average_checkpoints(model, [])


def test_command_writes_the_averaged_model_and_keeps_the_last_one(tmp_path, tiny, capsys):
    work = tmp_path / "work"
    work.mkdir()
    rng = np.random.default_rng(2)
    model = tiny
    saved = _write_checkpoints(model, work, epochs=(8, 9, 10), rng=rng)
    trained = _random_weights(model, rng)
    model.set_weights(trained)
    model.save(str(work / "model.keras"))

    averaging.main(["--work-dir", str(work), "--last", "2"])
    line = capsys.readouterr().out.strip()
    assert line.count("\n") == 0
    assert "2 checkpoints (epoch_009, epoch_010)" in line
    assert str(work / "model.keras") in line and str(work / "model.last.keras") in line

    mean = _mean(saved[9], saved[10])
    averaged = keras.saving.load_model(str(work / "model.keras"), compile=False)
    assert type(averaged) is Transformer
    _assert_weights(averaged, mean, atol=1e-6)
    unaveraged = keras.saving.load_model(str(work / "model.last.keras"), compile=False)
    _assert_weights(unaveraged, trained, atol=0)
    assert [p.name for p in work.iterdir() if p.name.startswith(".tmp")] == []

    # --output writes elsewhere and leaves the work dir alone.
    averaged_bytes = (work / "model.keras").read_bytes()
    unaveraged_bytes = (work / "model.last.keras").read_bytes()
    averaging.main(["--work-dir", str(work), "--last", "3", "--output", str(tmp_path / "a.keras")])
    assert str(tmp_path / "a.keras") in capsys.readouterr().out
    mean3 = _mean(saved[8], saved[9], saved[10])
    _assert_weights(keras.saving.load_model(str(tmp_path / "a.keras")), mean3, atol=1e-6)
    assert (work / "model.keras").read_bytes() == averaged_bytes
    # A second run over model.keras keeps the first unaveraged model.
    averaging.main(["--work-dir", str(work), "--last", "1"])
    assert (work / "model.last.keras").read_bytes() == unaveraged_bytes
    assert (work / "model.keras").read_bytes() != averaged_bytes


def test_command_rejects_bad_arguments_before_loading(tmp_path, capsys):
    with pytest.raises(SystemExit):
        averaging.main(["--work-dir", str(tmp_path), "--last", "0"])
    assert "--last 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        averaging.main(["--work-dir", str(tmp_path), "--output", "model.h5"])
    assert "--output model.h5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # a mistake: one line, exit 2
        averaging.main(["--work-dir", str(tmp_path)])
    assert exit_info.value.code == 2 and "model.keras" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="model.keras"):
        averaging.main(["--work-dir", str(tmp_path), "--debug"])


def test_module_imports_no_keras_or_tensorflow_at_top_level():
    # `--help` must not wait for TensorFlow: Keras is imported inside functions,
    # and the package `__init__` and `workdir` import only the standard library.
    code = (
        "import sys, keras_transformer.averaging; "
        "print(sorted({'keras', 'tensorflow', 'keras_hub', 'h5py'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )  # fmt: skip
    assert result.stdout.strip() == "[]"
