"""Resting occupancies of a batch: kingen's parallel elimination against NumPy's solve.

    python -m benchmarks rest_state --model robert_howe_2003 --population 65536

(``benchmarks/results/<device>/rest_state.json``; ``--out FILE`` to choose).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from benchmarks.solver import candidates  # noqa: E402
from kingen.scheme import Scheme  # noqa: E402
from kingen.solve.rest import rest_occupancy_batch  # noqa: E402


def best_of(fn, repeats: int) -> float:
    """Fastest of ``repeats`` wall-clock runs, seconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="robert_howe_2003")
    ap.add_argument("--population", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=3)
    add_output_options(ap, "rest_state")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    scheme = Scheme.load(ROOT / "models" / f"{args.model}.toml")
    params = scheme.complete(candidates(scheme, args.population))
    rest_occupancy_batch(scheme, params[:128])  # compile
    ours = best_of(lambda: rest_occupancy_batch(scheme, params), args.repeats)
    numpy = best_of(lambda: scheme.rest_occupancy(params), args.repeats)
    diff = float(np.nanmax(np.abs(rest_occupancy_batch(scheme, params)
                                  - scheme.rest_occupancy(params))))
    out = {"provenance": provenance("rest_state", argv), "model": args.model,
           "population": args.population, "cpus": os.cpu_count(), "kingen_s": ours,
           "numpy_s": numpy, "max_abs_difference": diff}
    write(out, output_path(args, "rest_state"))
    print(f"{args.model}, {args.population} candidates: kingen {ours * 1e3:.0f} ms, NumPy "
          f"{numpy * 1e3:.0f} ms, largest difference {diff:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
