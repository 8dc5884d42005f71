# firedrill: the two commands a fresh clone needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck layers unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: create the environment and run the main job on the built-in demo fleet
demo: $(STAMP)
	$(BIN)/firedrill twin run examples/fleet.yaml --hours 1 --seed 7 --out out/demo

## test: install what the tests need and run the whole suite (lint, types, layers, tests)
test: $(STAMP) lint typecheck layers unit

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/twin_bench.py

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
