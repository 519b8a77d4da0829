# Two commands that work on a fresh machine (README.md):
#   make lab    set up .venv and open JupyterLab on the guided notebooks
#   make test   set up .venv (and Debian's chromium if absent) and run every CPU test
# Both are idempotent: the install step re-runs only when pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gpu-workbench-installed
# Quiet, deterministic CPU runs: one intra-op thread (2-core machines), no C++ log chatter in nbval output.
export OMP_NUM_THREADS ?= 1
export KINETO_LOG_LEVEL ?= 6
export TORCH_CPP_LOG_LEVEL ?= ERROR
export PYTHONHASHSEED ?= 0
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: lab test test-unit test-slow test-notebooks notebooks-sync notebooks-execute test-browser test-browser-panels test-browser-notebooks test-gpu lint-imports setup chromium bench clean help screenshots

help:
	@echo "make lab   - set up and open JupyterLab on notebooks/"
	@echo "make test  - set up and run every CPU test (unit, notebooks via nbval, browser)"
	@echo "make test-gpu - the gpu-marked tests (on a CUDA machine)"
	@echo "make test-slow - the slow-marked tests (soak loops left out of make test)"
	@echo "make notebooks-sync - bring each notebooks/NN.ipynb and notebooks/src/NN.py pair level after an edit"
	@echo "make notebooks-execute [NB=notebooks/10_step_time.ipynb] - re-run notebooks in place (stored outputs)"
	@echo "make bench - benchmarks (results go to benchmarks/RESULTS.md by hand)"
	@echo "make screenshots - refresh docs/screenshots/*.png from the browser tests"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# torch first, pinned by constraints.txt, so no resolver step can pull another (multi-GB) build.
$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install -q -c constraints.txt torch
	$(PY) -m pip install -q -c constraints.txt -e ".[test,bench]"
	@mkdir -p $(VENV)/share/jupyter/lab/settings
	@cp binder/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	@touch $(STAMP)

setup: $(STAMP)

# Browser tests drive Debian's chromium; CI runs as root, elsewhere sudo is tried.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else sudo -n apt-get update -qq && sudo -n apt-get install -y -qq chromium >/dev/null; fi; }

lab: $(STAMP)
	$(VENV)/bin/workbench lab notebooks

lint-imports: $(STAMP)
	$(VENV)/bin/lint-imports

test-unit: $(STAMP)
	$(PY) -m pytest -m "not gpu and not browser and not slow" tests

test-notebooks: $(STAMP)
	$(PY) -m pytest --nbval-lax --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider notebooks

# Guided notebooks are jupytext pairs (notebooks/jupytext.toml): notebooks/src/NN_name.py (py:percent, the
# text to edit and review; nbval tags in the cell headers) and notebooks/NN_name.ipynb (the outputs nbval
# checks). After editing either side (JupyterLab with jupytext saves both), sync the other;
# tests/test_notebook_sources.py fails while a pair differs.
notebooks-sync: $(STAMP)
	$(VENV)/bin/jupytext --sync notebooks/[0-9]*.ipynb

# Re-execute notebooks in place after a change, the way nbval runs them: outputs stored, no widget state, no
# cell timings (make notebooks-execute NB="notebooks/10_step_time.ipynb notebooks/00_tour.ipynb").
NB ?= notebooks/[0-9]*.ipynb
notebooks-execute: notebooks-sync
	PYTHONPATH=$(CURDIR) $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.store_widget_state=False --ExecutePreprocessor.record_timing=False \
	  --ExecutePreprocessor.timeout=120 $(NB)

# Every panel and every guided notebook in a real JupyterLab + headless Chromium (part of make test;
# ~8 min on 2 cores: panels ~2, notebooks ~6).
test-browser: $(STAMP) chromium
	$(PY) -m pytest -m browser tests/browser

# The panels only (~2 min), or the guided notebooks only (~6 min).
test-browser-panels: $(STAMP) chromium
	$(PY) -m pytest -m browser tests/browser --ignore=tests/browser/test_notebooks_browser.py

test-browser-notebooks: $(STAMP) chromium
	$(PY) -m pytest -m browser tests/browser/test_notebooks_browser.py

test: $(STAMP) chromium lint-imports
	$(PY) -m pytest -m "not gpu and not browser and not slow" tests
	$(PY) -m pytest --nbval-lax --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider notebooks
	$(PY) -m pytest -m browser tests/browser

# The slow-marked tests (long soak loops), left out of make test.
test-slow: $(STAMP)
	$(PY) -m pytest -m "slow and not gpu and not browser" tests

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu tests

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf build dist *.egg-info .pytest_cache

# README pictures: run the browser tests and copy each panel's PNG from build/screenshots to docs/screenshots.
screenshots: $(STAMP) chromium
	WB_UPDATE_SCREENSHOTS=1 $(PY) -m pytest -m browser tests/browser/test_panels_browser.py
