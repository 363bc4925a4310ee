# Two commands: `make demo` and `make test`. Each bootstraps .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-full generate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m accord.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check accord tests benchmarks tools
	$(BIN)/ruff format --check accord tests benchmarks tools
	$(BIN)/mypy accord tools
	$(BIN)/python -m tools.synchro --check

generate: $(STAMP)
	$(BIN)/python -m tools.synchro

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# The engine-scale benchmark at 500,000 documents too (about half an hour).
bench-full: $(STAMP)
	$(BIN)/python -m benchmarks --full

clean:
	rm -rf $(VENV) .accord .pytest_cache
