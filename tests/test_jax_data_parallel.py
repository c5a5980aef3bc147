"""JAX's data parallelism over two devices, on a CPU split in two
(`XLA_FLAGS=--xla_force_host_platform_device_count=2`, in subprocesses: the
flag must be set before JAX starts).

`keras.distribution.DataParallel` shards each batch's rows over the devices,
so the rows must divide among them (`distribution.num_replicas`): packed
batches of the package's pipeline train over two devices to the same
weights as on one, and `train.py` runs there end to end (it crashed with a
segmentation fault when TensorBoard wrote its graph from Keras's callback
thread: `callbacks._tensorboard`).
"""

import json
import os
import subprocess
import sys
import time

import pytest
from ports import HeldPort
from translation_fixtures import write_parallel_folder

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_DEVICES = "--xla_force_host_platform_device_count=2"
# One deadline for all the processes of a test, inside pytest-timeout's 1,200 s: the
# test fails and kills them itself, and nothing is left running when it ends.
BUDGET_SECONDS = 1100

SAME_WEIGHTS = r"""
import sys
import jax, keras, numpy as np
from keras_transformer.config import get_preset
from keras_transformer.data import Batches, PyDataset, get_tokenizer, load_translation_data
from keras_transformer.data import tokenize_split
from keras_transformer.model import Transformer
from keras_transformer.recipe import compile_with_paper_recipe

assert len(jax.devices()) == 2, jax.devices()
folder, work = sys.argv[1], sys.argv[2]
data = load_translation_data(data_dir=folder)
tokenizer = get_tokenizer(work + "/vocab.model", data.splits["train"], 64)
split = tokenize_split(data.splits["train"], tokenizer, max_length=24)
config = get_preset("tiny", vocab_size=64, max_length=24, dropout=0.0)


def train(distribution, sgd):
    keras.distribution.set_distribution(distribution)
    keras.utils.set_random_seed(7)
    model = Transformer(**config.__dict__)
    ids = np.array([[5, 6, 3]], dtype="int32")
    model({"source_ids": ids, "target_ids": ids}, training=False)
    compile_with_paper_recipe(model, warmup_steps=10)
    if sgd:  # the weights then move by the gradients themselves (Adam divides them)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=model.loss)
    batches = Batches(split, max_length=24, batch_tokens=256, num_replicas=2, pack=True, seed=0)
    rows = [batches.batch(i)[1].shape[0] for i in range(4)]
    assert all(r % 2 == 0 for r in rows), rows  # they divide among the two devices
    losses = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"]))
    )
    model.fit(PyDataset(batches), epochs=1, steps_per_epoch=4, verbose=0, shuffle=False,
              callbacks=[record])
    return [keras.ops.convert_to_numpy(w) for w in model.weights], losses


devices = keras.distribution.DataParallel(devices=jax.devices())
(two, two_losses), (one, one_losses) = train(devices, False), train(None, False)
print("losses", two_losses, one_losses)
# Summed in another order over the two devices: float32 round-off, not another step.
np.testing.assert_allclose(two_losses, one_losses, rtol=1e-5)
(two, _), (one, _) = train(devices, True), train(None, True)
worst = max(float(np.max(np.abs(a - b))) for a, b in zip(one, two, strict=True))
print("largest weight difference after 4 SGD steps", worst)
assert worst < 1e-5, worst
"""


def _run(args, cwd=ROOT, timeout=900):
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS=TWO_DEVICES, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def test_two_devices_train_to_the_weights_of_one(tmp_path):
    corpus = write_parallel_folder(tmp_path / "numbers", sizes=(400, 20, 20))
    result = _run(["-c", SAME_WEIGHTS, str(corpus), str(tmp_path)])
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "largest weight difference" in result.stdout


def test_train_py_over_two_jax_devices(tmp_path):
    corpus = write_parallel_folder(tmp_path / "numbers", sizes=(400, 20, 20))
    work_dir = tmp_path / "work"
    args = [
        os.path.join(ROOT, "train.py"), "--preset", "tiny", "--vocab-size", "64",
        "--batch-tokens", "256", "--epochs", "2", "--steps", "10",
        "--validation-bleu-every", "0", "--test-samples", "10", "--beam-size", "2",
        "--no-export", "--data-dir", str(corpus), "--work-dir", str(work_dir),
    ]  # fmt: skip
    result = _run(args)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    info = json.loads((work_dir / "run.json").read_text())
    assert info["training"]["num_replicas"] == 2
    assert "over 2 device(s)" in info["training"]["distribution"]
    losses = info["history"]["loss"]
    assert losses[-1] < losses[0], losses


def _h5_arrays(path):
    import h5py

    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, item: (
                arrays.update({name: item[()]}) if isinstance(item, h5py.Dataset) else None
            )
        )
    return arrays


def test_two_jax_processes_train_the_weights_of_one_process_over_two_devices(tmp_path):
    """`jax.distributed` on localhost (Keras's KERAS_DISTRIBUTION_* variables, Gloo
    between the CPU processes): each process feeds its half of every batch's rows,
    and two processes of one device each end on the weights, bit for bit, of one
    process over two devices; only process 0 writes the work directory."""
    import numpy as np

    corpus = write_parallel_folder(tmp_path / "numbers", sizes=(400, 20, 20))
    args = [
        os.path.join(ROOT, "train.py"), "--preset", "tiny", "--vocab-size", "64",
        "--batch-tokens", "256", "--epochs", "2", "--steps", "10",
        "--validation-bleu-every", "0", "--test-samples", "4", "--beam-size", "2",
        "--no-export", "--data-dir", str(corpus),
    ]  # fmt: skip
    deadline = time.time() + BUDGET_SECONDS
    one = _run(args + ["--work-dir", str(tmp_path / "one")], timeout=BUDGET_SECONDS)
    assert one.returncode == 0, (one.stdout + one.stderr)[-4000:]

    work = tmp_path / "two"
    held = HeldPort()  # the coordinator's port, held until both processes end (ports.py)
    address = f"127.0.0.1:{held.port}"
    processes = []
    try:
        for index in range(2):
            env = dict(
                os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
                OMP_NUM_THREADS="1", KERAS_DISTRIBUTION_JOB_ADDRESSES=address,
                KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID=str(index),
            )  # fmt: skip
            env.pop("TF_CONFIG", None)
            env.pop("XLA_FLAGS", None)
            processes.append(
                subprocess.Popen(
                    [sys.executable, *args, "--work-dir", str(work)],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )  # fmt: skip
            )
        outputs = []
        for process in processes:
            try:
                outputs.append(process.communicate(timeout=max(1, deadline - time.time()))[0])
            except subprocess.TimeoutExpired:
                pytest.fail(f"two JAX processes did not finish in {BUDGET_SECONDS} s")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        held.close()
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-4000:]

    info = json.loads((work / "run.json").read_text())
    assert info["training"]["distribution"] == "jax DataParallel over 2 device(s) in 2 processes"
    assert info["training"]["num_replicas"] == 2
    worker = work / "workers" / "process_1"
    assert not (worker / "run.json").exists() and not (worker / "model.keras").exists()
    chief = _h5_arrays(work / "checkpoints" / "epoch_002.weights.h5")
    single = _h5_arrays(tmp_path / "one" / "checkpoints" / "epoch_002.weights.h5")
    second = _h5_arrays(worker / "checkpoints" / "epoch_002.weights.h5")
    assert chief.keys() == single.keys() == second.keys() and len(chief) > 10
    for name, value in chief.items():
        np.testing.assert_array_equal(value, second[name], err_msg=name)
        np.testing.assert_array_equal(value, single[name], err_msg=name)
    assert (
        info["history"]["loss"]
        == json.loads((tmp_path / "one" / "run.json").read_text())["history"]["loss"]
    )
