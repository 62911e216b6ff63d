"""RK4 steps a sample that each candidate of a real fit would need from its own rates.

The schedule steps every candidate of a batch as the fastest rates the bounds allow need
(``kingen.solve.schedule``). This runs a fit on the CPU, keeps every batch its evaluator
scores, and reports, generation by generation, the steps a sample each candidate would take
at ``--factor`` times the count its own rates need for RK4's stability (never more than the
schedule's), at each ``--concentrations`` (mM), as the mean of the longest count in groups
of 1, 4 and 32 consecutive candidates: one CPU thread, a warp of stage rows with 8 lanes, a
warp of the GPU's matrix builds, each of which runs its longest count
(``analysis/h200/optimization_log_exchange.md``, step 13). It then reports the same for the
rule the solver took up (step 14, :func:`kingen.solve.schedule.coarse_steps`): the share of
the schedule's steps each batch takes on the fit's edge keys and on the rows left in stage
form, as the mean of the longest in the same groups. Run from the repository root::

    python -m benchmarks.make_fit_problem --model robert_howe_2003 --exchange 0.2 \\
        --out /tmp/rh03x
    python analysis/own_steps.py /tmp/rh03x/fit.toml --population 2048 --generations 40
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROUPS = (1, 4, 32)


class Recording:
    """The fit's own evaluator, keeping a copy of every batch it scores."""

    def __init__(self, objective) -> None:
        from kingen.fitting.evaluator import InProcess

        self.inner = InProcess(objective)
        self.objective = objective
        self.scheme = objective.scheme
        self.batches: list[np.ndarray] = []

    def __call__(self, params, while_solving=None):
        self.batches.append(np.array(params, copy=True))
        return self.inner(params, while_solving)

    def take_reruns(self):
        return self.inner.take_reruns()


def own_steps(scheme, params: np.ndarray, concentration: float, sample_ms: float,
              factor: float, schedule_steps: int) -> np.ndarray:
    """Steps a sample for each row of ``params``: ``factor`` × what RK4's stability needs at
    its own rates, at most the schedule's (which failed rows keep)."""
    from kingen.solve.schedule import DEFAULT_COURANT, step_limit

    steps = np.full(params.shape[0], schedule_steps)
    for i in np.flatnonzero(np.isfinite(params).all(axis=1)):
        need = math.ceil(sample_ms / step_limit(scheme, concentration, params[i],
                                                DEFAULT_COURANT))
        steps[i] = min(schedule_steps, math.ceil(factor * need))
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--population", type=int, default=2048)
    ap.add_argument("--generations", type=int, default=40)
    ap.add_argument("--concentrations", default="10,1")
    ap.add_argument("--sample-ms", type=float, default=0.02)
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--every", type=int, default=5, help="print every N-th generation")
    args = ap.parse_args(argv)

    from kingen.runs.fit import fit
    from kingen.solve.schedule import DEFAULT_COURANT, max_rates, step_limit

    recorders: list[Recording] = []

    def evaluator(objective) -> Recording:
        recorders.append(Recording(objective))
        return recorders[-1]

    with tempfile.TemporaryDirectory() as tmp:
        overrides = {"population": args.population, "generations": args.generations,
                     "backend": "cpu", "output": str(Path(tmp) / "fit.h5")}
        fit(args.config, overwrite=True, progress=False, overrides=overrides,
            evaluator=evaluator)
    batches, scheme = recorders[0].batches, recorders[0].scheme
    print(f"{args.config}: {len(batches)} batches; steps a sample at {args.factor:g}x each "
          f"candidate's own need, mean of the longest in groups of {GROUPS}")
    for c in (float(x) for x in args.concentrations.split(",")):
        schedule = math.ceil(args.sample_ms / step_limit(scheme, c, max_rates(scheme),
                                                         DEFAULT_COURANT))
        for g, batch in enumerate(batches):
            if g % args.every and g != len(batches) - 1:
                continue
            steps = own_steps(scheme, batch, c, args.sample_ms, args.factor, schedule)
            longest = [steps[:steps.size // k * k].reshape(-1, k).max(axis=1).mean()
                       for k in GROUPS]
            print(f"{c:g} mM, batch {g:3d} ({batch.shape[0]} candidates): schedule {schedule}; "
                  + ", ".join(f"{k}: {v:.1f}" for k, v in zip(GROUPS, longest, strict=True)))
    print_built(recorders[0], args.every)
    return 0


def print_built(recording: Recording, every: int) -> None:
    """The share of the schedule's steps on smooth rows that each printed batch takes with
    the solver's own steps, on the edge keys and on the stage rows (the GPU's plan)."""
    from kingen.solve.plan import plan_propagator
    from kingen.solve.schedule import coarse_steps

    scheme, schedule = recording.scheme, recording.objective.simulator.schedule
    keyed = plan_propagator(scheme, schedule, every_constant_row=True).row_key >= 0
    smooth = schedule.rows_i[:, 3] != 0
    n, reps = schedule.rows_i[:, 0], schedule.rows_i[:, 1]
    print("as built (coarse_steps): share of the schedule's steps, groups of "
          f"{GROUPS}: edge keys | stage rows")
    batches = recording.batches
    for g, batch in enumerate(batches):
        if g % every and g != len(batches) - 1:
            continue
        taken = -(-n // coarse_steps(scheme, schedule, scheme.complete(batch)))
        shares = []
        for rows in (smooth & keyed, smooth & ~keyed):
            fine = (n[rows] * reps[rows]).sum()
            for k in GROUPS:
                t = taken[:taken.shape[0] // k * k, rows]
                t = t.reshape(-1, k, rows.sum()).max(axis=1)
                shares.append((t * reps[rows]).sum(axis=1).mean() / fine if fine else 1.0)
        print(f"batch {g:3d} ({batch.shape[0]} candidates): "
              + " / ".join(f"{v:.3f}" for v in shares[:3]) + " | "
              + " / ".join(f"{v:.3f}" for v in shares[3:]))


if __name__ == "__main__":
    raise SystemExit(main())
