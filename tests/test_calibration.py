"""The calibration that picks precision and XLA by timing them (keras_transformer.calibration)."""

import json
import math
import os
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from translation_fixtures import write_parallel_folder

from keras_transformer import Transformer, calibration
from keras_transformer.calibration import Candidate, Measurement
from keras_transformer.recipe import paper_loss

F32, F32_XLA, BF16 = (
    Candidate("float32", False),
    Candidate("float32", True),
    Candidate("mixed_bfloat16", False),
)


def _timed_fit(delay_seconds):
    """A measure of real training steps of a small Keras model, each made
    `delay_seconds` slower by a callback."""

    class Delay(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(delay_seconds)

    keras.utils.set_random_seed(0)  # the same initial weights, so the same first loss
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile("sgd", "mse")
    x, y = np.ones((16, 8), "float32"), np.zeros((16, 4), "float32")
    loss = float(keras.ops.mean((model(x) - y) ** 2))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # the trace, untimed
    start = time.perf_counter()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[Delay()])
    return Measurement((time.perf_counter() - start) / 4, loss)


@pytest.mark.parametrize("slow", [F32, F32_XLA])
def test_the_faster_candidate_is_chosen(slow):
    result = calibration.choose([F32, F32_XLA], lambda c: _timed_fit(0.05 if c == slow else 0.0))
    assert result.choice == (F32_XLA if slow == F32 else F32)
    assert result.measurements[slow.name].seconds_per_step > 0.04
    assert not result.rejected and not result.cached and result.seconds > 0


def test_a_candidate_whose_loss_diverges_is_not_chosen():
    losses = {F32.name: 4.0, F32_XLA.name: 4.0 * (1 + 2 * calibration.LOSS_TOLERANCE),
              BF16.name: math.nan}  # fmt: skip
    speed = {F32.name: 0.3, F32_XLA.name: 0.1, BF16.name: 0.05}
    result = calibration.choose(
        [F32, F32_XLA, BF16], lambda c: Measurement(speed[c.name], losses[c.name])
    )
    assert result.choice == F32
    assert set(result.rejected) == {F32_XLA.name, BF16.name}
    assert "(loss diverged)" in result.summary()
    # Within the tolerance the faster one wins.
    losses[F32_XLA.name] = 4.0 * (1 + calibration.LOSS_TOLERANCE / 2)
    assert (
        calibration.choose(
            [F32, F32_XLA], lambda c: Measurement(speed[c.name], losses[c.name])
        ).choice
        == F32_XLA
    )  # noqa: E501


def test_mixed_bfloat16_loss_is_within_the_tolerance_of_float32():
    """What `LOSS_TOLERANCE` must let through: a bf16 model's first-batch loss."""
    ids = np.random.default_rng(0).integers(4, 1000, (8, 20)).astype("int32")
    features = {"source_ids": ids, "target_ids": ids}
    losses = []
    for dtype in ("float32", "mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        model = Transformer.from_preset("tiny", dropout=0.0, dtype=dtype)
        model.build()
        losses.append(float(paper_loss(0)(ids, model(features, training=False))))
    assert abs(losses[1] - losses[0]) < calibration.LOSS_TOLERANCE / 2 * losses[0]


def test_the_choice_is_cached_per_key(tmp_path):
    path = str(tmp_path / "cache" / "calibration.json")
    result = calibration.choose(
        [F32, F32_XLA], lambda c: Measurement(0.2 if c.jit_compile else 0.3, 4.0)
    )
    key = calibration.machine_key(cpu="test", model={"d_model": 8})
    calibration.write_cache(key, result, path)
    cached = calibration.read_cache(key, path)
    assert cached.cached and cached.seconds == 0 and cached.choice == F32_XLA
    assert cached.measurements == result.measurements
    assert (
        calibration.read_cache(calibration.machine_key(cpu="test", model={"d_model": 16}), path)
        is None
    )  # noqa: E501
    (tmp_path / "cache" / "calibration.json").write_text("not json")
    assert calibration.read_cache(key, path) is None


def test_candidates_follow_the_machine_and_the_overrides():
    zen3, xeon = {"bf16": False}, {"bf16": True}
    assert calibration.candidates("tensorflow", zen3) == [F32, F32_XLA]
    assert calibration.candidates("tensorflow", xeon) == [
        F32, F32_XLA, BF16, Candidate("mixed_bfloat16", True)
    ]  # fmt: skip
    assert calibration.candidates("tensorflow", xeon, multi_device=True) == [F32, BF16]
    assert calibration.candidates("tensorflow", zen3, pack=False) == [F32]
    assert calibration.candidates("jax", zen3) == [F32_XLA]
    assert calibration.candidates("torch", xeon) == [F32, BF16]
    assert [c.dtype_policy for c in calibration.candidates("jax", zen3, has_gpu=True)] == [
        "float32", "mixed_bfloat16", "mixed_float16"
    ]  # fmt: skip
    # --dtype-policy and --jit-compile fix their axis; both leave one candidate.
    assert calibration.candidates("tensorflow", xeon, dtype_policy="float32") == [F32, F32_XLA]
    assert calibration.candidates("tensorflow", xeon, jit_compile=False) == [F32, BF16]
    assert calibration.candidates(
        "tensorflow", xeon, dtype_policy="mixed_bfloat16", jit_compile=True
    ) == [Candidate("mixed_bfloat16", True)]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_train_py_calibrates_once_per_machine_and_honours_the_overrides(tmp_path):
    corpus = write_parallel_folder(tmp_path / "numbers", sizes=(400, 20, 20))
    env = dict(
        os.environ, KERAS_BACKEND="tensorflow", KERAS_TRANSFORMER_CACHE=str(tmp_path / "cache")
    )  # noqa: E501

    def train(work_dir, *extra):
        command = [
            sys.executable, os.path.join(ROOT, "train.py"), "--preset", "tiny", "--vocab-size",
            "64", "--batch-tokens", "256", "--epochs", "1", "--steps", "10", "--no-test",
            "--no-export", "--validation-bleu-every", "0", "--data-dir", str(corpus),
            "--work-dir", str(tmp_path / work_dir), *extra,
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        info = json.loads((tmp_path / work_dir / "run.json").read_text())
        return info["training"], result.stderr

    from keras_transformer.hardware import describe_cpu

    # This machine's candidates: with native bf16 (AMX or AVX512-BF16) mixed_bfloat16 too.
    expected = {"float32", "float32 + XLA"}
    if describe_cpu()["bf16"]:
        expected |= {"mixed_bfloat16", "mixed_bfloat16 + XLA"}
    first, log = train("first")
    measured = first["calibration"]
    assert not measured["cached"] and set(measured["ms_per_step"]) == expected
    ms = measured["ms_per_step"]
    chosen = first["dtype_policy"] + (" + XLA" if first["jit_compile"] else "")
    # The fastest whose loss stays with float32's: never slower than a float32 candidate.
    assert chosen in expected and ms[chosen] <= min(ms["float32"], ms["float32 + XLA"])
    assert "Calibration: " in log and "(measured in" in log
    second, log = train("second")
    assert second["calibration"]["cached"] and "(cached)" in log
    assert (second["dtype_policy"], second["jit_compile"]) == (
        first["dtype_policy"],
        first["jit_compile"],
    )  # noqa: E501
    fixed, log = train("fixed", "--dtype-policy", "float32", "--no-jit-compile")
    assert fixed["calibration"] is None and "Calibration" not in log
    assert (fixed["dtype_policy"], fixed["jit_compile"]) == ("float32", False)
