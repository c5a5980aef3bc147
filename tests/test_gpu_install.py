"""The GPU install: pyproject.toml's GPU extras resolve and agree with the CPU pins,
the docs name them, and `train.py`'s start-up log says which accelerator it found.

The extras are resolved against the package registry from their metadata alone
(`pip install --dry-run`: no wheel is downloaded), since CI runs on a CPU machine.
"""

import json
import logging
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import keras
import pytest
from packaging.requirements import Requirement

from keras_transformer import hardware
from keras_transformer.hardware import SystemGpus, describe_accelerator, system_gpus
from keras_transformer.training import machine

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: its backport
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "keras-transformer-nmt"
GPU_EXTRAS = {
    "jax-cuda13": 13, "jax-cuda12": 12, "torch-cuda": 13, "tensorflow-cuda": 12,
    "onnx-gpu": 13, "ctranslate2-cuda": None, "cuda13": 13, "cuda12": 12,
}  # fmt: skip  (the CUDA version each one installs; CTranslate2's joins either)
H100 = SystemGpus(("NVIDIA H100 80GB HBM3",), "580.82.07")


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _extras():
    return _project()["optional-dependencies"]


def requirements(extra, extras=None):
    """`extra`'s requirements (`Requirement`s), with this package's own extras expanded."""
    extras = extras or _extras()
    found = []
    for line in extras[extra]:
        requirement = Requirement(line)
        if requirement.name == NAME:
            for inner in sorted(requirement.extras):
                found += requirements(inner, extras)
        else:
            found.append(requirement)
    return found


def _spec(extra, name):
    (requirement,) = [r for r in requirements(extra) if r.name == name]
    return requirement


# ------------------------------------------------------------------ the extras


def test_every_gpu_extra_is_declared_and_each_backend_has_one():
    extras = _extras()
    assert set(GPU_EXTRAS) <= set(extras)
    assert set(hardware.GPU_EXTRAS.values()) <= set(extras)
    assert set(hardware.GPU_EXTRAS) == {"jax", "torch", "tensorflow"}


def test_the_gpu_pins_are_the_cpu_pins():
    # torch-cuda joins [all]'s torch pin and leaves only PyPI's CUDA wheel of it.
    cpu, cuda = _spec("torch", "torch").specifier, _spec("torch-cuda", "torch").specifier
    (version,) = [s.version for s in cpu if s.operator == "=="]
    assert cuda.contains(version) and cpu.contains(version)
    assert cpu.contains(f"{version}+cpu") and not cuda.contains(f"{version}+cpu")
    # TensorFlow's CUDA libraries for the TensorFlow [tensorflow] pins.
    assert _spec("tensorflow-cuda", "tensorflow").specifier == _spec(
        "tensorflow", "tensorflow"
    ).specifier
    assert "and-cuda" in _spec("tensorflow-cuda", "tensorflow").extras
    assert _spec("ctranslate2-cuda", "ctranslate2").specifier == _spec(
        "ctranslate2", "ctranslate2"
    ).specifier
    assert _spec("jax-cuda13", "jax").extras == {"cuda13"}
    assert _spec("jax-cuda12", "jax").extras == {"cuda12"}


def test_onnx_gpu_is_serve_with_the_gpu_runtime():
    serve = {r.name for r in requirements("serve")}
    gpu = {r.name for r in requirements("onnx-gpu")}
    # onnxruntime and onnxruntime-gpu write one package; the Makefile removes the first.
    assert "onnxruntime" not in gpu and "onnxruntime-gpu" in gpu
    base = {Requirement(r).name for r in _project()["dependencies"]}
    assert serve - {"onnxruntime"} <= gpu | base


def test_a_cuda_group_holds_one_cuda_version():
    for group, version in (("cuda13", 13), ("cuda12", 12)):
        members = [Requirement(line) for line in _extras()[group]]
        assert all(r.name == NAME for r in members), group  # only other extras
        for extra in set().union(*(r.extras for r in members)):
            assert GPU_EXTRAS[extra] in (version, None), (group, extra)


def test_the_install_docs_and_the_makefile_name_the_gpu_extras():
    for page in ("README.md", "docs/training.md"):
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            text = f.read()
        for extra in GPU_EXTRAS:
            assert extra in text, (page, extra)
        assert "EXTRAS=" in text, page
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        makefile = f.read()
    assert re.search(r"^EXTRAS =", makefile, re.M)  # set in the Makefile: not from the environment


# Errors of pip's that mean the registry could not be reached, not that the pins are wrong.
_UNREACHABLE = re.compile(
    r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
    r"Network is unreachable|Connection refused|Read timed out|ConnectTimeout"
)


def _resolve(lines):
    """`{name: version}` that pip resolves for requirement `lines` (metadata only)."""
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
        "--timeout", "20", "--retries", "1", "--report", "-", *lines,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    if done.returncode != 0:
        if _UNREACHABLE.search(done.stderr):
            pytest.skip(f"the package registry is unreachable: {done.stderr.strip()[-300:]}")
        raise AssertionError(f"pip could not resolve {lines}:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}


def _cuda_major(resolved):
    """The CUDA versions of the cuDNN and NCCL resolved: both CUDA versions' wheels
    write `nvidia/cudnn/lib` and `nvidia/nccl/lib`, so one environment holds one."""
    return {
        int(m[1])
        for name in resolved
        if (m := re.fullmatch(r"nvidia-(?:cudnn|nccl)-cu(\d+)", name))
    }


def test_the_gpu_extras_resolve_against_the_registry():
    # Each group with the CPU pins it joins in [all]: [torch]'s and [tensorflow]'s.
    groups = {
        13: [str(r) for r in [*requirements("cuda13"), _spec("torch", "torch")]],
        12: [str(r) for r in [*requirements("cuda12"), _spec("tensorflow", "tensorflow")]],
    }
    with ThreadPoolExecutor(2) as pool:
        resolved = dict(zip(groups, pool.map(_resolve, groups.values()), strict=True))

    cuda13, cuda12 = resolved[13], resolved[12]
    (torch_pin,) = [s.version for s in _spec("torch", "torch").specifier]
    assert cuda13["torch"] == torch_pin  # PyPI's CUDA build, not the local "+cpu" wheel
    assert cuda13["jax"] == cuda13["jax-cuda13-plugin"]
    assert "onnxruntime-gpu" in cuda13 and "onnxruntime" not in cuda13
    assert "nvidia-cublas-cu12" in cuda13  # CTranslate2's cuBLAS 12, beside CUDA 13's
    assert _cuda_major(cuda13) == {13}

    assert cuda12["tensorflow"].startswith("2.21.")
    assert cuda12["jax"] == cuda12["jax-cuda12-plugin"]
    assert "torch" not in cuda12
    assert _cuda_major(cuda12) == {12}
    key = re.compile(r"jax|torch|tensorflow|onnxruntime-gpu|ctranslate2|nvidia-(cudnn|nccl)-.*")
    print({group: {k: v for k, v in r.items() if key.fullmatch(k)} for group, r in resolved.items()})


# ------------------------------------------------------- the start-up log line


def test_the_system_probe_reads_the_driver_then_nvidia_smi_then_dev(tmp_path):
    proc = tmp_path / "proc"
    (proc / "gpus" / "0000:1b:00.0").mkdir(parents=True)
    (proc / "gpus" / "0000:1b:00.0" / "information").write_text(
        "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t 42\n"
    )
    (proc / "gpus" / "0000:2c:00.0").mkdir()
    (proc / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07  Wed Aug 20 2025\n"
    )
    missing = str(tmp_path / "absent")
    assert system_gpus(str(proc), missing, missing) == SystemGpus(
        ("NVIDIA H100 80GB HBM3", "NVIDIA GPU"), "580.82.07"
    )

    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5a1b)'\n"
        "echo 'GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-77c2)'\n"
    )
    smi.chmod(0o755)
    assert system_gpus(missing, missing, str(smi)).names == ("NVIDIA A100-SXM4-40GB",) * 2

    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "null"):
        (dev / name).write_text("")
    assert system_gpus(missing, str(dev), missing) == SystemGpus(("NVIDIA GPU",), None)
    assert not system_gpus(missing, missing, missing)


def test_the_line_names_what_the_backend_found():
    line, warning = describe_accelerator("jax", ["NVIDIA H100 80GB HBM3"] * 8, H100)
    assert line == "Accelerator: 8 x NVIDIA H100 80GB HBM3 (jax)" and warning is None
    line, _ = describe_accelerator("torch", ["NVIDIA A100-SXM4-40GB"] * 2 + ["Tesla T4"], H100)
    assert line == "Accelerator: 2 x NVIDIA A100-SXM4-40GB, Tesla T4 (torch)"
    line, warning = describe_accelerator("torch", [], SystemGpus())
    assert line == "Accelerator: none, the CPU (torch; no NVIDIA GPU on this system)"
    assert warning is None


@pytest.mark.parametrize(
    "backend, driver, extra",
    [
        ("jax", "580.82.07", "jax-cuda13"),
        ("jax", "550.54.15", "jax-cuda12"),  # CUDA 13 needs a driver from 580 on
        ("jax", None, "jax-cuda13"),
        ("torch", "580.82.07", "torch-cuda"),
        ("tensorflow", "550.54.15", "tensorflow-cuda"),
    ],
)
def test_a_gpu_the_backend_cannot_see_is_warned_about_with_its_extra(backend, driver, extra):
    system = SystemGpus(("NVIDIA H100 80GB HBM3",) * 2, driver)
    line, warning = describe_accelerator(backend, [], system)
    assert line.startswith(f"Accelerator: none, the CPU ({backend}), although the system has 2 x")
    assert f"EXTRAS={extra}`" in warning and f'".[{extra}]"' in warning
    assert extra in _extras()
    assert f"the {backend} backend sees no GPU" in warning


def test_an_old_driver_is_named_for_torchs_cuda_13_build():
    _, warning = describe_accelerator("torch", [], SystemGpus(("Tesla T4",), "535.104.05"))
    assert "580 or later" in warning and "535.104.05" in warning


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_gpus_hidden_on_purpose_are_said_not_warned(hidden):
    line, warning = describe_accelerator("jax", [], H100, cuda_visible_devices=hidden)
    assert warning is None and f"CUDA_VISIBLE_DEVICES={hidden!r} hides" in line


@pytest.mark.multibackend
def test_the_machine_logs_the_accelerator_and_warns(monkeypatch, caplog):
    monkeypatch.setattr(machine, "backend_gpus", lambda: [])
    monkeypatch.setattr(machine, "system_gpus", lambda: H100)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with caplog.at_level(logging.INFO, logger=machine.logger.name):
        found = machine.set_up_machine(seed=1)
    backend = keras.backend.backend()
    assert not found.has_gpu and found.gpu_name is None
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert f"Accelerator: none, the CPU ({backend}), although the system has NVIDIA H100" in (
        "\n".join(infos)
    )
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"EXTRAS={hardware.GPU_EXTRAS[backend]}" in warning


@pytest.mark.multibackend
def test_the_backends_gpu_list_is_names():
    gpus = machine.backend_gpus()
    assert isinstance(gpus, list) and all(isinstance(name, str) for name in gpus)
    if not system_gpus():
        assert gpus == []
