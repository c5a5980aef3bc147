"""The CPU this process runs on, TensorFlow's thread pools for it, and the GPUs it has.

The machines this package is developed on differ from session to session
(Intel Xeon with AMX-BF16, AMD EPYC Zen 3 with AVX2 only), and the right
precision depends on which: `mixed_bfloat16` pays only where the CPU
multiplies bf16 natively. Every run and every benchmark names the CPU it ran
on with `describe_cpu()`.

A GPU is used only where the backend's CUDA build is installed (the CPU
builds are the default: pyproject.toml's GPU extras); `describe_accelerator()`
says at start-up which one a run found, and warns where the system has a GPU
that the backend does not see.
"""

import dataclasses
import os
import platform
import re
import shutil
import subprocess

# CPU flags (as /proc/cpuinfo spells them) that make bf16 matmuls native.
_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def _read(path):
    """A text file's contents; "" where it cannot be read (not Linux, no driver)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
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
    text = _read("/proc/cpuinfo")
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


# ----------------------------------------------------------------------- GPUs

# The extra that puts each backend on an NVIDIA GPU (pyproject.toml; docs/training.md,
# "On a GPU"), and CUDA 13's lowest Linux driver: below it, JAX's CUDA 12 build.
GPU_EXTRAS = {"jax": "jax-cuda13", "torch": "torch-cuda", "tensorflow": "tensorflow-cuda"}
_CUDA13_DRIVER = (580,)


@dataclasses.dataclass(frozen=True)
class SystemGpus:
    """The NVIDIA GPUs the operating system shows, whatever the Python packages see."""

    names: tuple = ()  # ("NVIDIA H100 80GB HBM3", ...); "NVIDIA GPU" where no name is shown
    driver: str | None = None  # "580.82.07"

    def __bool__(self):
        return bool(self.names)


def system_gpus(proc="/proc/driver/nvidia", dev="/dev", nvidia_smi="nvidia-smi"):
    """The GPUs the NVIDIA driver has, read where it shows them, without a backend.

    In order: the driver's `/proc` files (no process started), `nvidia-smi -L`
    (a container may have it without `/proc/driver/nvidia`), then the device
    files `/dev/nvidia0`, ... (no names). The arguments are for tests.

    Returns:
        SystemGpus: empty (and false) where there is no NVIDIA driver.
    """
    driver = None
    match = re.search(r"Kernel Module\s+(\d+(?:\.\d+)+)", _read(os.path.join(proc, "version")))
    if match:
        driver = match[1]
    names = []
    gpus = os.path.join(proc, "gpus")
    for bus_id in sorted(os.listdir(gpus)) if os.path.isdir(gpus) else ():
        information = _read(os.path.join(gpus, bus_id, "information"))
        model = re.search(r"^Model:\s*(.+)$", information, re.M)
        names.append(model[1].strip() if model else "NVIDIA GPU")
    if not names and shutil.which(nvidia_smi):
        try:
            listed = subprocess.run(
                [nvidia_smi, "-L"], capture_output=True, text=True, timeout=10, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError):
            listed = ""
        names = re.findall(r"^GPU \d+: (.+?)(?: \(UUID: [^)]*\))?$", listed, re.M)
    if not names and os.path.isdir(dev):
        names = ["NVIDIA GPU" for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name)]
    return SystemGpus(tuple(names), driver)


def describe_accelerator(backend, backend_gpus, system, cuda_visible_devices=None):
    """The start-up log's line on the accelerator, and a warning where a GPU goes unused.

    Args:
        backend: the Keras backend ("jax", "torch" or "tensorflow").
        backend_gpus: the names of the GPUs the backend found ([] for none).
        system: `system_gpus()`.
        cuda_visible_devices: `CUDA_VISIBLE_DEVICES`; "" or "-1" hides every GPU
            on purpose, which is then said rather than warned about.

    Returns:
        (line, warning): warning is None unless the system has a GPU that the
        backend does not see; it names the extra that installs the backend's
        GPU build.
    """
    if backend_gpus:
        return f"Accelerator: {_counted(backend_gpus)} ({backend})", None
    if not system:
        return f"Accelerator: none, the CPU ({backend}; no NVIDIA GPU on this system)", None
    gpus = _counted(system.names)
    if system.driver:
        gpus += f", driver {system.driver}"
    if cuda_visible_devices is not None and cuda_visible_devices.strip() in ("", "-1"):
        reason = f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} hides {gpus}"
        return f"Accelerator: none, the CPU ({backend}; {reason})", None
    line = f"Accelerator: none, the CPU ({backend}), although the system has {gpus}"
    return line, (
        f"The system has {gpus}, but the {backend} backend sees no GPU and trains on the CPU: "
        f"install its GPU build, {_gpu_install(backend, system.driver)} "
        f"(docs/training.md, \"On a GPU\")."
    )


def _counted(names):
    """`["A", "A", "B"]` as "2 x A, B"."""
    counts = {name: list(names).count(name) for name in names}
    return ", ".join(f"{n} x {name}" if n > 1 else name for name, n in counts.items())


def _gpu_install(backend, driver):
    """How to install `backend`'s GPU build for an NVIDIA driver of version `driver`."""
    extra = GPU_EXTRAS.get(backend)
    if extra is None:
        return f"a CUDA build of {backend}"
    old_driver = driver is not None and _version(driver) < _CUDA13_DRIVER
    if backend == "jax" and old_driver:
        extra = "jax-cuda12"  # CUDA 12 runs on drivers from 525 on
    install = f"`make train EXTRAS={extra}` or `pip install -e \".[{extra}]\"`"
    if backend == "torch" and old_driver:
        install += f" with a driver of version 580 or later (CUDA 13's; this one is {driver})"
    return install


def _version(text):
    return tuple(int(part) for part in re.findall(r"\d+", text))
