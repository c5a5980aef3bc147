"""The CPU this process runs on, and TensorFlow's thread pools for it.

The machines this package is developed on differ from session to session
(Intel Xeon with AMX-BF16, AMD EPYC Zen 3 with AVX2 only), and the right
precision depends on which: `mixed_bfloat16` pays only where the CPU
multiplies bf16 natively. Every run and every benchmark names the CPU it ran
on with `describe_cpu()`.
"""

import os
import platform

# CPU flags (as /proc/cpuinfo spells them) that make bf16 matmuls native.
_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def _cpuinfo():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def describe_cpu():
    """What the CPU is and can do, for `run.json` and benchmark tables.

    Returns:
        dict: `model` (e.g. "AMD EPYC"), `cores` (usable by this process),
        `bf16` (native bf16 matmuls: AMX-BF16 or AVX512-BF16), `amx`,
        `avx512`, `avx2` (bools), and `summary`, one line naming all of it.
    """
    text = _cpuinfo()
    model, flags = platform.processor() or platform.machine(), set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "model": model,
        "cores": cores,
        "bf16": any(flag in flags for flag in _BF16_FLAGS),
        "amx": "amx_bf16" in flags,
        "avx512": "avx512f" in flags,
        "avx2": "avx2" in flags,
    }
    extensions = [name for name in ("amx", "avx512", "avx2") if info[name]]
    info["summary"] = (
        f"{model}, {cores} cores, {'/'.join(e.upper() for e in extensions) or 'no AVX2'}, "
        f"{'native' if info['bf16'] else 'no native'} bf16"
    )
    return info


def default_dtype_policy(cpu=None):
    """`"mixed_bfloat16"` where the CPU multiplies bf16 natively, else `"float32"`.

    Only where nothing can be timed (a multi-worker run, whose workers must
    agree): `calibration.calibrated_model` chooses by measurement everywhere else,
    since on a Xeon with AVX512-BF16 but no AMX this rule picks the slowest setting.

    Measured on the AMX-BF16 Xeon: about 1.5x more training steps per second
    with `mixed_bfloat16`. Without native bf16 (AVX2 only), bf16 matmuls are
    emulated and slower than float32.
    """
    cpu = cpu or describe_cpu()
    return "mixed_bfloat16" if cpu["bf16"] else "float32"


def configure_threads(intra_op=None, inter_op=None):
    """Sets TensorFlow's intra- and inter-op thread pools before its first op.

    Args:
        intra_op, inter_op: thread counts; None keeps TensorFlow's default
            (one per core for both), which measured fastest for training on
            2 cores (docs/performance.md). `TF_NUM_INTRAOP_THREADS` and
            `TF_NUM_INTEROP_THREADS` in the environment override both.

    Returns:
        dict: the `intra_op` and `inter_op` counts in force (0 = TF's default).
    """
    import tensorflow as tf

    intra_op = int(os.environ.get("TF_NUM_INTRAOP_THREADS", intra_op or 0))
    inter_op = int(os.environ.get("TF_NUM_INTEROP_THREADS", inter_op or 0))
    try:
        if intra_op:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        if inter_op:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:
        pass  # TensorFlow already ran an op: its pools are fixed; report what they are
    return {
        "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
    }


def importable(name):
    """Whether module `name` can be imported here, without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def tensorflow_log_level():
    """`TF_CPP_MIN_LOG_LEVEL` for a command line, to set before TensorFlow is imported.

    "2" (errors only) where an NVIDIA driver is loaded; "3" where none is
    (`/proc/driver/nvidia` absent): there, TensorFlow's one C++ error is
    "failed call to cuInit" at its first op, on every run, and Python still
    raises every real failure. A value already in the environment wins.
    """
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return os.environ["TF_CPP_MIN_LOG_LEVEL"]
    return "2" if os.path.exists("/proc/driver/nvidia") else "3"


# Python loggers whose INFO lines a command's log does not need: TFDS's (through
# absl: six per run), tf2onnx's conversion (about 20 per export: opsets, constant
# folding, optimizer counts) and TensorFlow's ("Assets written to ...").
QUIET_LOGGERS = ("absl", "tf2onnx", "tensorflow")


def quiet_third_party_loggers():
    """Sets `QUIET_LOGGERS` to WARNING; for command-line entry points (train, export)."""
    import logging

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


# Where a training step's memory comes from. TensorFlow allocates and frees
# its activation and gradient buffers at every step. Left to glibc's malloc,
# every freed block above its (adaptive) mmap threshold went back to the
# kernel and the next step faulted fresh zeroed pages in: 21 million minor
# page faults and 22% of the process's CPU time in the kernel in a 2-minute
# run of the `cpu` preset on the 2-core EPYC. Two settings keep the memory in
# the process (benchmarks/README.md, "Settled questions"):
# - TensorFlow's BFC allocator for CPU tensors (the pool its GPU allocator
#   uses): 0.65 million faults, 5% in the kernel, 1.38x-1.40x steps per second
#   (measured with a process-environment benchmark now in the git history);
# - glibc's thresholds for what does not go through it (Eigen's packing
#   buffers, tf.data, Python): measured 1.15x before the BFC allocator.
# Both are read at process start (the BFC switch when TensorFlow creates its
# CPU allocator), hence the re-run below.
ALLOCATOR_ENV = {
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),  # glibc's maximum: blocks below it come from the heap
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),  # never shrink the heap between steps
    "MALLOC_TOP_PAD_": str(64 << 20),  # grow it in large steps
}


def reexec_with_allocator_env():
    """Re-runs this command (`sys.orig_argv`) with `ALLOCATOR_ENV` set, once; returns if set.

    Call it first thing in a command-line entry point (`train.py` does). A
    variable the user set is kept; `KERAS_TRANSFORMER_ALLOCATOR=0` turns it off.
    This module imports only the standard library at its top, so an entry
    point can load it alone, before anything imports TensorFlow.
    """
    import sys

    if os.environ.get("KERAS_TRANSFORMER_ALLOCATOR") == "0" or not sys.platform.startswith("linux"):
        return
    if all(name in os.environ for name in ALLOCATOR_ENV):
        return
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**ALLOCATOR_ENV, **os.environ})
