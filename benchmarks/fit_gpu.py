"""Time a large-population fit generation by generation: solver vs everything else.

Runs the bundled demo problem (Jonas 1993 scheme, four SYNTHETIC protocols) with μ = λ =
``--population`` for ``--generations`` generations (polish off) and writes JSON with the
per-generation timings and the share of each generation spent outside the solver::

    python -m benchmarks fit_gpu --population 16384 --generations 5 --name 16384

(``benchmarks/results/<device>/fit_gpu/16384.json``; ``--out FILE`` to choose).

Per generation: ``solver_s`` is the whole ``Simulator.run`` call (host preparation of the
parameters and initial occupancies, transfers, kernel), ``kernel_s`` the kernel alone;
``outside_s`` is everything else the generation's thread did (variation and selection, the
objective's reduction, the hall of fame, packing the resume state and waiting for the
previous generation's write). The write itself (compression into the run file) runs on a
background thread while the next generation solves; its duration is ``background_write_s``.
``outside_over_solver`` = outside_s / solver_s is the figure the fitting issue bounds at
0.2 on the GPU for populations of 8,192 and more.

``--gpus N`` spreads each generation over N GPUs of this process, as ``kingen fit --gpus``
does (:mod:`kingen.fitting.gpus`); run once with 1 and once with N on the same machine, the
two files give the speed-up, and their ``best_fitness`` and ``best_params`` must be equal::

    python -m benchmarks fit_gpu --config fit.toml --population 65536 --generations 8 \
        --gpus 2 --name rh03_65536_2gpus
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from kingen.fitting.config import demo_config, load_config  # noqa: E402
from kingen.fitting.gpus import GpuEvaluators, threading_layer  # noqa: E402
from kingen.runs.fit import fit  # noqa: E402


def problem_label(cfg, config: Path | None) -> str:
    """What was fitted, from the configuration itself: its file (or the bundled demo), its
    scheme, and its protocols, free rates and sweeps.

    >>> cfg = load_config(demo_config())
    >>> problem_label(cfg, None).startswith("bundled demo: scheme ")
    True
    """
    source = "bundled demo" if config is None else f"configuration {config.name}"
    return (f"{source}: scheme {cfg.scheme.name}, {len(cfg.protocols)} protocols, "
            f"{cfg.pmap.n_genes} free rates, "
            f"{sum(p.protocol.n_sweeps for p in cfg.protocols)} sweeps")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", type=int, default=16384)
    ap.add_argument("--generations", type=int, default=5)
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--precision", default="float64", choices=("float64", "float32"))
    ap.add_argument("--config", type=Path, default=None,
                    help="fit configuration (default: the bundled demo)")
    ap.add_argument("--gpus", default="1", help="GPUs to spread each generation over "
                    "(kingen fit --gpus)")
    add_output_options(ap, "fit_gpu")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    path = output_path(args, "fit_gpu")

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config or demo_config(), overrides={
            "backend": args.backend, "precision": args.precision,
            "population": args.population, "generations": args.generations,
            "output": str(Path(tmp) / "fit_gpu.h5")})
        cfg.polish = False
        cfg.stop.patience = 0
        cfg.settings = cfg.to_dict()
        t0 = time.perf_counter()
        with GpuEvaluators(args.gpus) as evaluators:
            result = fit(cfg, progress=True, evaluator=evaluators)
        wall = time.perf_counter() - t0
    t = result.timings
    gens = []
    for g in range(len(t["solver_s"])):
        total = t["total_s"][g]
        outside = total - t["solver_s"][g]
        gens.append({
            "generation": g, "candidates": args.population,
            "solver_s": t["solver_s"][g], "kernel_s": t["kernel_s"][g],
            "objective_s": t["objective_s"][g], "ga_s": t["ga_s"][g], "io_s": t["io_s"][g],
            "background_write_s": t["write_s"][g],
            "total_s": total, "outside_s": outside,
            "outside_over_solver": outside / t["solver_s"][g],
            "outside_over_kernel": (total - t["kernel_s"][g]) / t["kernel_s"][g],
            "candidates_per_s": args.population / total,
            # the parts of the solver's host work and of the GA, where the fit timed them
            **{k: v[g] for k, v in t.items() if isinstance(v, list)
               and k.startswith(("solver_prepare", "solver_finish", "ga_", "params"))}})
    steady = gens[1:] or gens  # generation 0 includes compiling the kernel
    out = {
        "benchmark": "fit_gpu",
        "provenance": provenance("fit_gpu", argv),
        "problem": problem_label(cfg, args.config),
        "population": args.population, "offspring": cfg.ga.lambda_,
        "operators": "numpy" if cfg.ga.lambda_ >= 2048 else "deap",
        "generations": result.generations, "backend": result.backend,
        "device": result.device, "precision": args.precision,
        "gpus": args.gpus, "numba_threading_layer": threading_layer(),
        "wall_s": wall,
        "best_fitness": result.fitness, "best_params": [float(x) for x in result.params],
        "steady_state": {
            "mean_solver_s": sum(g["solver_s"] for g in steady) / len(steady),
            "mean_outside_s": sum(g["outside_s"] for g in steady) / len(steady),
            "max_outside_over_solver": max(g["outside_over_solver"] for g in steady),
            "mean_outside_over_solver": sum(g["outside_over_solver"] for g in steady)
            / len(steady)},
        "per_generation": gens,
    }
    write(out, path)
    s = out["steady_state"]
    print(f"{result.backend} ({result.device}): solver {s['mean_solver_s']:.3f} s/gen, outside "
          f"{s['mean_outside_s']:.3f} s/gen, outside/solver max "
          f"{s['max_outside_over_solver']:.3f}; wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
