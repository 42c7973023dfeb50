"""Shared fixtures: the starter model (built once per session), gateways, servers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ADMIN_KEY


@pytest.fixture(scope="session")
def starter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The untrained starter model + tokenizer, built into a session cache."""
    cache = Path(os.environ.get("TETHER_TEST_CACHE") or tmp_path_factory.mktemp("starter-cache"))
    try:
        from tether.starter import build_starter

        return Path(build_starter(cache_dir=cache, warm=False))
    except ModuleNotFoundError as exc:
        # dev/py310.sh runs the gateway and runner tests where torch cannot be installed:
        # they use the starter tokenizer that an environment with torch built into the cache.
        built = sorted(cache.glob("base-*"), key=lambda p: p.stat().st_mtime)
        if exc.name != "torch" or not built:
            raise
        return built[-1]


@pytest.fixture(scope="session")
def tokenizer(starter_dir: Path) -> Any:
    try:
        from tether.models import load_tokenizer
    except ModuleNotFoundError as exc:  # no torch (dev/py310.sh): what load_tokenizer does
        if exc.name != "torch":
            raise
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(starter_dir))
    return load_tokenizer(starter_dir)


@pytest.fixture(scope="module")
def model(starter_dir: Path) -> Any:
    """The starter model, loaded once per test module (a module may define its own
    ``model``); tests that train must load their own copy."""
    from tether.models import load_model

    return load_model(starter_dir)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    from tether.store import Store

    s = Store(tmp_path / "traces.sqlite")
    yield s
    s.close()


@pytest.fixture
def make_gateway(store: Any, tokenizer: Any):
    """Build a Gateway over an engine with test defaults (admin key set, loopback)."""
    from tether.gateway import Gateway, GatewayConfig

    def make(engine: Any, **overrides: Any) -> Any:
        cfg = GatewayConfig(admin_key=ADMIN_KEY, **overrides)
        return Gateway(engine, overrides.pop("tokenizer", tokenizer), store, cfg)

    return make


from tests.dashboard_stores import runs_dir  # noqa: E402, F401  two run folders (dashboard tests)
from tests.tracking_run import tracked  # noqa: E402, F401  the tracked run (tests/tracking_run.py)
