"""Candidates per second of the CPU backend against its thread count (strong and weak scaling).

For one scheme on the standard protocol set (objective mode, the GA's path, the CPU's
default form unless ``--variant``), the batch is timed end to end through
``Simulator.run`` at each thread count of ``--threads`` (``numba.set_num_threads``):

- weak scaling: ``--per-thread`` candidates per thread (the population grows with the
  threads);
- strong scaling: ``--population`` candidates whatever the thread count.

Each row gives candidates/s, seconds per generation, and the speed-up over one thread.
The result of every thread count is checked against the one-thread result (bit for bit is
expected: each (candidate, sweep) is one thread's work whatever the split).

The propagator form's solve is split in two: ``build_s`` is the same parallel call with
the matrices built and no sample run (:func:`kingen.solve.cpu.run_on_cpu` with ``solve``
False), ``samples_s`` the rest of ``solve_s``; each has its own speed-up over one thread,
so that a row shows which part stops scaling. With ``--ceiling`` the file also holds the
weak scaling of multiply-add chains that fill a core's arithmetic units (``ceiling``):
what the host allows any compute-bound kernel, its all-core clock included. ``path`` says
how the batch ran (``candidate``: each thread builds a candidate's matrices and runs its
sweeps; ``pairs``: all matrices first, then the (candidate, sweep) pairs; ``--path``
forces one). The
threading layer is Numba's choice unless ``--threading-layer``, and the file records the
processor (``lscpu``) so that cores can be told from hyperthreads.

    python -m benchmarks cpu_scaling --threads 1,2,4,8,16 --name rh03_f64

writes ``benchmarks/results/<device>/cpu_scaling/rh03_f64.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from benchmarks.solver import candidates, objective_inputs  # noqa: E402
from kingen.experiment.protocol import standard_protocol  # noqa: E402
from kingen.model.scheme import Scheme  # noqa: E402
from kingen.solve import Simulator, batch, cpu  # noqa: E402
from kingen.solve.cuda import CPU_DEFAULT, LaunchConfig  # noqa: E402
from kingen.solve.options import SolverOptions  # noqa: E402

STANDARD = ("deactivation", "desensitization", "recovery", "dose_response")


@contextlib.contextmanager
def builds_only():
    """Within it, the CPU propagator form builds its matrices and runs no sample."""
    whole = batch.run_on_cpu
    batch.run_on_cpu = functools.partial(cpu.run_on_cpu, solve=False)
    try:
        yield
    finally:
        batch.run_on_cpu = whole


def timed(sim: Simulator, params: np.ndarray, config: LaunchConfig, repeats: int):
    """Median seconds of one objective-mode run, the medians of its parts (the host's
    preparation, the parallel solve, the results; for the propagator form the solve's
    builds alone and the samples, the rest), and the last result."""
    times, parts, builds, res = [], [], [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = sim.run(params, "objective", launch_config=config)
        times.append(time.perf_counter() - t0)
        parts.append(res.timings)
        if config.form != "stage":
            with builds_only():
                builds.append(sim.run(params, "objective", launch_config=config)
                              .timings["solve_s"])
    medians = {k: float(np.median([p[k] for p in parts]))
               for k in ("prepare_s", "solve_s", "finish_s")}
    if builds:
        medians["build_s"] = float(np.median(builds))
        medians["samples_s"] = max(0.0, medians["solve_s"] - medians["build_s"])
    return float(np.median(times)), medians, res


def processor() -> dict:
    """``lscpu``'s fields (model, sockets, cores per socket, threads per core, caches), or
    what ``os`` knows where it is missing."""
    try:
        out = subprocess.run(["lscpu", "-J"], capture_output=True, text=True, timeout=20)
        fields = {e["field"].rstrip(":"): e["data"] for e in json.loads(out.stdout)["lscpu"]}
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return {"cpu_count": os.cpu_count()}
    keep = ("Model name", "Socket(s)", "Core(s) per socket", "Thread(s) per core", "CPU(s)",
            "NUMA node(s)", "L1d cache", "L2 cache", "L3 cache", "Flags")
    info = {k: v for k, v in fields.items() if k in keep}
    if "Flags" in info:  # only the vector extensions matter here
        info["Flags"] = " ".join(f for f in info["Flags"].split()
                                 if f.startswith(("avx", "fma", "sse4")))
    return info


def path_of(config: LaunchConfig, n: int, threads: int) -> str:
    """How the solver runs a batch of ``n`` on ``threads`` threads."""
    if config.form == "stage":
        return "pairs"
    return "candidate" if cpu.by_candidate(n, threads) else "pairs"


def part_speedups(parts: dict, first: dict, work: float) -> dict:
    """Each part's speed-up over the first thread count, for ``work`` times its work."""
    return {f"{k[:-2]}_speedup": work * first[k] / parts[k]
            for k in ("solve_s", "build_s", "samples_s") if parts.get(k) and first.get(k)}


@functools.cache
def _chains():
    """A kernel of multiply-add chains, 64 independent ones per work item held in one
    core's L1 cache: enough at once to fill a core's arithmetic units (4 chains would leave
    them idle between dependent steps, and two threads sharing one core through
    hyper-threading would then each run at full speed). What the host's cores give
    together, their clock at that load included."""
    import numba

    @numba.njit(parallel=True, cache=True, fastmath={"contract"})
    def chains(n_items: int, length: int, out: np.ndarray) -> None:
        for i in numba.prange(n_items):
            acc = np.full(64, 1.0 + i * 1e-9)
            for _ in range(length):
                for k in range(64):
                    acc[k] = acc[k] * 0.999999 + 1e-7
            out[i] = acc.sum()

    return chains


def arithmetic_ceiling(threads: list[int], repeats: int, items_per_thread: int = 64,
                       length: int = 400_000) -> list[dict]:
    """Weak scaling of :func:`_chains`: the speed-up any compute-bound kernel can reach on
    this host at each thread count (below the thread count when the cores' clock falls as
    more of them run)."""
    import numba

    chains = _chains()
    chains(2, 10, np.zeros(2))  # compile
    rows, base = [], None
    for t in threads:
        numba.set_num_threads(t)
        n = items_per_thread * t
        out = np.zeros(n)
        best = min(_timed_call(chains, n, length, out) for _ in range(repeats))
        rate = n / best
        base = base or rate
        rows.append({"threads": t, "items": n, "run_s": best, "items_per_s": rate,
                     "speedup": rate / base})
        print(f"  ceiling threads {t:3d}  {best:7.3f} s  x{rate / base:5.2f}", flush=True)
    return rows


def _timed_call(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    import numba

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="robert_howe_2003")
    ap.add_argument("--precision", default="float64", choices=["float64", "float32"])
    ap.add_argument("--variant", default=None,
                    help=f"launch variant (default: the CPU's, {CPU_DEFAULT.name})")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--per-thread", type=int, default=64,
                    help="candidates per thread for weak scaling (0: skip)")
    ap.add_argument("--population", type=int, default=1024,
                    help="candidates for strong scaling (0: skip)")
    ap.add_argument("--exchange", type=float, default=0.0, help="10-90 %% exchange time, ms")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--path", default="auto", choices=["auto", "candidate", "pairs"],
                    help="how the propagator form runs a batch (default: the solver's choice)")
    ap.add_argument("--threading-layer", default=None, choices=["omp", "tbb", "workqueue"],
                    help="Numba's threading layer (default: Numba's choice)")
    ap.add_argument("--ceiling", action="store_true",
                    help="also time multiply-add chains that fill a core at each thread count: "
                         "the speed-up the host's cores and clocks allow any compute-bound "
                         "kernel")
    add_output_options(ap, "cpu_scaling")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    out = output_path(args, "cpu_scaling")
    if args.threading_layer:
        numba.config.THREADING_LAYER = args.threading_layer
    if args.path != "auto":
        cpu.PER_THREAD = 0 if args.path == "candidate" else 1 << 40

    scheme = Scheme.load(ROOT / "models" / f"{args.model}.toml")
    protocols = [standard_protocol(n, exchange=args.exchange) for n in STANDARD]
    sim = Simulator(scheme, protocols,
                    options=SolverOptions(backend="cpu", precision=args.precision),
                    objective=objective_inputs(scheme, protocols))
    config = LaunchConfig.parse(args.variant) if args.variant else CPU_DEFAULT
    threads = [t for t in map(int, args.threads.split(",")) if t <= numba.config.NUMBA_NUM_THREADS]
    result = {"provenance": provenance("cpu_scaling", argv), "model": args.model,
              "precision": args.precision, "variant": config.name,
              "exchange_ms": args.exchange, "cores": os.cpu_count(),
              "processor": processor(), "path_option": args.path,
              "numba_threads_max": numba.config.NUMBA_NUM_THREADS, "rows": []}
    if args.ceiling:
        result["ceiling"] = arithmetic_ceiling(threads, args.repeats)
        write(result, out)
    if not (args.per_thread or args.population):
        return 0
    sim.run(candidates(scheme, 8, seed=1), "objective", launch_config=config)  # compile
    result["threading_layer"] = numba.threading_layer()
    print(f"== {args.model} {args.precision} {config.name} on {os.cpu_count()} cores "
          f"({result['threading_layer']}); threads {threads}", flush=True)
    for kind, sizes in (("weak", [args.per_thread * t for t in threads] if args.per_thread
                         else []),
                        ("strong", [args.population] * len(threads) if args.population else [])):
        if not sizes:
            continue
        base = ref = first = None
        for t, n in zip(threads, sizes):
            numba.set_num_threads(t)
            params = candidates(scheme, n, seed=n)
            seconds, parts, res = timed(sim, params, config, args.repeats)
            rate = n / seconds
            if kind == "strong":
                if ref is None:
                    ref = res.sgg.copy()
                same = bool(np.array_equal(res.sgg, ref, equal_nan=True))
            else:
                same = None
            base = base or rate
            first = first or parts
            row = {"scaling": kind, "threads": t, "population": n, "run_s": seconds,
                   "candidates_per_s": rate, "speedup": rate / base,
                   "same_as_one_thread": same, "path": path_of(config, n, t), **parts,
                   **part_speedups(parts, first, n / sizes[0])}
            result["rows"].append(row)
            print(f"  {kind:6s} threads {t:3d}  N={n:6d}  {seconds:7.3f} s/generation  "
                  f"{rate:9.0f} candidates/s  x{rate / base:5.2f}  "
                  f"(prepare {parts['prepare_s']:.3f} s, solve {parts['solve_s']:.3f} s"
                  + (f": builds {parts['build_s']:.3f} s x{row['build_speedup']:.2f}, "
                     f"samples {parts['samples_s']:.3f} s x{row['samples_speedup']:.2f}, "
                     f"{row['path']}" if "build_s" in parts else "") + ")"
                  + ("" if same is None else f"  same as 1 thread: {same}"), flush=True)
            write(result, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
