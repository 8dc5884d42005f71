# firedrill: the two commands a fresh clone needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test tools lint typecheck layers unit bench fuzz clean e2e-kind

# The real tools the tests check the generated config with (Debian/Ubuntu package names), the
# PostgreSQL server the store tests start on loopback (its binaries are not on PATH), and the
# headless Chromium the report and browser tests drive, the Prometheus server the live tests
# scrape the twin with, and patch(1), which applies the drill diffs `gameday next` proposes.
TOOLS     := prometheus promtool amtool $(or $(FIREDRILL_ALERTMANAGER),prometheus-alertmanager) \
             chromium patch
TOOL_PKGS := prometheus prometheus-alertmanager postgresql chromium patch
PG_INITDB := /usr/lib/postgresql/*/bin/initdb

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: create the environment and run the main job on the built-in demo fleet: the L5 game day
## (us-east-1 blackholed for llm-70b); prints the verdict table, writes out/demo/report.{md,html}
demo: $(STAMP)
	$(BIN)/firedrill gameday run examples/drills/l5-region-blackhole.yaml --seed 7 --out out/demo

## test: install what the tests need and run the whole suite (lint, types, layers, tests)
test: $(STAMP) tools lint typecheck layers unit

## tools: install promtool, amtool, Alertmanager, PostgreSQL and Chromium from apt if missing
## (no-op otherwise); services the packages start are stopped: the tests start their own
tools:
	@missing=""; for t in $(TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	ls $(PG_INITDB) >/dev/null 2>&1 || missing="$$missing initdb"; \
	if [ -n "$$missing" ]; then \
	  echo "missing:$$missing; installing $(TOOL_PKGS)"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; \
	  elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; \
	  else echo "not root and no sudo: install $(TOOL_PKGS) by hand" >&2; exit 1; fi; \
	  $$sudo apt-get update && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y --no-install-recommends $(TOOL_PKGS) || exit 1; \
	  for svc in $(TOOL_PKGS); do $$sudo service $$svc stop >/dev/null 2>&1 || true; done; \
	  for t in $(TOOLS); do \
	    command -v $$t >/dev/null 2>&1 || { echo "$$t still missing" >&2; exit 1; }; \
	  done; \
	  ls $(PG_INITDB) >/dev/null 2>&1 || { echo "initdb still missing ($(PG_INITDB))" >&2; exit 1; }; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP) tools
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/twin_bench.py
	$(BIN)/python benchmarks/drill_bench.py

## e2e-kind: the Kubernetes flows against a throwaway kind cluster (needs docker, kind, kubectl);
## not part of `make test`
e2e-kind: $(STAMP)
	PYTEST=$(BIN)/pytest deploy/e2e-kind.sh

## fuzz: the property-based fuzz suite (tests/fuzz) with the long hypothesis profile (thousands
## of examples per property; `make test` runs the same properties briefly), then a mutation fuzz
## of 14,000 example specs that prints its crash counts (benchmarks/spec_fuzz.py)
fuzz: $(STAMP)
	FIREDRILL_FUZZ=long $(BIN)/pytest -q tests/fuzz
	$(BIN)/python benchmarks/spec_fuzz.py --mutants 14000

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache

## bench-webhook: webhook ingestion through the real HTTP stack (firedrill serve on loopback)
bench-webhook: $(STAMP)
	PATH=$(BIN):$$PATH $(BIN)/python benchmarks/webhook_bench.py --batch 50 --seconds 5

## bench-board: the incident board with 1,000 open incidents and 100 updates/s (serve on loopback)
bench-board: $(STAMP)
	$(BIN)/python benchmarks/board_bench.py --incidents 1000 --rate 100 --seconds 10

## bench-step: the twin step's fixed cost, the code at BASELINE and this tree side by side on the
## same seeds (one L5 drill, a small cell against SimPy, a 20-run sweep), after proving every
## example's output byte for byte unchanged; then the ensemble against lone twins, and a sweep
## one run at a time against ensembles of 32
BASELINE ?= main
bench-step: $(STAMP)
	$(BIN)/python benchmarks/same_outputs.py check --baseline $(BASELINE)
	$(BIN)/python benchmarks/drill_bench.py --baseline $(BASELINE) --rounds 3 --repeats 3
	$(BIN)/python benchmarks/cell_vs_simpy.py --baseline $(BASELINE) --hours 24 --repeats 1
	$(BIN)/python benchmarks/drill_runs_bench.py --baseline $(BASELINE) --runs 20
	$(BIN)/python benchmarks/ensemble_bench.py --members 1,4,16,32 --steps 600
	$(BIN)/python benchmarks/drill_runs_bench.py --runs 32 --executor serial --workers 1 --batch 1,32
