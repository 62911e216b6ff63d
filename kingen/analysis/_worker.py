"""Process that ncu profiles: rebuild one case by name and launch it a given number of times.

Usage: ``python -m kingen.analysis._worker --target T --case NAME [--size S] [--launches N]``;
the solver's cases (``--target rk4``) also take ``--model``, ``--precision``,
``--candidates``, ``--protocols`` and ``--variant`` (a LaunchConfig as JSON), so that only
the one variant is built and compiled.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kingen.analysis._worker")
    p.add_argument("--target", required=True)
    p.add_argument("--case", required=True)
    p.add_argument("--size", default="default")
    p.add_argument("--launches", type=int, default=2)
    p.add_argument("--model")
    p.add_argument("--precision")
    p.add_argument("--candidates", type=int, default=16384)
    p.add_argument("--protocols", default="desensitization")
    p.add_argument("--variant", help="LaunchConfig fields as JSON")
    a = p.parse_args(argv)
    from kingen.analysis.gpu import synchronize
    from kingen.analysis.kernels.base import cases_for

    rk4 = None
    if a.target == "rk4":
        from kingen.solve.cuda import LaunchConfig

        rk4 = {"model": a.model, "n_candidates": a.candidates, "precision": a.precision,
               "protocols": a.protocols,
               "variants": (LaunchConfig(**json.loads(a.variant)),) if a.variant else None}
    cases = [c for c in cases_for(a.target, a.size, rk4) if c.name == a.case]
    if not cases:
        print(f"no case {a.case!r} in target {a.target!r}", file=sys.stderr)
        return 2
    for _ in range(a.launches):
        cases[0].launch()
    synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
