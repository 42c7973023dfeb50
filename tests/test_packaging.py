"""The package as users install it: one version, the extras, and the install hints.

- ``tether.__version__`` is the version (pyproject reads it), equal to the installed
  metadata and to what the gateway's OpenAPI document shows; ``import tether`` imports
  nothing else;
- the ``all`` extra names every extra a user may want: all of them but vllm (its own
  torch and CUDA stack), dev and docs (for working on tether itself);
- every "pip install X" hint in tether/ names an extra, ``'tether[X]'``, or a package
  tether itself depends on; trainer.lora without peft says which extra.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import tether
from tether.engine.testing import NullEngine
from tether.gateway import create_app
from tether.tracking.config import SINKS

from .conftest import ADMIN_KEY

ROOT = Path(__file__).resolve().parents[1]
NOT_IN_ALL = {"all", "vllm", "dev", "docs"}


def _pyproject() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_the_installed_metadata() -> None:
    # stale after a version change until `pip install -e . --no-deps` (make setup) reruns
    assert tether.__version__ == importlib.metadata.version("tether")
    assert re.fullmatch(r"\d+\.\d+\.\d+", tether.__version__)
    assert "version" in _pyproject()["project"]["dynamic"]


def test_import_tether_imports_nothing_else() -> None:
    code = (
        "import sys, tether; "
        "print(sorted(m for m in sys.modules if m.startswith(('tether.', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


async def test_the_gateways_openapi_shows_the_version(make_gateway: Any) -> None:
    app = create_app(make_gateway(NullEngine(token_ids=[40])))
    assert app.version == tether.__version__
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r = await c.get("/openapi.json", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert r.json()["info"]["version"] == tether.__version__


def test_the_all_extra_names_every_user_extra() -> None:
    extras = _pyproject()["project"]["optional-dependencies"]
    assert sorted(extras["all"]) == sorted(f"tether[{e}]" for e in set(extras) - NOT_IN_ALL)


def _hints() -> list[tuple[str, str]]:
    """(file, what it tells the user to pip install) for every hint in tether/."""
    found = [
        (str(p.relative_to(ROOT)), m)
        for p in sorted((ROOT / "tether").rglob("*.py"))
        for m in re.findall(r"pip install (\S+?)[`\"),]", p.read_text())
    ]
    return found + [("tether/tracking/config.py SINKS", v) for v in SINKS.values()]


def test_every_install_hint_names_an_extra_or_a_dependency() -> None:
    project = _pyproject()["project"]
    deps = {re.split(r"[<>=\[; ]", d)[0] for d in project["dependencies"]}
    hints = _hints()
    assert len(hints) >= 8, hints  # the scan finds them
    for where, target in hints:
        if target == "%s":  # filled in from SINKS, checked on its own
            continue
        extra = re.fullmatch(r"'tether\[(\w+)\]'", target)
        assert (extra and extra[1] in project["optional-dependencies"]) or target in deps, (
            f"{where}: pip install {target}"
        )


def test_lora_without_peft_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from tether.errors import UserError
    from tether.trainer import LoraConfig, PolicyTrainer, TrainerConfig

    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ModuleNotFoundError
    cfg = TrainerConfig(lora=LoraConfig(r=4, alpha=8))
    with pytest.raises(UserError, match=r"^trainer.lora needs peft: pip install 'tether\[lora\]'$"):
        PolicyTrainer(torch.nn.Linear(2, 2), cfg)
