"""The GA's own cost per generation, without the solver: where the time outside it goes.

Runs kingen's (μ + λ) engine on the bundled demo configuration with a stand-in evaluation
(random fitness, no simulation) and times, per generation, the drawing of its random
numbers (in a fit, done during the previous generation's solve), the variation
(``np_var_or``),
the hall-of-fame update, the survival (the tournaments and the gathering of the new
population, :func:`~kingen.fitting.selection.survivors`), and the rest of the generation
(statistics, the resume snapshot). ``--threads`` sets numba's thread count for
the compiled operators; ``--no-gc`` runs with Python's cyclic collector off, to see whether
collections explain the outliers; ``--parallel-from`` moves the size from which the operators use
all threads (0: always); ``--allocator default`` leaves the C library's allocator as it is
(a fit keeps its freed memory, :mod:`kingen.base.allocator`)::

    python -m benchmarks ga_step --populations 8192,65536 --generations 40 --name idle \\
        --solver-s 0.1

(``benchmarks/results/<device>/ga_step/idle.json``; ``--out FILE`` to choose).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kingen.fitting.operators as operators  # noqa: E402
import kingen.fitting.selection as selection  # noqa: E402
from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from kingen.base.allocator import keep_freed_memory  # noqa: E402
from kingen.fitting.algorithms.mu_plus_lambda import MuPlusLambda  # noqa: E402
from kingen.fitting.config import demo_config, load_config  # noqa: E402
from kingen.fitting.engine import Engine  # noqa: E402
from kingen.fitting.evaluator import FromFunction  # noqa: E402
from kingen.fitting.objective import Evaluation  # noqa: E402
from kingen.fitting.progress import Progress  # noqa: E402
from kingen.fitting.state import HallOfFame  # noqa: E402


class _StandInObjective:
    n_protocols = 4


class _NullStore:
    def append_generation(self, **_fields) -> None:
        pass


def _timed(clock: dict[str, float], key: str, func):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            clock[key] = clock.get(key, 0.0) + time.perf_counter() - t
    return wrapper


def run(population: int, generations: int, seed: int, solver_s: float = 0.0) -> dict:
    """Time ``generations`` generations at μ = λ = ``population``.

    ``solver_s`` is slept in each evaluation: the host idles like that while the GPU solves,
    and what idling does to the next GA step (threads and cores gone to sleep) is part of
    its cost in a fit.
    """
    cfg = load_config(demo_config(), overrides={
        "population": population, "generations": generations, "backend": "cpu",
        "output": "unused.h5"})
    rng = np.random.default_rng(seed)
    clock: dict[str, float] = {}

    def evaluate(params: np.ndarray):
        t = time.perf_counter()
        m = params.shape[0]
        ev = Evaluation(fitness=rng.random(m), errors=rng.random((m, 4)),
                        fail=np.zeros(m, dtype=np.int64), amplitudes=np.ones((m, 4)))
        if solver_s:
            time.sleep(solver_s)
        clock["evaluate"] = clock.get("evaluate", 0.0) + time.perf_counter() - t
        return ev, {}

    engine = Engine(cfg, _StandInObjective(), _NullStore(),
                    Progress(generations, enabled=False), evaluate=FromFunction(evaluate))
    ga = engine.algorithm
    assert isinstance(ga, MuPlusLambda)
    hall_of_fame = HallOfFame.merged
    HallOfFame.merged = _timed(clock, "hall_of_fame", HallOfFame.merged)
    # a generation's random numbers (drawn during the solve in a fit; here, in turn)
    ga._draw_generation = _timed(clock, "draws", ga._draw_generation)
    saved = operators.np_var_or_new, selection.survivors
    operators.np_var_or_new = _timed(clock, "variation", operators.np_var_or_new)
    selection.survivors = _timed(clock, "selection", selection.survivors)
    try:
        ga.warm_up()
        state = engine.start()
        engine.record(state, time.perf_counter())
        rows = []
        for _ in range(generations):
            clock.clear()
            t0 = time.perf_counter()
            state = engine.generation(state)
            engine.record(state, t0)
            total = time.perf_counter() - t0 - clock.get("evaluate", 0.0)
            row = {k: clock.get(k, 0.0) for k in ("draws", "variation", "hall_of_fame",
                                                  "selection")}
            row["rest"] = total - sum(row.values())
            row["total"] = total
            rows.append(row)
    finally:
        operators.np_var_or_new, selection.survivors = saved
        HallOfFame.merged = hall_of_fame
    summary = {}
    for key in rows[0]:
        v = np.array([r[key] for r in rows])
        summary[key] = {"median_s": float(np.median(v)), "max_s": float(v.max())}
    return {"population": population, "summary": summary, "per_generation": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--populations", default="8192,16384,65536")
    ap.add_argument("--generations", type=int, default=40)
    ap.add_argument("--threads", type=int, default=0, help="numba threads (0: all)")
    ap.add_argument("--no-gc", action="store_true", help="disable Python's cyclic GC")
    ap.add_argument("--solver-s", type=float, default=0.0,
                    help="seconds to idle in each evaluation, as while the GPU solves")
    ap.add_argument("--parallel-from", type=int, default=None,
                    help="override kingen.fitting.operators.PARALLEL_FROM_GENES "
                         "(0: always all threads)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--allocator", choices=("kept", "default"), default="kept",
                    help="kept: freed memory kept for reuse, as in a fit "
                         "(kingen.base.allocator); default: the C library's own behaviour")
    add_output_options(ap, "ga_step")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.threads:
        numba.set_num_threads(args.threads)
    if args.no_gc:
        gc.disable()
    if args.allocator == "kept":
        keep_freed_memory()
    if args.parallel_from is not None:
        operators.PARALLEL_FROM_GENES = args.parallel_from
    results = []
    for n in (int(x) for x in args.populations.split(",")):
        r = run(n, args.generations, args.seed, args.solver_s)
        s = r["summary"]
        print(f"{n:>6}: total median {s['total']['median_s'] * 1e3:.1f} ms, max "
              f"{s['total']['max_s'] * 1e3:.1f} ms (draws "
              f"{s['draws']['median_s'] * 1e3:.1f}, variation "
              f"{s['variation']['median_s'] * 1e3:.1f}, hof "
              f"{s['hall_of_fame']['median_s'] * 1e3:.1f}, selection "
              f"{s['selection']['median_s'] * 1e3:.1f}, rest "
              f"{s['rest']['median_s'] * 1e3:.1f})", flush=True)
        results.append(r)
    out = {"benchmark": "ga_step",
           "provenance": provenance("ga_step", argv),
           "threads": numba.get_num_threads(), "threading_layer": numba.threading_layer(),
           "gc": not args.no_gc, "solver_s": args.solver_s, "allocator": args.allocator,
           "parallel_from_genes": operators.PARALLEL_FROM_GENES, "results": results}
    write(out, output_path(args, "ga_step"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
