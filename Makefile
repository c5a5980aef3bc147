# Two set-up commands do everything on a fresh machine:
#   make train   train on the default corpus, evaluate, export to saved_models/
#   make test    the test suite on TensorFlow, then the backend-agnostic tests on JAX and torch
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CORPUS := /usr/share/trans/de-en
PYTEST_ARGS =  # `make test PYTEST_ARGS=...` only: never taken from the environment

.PHONY: train test install corpus browser lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[all,dev]"
	touch $(STAMP)

install: $(STAMP)

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
test: install corpus browser
	KERAS_TRANSFORMER_REQUIRE_EXTRAS=1 KERAS_BACKEND=tensorflow $(PY) -m pytest $(PYTEST_ARGS)
	KERAS_TRANSFORMER_REQUIRE_EXTRAS=1 KERAS_BACKEND=jax $(PY) -m pytest -m multibackend $(PYTEST_ARGS)
	KERAS_TRANSFORMER_REQUIRE_EXTRAS=1 KERAS_BACKEND=torch $(PY) -m pytest -m multibackend $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check keras_transformer tests train.py export benchmarks
