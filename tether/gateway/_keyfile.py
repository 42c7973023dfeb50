"""The admin key kept in a file readable only by its owner (``tether serve``'s
``.tether/admin_key``, ``tether train``'s ``runs/admin_key``): made once, reused at
every later start, so the key stays the same across restarts and the dashboard's
login keeps working."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from tether.errors import UserError

__all__ = ["admin_key_file"]


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
