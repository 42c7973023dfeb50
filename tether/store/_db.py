"""Connections to one SQLite file: one writer, a pool of readers.

Every write goes through the single writer connection, held under a lock for
one ``BEGIN IMMEDIATE … COMMIT`` transaction, so writes from many threads are
serialized in the process and never meet "database is locked" from each
other; ``BEGIN IMMEDIATE`` takes the file's write lock up front, so writers in
other processes wait (``busy_timeout``) instead of failing on a lock upgrade.

An event loop hands its writes to the writer thread (:meth:`Database.submit`, a
single thread made on first use): they run there one at a time, in the order
sent, under the same lock, while the loop goes on serving.

Reads use their own connections (``query_only``) from a small pool. In WAL
mode a reader sees the last committed state and never a half-done write, and
it does not wait for the writer.

A read-only database (``read_only=True``: the dashboard, over a file a
training run is writing) opens no writer at all: its connections are opened
``mode=ro``, it never migrates, and it refuses a file whose schema version is
not the one this tether writes. With ``peek`` as well (a one-off look, such as
whether a run folder holds a run) it creates no file either: a WAL file that no
connection holds has no ``-wal`` beside it, and a ``mode=ro`` reader would make
an empty ``-wal`` and ``-shm`` and leave them; it is then opened
``immutable=1`` instead (nothing is being written to it). When a ``-wal`` is
there, those files exist already and the plain read-only open is used.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from tether.errors import UserError
from tether.store._errors import StoreError
from tether.store._migrations import MIGRATIONS, migrate

__all__ = ["SYNCHRONOUS", "Database"]

SYNCHRONOUS = ("NORMAL", "FULL")

T = TypeVar("T")


class Database:
    """The connections of one :class:`~tether.store.Store`."""

    def __init__(
        self,
        path: str | Path,
        synchronous: str,
        busy_timeout_s: float,
        read_only: bool = False,
        peek: bool = False,
    ) -> None:
        mode = str(synchronous).upper()
        if mode not in SYNCHRONOUS:
            raise UserError(
                f"synchronous ({synchronous!r}) must be one of {', '.join(SYNCHRONOUS)}; "
                "use NORMAL (default, durable against process crashes) or FULL "
                "(also against power loss)"
            )
        if not busy_timeout_s > 0:
            raise UserError(f"busy_timeout_s ({busy_timeout_s}) must be > 0")
        self.path = str(path)
        self.read_only = read_only or peek
        #: immutable=1: a peek at a file that no connection holds (no -wal beside it)
        self._immutable = peek and not Path(f"{path}-wal").exists()
        self.synchronous = mode
        self._busy_ms = int(busy_timeout_s * 1000)
        self._lock = threading.Lock()
        self._pool_lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._readers: list[sqlite3.Connection] = []
        self._thread: ThreadPoolExecutor | None = None  # the writer thread (submit)
        self._closed = False
        self.migrations_run = 0
        if self.read_only:
            self._open_read_only()
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._writer = self._connect()
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the store at {self.path}: {e}") from e
        try:
            journal = self._writer.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if journal.lower() != "wal":
                raise StoreError(f"{self.path}: could not switch to WAL (journal_mode={journal})")
            self.migrations_run = migrate(self._writer)
        except BaseException as e:
            self._writer.close()
            if isinstance(e, sqlite3.Error):
                raise StoreError(f"cannot open the store at {self.path}: {e}") from e
            raise

    def _open_read_only(self) -> None:
        if not Path(self.path).is_file():
            raise StoreError(f"no trace store at {self.path}")
        with self.read() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != len(MIGRATIONS):
            self.close()
            fix = (
                "upgrade tether to read it"
                if version > len(MIGRATIONS)
                else f"migrate it first: tether rollouts list --store {self.path}"
            )
            raise StoreError(
                f"the store at {self.path} is at schema version {version}, this tether "
                f"reads version {len(MIGRATIONS)} and opened it read-only: {fix}"
            )

    def _connect(self, *, query_only: bool = False) -> sqlite3.Connection:
        query = "?mode=ro&immutable=1" if self._immutable else "?mode=ro"
        target = Path(self.path).resolve().as_uri() + query if self.read_only else self.path
        conn = sqlite3.connect(
            target,
            uri=self.read_only,
            isolation_level=None,  # autocommit; transactions are explicit
            check_same_thread=False,  # guarded by the lock (writer) or the pool (readers)
            timeout=self._busy_ms / 1000,
            cached_statements=256,
        )
        conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        if query_only:
            conn.execute("PRAGMA query_only = ON")
        return conn

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store at {self.path} is closed")

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on the writer: committed on exit, rolled back on error."""
        if self.read_only:
            raise StoreError(f"the store at {self.path} was opened read-only; nothing is written")
        with self._lock:
            self._check_open()
            conn = self._writer
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise StoreError(f"store write failed ({self.path}): {e}") from e
                raise

    def submit(self, write: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``write(*args)`` (a write method of the store) on the writer thread; the writes
        sent here run one at a time, in the order sent. StoreError once closed."""
        with self._pool_lock:
            self._check_open()
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="tether-store-writer")
            return self._thread.submit(write, *args)

    @contextmanager
    def read(self, *, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
        """A pooled reader; with ``snapshot`` all its queries see one committed state."""
        self._check_open()
        with self._pool_lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            try:
                conn = self._connect(query_only=True)
            except sqlite3.Error as e:
                raise StoreError(f"cannot open a reader on {self.path}: {e}") from e
            with self._pool_lock:
                self._readers.append(conn)
        try:
            if snapshot:
                conn.execute("BEGIN")
            yield conn
        except sqlite3.Error as e:
            raise StoreError(f"store read failed ({self.path}): {e}") from e
        finally:
            try:
                if conn.in_transaction:
                    conn.execute("COMMIT")
            except sqlite3.ProgrammingError:  # closed under us by close()
                pass
            with self._pool_lock:
                if not self._closed:
                    self._idle.append(conn)

    def close(self) -> None:
        """Close every connection, after the writes sent to the writer thread; later use
        raises :class:`StoreError`. Idempotent."""
        with self._pool_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=True)
        with self._lock, self._pool_lock:
            if self._closed:
                return
            self._closed = True
            for conn in self._readers:
                conn.close()
            self._readers.clear()
            self._idle.clear()
            if self.read_only:
                return
            with suppress(sqlite3.Error):
                self._writer.execute("PRAGMA optimize")
            self._writer.close()
