"""The bounded tail of a stream, kept by every runner that captures an agent's output.

Standard library only: the pool worker, run as a script, loads this file by path.
"""

from __future__ import annotations

__all__ = ["Tail"]


class Tail:
    """The last ``cap`` bytes of a stream, and how many bytes were dropped before them."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.dropped = 0
        self._buf = bytearray()

    def add(self, data: bytes) -> None:
        self._buf += data
        excess = len(self._buf) - self.cap
        if excess > 0:
            del self._buf[:excess]
            self.dropped += excess

    def text(self) -> str:
        """The kept bytes as text, with a marker saying how much was cut off in front."""
        body = self._buf.decode("utf-8", errors="replace")
        return f"[... {self.dropped} bytes truncated ...]\n{body}" if self.dropped else body

    def last_line(self) -> str | None:
        """The last non-empty line (stripped), or None: the agent's final answer."""
        for line in reversed(self._buf.decode("utf-8", errors="replace").splitlines()):
            if line.strip():
                return line.strip()
        return None
