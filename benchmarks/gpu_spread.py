"""One fit on one GPU against the same fit spread over several GPUs of one process.

Runs whole fits of one problem (polish off, no early stop) in one process, in the order
``--order`` gives, so that the host's drift falls on every way alike:

- ``one``: the fit's own objective on GPU 0 (``kingen fit``);
- ``threads``: each generation cut into one row block per GPU, a thread per GPU
  (:class:`kingen.fitting.gpus.GpuShards`, ``kingen fit --gpus N``);
- ``nested``: the same blocks driven from one thread in turn: block i's solve, once its
  kernels are launched, prepares and launches block i + 1 on the next GPU before it waits
  for its own (tried against ``threads``, not kept).

Per fit it records the medians, over generations 1 on (generation 0 compiles), of the
generation, the solver call, its kernels, its host parts, and of a block's rate
constants put in the solver's layout (``kingen.solve.inputs.solver_rates``, before its
kernels start; the resting occupancies are solved while they run), timed around the calls
the solver makes, and the best fitness, which must be the same for every way::

    python -m benchmarks.make_fit_problem --model robert_howe_2003 --out /tmp/rh03
    python -m benchmarks gpu_spread --config /tmp/rh03/fit.toml --population 65536 \\
        --order one,threads,nested,one,threads,nested --name rh03_65536

(``benchmarks/results/<device>/gpu_spread/rh03_65536.json``; ``--out FILE`` to choose).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402

WAYS = ("one", "threads", "nested")
_KEYS = ("total_s", "solver_s", "kernel_s", "solver_prepare_s", "solver_finish_s", "ga_s")


class Nested:
    """The blocks driven from one thread, each GPU made current in turn (``nested``)."""

    def __init__(self, objective: Any, devices: list[int]) -> None:
        from numba import cuda

        from kingen.fitting.objective import Objective

        self.devices, self.objectives = devices, [objective]
        for d in devices[1:]:
            with cuda.gpus[d]:
                copy = Objective(objective.scheme, objective.items, objective.simulator.options)
                copy.evaluate(objective.scheme.values[None, :])
            self.objectives.append(copy)

    def __call__(self, params: np.ndarray, while_solving: Any = None) -> tuple[Any, dict]:
        from numba import cuda

        from kingen.fitting.gpus import join_evaluations

        t0 = time.perf_counter()
        n, k = params.shape[0], len(self.objectives)
        bounds = np.linspace(0, n, k + 1).round().astype(np.int64)
        parts: list[Any] = [None] * k

        def solve(i: int) -> None:
            def launched() -> None:
                if i + 1 < k:
                    solve(i + 1)
                elif while_solving is not None:
                    while_solving()

            with cuda.gpus[self.devices[i]]:
                parts[i] = self.objectives[i].evaluate(
                    params[bounds[i]:bounds[i + 1]], complete=False, while_solving=launched,
                    batch_rows=n)

        solve(0)
        timings = {key: sum(p[1].timings[key] for p in parts) for key in ("prepare_s",
                                                                         "finish_s")}
        timings["total_s"] = time.perf_counter() - t0
        timings["solve_s"] = timings["total_s"] - timings["prepare_s"] - timings["finish_s"]
        return join_evaluations([p[0] for p in parts]), timings

    def take_reruns(self) -> None:
        return None

    def close(self) -> None:
        del self.objectives[1:]


def _timed_inputs() -> list[float]:
    """Time every call of more than 1,000 rows of the solver's rates in its layout
    (``kingen.solve.inputs.solver_rates``, which a block makes on its thread before its
    kernels start; seconds, in order)."""
    from kingen.solve import batch

    seen: list[float] = []
    rates = batch.solver_rates

    def timed(scheme: Any, params: np.ndarray, *args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = rates(scheme, params, *args, **kw)
        if params.shape[0] > 1000:
            seen.append(time.perf_counter() - t0)
        return out

    batch.solver_rates = timed
    return seen


def _cpus() -> int:
    """The CPUs the calling thread may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else -1


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from kingen.fitting.config import load_config
    from kingen.fitting.gpus import GpuShards
    from kingen.runs.fit import fit

    devices = list(range(args.gpus))
    inputs = _timed_inputs()
    rows = []
    for way in args.order.split(","):
        if way not in WAYS:
            raise SystemExit(f"gpu_spread: unknown way {way!r} (use {', '.join(WAYS)})")
        made: list[Any] = []

        def evaluator(objective: Any, way: str = way, made: list[Any] = made) -> Any:
            made.append(GpuShards(objective, devices, switch_interval=args.switch_interval)
                        if way == "threads" else Nested(objective, devices))
            return made[-1]

        inputs.clear()
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_config(args.config, overrides={
                "population": args.population, "generations": args.generations,
                "precision": args.precision, "output": str(Path(tmp) / "fit.h5")})
            cfg.polish = False
            cfg.stop.patience = 0
            cfg.settings = cfg.to_dict()
            try:
                result = fit(cfg, progress=False,
                             evaluator=None if way == "one" else evaluator)
            except BaseException:
                for m in made:
                    m.close()
                raise
        t = result.timings
        steady = range(1, len(t["total_s"]))
        row: dict[str, Any] = {"way": way, "best_fitness": result.fitness}
        if way == "threads":  # an inherited narrow CPU mask would serialise a block's loops
            row["block_thread_cpus"] = [pool.submit(_cpus).result()
                                        for pool in made[0]._pools]
        row.update({key: statistics.median(t[key][g] for g in steady)
                    for key in _KEYS if key in t})
        row["inputs_s"] = statistics.median(inputs[2 * len(devices):]) if inputs else None
        row["candidates_per_s"] = args.population / row["total_s"]
        rows.append(row)
        for m in made:
            m.close()
        print(f"{way:>8}: generation {row['total_s']:.4f} s ({row['candidates_per_s']:,.0f} "
              f"candidates/s), solver {row['solver_s']:.4f}, kernels {row['kernel_s']:.4f}, "
              f"host prepare {row['solver_prepare_s'] * 1e3:.1f} ms, a block's rates "
              f"{(row['inputs_s'] or 0) * 1e3:.1f} ms; best {result.fitness:.6g}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    from kingen.fitting.gpus import SWITCH_INTERVAL_S, threading_layer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True, help="fit configuration")
    ap.add_argument("--population", type=int, default=65536)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--precision", default="float64", choices=("float64", "float32"))
    ap.add_argument("--gpus", type=int, default=2, help="GPUs of the spread ways")
    ap.add_argument("--order", default="one,threads,nested,one,threads,nested",
                    help=f"ways, in order ({', '.join(WAYS)})")
    ap.add_argument("--switch-interval", type=float, default=SWITCH_INTERVAL_S,
                    help="Python's switch interval while ``threads`` scores (s)")
    add_output_options(ap, "gpu_spread")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    rows = run(args)
    out = {"benchmark": "gpu_spread", "provenance": provenance("gpu_spread", argv),
           "config": str(args.config), "population": args.population,
           "generations": args.generations, "precision": args.precision, "gpus": args.gpus,
           "switch_interval_s": args.switch_interval, "main_thread_cpus": _cpus(),
           "numba_threading_layer": threading_layer(),
           "openmp_environment": {k: v for k, v in os.environ.items()
                                  if k.startswith(("OMP_", "GOMP_", "KMP_"))},
           "runs": rows}
    print(f"wrote {write(out, output_path(args, 'gpu_spread'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
