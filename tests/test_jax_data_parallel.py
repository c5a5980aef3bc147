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

import pytest
from translation_fixtures import write_parallel_folder

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_DEVICES = "--xla_force_host_platform_device_count=2"

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


def _run(args, cwd=ROOT):
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS=TWO_DEVICES, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=900
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
