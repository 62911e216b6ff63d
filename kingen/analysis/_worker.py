"""Process that ncu profiles: rebuild one case by name and launch it a given number of times.

Usage: ``python -m kingen.analysis._worker --target T --case NAME --size S --launches N``.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kingen.analysis._worker")
    p.add_argument("--target", required=True)
    p.add_argument("--case", required=True)
    p.add_argument("--size", default="default")
    p.add_argument("--launches", type=int, default=2)
    a = p.parse_args(argv)
    from kingen.analysis._gpu import synchronize
    from kingen.analysis.kernels.base import cases_for

    cases = [c for c in cases_for(a.target, a.size) if c.name == a.case]
    if not cases:
        print(f"no case {a.case!r} in target {a.target!r}", file=sys.stderr)
        return 2
    for _ in range(a.launches):
        cases[0].launch()
    synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
