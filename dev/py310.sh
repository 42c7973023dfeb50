#!/usr/bin/env bash
# Python 3.10 check (requires-python >= 3.10): the gateway and runner tests in a throwaway
# venv. No CPU torch wheel for 3.10 is reachable here (PyPI's Linux torch is the CUDA build,
# ~500 MB plus the nvidia wheels), so torch is left out: the tests run with the starter
# tokenizer that an environment with torch built into $TETHER_TEST_CACHE (tests/conftest.py
# falls back to it), and test files that import torch (test_gateway_openai.py,
# test_security_secrets.py, ...) and the Ray training step are not in the default list.
#
#   dev/py310.sh                       # set up $VENV once, run the default test files
#   dev/py310.sh tests/test_gate.py    # other test files
# Build the starter first (any test run with the main env does it), e.g.
#   TETHER_TEST_CACHE=/tmp/tether-test-cache .venv/bin/python -m pytest -q tests/test_gate.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY310=${PY310:-/root/.pyenv/versions/3.10.13/bin/python3.10}
VENV=${VENV:-/tmp/py310}
export TETHER_TEST_CACHE=${TETHER_TEST_CACHE:-/tmp/tether-test-cache}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY310" -m venv "$VENV"
  "$VENV/bin/pip" install -q "transformers>=4.51" "tokenizers>=0.21" "safetensors>=0.4" \
    "fastapi>=0.115" "uvicorn>=0.30" "httpx>=0.27" "pydantic>=2.7" "typer>=0.12" "rich>=13" \
    "openai>=1.60" "pyyaml>=6" jinja2 "pytest>=8" "pytest-asyncio>=0.24" "psutil>=5.9" \
    "hypothesis>=6" "kubernetes>=30" "urllib3>=2.3" "ray>=2.30"
  "$VENV/bin/pip" install -q --no-deps -e .
fi
if [ $# -eq 0 ]; then
  set -- tests/test_gate.py tests/test_gateway_api.py tests/test_async_gate.py \
    tests/test_security_gateway.py tests/test_runner.py tests/test_runner_hardening.py \
    tests/test_runner_inprocess.py tests/test_runner_kubernetes.py tests/test_runner_ray.py \
    --deselect tests/test_runner_ray.py::test_one_training_step_with_rollouts_as_ray_tasks
fi
PYTHONPATH=$PWD exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
