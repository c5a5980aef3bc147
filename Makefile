# Two set-up commands do everything on a fresh machine:
#   make train   train on the default corpus, evaluate, export to saved_models/
#   make test    the test suite on TensorFlow, then the backend-agnostic tests on JAX and torch
# On a GPU, `KERAS_BACKEND=jax make train EXTRAS=jax-cuda13` adds JAX's GPU build to
# [all,dev]; `EXTRAS=cuda13` adds JAX's, torch's, ONNX Runtime's and CTranslate2's,
# `EXTRAS=cuda12` TensorFlow's, JAX's and CTranslate2's (pyproject.toml lists them all).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CORPUS := /usr/share/trans/de-en
PYTEST_ARGS =  # `make test PYTEST_ARGS=...` only: never taken from the environment
EXTRAS =  # `make train EXTRAS=...` only, likewise: CI's `make test` installs [all,dev]

.PHONY: train test install corpus browser lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[all,dev]"
	touch $(STAMP)

# The GPU extras, on top of [all,dev]. [all] brings onnxruntime, which onnxruntime-gpu
# replaces: both install the package `onnxruntime`, so the CPU one is removed and
# the GPU one written again over the files that the removal took.
$(VENV)/.installed-%: $(STAMP)
	$(PY) -m pip install --quiet -e ".[all,dev,$*]"
	@if $(PY) -m pip show --quiet onnxruntime-gpu 2>/dev/null; then \
	  set -x; $(PY) -m pip uninstall --quiet -y onnxruntime && \
	  $(PY) -m pip install --quiet --no-deps --force-reinstall \
	    "onnxruntime-gpu==$$($(PY) -m pip show onnxruntime-gpu | sed -n 's/^Version: //p')"; fi
	touch $@

install: $(STAMP) $(if $(EXTRAS),$(VENV)/.installed-$(EXTRAS))

# The Ding dictionary (Debian package trans-de-en, GPL-2+), parsed at run time.
corpus:
	@test -f $(CORPUS) || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq trans-de-en; }

# Chromium and its driver (Debian packages) for the server page's browser test.
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver; }

train: install corpus
	$(PY) train.py $(TRAIN_ARGS)

# Every extra is installed here: a test skipped for a missing package fails
# (tests/conftest.py). The backend of each run is set, never the environment's.
# Each run ends with its 25 slowest tests (the time budget: docs/development.md).
# The TensorFlow run takes two worker processes, a test file each (pytest-xdist):
# alone it took 92 minutes on a 2-core Zen 3 where a Zen 4 took 37.
PYTEST := KERAS_TRANSFORMER_REQUIRE_EXTRAS=1 $(PY) -m pytest --durations=25
test: install corpus browser lint
	KERAS_BACKEND=tensorflow $(PYTEST) -n 2 --dist loadfile $(PYTEST_ARGS)
	KERAS_BACKEND=jax $(PYTEST) -m multibackend $(PYTEST_ARGS)
	KERAS_BACKEND=torch $(PYTEST) -m multibackend $(PYTEST_ARGS)

# ruff from the [dev] extra, with pyproject.toml's rules (not yet `ruff format --check`:
# files written before it would change).
lint: install
	$(VENV)/bin/ruff check .
