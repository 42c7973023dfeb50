"""The admin key: one rule for every command that serves the admin API or the dashboard
(:func:`resolve_admin_key`), and the key file readable only by its owner that tether
keeps when the operator gives none (``tether serve``'s ``.tether/admin_key``,
``tether train``'s ``runs/admin_key``): made once, reused at every later start, so the
key stays the same across restarts and the dashboard's login keeps working."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from tether.errors import UserError

from ._config import is_loopback

__all__ = ["ADMIN_KEY_VAR", "AdminKey", "admin_key_file", "resolve_admin_key"]

#: The environment variable that gives the admin key; it wins over ``gateway.admin_key``.
ADMIN_KEY_VAR = "TETHER_ADMIN_KEY"


@dataclass(frozen=True)
class AdminKey:
    """An admin key and how its user gets it (``how``: ``$TETHER_ADMIN_KEY``,
    ``gateway.admin_key of the config``, ``cat runs/admin_key``)."""

    value: str = field(repr=False)
    how: str
    #: The file tether keeps the key in (mode 600); None when the operator gave the key.
    path: Path | None = None


def resolve_admin_key(host: str, folder: Path, configured: str | None = None) -> AdminKey:
    """The admin key of a server bound to ``host``, the same for ``tether train``, ``serve``
    and ``dashboard`` (docs/dashboard.md, "Log in"):

    1. ``TETHER_ADMIN_KEY`` when set: the operator's, for this shell or deployment, as an
       API key in the environment overrides one in a config file;
    2. else ``configured``, the config's ``gateway.admin_key``;
    3. else, on a loopback bind, the key in ``folder/admin_key`` (:func:`admin_key_file`);
    4. else a :class:`~tether.errors.UserError` naming the fix: off loopback the key must
       be one the operator knows.
    """
    given = os.environ.get(ADMIN_KEY_VAR)
    if given:
        return AdminKey(given, f"${ADMIN_KEY_VAR}")
    if configured:
        return AdminKey(configured, "gateway.admin_key of the config")
    if not is_loopback(host):
        raise UserError(
            f"refusing to bind {host} without an admin key: set {ADMIN_KEY_VAR} "
            f"(e.g. export {ADMIN_KEY_VAR}=$(openssl rand -hex 32)) or bind 127.0.0.1"
        )
    path = folder / "admin_key"
    return AdminKey(admin_key_file(path), f"cat {path}", path)


def admin_key_file(path: Path) -> str:
    """The key in ``path``; made (mode 600) when the file is missing or empty. A file
    others can read is refused with the fix."""
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise UserError(
                f"admin key file {path} is readable by others (mode {mode:o}): "
                f"run chmod 600 {path}, or delete it to get a new key"
            )
        key = path.read_text().strip()
        if key:
            return key
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    # written aside, then linked into place: two runs starting at once agree on one key
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    try:
        if path.exists():  # an empty file: replaced
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    except FileExistsError:  # another process made it first: use theirs
        return path.read_text().strip() or key
    finally:
        tmp.unlink(missing_ok=True)
    return key
