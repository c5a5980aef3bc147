"""End-to-end training: 2-replica MirroredStrategy, kill and resume, multi-worker."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from ports import HeldPort
from translation_fixtures import write_parallel_folder

from keras_transformer import training, workdir
from keras_transformer.config import get_preset

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ARGS = [
    "--preset", "tiny", "--vocab-size", "64", "--batch-tokens", "256",
    "--validation-bleu-samples", "10", "--test-samples", "10", "--beam-size", "1", "--no-export",
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_parallel_folder(tmp_path_factory.mktemp("corpus") / "numbers", sizes=(400, 20, 20))


def _env(**extra):
    env = dict(
        os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow"
    )
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def test_tiny_run_on_two_replicas_lowers_loss_and_writes_work_dir(corpus, tmp_path):
    # A fresh process, as `python train.py` runs: TensorFlow's collective ops
    # key their instances per process, and other MirroredStrategy tests in
    # this one would collide with them. Mixed precision, as on an accelerator.
    work_dir = str(tmp_path / "work")
    command = [
        *_train_command(corpus, work_dir, epochs=3, steps=15),
        "--logical-devices", "2", "--warmup-steps", "30", "--beam-size", "2",
        "--dtype-policy", "mixed_bfloat16",
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(os.path.join(work_dir, "run.json"), encoding="utf-8") as f:
        info = json.load(f)
    assert info["training"]["num_replicas"] == 2
    assert info["training"]["dtype_policy"] == "mixed_bfloat16"
    assert info["metrics"]["beam_size"] == 2
    # A small corpus: `corpus_defaults` leaves `tiny` its own dropout (it raises only `cpu`'s).
    assert info["config"]["dropout"] == get_preset("tiny").dropout == 0.1
    losses = info["history"]["loss"]
    assert losses[-1] < losses[0]
    assert info["history"]["val_loss"][-1] < info["history"]["val_loss"][0]
    assert "val_bleu" in info["history"] and "learning_rate" in info["history"]
    for name in ("vocab.model", "model.keras", "run.json", "checkpoints", "logs"):
        assert os.path.exists(os.path.join(work_dir, name)), name
    assert info["metrics"]["test"]["segments"] == 10  # the --test-samples decoded and scored
    # The wall clock is accounted for, and averaging chose the lowest validation loss.
    timing = info["timing"]
    assert 0 < timing["train_steps_seconds"] <= timing["fit_seconds"]
    assert [point["step"] for point in info["curve"]] == [15, 30, 45]
    averaged = info["averaging"]["val_loss"]
    assert set(averaged) == {"1", "2", "3"}
    assert averaged[str(info["averaging"]["chosen"])] == min(averaged.values())
    model, tokenizer, run_info = training.load_trained(work_dir)
    assert run_info["config"] == info["config"]
    assert model.config.vocab_size == tokenizer.vocabulary_size() == 64
    assert model.dtype_policy.name == "float32"  # trained mixed, saved float32
    ids = np.array([[5, 6, 7, 3]], dtype="int32")
    assert model({"source_ids": ids, "target_ids": ids[:, :2]}).shape == (1, 2, 64)


def test_plain_float32_copy_of_a_mixed_precision_model():
    import keras

    from keras_transformer.model import Transformer
    from keras_transformer.training.finishing import plain_float32

    mixed = Transformer.from_preset("tiny", dtype="mixed_bfloat16")
    ids = np.array([[5, 6, 7, 3]], dtype="int32")
    inputs = {"source_ids": ids, "target_ids": ids[:, :3]}
    mixed_logits = keras.ops.convert_to_numpy(mixed(inputs))
    plain = plain_float32(mixed)
    assert plain is not mixed and plain.dtype_policy.name == "float32"
    assert plain.config == mixed.config
    assert plain.embedding.dtype_policy.name == "float32"
    for a, b in zip(plain.get_weights(), mixed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    # Same weights, float32 compute: close to the bfloat16 logits (8-bit mantissa).
    np.testing.assert_allclose(keras.ops.convert_to_numpy(plain(inputs)), mixed_logits, atol=0.1)
    assert plain_float32(plain) is plain


def _train_command(corpus, work_dir, epochs, steps):
    return [
        sys.executable, os.path.join(ROOT, "train.py"), *TINY_ARGS, "--data-dir", str(corpus),
        "--work-dir", str(work_dir), "--epochs", str(epochs), "--steps", str(steps),
    ]  # fmt: skip


def test_killed_run_resumes_from_backup_without_repeating_epochs(corpus, tmp_path):
    work_dir = tmp_path / "work"
    command = _train_command(corpus, work_dir, epochs=3, steps=40)
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT
    )
    try:  # kill it once the backup holds a finished epoch (what the run writes, not its log)
        deadline = time.time() + 600
        while time.time() < deadline and process.poll() is None:
            if (workdir.backup_epochs(str(work_dir)) or 0) >= 1:
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        process.kill()
        process.wait()
        log.close()
    assert process.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()[-3000:]
    assert not (work_dir / "run.json").exists()
    killed_at = workdir.backup_epochs(str(work_dir))
    assert killed_at in (1, 2)  # a second epoch may have finished before the signal

    resumed = subprocess.run(
        command, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300
    )
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    info = json.loads((work_dir / "run.json").read_text())
    assert info["training"]["epochs_run"] == 3 - killed_at  # the rest only, none again
    # The resumed run knows what came before: the first process's epochs and
    # training time (which a --max-train-minutes budget subtracts), and its
    # optimizer steps count in the run's total (which --init-from continues).
    assert info["run"]["kind"] == "resumed" and info["run"]["epochs"] == killed_at
    assert info["run"]["train_seconds"] > 0
    assert info["metrics"]["train_steps"] == 40 * (3 - killed_at)
    assert info["metrics"]["optimizer_steps"] == 120


def _h5_arrays(path):
    import h5py

    arrays = {}

    def collect(name, item):
        if isinstance(item, h5py.Dataset):
            arrays[name] = item[()]

    with h5py.File(path, "r") as f:
        f.visititems(collect)
    return arrays


@pytest.fixture
def held_ports():
    """Two ports for the workers' gRPC servers, held until the test ends (ports.py)."""
    held = [HeldPort(), HeldPort()]
    yield [h.port for h in held]
    for h in held:
        h.close()


def test_multi_worker_mirrored_strategy_with_two_local_workers(corpus, tmp_path, held_ports):
    """Two worker processes on loopback train 3 synchronous steps through `model.fit`."""
    work_dir = tmp_path / "work"
    cluster = {"worker": [f"127.0.0.1:{port}" for port in held_ports]}
    command = _train_command(corpus, work_dir, epochs=1, steps=3)
    command += ["--validation-bleu-samples", "0", "--test-samples", "1"]  # argparse: last wins
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        processes.append(
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=_env(TF_CONFIG=tf_config, OMP_NUM_THREADS="1"),
                cwd=ROOT,
            )  # fmt: skip
        )
    outputs = []
    deadline = time.time() + 300
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=max(1, deadline - time.time()))[0])
        except subprocess.TimeoutExpired:
            for p in processes:
                p.kill()
            pytest.fail("multi-worker training did not finish in time")
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]
    chief = json.loads((work_dir / "run.json").read_text())
    assert chief["training"]["distribution"].startswith("MultiWorkerMirroredStrategy")
    assert chief["training"]["num_replicas"] == 2
    assert chief["metrics"]["train_steps"] == 3
    assert np.isfinite(chief["metrics"]["train_loss"]) and np.isfinite(chief["metrics"]["val_loss"])
    # Only the chief writes the work directory; worker 1 writes beside it.
    worker = work_dir / "workers" / "worker_1"
    assert not (worker / "run.json").exists() and not (worker / "model.keras").exists()
    # Each worker trains its own vocabulary: they must agree on the ids.
    assert (worker / "vocab.model").read_bytes() == (work_dir / "vocab.model").read_bytes()
    # Synchronous data parallelism: all-reduced updates leave the same weights on both workers.
    chief_weights = _h5_arrays(work_dir / "checkpoints" / "epoch_001.weights.h5")
    worker_weights = _h5_arrays(worker / "checkpoints" / "epoch_001.weights.h5")
    assert chief_weights.keys() == worker_weights.keys() and len(chief_weights) > 10
    for name, value in chief_weights.items():
        np.testing.assert_array_equal(value, worker_weights[name], err_msg=name)
    model, _, _ = training.load_trained(work_dir)  # model.keras of a multi-worker run loads back
    assert model.config.vocab_size == 64


# Continued training: --init-from a finished run, in a new work directory.
INIT_FROM_TOLERANCE = 1e-4  # relative: the same weights and batches, float32 sums in another order


def test_init_from_starts_from_the_finished_weights_and_vocabulary(corpus, tmp_path):
    finished = tmp_path / "finished"
    # float32 on every machine: with native bf16 the calibration may pick mixed_bfloat16,
    # whose validation loss moves by more than float32's summation order (2.5e-4 seen).
    float32 = ["--dtype-policy", "float32"]
    first = subprocess.run(
        _train_command(corpus, finished, epochs=2, steps=10) + float32,
        capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600,
    )  # fmt: skip
    log = first.stdout + first.stderr
    assert first.returncode == 0, log[-3000:]
    # A clean log: SentencePiece's trainer and Keras's input warnings silenced at their source.
    for noise in ("bpe_model_trainer", "trainer_interface", "ran out of data", "shuffle=True"):
        assert noise not in log, noise
    finished_info = json.loads((finished / "run.json").read_text())

    continued = tmp_path / "continued"
    command = _train_command(corpus, continued, epochs=1, steps=5) + float32
    command += ["--init-from", str(finished)]
    second = subprocess.run(
        command, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600
    )
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    info = json.loads((continued / "run.json").read_text())
    init = info["init_from"]
    assert init["work_dir"] == str(finished)
    # It starts from the saved (averaged) weights: its validation loss before the
    # first step is the finished run's last one.
    chosen = finished_info["averaging"]["chosen"]
    assert init["finished_val_loss"] == finished_info["averaging"]["val_loss"][str(chosen)]
    np.testing.assert_allclose(
        init["val_loss"], init["finished_val_loss"], rtol=INIT_FROM_TOLERANCE
    )
    # Vocabulary, architecture and preset are kept; the schedule goes on from step 20.
    assert (continued / "vocab.model").read_bytes() == (finished / "vocab.model").read_bytes()
    assert info["config"] == finished_info["config"] and info["preset"] == "tiny"
    assert init["initial_step"] == finished_info["metrics"]["train_steps"] == 20
    # Warm-up (50 steps) is linear in the step counted from 1: 26 after 25 updates, 21 after 20.
    np.testing.assert_allclose(
        info["history"]["learning_rate"][-1] / finished_info["history"]["learning_rate"][-1],
        26 / 21,
        rtol=1e-5,
    )
    # The finished run is left alone; its work directory is refused as the new one.
    assert json.loads((finished / "run.json").read_text()) == finished_info
    with pytest.raises(ValueError, match="new --work-dir"):
        training.run(init_from=str(finished), work_dir=str(finished))
