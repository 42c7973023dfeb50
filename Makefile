# One set of commands for people and CI. Each target creates or reuses .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test test-slow test-all demo lint fmt bench clean

# The CPU build of torch: on Linux, PyPI's torch wheel is the CUDA build, so pass
# TORCH_INDEX=https://download.pytorch.org/whl/cpu there (or have pip configured
# with a local CPU wheel). The check after the install stops with the fix if a CUDA
# build came in; ALLOW_CUDA_TORCH=1 keeps one on purpose (GPU machines).
TORCH_INDEX ?=
ALLOW_CUDA_TORCH ?=

$(STAMP): pyproject.toml dev/constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c dev/constraints.txt $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch
	@test -n "$(ALLOW_CUDA_TORCH)" || $(BIN)/python -c "import sys, torch; sys.exit(0 if torch.version.cuda is None else \
	  'error: a CUDA build of torch ' + torch.__version__ + ' was installed; for the CPU build run: ' \
	  '$(BIN)/pip uninstall -y torch && make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu ' \
	  '(or make setup ALLOW_CUDA_TORCH=1 to keep it)')"
	$(BIN)/python -m pip install -q -c dev/constraints.txt -e '.[dev]'
	touch $(STAMP)
	@echo "tether is installed in $(VENV): run '. $(VENV)/bin/activate' to put tether on your PATH"

setup: $(STAMP)

# The default suite (pyproject: -m 'not slow'), about 8 minutes on 2 cores; test-slow: the
# end-to-end runs of ~10 s or more each (about 10 minutes); CI runs both.
test: $(STAMP)
	$(BIN)/ruff check tether tests benchmarks examples
	$(BIN)/ruff format --check tether tests benchmarks examples
	$(BIN)/pyright
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

test-all: $(STAMP)
	$(BIN)/ruff check tether tests benchmarks examples
	$(BIN)/ruff format --check tether tests benchmarks examples
	$(BIN)/pyright
	$(BIN)/python -m pytest -q -m 'slow or not slow'

demo: $(STAMP)
	$(BIN)/tether demo

lint: $(STAMP)
	$(BIN)/ruff check tether tests benchmarks examples
	$(BIN)/ruff format --check tether tests benchmarks examples
	$(BIN)/pyright

fmt: $(STAMP)
	$(BIN)/ruff format tether tests benchmarks examples
	$(BIN)/ruff check --fix tether tests benchmarks examples

bench: $(STAMP)
	for b in benchmarks/[!_]*.py; do \
		case $$b in *vs_trl.py) continue;; esac; \
		$(BIN)/python $$b || exit 1; \
	done
	@echo "benchmarks/vs_trl.py needs TRL in a venv of its own: see benchmarks/README.md"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
