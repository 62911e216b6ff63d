"""Full-size parameter-recovery check on the SYNTHETIC example data.

Fits ``data/demo.toml`` (ten free rates of the Jonas et al. 1993 scheme, four protocols,
2 % noise) with a large population, then compares the fitted rates with the ground truth
(``data/ground_truth.json``), the fitted currents with the noise-free ones
(``data/truth/*.csv``), and reports each rate's standard error from the Fisher information
of the data (the noise limit on how well the rate can be recovered at all)::

    python data/check_recovery.py --population 2048 --generations 60 \\
        --out benchmarks/results/fit_recovery.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kingen.data import load_recording  # noqa: E402
from kingen.fit import fit  # noqa: E402
from kingen.fit_config import load_config  # noqa: E402
from kingen.objective import Objective  # noqa: E402
from kingen.solve import simulate_exact  # noqa: E402

WELL_DETERMINED = {"k01": "binding", "k12": "binding", "k10": "unbinding",
                   "k21": "unbinding", "k2o": "opening", "ko2": "closing",
                   "k13": "entry into desensitization", "k24": "entry into desensitization",
                   "ko5": "entry into desensitization"}


def fisher_se(objective: Objective, pmap, genes: np.ndarray, sd: float) -> np.ndarray:
    """Standard errors of the genes (log10 rates) from J^T J / sigma^2 at ``genes``."""
    h = 1e-5
    x = np.vstack([genes] + [genes + h * np.eye(genes.size)[i] for i in range(genes.size)])
    r = objective.residuals(pmap.to_params(x))
    jac = ((r[1:] - r[0]) / h).T
    scale = np.concatenate([
        np.full(int((objective.weight[objective._slice(p)] > 0).sum()),
                sd * np.sqrt(item.weight) / np.sqrt(objective.dd[p]))
        for p, item in enumerate(objective.items)])
    fim = jac.T @ (jac / scale[:, None] ** 2)
    return np.sqrt(np.diag(np.linalg.inv(fim)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", type=int, default=2048)
    ap.add_argument("--generations", type=int, default=60)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    truth = json.loads((HERE / "ground_truth.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(HERE / "demo.toml", overrides={
            "backend": args.backend, "population": args.population, "seed": args.seed,
            "generations": args.generations, "output": str(Path(tmp) / "run.h5")})
        cfg.stop.patience = 0
        cfg.polish_evaluations = 60
        cfg.settings = cfg.to_dict()
        t0 = time.perf_counter()
        result = fit(cfg, progress=True)
        wall = time.perf_counter() - t0
    scheme = cfg.scheme
    objective = Objective(scheme, cfg.protocols, backend=args.backend)
    se = fisher_se(objective, cfg.pmap, cfg.pmap.to_genes(result.params)[0],
                   truth["noise_sd_pA"])
    rates = {}
    for name, s in zip(cfg.pmap.gene_names, se, strict=True):
        true = truth["parameters_file_units"][name]
        fitted = result.values[name]
        rates[name] = {"role": WELL_DETERMINED.get(name, "other"), "true": true,
                       "fitted": fitted, "ratio": fitted / true,
                       "within_20_percent": bool(0.8 <= fitted / true <= 1.2),
                       "fisher_se_percent": float((10 ** s - 1) * 100)}
    currents = {}
    peak = truth["peak_10mM_pA"]
    for item in cfg.protocols:
        p = item.protocol
        clean = load_recording(HERE / "truth" / f"{p.name}.csv")
        fitted = simulate_exact(scheme, p, params=result.params,
                                channels=result.amplitudes[p.name]).currents
        err = np.concatenate([f - c for f, c in zip(fitted, clean.currents_list(),
                                                     strict=True)])
        currents[p.name] = {"rmse_over_peak": float(np.sqrt(np.mean(err ** 2)) / peak)}
    out = {"check": "parameter recovery, full size",
           "command": "python data/check_recovery.py " + " ".join(argv or sys.argv[1:]),
           "data": "data/*.csv (SYNTHETIC, Jonas 1993 scheme, 2 % noise, 20 kHz)",
           "backend": result.backend, "device": result.device, "wall_s": wall,
           "generations": result.generations, "evaluations": result.evaluations,
           "fitness": result.fitness, "polish": result.polish,
           "fitness_at_truth": float(objective.evaluate(scheme.values[None, :])[0].fitness[0]),
           "rates": rates, "currents": currents, "errors": result.errors,
           "amplitudes": result.amplitudes}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    for name, r in rates.items():
        print(f"{name:5s} {r['role']:28s} fitted/true {r['ratio']:.3f}  "
              f"Fisher SE {r['fisher_se_percent']:.1f} %")
    for name, c in currents.items():
        print(f"{name:16s} RMSE vs noise-free {c['rmse_over_peak'] * 100:.2f} % of peak")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
