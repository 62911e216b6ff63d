"""One objective evaluation's host work, on the main thread, on another thread and in a Dask worker.

A one-process fit evaluates on its main thread; a Dask worker runs each shard (and each
fit of a batch) on a thread of its own, whose memory comes from an arena of its own
(:mod:`kingen.base.allocator`). This suite times the host's share of one evaluation of
``--population`` candidates of a fit configuration (the solver's preparation and results,
``prepare_ms`` and ``finish_ms``; the objective's checks and errors beyond them,
``score_ms``) and counts the process's minor page faults during it (``faults``: pages
written for the first time since the allocator got them), in each place:

- ``main``: the calling thread of a fresh process, as ``kingen fit``;
- ``thread``: another thread of a fresh process;
- ``worker``: one task of a one-worker ``LocalCluster`` that builds the objective and
  evaluates it (on the worker's task thread);
- ``shard``: as a sharded fit does it: the objective built once on the worker by
  :class:`~kingen.scaleout.worker.SolverPlugin`, and each evaluation one task of
  :func:`~kingen.scaleout.worker.evaluate_shard` given the candidates as its argument.

::

    python -m benchmarks.make_fit_problem --model robert_howe_2003 --out /tmp/rh03
    python -m benchmarks host_work --config /tmp/rh03/fit.toml --population 32768 \\
        --name rh03_32768

(``benchmarks/results/<device>/host_work/rh03_32768.json``; ``--out FILE`` to choose).

``--generations N`` times instead the host's side of N generations of the GA loop at
``--population`` (μ = λ), with a stand-in evaluator that returns kernel sums solved once
beforehand (a few candidates' sums, tiled): per generation the variation, the selection, genes
to rates (the engine's ``to_params`` and the objective's guard) and the scoring (the
objective's reduction of the sums to fitness), medians in ms, with the next generation's
random numbers drawn ahead during the stand-in solve, as a fit draws them, and the numba
threads it ran on (``numba_threads``)::

    python -m benchmarks host_work --config /tmp/rh03/fit.toml --population 65536 \
        --generations 12 --name ga_65536
Each place runs in a fresh process (a worker: a one-worker ``LocalCluster``), ``--rounds``
times in turn, so that the host's drifts fall on every place alike; medians over the
evaluations after ``--warm-up``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402

PLACES = ("main", "thread", "worker", "shard")


def evaluations(config: str, population: int, evaluations: int, backend: str,
                pause_s: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """Evaluate one batch of candidates ``evaluations`` times in the calling thread, as a
    fit's process does (freed memory kept); per evaluation its host work and page faults."""
    from kingen.base.allocator import keep_freed_memory
    from kingen.fitting.config import load_config
    from kingen.fitting.objective import Objective

    kept = keep_freed_memory()
    cfg = load_config(config, overrides={"backend": backend})
    objective = Objective(cfg.scheme, cfg.protocols, cfg.solver)
    start = cfg.pmap.start_genes()
    genes = start + np.random.default_rng(seed).normal(0.0, 0.2, (population, start.size))
    params = objective.guard(cfg.pmap.to_params(genes))
    rows = []
    for _ in range(evaluations):
        fresh = np.array(params)  # a new argument each time, as a shard arrives
        time.sleep(pause_s)  # a worker idles between its shards
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        _, res = objective.evaluate(fresh, complete=False)
        wall = time.perf_counter() - t0
        tm = res.timings
        rows.append({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
                     "prepare_ms": tm["prepare_s"] * 1e3, "finish_ms": tm["finish_s"] * 1e3,
                     "solve_ms": tm["solve_s"] * 1e3,
                     "score_ms": (wall - tm["total_s"]) * 1e3, "total_ms": wall * 1e3})
    return {"thread": threading.current_thread().name, "allocator_kept": kept,
            "backend": objective.simulator.backend, "device": objective.simulator.device,
            "evaluations": rows}


def _shard_task(plugin: str, params: np.ndarray) -> dict[str, Any]:
    """:func:`~kingen.scaleout.worker.evaluate_shard`, with the page faults it caused."""
    from kingen.scaleout.worker import evaluate_shard

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    got = evaluate_shard(plugin, params, False)
    got["faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return got


def _shards(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    from kingen.fitting.config import load_config
    from kingen.fitting.objective import Objective
    from kingen.scaleout.worker import SolverPlugin, workers_per_host

    cfg = load_config(args.config, overrides={"backend": args.backend})
    start = cfg.pmap.start_genes()
    genes = start + np.random.default_rng(0).normal(0.0, 0.2, (args.population, start.size))
    guard = Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu")).guard
    params = guard(cfg.pmap.to_params(genes))
    client.register_plugin(SolverPlugin(
        cfg.scheme, cfg.protocols, cfg.solver, warm=params[:1],
        workers_per_host=workers_per_host(client)), name="host-work")
    rows = []
    info: dict[str, Any] = {}
    for _ in range(args.warm_up + args.evaluations):
        time.sleep(args.pause_s)
        got = client.submit(_shard_task, "host-work", params, pure=False).result()
        info = {"backend": got["backend"], "device": got["device"]}
        rows.append({"faults": got["faults"], "prepare_ms": got["prepare_s"] * 1e3,
                     "finish_ms": got["finish_s"] * 1e3, "solve_ms": got["solve_s"] * 1e3,
                     "score_ms": got["score_s"] * 1e3,
                     "total_ms": (got["total_s"] + got["score_s"]) * 1e3})
    return {"thread": "the worker's task thread", "allocator_kept": True, **info,
            "evaluations": rows}


def _in_place(place: str, args: argparse.Namespace) -> dict[str, Any]:
    run = (args.config, args.population, args.warm_up + args.evaluations, args.backend,
           args.pause_s)
    if place == "main":
        return evaluations(*run)
    if place == "thread":
        out: list[dict[str, Any]] = []
        worker = threading.Thread(target=lambda: out.append(evaluations(*run)))
        worker.start()
        worker.join()
        return out[0]
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        if place == "shard":
            return _shards(client, args)
        return client.submit(evaluations, *run, pure=False).result()


def _child(argv: list[str]) -> int:
    """``--child PLACE``: one place's evaluations in this (fresh) process, JSON on stdout."""
    ap = _parser()
    args = ap.parse_args(argv)
    print(json.dumps(_in_place(args.child, args)))
    return 0


def generation_parts(config: str, population: int, generations: int, warm_up: int = 2,
                     solved: int = 16, seed: int = 0, fitness: str = "chi2") -> dict[str, Any]:
    """The host's side of ``generations`` GA generations at μ = λ = ``population``: per
    generation, ms of variation, selection, genes to rates and scoring (the hall of fame
    apart); the kernel sums are those of ``solved`` candidates, solved once and tiled.
    ``fitness``: ``"chi2"`` scores on the likelihood, as ``kingen fit`` does (its noise
    model estimated at the start genes); ``"relative"`` on the relative errors."""
    from dataclasses import replace

    import numba

    from kingen.base.allocator import keep_freed_memory
    from kingen.fitting.config import load_config
    from kingen.fitting.engine import Engine
    from kingen.fitting.evaluator import FromFunction
    from kingen.fitting.objective import Objective
    from kingen.fitting.progress import Progress

    keep_freed_memory()
    cfg = load_config(config, overrides={"population": population, "backend": "cpu",
                                         "generations": generations + warm_up,
                                         "output": "unused.h5", "seed": seed})
    objective = Objective(cfg.scheme, cfg.protocols, cfg.solver)
    start = cfg.pmap.start_genes()
    if fitness == "chi2":
        from kingen.identify.refine import start_noise

        start_noise(objective, cfg.pmap, start)
    genes = start + np.random.default_rng(seed).normal(0.0, 0.2, (solved, start.size))
    once = objective.simulator.run(objective.guard(cfg.pmap.to_params(genes)), "objective",
                                   complete=False)
    rows = np.arange(population) % solved
    sums = replace(once, **{k: getattr(once, k).take(rows, axis=0) for k in (
        "fail", "sgg", "sgd", "sg", "windows") if getattr(once, k) is not None})
    clock: dict[str, float] = {}

    def evaluate(params: np.ndarray):
        # The solve: a fit's next random numbers are drawn during it, on the drawing thread
        # (FromFunction has started them); waiting here keeps them out of the parts timed.
        drawer.submit(lambda: None).result()
        t = time.perf_counter()
        p = objective.guard(params, complete=False)
        clock["guard"] = time.perf_counter() - t
        n = p.shape[0]
        t = time.perf_counter()
        ev = objective.reduce(sums.sgg[:n], sums.sgd[:n], sums.windows[:n], sums.fail[:n],
                              None if sums.sg is None else sums.sg[:n])
        clock["scoring"] = time.perf_counter() - t
        return ev, {}

    class _NoStore:
        def append_generation(self, **_fields) -> None:
            pass

    engine = Engine(cfg, objective, _NoStore(), Progress(generations, enabled=False),
                    evaluate=FromFunction(evaluate))
    engine.algorithm.warm_up()
    drawer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kingen-draws")
    engine.randoms.executor = drawer  # as Engine.run lends it
    state = engine.start()
    per = []
    for _ in range(generations + warm_up):
        engine._eval_clock.clear()
        clock.clear()
        state = engine.generation(state)
        c = engine._eval_clock
        per.append({"variation": c.get("variation_s", 0.0) * 1e3,
                    "selection": c.get("select_s", 0.0) * 1e3,
                    "genes_to_rates": (c.get("params_s", 0.0) + clock.get("guard", 0.0)) * 1e3,
                    "scoring": clock.get("scoring", 0.0) * 1e3,
                    "hall_of_fame": c.get("hof_s", 0.0) * 1e3})
    engine.randoms.executor = None
    engine.randoms.settle()
    drawer.shutdown()
    kept = per[warm_up:]
    median = {k: float(np.median([r[k] for r in kept])) for k in kept[0]}
    median["total"] = float(np.median([sum(r.values()) for r in kept]))
    return {"generations": generations, "warm_up": warm_up, "solved": solved,
            "fitness": objective.fitness_kind, "numba_threads": numba.get_num_threads(),
            "algorithm": type(engine.algorithm).__name__, "median_ms": median,
            "per_generation_ms": per}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a fit configuration")
    ap.add_argument("--population", type=int, default=32768, help="candidates per evaluation")
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--places", default=",".join(PLACES),
                    help=f"comma separated, of {', '.join(PLACES)}")
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per place")
    ap.add_argument("--evaluations", type=int, default=8, help="timed, per process")
    ap.add_argument("--warm-up", type=int, default=2, help="evaluations left out first")
    ap.add_argument("--pause-s", type=float, default=0.05,
                    help="seconds slept before each evaluation (a worker idles between "
                         "shards while the driver runs the GA)")
    ap.add_argument("--generations", type=int, default=0,
                    help="time the host's side of this many GA generations instead (a "
                         "stand-in evaluator returns precomputed kernel sums)")
    ap.add_argument("--fitness", default="chi2", choices=("chi2", "relative"),
                    help="with --generations: score on the likelihood as kingen fit does, "
                         "or on the relative errors (as the host_work files written before it)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_output_options(ap, "host_work")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.child:
        return _child(argv)
    if args.generations:
        out = {"benchmark": "host_work", "provenance": provenance("host_work", argv),
               "config": args.config, "population": args.population,
               **generation_parts(args.config, args.population, args.generations,
                                  args.warm_up, fitness=args.fitness)}
        print(", ".join(f"{k} {v:.2f} ms" for k, v in out["median_ms"].items()))
        print(f"wrote {write(out, output_path(args, 'host_work'))}")
        return 0
    places = [p.strip() for p in args.places.split(",") if p.strip()]
    unknown = sorted(set(places) - set(PLACES))
    if unknown:
        print(f"host_work: unknown place {unknown[0]!r} (use {', '.join(PLACES)})",
              file=sys.stderr)
        return 2
    runs = []
    for r in range(args.rounds):
        for place in places:
            done = subprocess.run([sys.executable, "-m", "benchmarks", "host_work", *argv,
                                   "--child", place], capture_output=True, text=True,
                                  cwd=ROOT)
            if done.returncode != 0:
                print(done.stderr[-4000:], file=sys.stderr)
                return done.returncode
            got = json.loads(done.stdout.strip().splitlines()[-1])
            kept = got["evaluations"][args.warm_up:]
            median = {k: float(np.median([e[k] for e in kept])) for k in kept[0]}
            runs.append({"place": place, "round": r, **got, "median": median})
            print(f"{place:>7} (round {r}): " + ", ".join(
                f"{k} {v:.1f}" for k, v in median.items()), flush=True)
    out = {"benchmark": "host_work", "provenance": provenance("host_work", argv),
           "config": args.config, "population": args.population, "pause_s": args.pause_s,
           "runs": runs}
    print(f"wrote {write(out, output_path(args, 'host_work'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
