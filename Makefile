# nwor_lab: the two commands of the README, and their pieces.
#   make run    set up (.venv) and run the main job on the shipped default (CPU if no GPU)
#   make test   set up (.venv) and run the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch first, on its own: where a local wheel cache exists (CI), `pip install torch` takes the
# CUDA build from it, whose headers the extension's compile test needs.
STAMP := $(VENV)/.nwor_lab-installed

.PHONY: setup run test test-gpu selfcheck clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	mkdir -p runs
	$(VENV)/bin/nwor-lab doctor
	$(VENV)/bin/nwor-lab selfcheck --out runs/selfcheck.json > /dev/null && echo "selfcheck ok: runs/selfcheck.json"
	$(VENV)/bin/nwor-lab generate "def parse_args(argv):" --k 4 --nwor stage --max-new-tokens 64

test: $(STAMP)
	$(PY) -m pytest -q tests

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests

clean:
	rm -rf build .pytest_cache .hypothesis runs
