"""One Levenberg–Marquardt step of a profile, phase by phase: the solver, the Gauss–Newton sums.

Rebuilds the problem of a finished fit's run file (``--run``) as ``kingen profile`` does,
then evaluates groups of a base point and its forward-difference perturbations in every
free gene (:class:`kingen.identify.gauss_newton.Groups`, what each profile step hands the
solver), ``--groups`` at a time, ``--repeats`` times. Each phase is timed between device
synchronisations (on the GPU), so the phases add up to the step; the medians leave out the
first repeats, which also load the process's kernels. A step of 32 groups of 10 genes is
352 candidates, the size of most of a 10-parameter profile's steps.

    python -m benchmarks.make_fit_problem --model robert_howe_2003 --exchange 0.2 --out /tmp/rh03x
    kingen fit /tmp/rh03x/fit.toml --population 1024 --generations 25
    python -m benchmarks lm_step --run /tmp/rh03x/fit.h5 --backend cuda --groups 32,200

(``benchmarks/results/<device>/lm_step.json``; ``--out FILE`` to choose).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from kingen.identify import gauss_newton as gn  # noqa: E402
from kingen.identify.gauss_newton import Groups  # noqa: E402
from kingen.identify.likelihood import Likelihood  # noqa: E402
from kingen.identify.problem import rebuild  # noqa: E402
from kingen.runs.profile import run_noise  # noqa: E402
from kingen.store import RunStore  # noqa: E402

PHASES = (("scale_sums", gn), ("gn_sums", gn), ("_target_residuals", gn))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished fit's run file")
    ap.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--groups", default="32,200", help="groups per step, comma-separated")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--note", default="")
    add_output_options(ap, "lm_step")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    with RunStore.open(args.run, "r") as store:
        problem = rebuild(store, None if args.backend == "auto" else args.backend)
        best = store.best()
    lik = Likelihood(problem.objective, problem.pmap, run_noise(problem, best),
                     problem.best_genes)
    sim = problem.objective.simulator
    sync = _synchronise(sim.backend)
    rows = []
    for n_groups in (int(g) for g in args.groups.split(",")):
        rows.append(_time_step(lik, problem, n_groups, args.repeats, sync))
        r = rows[-1]
        print(f"{n_groups} groups, {r['candidates']} candidates: {r['step_ms']:.1f} ms a step "
              f"({r['candidates_per_s']:.0f} candidates/s); " + ", ".join(
                  f"{k} {v:.1f}" for k, v in r["phases_ms"].items()) + " ms")
    out = {"provenance": provenance("lm_step", argv), "backend": sim.backend,
           "device": sim.device, "run": str(args.run), "rows": rows, "note": args.note}
    write(out, output_path(args, "lm_step"))
    return 0


def _synchronise(backend: str):
    if backend != "cuda":
        return lambda: None
    from numba import cuda

    return cuda.synchronize


def _time_step(lik, problem, n_groups: int, repeats: int, sync) -> dict:
    """Median times (ms) of a step of ``n_groups`` groups and of its phases."""
    x, pmap = problem.best_genes, problem.pmap
    rng = np.random.default_rng(0)
    groups = Groups()
    free = np.ones(x.size, dtype=bool)
    for _ in range(n_groups):
        groups.add_lm(pmap.clip(x + rng.normal(0.0, 1e-3, x.size)), pmap.upper, 1e-4, free)
    times: dict[str, list[float]] = {"solve": []}
    saved = [(mod, name, getattr(mod, name)) for name, mod in PHASES]
    solve = lik.solve

    def timed(name, f):
        def run(*a, **k):
            sync()
            t0 = time.perf_counter()
            out = f(*a, **k)
            sync()
            times.setdefault(name, []).append(time.perf_counter() - t0)
            return out
        return run

    for mod, name, f in saved:
        setattr(mod, name, timed(name, f))
    lik.solve = timed("solve", solve)
    steps = []
    try:
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            groups.evaluate(lik)
            sync()
            steps.append(time.perf_counter() - t0)
    finally:
        for mod, name, f in saved:
            setattr(mod, name, f)
        lik.solve = solve
    skip = min(2, repeats - 1)  # the first calls load kernels
    phases = {k: 1e3 * float(np.median(v[skip:])) for k, v in times.items()}
    step = 1e3 * float(np.median(steps[skip:]))
    phases["rest"] = step - sum(phases.values())
    n = len(groups.rows)
    return {"groups": n_groups, "candidates": n, "step_ms": step,
            "candidates_per_s": n / (step / 1e3), "phases_ms": phases,
            "first_step_ms": 1e3 * steps[0], "steps_ms": [1e3 * t for t in steps]}


if __name__ == "__main__":
    sys.exit(main())
