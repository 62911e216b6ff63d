"""Profiles of every free parameter of the bundled demo fit: time, solver calls, candidates/s.

Fits the bundled demo (``kingen fit --demo``) unless ``--run`` names its run file, then
profiles all ten free parameters at ``--points`` points each (the goal of issue #15: 25
points in 2 minutes on an H100, in 15 minutes on 2 CPU cores).

    python -m benchmarks profile_demo --points 25 --backend cpu
    python -m benchmarks profile_demo --points 25 --backend cuda     (on the GPU machine)

(``benchmarks/results/<device>/profile_demo.json``; ``--out FILE`` to choose).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from kingen.fitting.config import demo_config  # noqa: E402
from kingen.runs.fit import fit  # noqa: E402
from kingen.runs.profile import profile_run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="the demo's run file (default: fit it first)")
    ap.add_argument("--points", type=int, default=25)
    ap.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--note", default="", help="a remark for the JSON (e.g. a shared machine)")
    add_output_options(ap, "profile_demo")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "demo.h5"
        fit_s = None
        if args.run is not None:
            shutil.copy(args.run, run)  # the profiles are written into the copy
        else:
            t0 = time.perf_counter()
            fit(demo_config(), progress=False, overrides={"output": str(run),
                                                          "backend": args.backend})
            fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = profile_run(run, points=args.points, backend=args.backend, restart=True,
                             progress=True)
        wall = time.perf_counter() - t0
    solver_s = result.extra["solver_s"]
    out = {"provenance": provenance("profile_demo", argv), "backend": args.backend,
           "points": args.points,
           "parameters": len(result.rows), "wall_s": wall, "fit_s": fit_s,
           "steps": result.steps, "solver_calls": result.solver_calls,
           "candidates": result.candidates,
           "candidates_per_s": result.candidates / max(wall, 1e-9),
           "solver_s": solver_s,
           "solver_candidates_per_s": result.candidates / max(solver_s, 1e-9),
           "goal": "25 points: <= 120 s on an H100, <= 900 s on 2 CPU cores (issue #15)",
           "note": args.note, "table": result.summary(), "rows": result.rows}
    write(out, output_path(args, "profile_demo"))
    print(result.summary())
    print(f"{result.steps} steps, {result.solver_calls} solver calls, {result.candidates} "
          f"candidates in {wall:.0f} s ({out['candidates_per_s']:.0f} candidates/s; solver "
          f"{solver_s:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
