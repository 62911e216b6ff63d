"""Profiles of every free parameter of the bundled demo fit: time, solver calls, candidates/s.

Fits the bundled demo (``kingen fit --demo``) unless ``--run`` names its run file, then
profiles all ten free parameters at ``--points`` points each (the goal of issue #15: 25
points in 2 minutes on an H100, in 15 minutes on 2 CPU cores). It records the candidates/s
of the Levenberg–Marquardt steps (solver call and the Gauss–Newton sums formed where the
traces are, :mod:`kingen.identify.gauss_newton`), in all and after the first step (which
also sets up Numba and loads the process's kernels), each step's time and candidates, the
device, and how the profile's optimum agrees with the fit's best (genes in decades, and χ²).

A process's first step also sets up Numba itself (its CPU target, and on the GPU the CUDA
context and target), once per process whatever it runs. ``--runtime-first`` does that
before the profile, timed apart (``runtime_setup_s``), so that the steps' figures hold
kingen's work alone, the first step's loading of kingen's own modules and kernels included.

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
from kingen.store import RunStore  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="the demo's run file (default: fit it first)")
    ap.add_argument("--points", type=int, default=25)
    ap.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--runtime-first", action="store_true",
                    help="set up Numba's targets (and the CUDA context) before the profile, "
                         "timed apart")
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
        with RunStore.open(run) as store:
            local = store.local_uncertainty() or {}
            device = store.config.get("device", "")
        setup = runtime_setup(args.backend) if args.runtime_first else None
        t0 = time.perf_counter()
        result = profile_run(run, points=args.points, backend=args.backend, restart=True,
                             progress=True)
        wall = time.perf_counter() - t0
    solver_s = result.extra["solver_s"]
    steps_s = result.extra.get("steps_s", 0.0)
    agree = _agreement(local, result.results)
    log = [[float(t), int(n)] for t, n in result.extra.get("step_log", [])]
    later_s, later_n = sum(t for t, _ in log[1:]), sum(n for _, n in log[1:])
    out = {"provenance": provenance("profile_demo", argv), "backend": args.backend,
           "points": args.points,
           "parameters": len(result.rows), "wall_s": wall, "fit_s": fit_s,
           "steps": result.steps, "solver_calls": result.solver_calls,
           "candidates": result.candidates,
           "candidates_per_s": result.candidates / max(wall, 1e-9),
           "solver_s": solver_s,
           "solver_candidates_per_s": result.candidates / max(solver_s, 1e-9),
           "device": result.extra.get("device") or device or args.backend,
           "lm_steps_s": steps_s,
           "lm_candidates_per_s": result.candidates / max(steps_s, 1e-9),
           # after the first step, which also sets up Numba and loads the process's kernels
           "lm_later_steps_s": later_s,
           "lm_later_candidates_per_s": later_n / max(later_s, 1e-9),
           "lm_step_log": log,
           "runtime_setup_s": setup,
           "fit_vs_profile": agree,
           "goal": "25 points: <= 120 s on an H100, <= 900 s on 2 CPU cores (issue #15)",
           "note": args.note, "table": result.summary(), "rows": result.rows}
    write(out, output_path(args, "profile_demo"))
    print(result.summary())
    print(f"{result.steps} steps, {result.solver_calls} solver calls, {result.candidates} "
          f"candidates in {wall:.0f} s ({out['candidates_per_s']:.0f} candidates/s; solver "
          f"{solver_s:.0f} s; LM steps {out['lm_candidates_per_s']:.0f} candidates/s, "
          f"{out['lm_later_candidates_per_s']:.0f} after the first)")
    print(f"fit vs profile: {agree}")
    return 0


def runtime_setup(backend: str) -> dict[str, float]:
    """Set up what Numba sets up once per process, and the seconds each part took: its CPU
    target (the genes-to-rates map and the host's sums are compiled CPU functions, on either
    backend); unless ``backend`` is the CPU, the import of numba-cuda; and where ``backend``
    resolves to the GPU, the CUDA context and target.

    Examples
    --------
    >>> sorted(runtime_setup("cpu"))
    ['cpu_target']
    """
    from numba.core.registry import cpu_target

    from kingen.solve.backends import choose_backend

    took = {}
    t0 = time.perf_counter()
    cpu_target.target_context.refresh()
    took["cpu_target"] = time.perf_counter() - t0
    if backend == "cpu":
        return took
    t0 = time.perf_counter()
    from numba import cuda
    from numba.cuda.descriptor import cuda_target

    took["cuda_import"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if choose_backend(backend)[0] == "cuda":  # its probe of the GPU makes the context
        cuda.current_context()
        took["cuda_context"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cuda_target.target_context.refresh()
        took["cuda_target"] = time.perf_counter() - t0
    return took


def _agreement(local: dict, results: dict) -> dict:
    """The profile's optimum against the fit's best: the largest gene shift (decades, log
    genes) and both χ²."""
    names = local.get("names", [])
    best = dict(zip(names, local.get("best_log10", []), strict=False))
    shifts = {n: abs(p["best"] - best[n]) for n, p in results.get("profiles", {}).items()
              if n in best}
    return {"fit_chi2": local.get("chi2"), "profile_chi2_optimum": results.get("chi2_optimum"),
            "profile_chi2_min": results.get("chi2_min"),
            "max_gene_shift_decades": max(shifts.values(), default=None),
            "gene_shift_decades": shifts}


if __name__ == "__main__":
    raise SystemExit(main())
