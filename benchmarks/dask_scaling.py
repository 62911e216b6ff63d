"""Scale-out with Dask: batches of fits over 1, 2, 4, 8 workers, and one fit sharded.

Two measurements, each written as JSON with the command, git commit, host and versions:

``batch``: a batch of ``--fits`` demo fits (the bundled demo, seeds 1..N, no polish) run by
``kingen.scaleout.run_batch`` on a local cluster of each ``--workers`` count (CPU worker
processes, the cores shared between them; on a GPU host with dask-cuda, one worker per
GPU). The cluster is started and every worker has compiled the solver before the clock
starts; the batch's wall time, fits per second and the speed-up over the first count are
recorded::

    python -m benchmarks dask_scaling batch --workers 1,2,4,8 --fits 16 --name batch

``--repeats 3`` runs the counts in turn three times (1, 2, 1, 2, ...) and gives the speed-up
of the median walls: a batch of demo fits lasts seconds, and one run's figure moves with
how evenly its fits happened to fall on the workers (``busy_s_per_worker``). ``--one-gpu``
puts every worker on GPU 0: a demo fit's 48 candidates leave the GPU mostly idle, so this
measures what the batch layer itself allows on one host, GPU or not.

``shard``: one fit, each generation's candidates sharded over ``--workers`` workers, against
the same fit in one process (same seed: the result must be the same, and it is checked).
Per generation (the initial population left out): candidates per second, and Dask's share
of the generation (``dask_s``: cutting, sending, waiting and gathering, beyond the slowest
shard's solve, split into the send, the worker's share beyond its solver and the return).
``--pieces 1,2`` runs each worker count with one and with two shards per worker;
``--one-gpu`` puts every worker on GPU 0 (the "two workers on one GPU" overhead run)::

    python benchmarks/make_fit_problem.py --model robert_howe_2003 --out /tmp/rh03
    python -m benchmarks dask_scaling shard --config /tmp/rh03/fit.toml --population 65536 \\
        --generations 5 --workers 1,2 --one-gpu --out $OUT/dask_shard_one_gpu.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kingen  # noqa: E402
from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from kingen.scaleout.batch import run_batch  # noqa: E402
from kingen.scaleout.cluster import ClusterSettings, local_plan, open_client  # noqa: E402
from kingen.scaleout.manifest import load_manifest  # noqa: E402


def environment() -> dict[str, Any]:
    """What the provenance block does not hold: the GPUs a local cluster would use, and
    Dask's versions."""
    import dask
    import distributed

    from kingen.scaleout.cluster import local_gpus

    return {"gpus": local_gpus(), "dask_versions": {"dask": dask.__version__,
                                                    "distributed": distributed.__version__}}


def _counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _pieces(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _manifest(folder: Path, fits: int, generations: int, population: int, backend: str
              ) -> Path:
    p = folder / "batch.toml"
    p.write_text(f'''config = "{kingen.demo_config()}"
output = "out"
seeds = {list(range(1, fits + 1))}
[overrides]
polish = false
backend = "{backend}"
ga = {{ population = {population}, offspring = {population}, generations = {generations} }}
stop = {{ patience = 0 }}
''')
    return p


def _batch_run(args: argparse.Namespace, n: int) -> dict[str, Any]:
    """One batch of ``args.fits`` demo fits on a fresh local cluster of ``n`` workers."""
    settings = ClusterSettings(workers=n, gpus=args.backend != "cpu")
    plan = local_plan(settings)
    env = {"CUDA_VISIBLE_DEVICES": "0"} if args.one_gpu else None
    with tempfile.TemporaryDirectory(prefix="kingen-dask-bench-") as tmp:
        (Path(tmp) / "warm").mkdir()
        warm = load_manifest(_manifest(Path(tmp) / "warm", n, 1, 8, args.backend))
        m = load_manifest(_manifest(Path(tmp), args.fits, args.generations,
                                    args.population, args.backend))
        t0 = time.perf_counter()
        with open_client(settings, env=env) as client:
            client.wait_for_workers(n, timeout=120)
            started = time.perf_counter() - t0
            # one tiny fit per worker first: imports and solver compilation off the clock
            run_batch(warm, client=client, progress=False)
            t1 = time.perf_counter()
            rows = run_batch(m, client=client, progress=False)
            wall = time.perf_counter() - t1
    ok = sum(1 for r in rows if r["status"] == "ok")
    by_worker: dict[str, float] = {}
    for r in rows:
        by_worker[r.get("worker", "")] = by_worker.get(r.get("worker", ""), 0.0) + (
            r.get("wall_s") or 0.0)
    print(f"{n} worker(s): {len(rows)} fits in {wall:.2f} s ({len(rows) / wall:.3f} fits/s)"
          f", cluster start {started:.1f} s", flush=True)
    return {"workers": n, "cluster": ("distributed.LocalCluster, every worker on GPU 0"
                                      if env else plan["cluster"]),
            # with env: plain processes, each with its share of the cores for the solver
            "threads_per_worker": (max(1, (os.cpu_count() or 1) // n) if env
                                   else plan["threads"]),
            "gpus": plan["gpus"][:1] if env else plan["gpus"], "fits": len(rows), "ok": ok,
            "cluster_start_s": started,
            "wall_s": wall, "fits_per_s": len(rows) / wall,
            "fit_wall_s": [r.get("wall_s") for r in rows],
            # the fits' own time per worker process: how evenly the batch was shared
            "busy_s_per_worker": sorted(by_worker.values(), reverse=True)}


def bench_batch(args: argparse.Namespace) -> dict[str, Any]:
    """Each worker count in turn, ``args.repeats`` times (alternating, so that the host's
    drifts fall on every count); the speed-up of each count is over the first count's,
    from the median walls."""
    import numpy as np

    counts = _counts(args.workers)
    runs = [_batch_run(args, n) for _ in range(args.repeats) for n in counts]
    median = {n: float(np.median([r["wall_s"] for r in runs if r["workers"] == n]))
              for n in counts}
    for r in runs:
        r["speedup"] = median[counts[0]] / r["wall_s"]
    return {"benchmark": "batch", "fits": args.fits, "generations": args.generations,
            "population": args.population, "backend": args.backend,
            "one_gpu": args.one_gpu, "repeats": args.repeats, "runs": runs,
            "median_wall_s": {str(n): median[n] for n in counts},
            "speedup_of_medians": {str(n): median[counts[0]] / median[n] for n in counts}}


def bench_shard(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from kingen.scaleout.shard import ShardedEvaluator

    overrides = {"generations": args.generations, "population": args.population,
                 "backend": args.backend, "seed": 1}
    with tempfile.TemporaryDirectory(prefix="kingen-dask-bench-") as tmp:
        def run(evaluator: Any, name: str) -> Any:
            cfg = kingen.load_config(args.config, overrides={**overrides,
                                                             "output": f"{tmp}/{name}.h5"})
            cfg.polish = False
            return kingen.fit(cfg, overwrite=True, progress=False, evaluator=evaluator)

        def per_generation(result: Any) -> dict[str, Any]:
            t = result.timings
            total = np.asarray(t["total_s"][1:])
            out = {"generation_s": total.tolist(),
                   "candidates_per_s": float(args.population / np.median(total)),
                   "median_s": {key: float(np.median(np.asarray(v[1:], dtype=float)))
                                for key, v in t.items() if isinstance(v, list) and len(v) > 1}}
            if "dask_s" in t:
                dask_s = np.asarray(t["dask_s"][1:])
                out["dask_s"] = dask_s.tolist()
                out["dask_share"] = float(np.median(dask_s / total))
            return out

        one = run(None, "one_process")
        runs = [{"workers": 0, "what": "one process, no Dask", **per_generation(one)}]
        for n in _counts(args.workers):
            env = {"CUDA_VISIBLE_DEVICES": "0"} if args.one_gpu else None
            settings = ClusterSettings(workers=n, gpus=args.backend != "cpu")
            with open_client(settings, env=env) as client:
                client.wait_for_workers(n, timeout=120)
                for pieces in _pieces(args.pieces):
                    made: list[ShardedEvaluator] = []

                    def sharded(objective: Any, pieces: int = pieces,
                                made: list[ShardedEvaluator] = made) -> ShardedEvaluator:
                        # from the fit's own objective, as `kingen fit --cluster` makes it:
                        # its items carry the noise model the fit scores its χ² with
                        made.append(ShardedEvaluator(
                            client, objective.scheme, objective.items,
                            objective.simulator.options, warm=objective.scheme.values[None],
                            pieces=pieces))
                        return made[-1]

                    try:
                        res = run(sharded, f"sharded_{n}_{pieces}")
                    finally:
                        for ev in made:
                            ev.close()
                    same = bool(res.fitness == one.fitness
                                and np.array_equal(res.params, one.params))
                    runs.append({"workers": n, "pieces": pieces,
                                 "what": ("workers on GPU 0" if args.one_gpu else
                                          "local cluster"),
                                 "same_result_as_one_process": same, **per_generation(res)})
                    print(f"{n} worker(s), pieces {pieces}: "
                          f"{runs[-1]['candidates_per_s']:,.0f} candidates/s, Dask share "
                          f"{runs[-1].get('dask_share', float('nan')):.1%}, same result: "
                          f"{same}", flush=True)
    return {"benchmark": "shard", "config": str(args.config), "population": args.population,
            "generations": args.generations, "backend": args.backend,
            "one_gpu": args.one_gpu, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("batch", "shard"),
                    help="batch: demo fits over worker counts; shard: one fit, sharded")
    ap.add_argument("--workers", default=None,
                    help="worker counts, comma separated (batch 1,2,4,8; shard 1,2)")
    ap.add_argument("--fits", type=int, default=16, help="batch: fits in the batch")
    ap.add_argument("--repeats", type=int, default=1,
                    help="batch: runs of every worker count, alternating")
    ap.add_argument("--generations", type=int, default=None, help="batch 20, shard 5")
    ap.add_argument("--population", type=int, default=None, help="batch 48, shard 65536")
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--config", type=Path, default=None, help="shard: the fit configuration")
    ap.add_argument("--one-gpu", action="store_true", help="every worker on GPU 0")
    ap.add_argument("--pieces", default="1",
                    help="shard: shards per worker, comma separated (1, 2, ...)")
    add_output_options(ap, "dask_scaling")
    args = ap.parse_args(argv)
    batch = args.what == "batch"
    args.workers = args.workers or ("1,2,4,8" if batch else "1,2")
    args.generations = args.generations or (20 if batch else 5)
    args.population = args.population or (48 if batch else 65536)
    if not batch and args.config is None:
        ap.error("shard needs --config")
    result = bench_batch(args) if batch else bench_shard(args)
    out = {"provenance": provenance("dask_scaling", argv), **environment(), **result}
    path = write(out, output_path(args, "dask_scaling"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
