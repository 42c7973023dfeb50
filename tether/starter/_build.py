"""Build, cache and load the starter model.

A starter folder is an ordinary Hugging Face folder (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``,
``generation_config.json``) plus ``tether_starter.json``, which marks it and
records its recipe. Folders live in ``<cache>/<hash>``, where ``<cache>`` is
``$TETHER_CACHE/starter`` (default ``~/.cache/tether/starter``) and
``<hash>`` is a hash of the recipe, so a changed recipe never reuses a stale
build. A folder is written in a temporary directory and renamed into place,
under a file lock, so concurrent builders never see (or make) half a folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tether.models import load_model, load_tokenizer
from tether.starter import _tokenizer, calc
from tether.starter._errors import StarterError
from tether.starter._model import ModelRecipe, build_model, count_parameters, stop_token_ids
from tether.starter._template import CHAT_TEMPLATE
from tether.starter._tokenizer import PRETOKENIZE_PATTERN, TokenizerRecipe, build_tokenizer
from tether.starter._warmup import WarmupRecipe

__all__ = [
    "MARKER_FILE",
    "Recipe",
    "build_starter",
    "cache_root",
    "is_starter",
    "starter_path",
]

logger = logging.getLogger(__name__)

MARKER_FILE = "tether_starter.json"
# Bump when code changes what a recipe builds in a way the key does not see
# (the key already covers the recipes, the template, the calc generators' output
# and the tokenizer's word list).
RECIPE_VERSION = 1


@dataclass(frozen=True)
class Recipe:
    """Everything a starter build depends on."""

    tokenizer: TokenizerRecipe = field(default_factory=TokenizerRecipe)
    model: ModelRecipe = field(default_factory=ModelRecipe)
    warmup: WarmupRecipe = field(default_factory=WarmupRecipe)

    def key(self, warm: bool) -> dict[str, Any]:
        """The JSON the cache hash is taken of."""
        key: dict[str, Any] = {
            "version": RECIPE_VERSION,
            "tokenizer": self.tokenizer.as_dict(),
            "model": self.model.as_dict(),
            "pretokenize": PRETOKENIZE_PATTERN,
            "chat_template": CHAT_TEMPLATE,
            "system_prompt": calc.SYSTEM_PROMPT,
            "tool": calc.CALCULATOR_TOOL,
            "calc": calc.fingerprint(),  # the corpus and the warm-up data
            "words": _tokenizer.fingerprint(),
        }
        if warm:
            # A warm-up's floats depend on the kernels: same torch, same CPU model, same
            # threads (in the recipe) give the same weights; anything else is another build.
            key["warmup"] = self.warmup.as_dict()
            key["torch"] = torch.__version__
            key["cpu"] = torch.backends.cpu.get_cpu_capability()
            key["cpu_model"] = cpu_model()
        return key

    def digest(self, warm: bool) -> str:
        blob = json.dumps(self.key(warm), sort_keys=True).encode()
        return ("warm-" if warm else "base-") + hashlib.sha256(blob).hexdigest()[:16]


def cpu_model() -> str:
    """The CPU's vendor and model name (``AuthenticAMD AMD EPYC``). Torch's matmuls run
    in MKL, which picks its kernels by CPU vendor and model, not only by instruction set:
    an Intel and an AMD CPU that torch both calls ``AVX512`` sum in another order, and
    a warm-up of 1,200 steps then ends on other weights (measured: MKL's ``COMPATIBLE``
    code path vs its default on one machine gives other weights after 30 steps; the
    hash seed and the caller's thread count change nothing)."""
    vendor = name = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key.strip() == "model name" and not name:
                    name = value.strip()
                if vendor and name:
                    break
    except OSError:  # not Linux
        pass
    return " ".join(p for p in (vendor, name or platform.processor() or platform.machine()) if p)


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where starter folders live: ``cache_dir``, else ``$TETHER_CACHE/starter``,
    else ``~/.cache/tether/starter``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("TETHER_CACHE")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "tether"
    return base / "starter"


def starter_path(
    cache_dir: str | os.PathLike[str] | None = None,
    warm: bool = False,
    recipe: Recipe | None = None,
) -> Path:
    """The folder a build would use (it may not exist yet)."""
    return cache_root(cache_dir) / (recipe or Recipe()).digest(warm)


def is_starter(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a folder built by :func:`build_starter`."""
    return (Path(path) / MARKER_FILE).is_file()


def build_starter(
    cache_dir: str | os.PathLike[str] | None = None,
    warm: bool = False,
    recipe: Recipe | None = None,
) -> Path:
    """Build the starter model (untrained, or warmed up when ``warm``) unless
    cached, and return its folder. The untrained build takes seconds; the
    warm-up a few minutes on two CPU cores."""
    recipe = recipe or Recipe()
    final = starter_path(cache_dir, warm, recipe)
    clean_stale(final.parent)
    if is_starter(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    base = build_starter(cache_dir, warm=False, recipe=recipe) if warm else None
    with _locked(final.parent / f".{final.name}.lock"):
        if is_starter(final):  # another process built it while we waited
            return final
        with _staging(final) as tmp:
            info: dict[str, Any] = {"tether_starter": 1, "hash": final.name, "warm": warm}
            if base is None:
                tokenizer = build_tokenizer(recipe.tokenizer)
                model = build_model(recipe.model, tokenizer)
            else:
                from tether.starter._warmup import warm_up

                tokenizer = load_tokenizer(base)
                model = load_model(base)
                info["warmup_stats"] = warm_up(model, tokenizer, recipe.warmup)
                model.eval()
            tokenizer.save_pretrained(tmp)
            model.save_pretrained(tmp)
            info["weights_sha256"] = _sha256(tmp / "model.safetensors")
            info["parameters"] = count_parameters(model)
            info["stop_token_ids"] = stop_token_ids(tokenizer)
            info["recipe"] = recipe.key(warm)
            (tmp / MARKER_FILE).write_text(json.dumps(info, indent=2) + "\n")
    logger.info("built starter model at %s", final)
    return final


def _sha256(path: Path) -> str:
    """The file's sha256: two builds of one recipe hash are the same model if it matches."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive inter-process lock (no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _staging(final: Path) -> Iterator[Path]:
    """A temporary folder next to ``final``, renamed onto it on success."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
    try:
        yield tmp
        if final.exists():  # a stale folder without a marker: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


STALE_AFTER_S = 3600.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_stale(root: Path) -> list[Path]:
    """Remove staging folders left by killed builds: ``.<hash>.tmp-<pid>-*`` whose
    process is gone, or (no pid in the name) older than an hour. Returns them."""
    removed = []
    for tmp in root.glob(".*.tmp-*") if root.is_dir() else []:
        owner = tmp.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        try:
            stale = not _pid_alive(int(owner))
        except ValueError:
            try:
                stale = time.time() - tmp.stat().st_mtime > STALE_AFTER_S
            except OSError:  # removed meanwhile
                continue
        if stale and tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            logger.info("removed %s, left by a build that was killed", tmp)
            removed.append(tmp)
    return removed


def read_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The contents of a starter folder's marker file."""
    try:
        return json.loads((Path(path) / MARKER_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise StarterError(f"{path} is not a starter folder ({MARKER_FILE} unreadable)") from exc
