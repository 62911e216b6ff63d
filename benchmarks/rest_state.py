"""Resting occupancies of a batch: kingen's compiled elimination against NumPy's solve.

    python -m benchmarks rest_state --model robert_howe_2003 --population 65536

(``benchmarks/results/<device>/rest_state.json``; ``--out FILE`` to choose). It also times
kingen's two paths apart, on one thread and on all of numba's, each back to back and after
``--idle`` seconds of sleep before every run (as the host sleeps through a GPU solve, and
its threads with it): the evidence for :data:`kingen.solve.rest.PARALLEL_FROM_WORK`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from benchmarks.solver import candidates  # noqa: E402
from kingen.model.scheme import Scheme  # noqa: E402
from kingen.solve import rest  # noqa: E402
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
    ap.add_argument("--idle", type=float, default=0.3,
                    help="seconds slept before each run of the 'after idling' timings")
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
    paths = {}
    shipped = rest.PARALLEL_FROM_WORK
    try:
        for name, threshold in (("one_thread", 1 << 62), ("all_threads", 0)):
            rest.PARALLEL_FROM_WORK = threshold
            rest_occupancy_batch(scheme, params[:128])  # compile this path

            paths[name] = {
                "back_to_back_s": best_of(lambda: rest_occupancy_batch(scheme, params),
                                          args.repeats),
                "after_idle_s": _after_idle(lambda: rest_occupancy_batch(scheme, params),
                                            args.repeats, args.idle)}
    finally:
        rest.PARALLEL_FROM_WORK = shipped
    work = args.population * rest.resting_class(scheme).size ** 3
    out = {"provenance": provenance("rest_state", argv), "model": args.model,
           "population": args.population, "cpus": os.cpu_count(),
           "numba_threads": numba.get_num_threads(),
           "threading_layer": numba.threading_layer(), "kingen_s": ours,
           "numpy_s": numpy, "max_abs_difference": diff, "idle_s": args.idle,
           "paths": paths, "work": work, "parallel_from_work": shipped,
           "shipped_path": "all_threads" if work >= shipped else "one_thread"}
    write(out, output_path(args, "rest_state"))
    print(f"{args.model}, {args.population} candidates: kingen {ours * 1e3:.1f} ms "
          f"({out['shipped_path']}), NumPy {numpy * 1e3:.0f} ms, largest difference "
          f"{diff:.1e}")
    for name, t in paths.items():
        print(f"  {name}: {t['back_to_back_s'] * 1e3:.2f} ms back to back, "
              f"{t['after_idle_s'] * 1e3:.2f} ms after {args.idle:g} s idle "
              f"({numba.get_num_threads()} threads, {numba.threading_layer()})")
    return 0


def _after_idle(fn, repeats: int, idle: float) -> float:
    """Median of ``repeats`` wall-clock runs, each after ``idle`` seconds of sleep."""
    times = []
    for _ in range(repeats):
        time.sleep(idle)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


if __name__ == "__main__":
    raise SystemExit(main())
