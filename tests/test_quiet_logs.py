"""Other libraries' INFO logs stay out of a command's output unless `--verbose`
(`command_line.configure_logging`); their warnings, and this package's INFO
lines, show either way.

Two sources: Python loggers (absl's TFDS lines, tf2onnx's conversion, JAX's
"Unable to initialize backend 'tpu'", matplotlib's font cache), checked on the
rule itself; and TensorFlow's C++ log, checked on the cheapest command that
loads TensorFlow: `keras-transformer-translate` with a missing work directory
(TensorFlow loads with Keras, then the command ends in one error line). Each
check also runs with `--verbose` and expects the lines there, so that it
cannot pass because the libraries stopped writing them.

TensorFlow 2.21 writes two INFO lines (`STATIC_INIT`) from static initializers
of libtensorflow_framework.so and again of its profiler plugin, before it reads
`TF_CPP_MIN_LOG_LEVEL`: no setting silences them (set in the environment at
process start, they still appear), and filtering stderr is not done. Every
other C++ INFO line is silenced (`cpu_feature_guard`'s at import, for one),
as is, where no NVIDIA driver is loaded, the "failed call to cuInit" error of
a first op (`hardware.tensorflow_log_level`).
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIRD_PARTY = ("absl", "tf2onnx", "tensorflow", "jax._src.xla_bridge", "matplotlib.font_manager")
LOG_ALL = f"""
import logging, sys
from keras_transformer.command_line import configure_logging

configure_logging(sys.argv[1] == "--verbose", "%(levelname)s %(name)s: %(message)s")
for name in {THIRD_PARTY!r}:
    logging.getLogger(name).info("an info line")
    logging.getLogger(name).warning("a warning")
logging.getLogger("keras_transformer.training").info("the run's own line")
"""
# TensorFlow's C++ INFO lines (absl's format: severity, MMDD, time, thread, file:line]),
# and the two of them that no setting reaches (the module's docstring).
TF_CPP_INFO = re.compile(r"^I\d{4} \S+ +\d+ ([\w.]+):\d+\]")
STATIC_INIT = {"port.cc", "cudart_stub.cc"}


def _stderr(args, backend="tensorflow"):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # conftest's
    env.update(KERAS_BACKEND=backend, PYTHONPATH=ROOT)
    completed = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    return completed.returncode, completed.stderr.splitlines()


def test_other_libraries_info_lines_show_only_with_verbose_their_warnings_always():
    for verbose in (False, True):
        _, lines = _stderr(["-c", LOG_ALL, "--verbose" if verbose else "--quiet"])
        infos = [name for name in THIRD_PARTY if f"INFO {name}: an info line" in lines]
        warnings = [name for name in THIRD_PARTY if f"WARNING {name}: a warning" in lines]
        assert infos == (list(THIRD_PARTY) if verbose else []), lines
        assert warnings == list(THIRD_PARTY), lines
        assert "INFO keras_transformer.training: the run's own line" in lines


def test_tensorflows_cpp_info_lines_show_only_with_verbose(tmp_path):
    missing = str(tmp_path / "missing")
    command = ["-m", "keras_transformer.translate", "--work-dir", missing]
    status, lines = _stderr(command)
    assert status == 2, lines
    infos = {m[1] for m in map(TF_CPP_INFO.match, lines) if m}
    assert infos <= STATIC_INIT, lines
    assert not [x for x in lines if x.startswith("INFO")], lines
    assert f"keras-transformer-translate: error: --work-dir {missing!r} is not a directory" in lines
    status, verbose = _stderr([*command, "--verbose"])
    assert status == 2, verbose
    brought_back = {m[1] for m in map(TF_CPP_INFO.match, verbose) if m} - STATIC_INIT
    assert brought_back, verbose  # cpu_feature_guard.cc's on this fleet's x86 CPUs


def test_train_py_under_jax_keeps_its_own_lines_and_not_jaxs(tmp_path):
    # JAX logs "Unable to initialize backend 'tpu'" at INFO when train.py sets up its
    # devices; an empty --data-dir then ends the run in one error line.
    (tmp_path / "data").mkdir()
    args = ["train.py", "--data-dir", str(tmp_path / "data"), "--work-dir", str(tmp_path / "w")]
    status, lines = _stderr(args, backend="jax")
    assert status == 2, lines
    assert [x for x in lines if "INFO keras_transformer.training.machine: Distribution" in x]
    assert not [x for x in lines if " INFO " in x and " INFO keras_transformer." not in x], lines
