# One set of commands for people and CI. Each target creates or reuses .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test demo lint fmt bench clean

$(STAMP): pyproject.toml dev/constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c dev/constraints.txt torch
	$(BIN)/python -m pip install -q -c dev/constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check tether tests benchmarks examples
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/tether demo

lint: $(STAMP)
	$(BIN)/ruff check tether tests benchmarks examples
	$(BIN)/ruff format --check tether tests benchmarks examples

fmt: $(STAMP)
	$(BIN)/ruff format tether tests benchmarks examples
	$(BIN)/ruff check --fix tether tests benchmarks examples

bench: $(STAMP)
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
