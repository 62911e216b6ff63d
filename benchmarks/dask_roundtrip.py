"""Dask's round trip for one generation's shards, with no solver: where the send and return go.

A sharded fit (:class:`kingen.scaleout.shard.ShardedEvaluator`) sends each worker a block
of rate constants and gathers its scores, every generation. This suite times that round
trip alone, on a local cluster of ``--workers`` CPU worker processes (the comm path of a GPU
cluster: the same client, scheduler and TCP), with a stand-in task that sleeps
``--solve-s`` (the GPU's solve) and returns arrays of a real shard's shapes. Per round:

- ``send_s``: the submit to the last shard's start on its worker;
- ``return_s``: the last shard's end to the gathered results;
- ``overhead_s``: the round's wall time beyond the longest task.

Two ways of submitting: ``submit`` (one ``client.submit`` per shard, kingen's way) and
``compute`` (all shards in one graph, one message to the scheduler, which the client
otherwise sends at most once per 10 ms). On the H100 machine's 16-core host they cost the
same (``benchmarks/results/h100/dask_roundtrip/``), so kingen keeps the first. With
``--rows 2`` the round trip is Dask's latency alone::

    python -m benchmarks dask_roundtrip --rows 65536 --workers 2 --rounds 40 \\
        --name two_workers

(``benchmarks/results/<device>/dask_roundtrip/two_workers.json``; ``--out FILE`` to
choose).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402

MODES = ("submit", "compute")


def stand_in_shard(params: np.ndarray, n_protocols: int, solve_s: float) -> dict[str, Any]:
    """A shard's task without its solve: sleeps ``solve_s``, returns what
    :func:`kingen.scaleout.worker.evaluate_shard` returns, in shape and type."""
    started = time.time()
    time.sleep(solve_s)
    n = params.shape[0]
    return {"fitness": np.ones(n), "errors": np.ones((n, n_protocols)),
            "fail": np.zeros(n, dtype=np.int64), "amplitudes": np.ones((n, n_protocols)),
            "started": started, "finished": time.time()}


def _send(client: Any, mode: str, shards: list[np.ndarray], workers: list[str],
          n_protocols: int, solve_s: float, tag: str) -> list[Any]:
    import dask

    if mode == "submit":
        return [client.submit(stand_in_shard, s, n_protocols, solve_s, pure=False,
                              key=f"{tag}-{i}", workers=[workers[i % len(workers)]],
                              allow_other_workers=True) for i, s in enumerate(shards)]
    tasks = []
    for i, s in enumerate(shards):
        with dask.annotate(workers=[workers[i % len(workers)]], allow_other_workers=True):
            tasks.append(dask.delayed(stand_in_shard, pure=False)(
                s, n_protocols, solve_s, dask_key_name=f"{tag}-{i}"))
    return client.compute(tasks, optimize_graph=False)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import dask
    from distributed import Client, LocalCluster

    rng = np.random.default_rng(0)
    params = rng.random((args.rows, args.params))
    results = []
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client, \
            dask.config.set({"distributed.admin.large-graph-warning-threshold": "1 PiB"}):
        client.wait_for_workers(args.workers)
        workers = sorted(client.nthreads())
        bounds = np.linspace(0, args.rows, args.workers + 1).round().astype(int)
        shards = [params[bounds[i]:bounds[i + 1]] for i in range(args.workers)]
        # the modes alternate, round by round, so that drifts of the host fall on both
        rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for r in range(args.rounds + args.warm_up):
            for mode in MODES:
                submitted = time.time()
                futures = _send(client, mode, shards, workers, args.protocols,
                                args.solve_s, f"{mode}-{r}")
                parts = client.gather(futures)
                gathered = time.time()
                del futures
                if r >= args.warm_up:
                    longest = max(p["finished"] - p["started"] for p in parts)
                    rows[mode].append({
                        "send_s": max(p["started"] for p in parts) - submitted,
                        "return_s": gathered - max(p["finished"] for p in parts),
                        "overhead_s": gathered - submitted - longest})
                time.sleep(args.pause_s)
        for mode in MODES:
            summary = {key: float(np.median([x[key] for x in rows[mode]]))
                       for key in rows[mode][0]}
            results.append({"mode": mode, "median_s": summary, "rounds": rows[mode]})
            print(f"{mode:>8}: send {summary['send_s'] * 1e3:.1f} ms, return "
                  f"{summary['return_s'] * 1e3:.1f} ms, overhead "
                  f"{summary['overhead_s'] * 1e3:.1f} ms (medians of {args.rounds})",
                  flush=True)
    return {"rows": args.rows, "params": args.params, "protocols": args.protocols,
            "workers": args.workers, "solve_s": args.solve_s, "results": results}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=65536, help="candidates in a generation")
    ap.add_argument("--params", type=int, default=11, help="rate constants per candidate")
    ap.add_argument("--protocols", type=int, default=4, help="protocols (error columns)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes, one shard each")
    ap.add_argument("--solve-s", type=float, default=0.2, help="seconds each task sleeps")
    ap.add_argument("--pause-s", type=float, default=0.03,
                    help="seconds between rounds (the driver's GA step)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--warm-up", type=int, default=3, help="rounds left out first")
    add_output_options(ap, "dask_roundtrip")
    args = ap.parse_args(argv)
    out = {"benchmark": "dask_roundtrip", "provenance": provenance("dask_roundtrip", argv),
           **run(args)}
    print(f"wrote {write(out, output_path(args, 'dask_roundtrip'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
