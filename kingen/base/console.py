"""The live progress line that fits and batches print while they run."""

from __future__ import annotations

import sys
from typing import TextIO


class LiveLine:
    """One line kept up to date: rewritten in place (``\\r``) on a terminal, one plain line
    per update in a log file; :meth:`message` prints a line of its own.

    Parameters
    ----------
    stream
        Where to write (default standard error).
    enabled
        False: print nothing.
    """

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._width = 0

    def show(self, text: str) -> None:
        """Replace the live line with ``text`` (a new line when not on a terminal)."""
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + text + " " * max(self._width - len(text), 0))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (ends the live line first)."""
        if not self.enabled:
            return
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the live line."""
        if self.enabled and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def duration(seconds: float) -> str:
    """A short human duration.

    >>> duration(42), duration(125), duration(7384)
    ('42s', '2m05s', '2h03m')
    """
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
