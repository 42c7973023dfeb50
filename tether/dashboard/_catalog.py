"""Which trace stores the dashboard shows, each under a short key used in its URLs.

``tether dashboard --dir runs`` shows every ``runs/NAME/traces.sqlite`` (key
``NAME``; a run folder made after the dashboard started appears on the next
page load); ``--store FILE`` shows one file. Stores are opened read-only
(:class:`tether.store.Store` with ``read_only=True``) on first use and kept open.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from tether.store import Store, StoreError

__all__ = ["DEFAULT_PORT", "STORE_FILE", "Catalog"]

STORE_FILE = "traces.sqlite"
#: ``tether dashboard``'s port when ``--port`` is not given (the gateway's is 8321).
DEFAULT_PORT = 8322
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


def _key(name: str) -> str:
    """A URL-safe key for a folder name (other characters become ``_``)."""
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip("._-")[:128]
    return key or "store"


class Catalog:
    """Store files by key: fixed files (``files``) and/or every run folder of ``runs_dir``."""

    def __init__(self, files: dict[str, Path] | None = None, runs_dir: Path | None = None):
        self._files = {_key(k): Path(v) for k, v in (files or {}).items()}
        self.runs_dir = runs_dir
        self._open: dict[str, tuple[Store, tuple[int, int]]] = {}
        self._lock = threading.Lock()

    @classmethod
    def of_file(cls, path: Path, key: str | None = None) -> Catalog:
        return cls({key or _key(path.parent.name or "store"): path})

    def paths(self) -> dict[str, Path]:
        """Every store file shown now, by key (fixed files first, then run folders by name)."""
        found = dict(self._files)
        if self.runs_dir is not None and self.runs_dir.is_dir():
            for db in sorted(self.runs_dir.glob(f"*/{STORE_FILE}")):
                found.setdefault(_key(db.parent.name), db)
        return found

    def store(self, key: str) -> Store | None:
        """The store under ``key`` (opened read-only on first use); None if there is none
        or it cannot be read. A file replaced since it was opened (``tether demo`` starts
        its run folder afresh) is opened again."""
        if not _KEY.fullmatch(key):
            return None
        path = self.paths().get(key)
        try:
            ident = None if path is None else _identity(path)
        except OSError:
            ident = None
        with self._lock:
            held = self._open.get(key)
            if held is not None and held[1] == ident:
                return held[0]
            if held is not None:  # gone or replaced: drop the old file's connections
                del self._open[key]
                held[0].close()
        if path is None or ident is None:
            return None
        try:
            store = Store(path, read_only=True)
        except StoreError:
            return None
        with self._lock:
            if key in self._open:  # another thread opened it meanwhile
                store.close()
                return self._open[key][0]
            self._open[key] = (store, ident)
            return store

    def close(self) -> None:
        with self._lock:
            for store, _ in self._open.values():
                store.close()
            self._open.clear()
