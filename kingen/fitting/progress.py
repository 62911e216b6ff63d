"""A fit's live :class:`Progress` line.

Examples
--------
>>> import io
>>> p = Progress(10, stream=io.StringIO())
>>> p.update(3, 0.5, 0.8, 1200.0, 65.0)
>>> p.stream.getvalue()
'gen 3/10  best 0.5  median 0.8  1,200 cand/s  ETA 1m05s\\n'
"""

from __future__ import annotations

import math
from typing import TextIO

from kingen.base.console import LiveLine, duration


class Progress(LiveLine):
    """A fit's live progress line (see :class:`kingen.base.console.LiveLine`)."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        super().__init__(stream, enabled)
        self.total = total

    def starting(self, generation: int) -> None:
        """Say what the first generation's wait is, before its figures come."""
        self.show(f"gen {generation}/{self.total}  solving (a scheme's first fit on this "
                  "machine compiles its solver first)")

    def update(self, generation: int, best: float, median: float, rate: float, eta_s: float
               ) -> None:
        """Show one generation's figures."""
        if not self.enabled:
            return
        eta = "?" if not math.isfinite(eta_s) else duration(eta_s)
        self.show(f"gen {generation}/{self.total}  best {best:.5g}  median {median:.5g}  "
                  f"{rate:,.0f} cand/s  ETA {eta}")


