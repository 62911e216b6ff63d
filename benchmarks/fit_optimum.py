"""Does a fit reach the optimum? A fit against Levenberg–Marquardt started from the truth.

SYNTHETIC recordings of a shipped scheme other than the demo's (default: Raman & Trussell
1992, six states, two open), made by the exact reference (``simulate_exact``) with Gaussian
noise of ``--noise`` of the peak, are fitted by ``kingen fit`` from random starts inside
bounds ×/÷ ``--spread`` around the true rates. The same likelihood (the noise model the fit
stored) is then minimised by the batched Levenberg–Marquardt descent of
:mod:`kingen.identify.refine`, started from the true rates, to its χ² tolerance. The fit
passes when its χ² is within ``--tolerance`` (relative) of that optimum, or below it.

    python -m benchmarks fit_optimum --name DATE_COMMIT       (a few minutes on 2 CPU cores)

(``benchmarks/results/<device>/fit_optimum/NAME.json``; ``--out FILE`` to choose).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from kingen.experiment.protocol import standard_protocol  # noqa: E402
from kingen.experiment.recordings import Recording, write_csv  # noqa: E402
from kingen.identify.profile import ProfileEngine  # noqa: E402
from kingen.model.scheme import Scheme  # noqa: E402
from kingen.runs.fit import fit  # noqa: E402
from kingen.runs.profile import run_likelihood  # noqa: E402
from kingen.solve import simulate_exact  # noqa: E402
from kingen.store import RunStore  # noqa: E402

SCHEME = ROOT / "models" / "raman_trussell_1992.toml"
FREE = ("Rb", "Rd", "Rc1", "Rc2")
PROTOCOLS = ("deactivation", "desensitization")


def make_problem(folder: Path, *, noise: float, seed: int, spread: float, population: int,
                 generations: int, free: tuple[str, ...]) -> tuple[Path, dict[str, float]]:
    """Recordings and a fit configuration in ``folder``; returns it and the true rates."""
    scheme = Scheme.load(SCHEME)
    rng = np.random.default_rng(seed)
    (folder / "model.toml").write_text(SCHEME.read_text(encoding="utf-8"), encoding="utf-8")
    blocks = []
    for name in PROTOCOLS:
        p = standard_protocol(name, exchange=0.2, dt=0.05)
        clean = [s.current for s in simulate_exact(scheme, p).sweeps]
        peak = max(float(np.max(np.abs(c))) for c in clean)
        noisy = [c + rng.normal(0.0, noise * peak, c.size) for c in clean]
        write_csv(Recording(p.name, [s.times() for s in p.sweeps], noisy,
                            [s.label for s in p.sweeps], holding_mV=-60.0,
                            meta={"synthetic": True}), folder / f"{name}.csv")
        blocks.append(f'[[protocols]]\nprotocol = "{name}"\nexchange = 0.2\n'
                      f'recording = "{name}.csv"\n')
    truth = dict(zip(scheme.param_names, (float(v) for v in scheme.values), strict=True))
    bounds = "\n".join(f"{n} = {{ bounds = [{truth[n] / spread:.6g}, {truth[n] * spread:.6g}] }}"
                       for n in free)
    text = ('model = "model.toml"\noutput = "run.h5"\nbackend = "cpu"\n'
            f"seed = {seed}\npolish = true\npolish_evaluations = 60\n\n" + "\n".join(blocks)
            + "\n[parameters]\nfree = [" + ", ".join(f'"{n}"' for n in free) + "]\n"
            + bounds + f"\n\n[ga]\npopulation = {population}\ngenerations = {generations}\n")
    cfg = folder / "fit.toml"
    cfg.write_text(text, encoding="utf-8")
    return cfg, truth


def lm_from(run: Path, params: np.ndarray) -> tuple[float, np.ndarray, str, int]:
    """χ² at the optimum the descent reaches from ``params`` (internal units), on the
    likelihood the run stored; its genes, why it stopped, and its iterations."""
    with RunStore.open(run) as store:
        lik, problem = run_likelihood(store, "cpu")
    genes = problem.pmap.to_genes(np.atleast_2d(params))
    eng = ProfileEngine.from_starts(lik, genes, max_iter=200, tol=1e-9)
    while eng.descend():
        pass
    return float(eng.chi2[0]), eng.x[0], eng.why.get(0, ""), int(eng.iters[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", type=int, default=32)
    ap.add_argument("--generations", type=int, default=15)
    ap.add_argument("--noise", type=float, default=0.02, help="noise sd, fraction of the peak")
    ap.add_argument("--spread", type=float, default=4.0, help="bounds: truth ×/÷ this")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--tolerance", type=float, default=1e-6, help="relative χ² to pass")
    add_output_options(ap, "fit_optimum")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    runs = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            cfg, truth = make_problem(Path(tmp), noise=args.noise, seed=seed,
                                      spread=args.spread, population=args.population,
                                      generations=args.generations, free=FREE)
            t0 = time.perf_counter()
            result = fit(cfg, progress=False)
            fit_s = time.perf_counter() - t0
            run = Path(tmp) / "run.h5"
            with RunStore.open(run) as store:
                names = store.param_names
            chi2_lm, genes_lm, why, iters = lm_from(run, np.array([truth[n] for n in names]))
        rel = (result.fitness - chi2_lm) / chi2_lm
        fitted = {n: float(result.values[n]) for n in FREE}
        runs.append({
            "seed": seed, "chi2_fit": result.fitness, "chi2_lm_from_truth": chi2_lm,
            "relative_difference": rel, "passed": bool(rel <= args.tolerance),
            "fit_converged": result.converged, "fit_convergence": result.convergence,
            "lm_from_truth_stopped": why, "lm_from_truth_iterations": iters,
            "fit_s": fit_s, "evaluations": result.evaluations,
            "fitted": fitted, "truth": {n: truth[n] for n in FREE},
            "decades_from_truth": {n: math.log10(fitted[n] / truth[n]) for n in FREE}})
        print(f"seed {seed}: χ² fit {result.fitness:.12g}, LM from the truth {chi2_lm:.12g}, "
              f"relative {rel:+.2e} ({'pass' if rel <= args.tolerance else 'FAIL'}); "
              f"{fit_s:.0f} s")
    out = {"provenance": provenance("fit_optimum", argv), "scheme": SCHEME.name,
           "free": list(FREE), "protocols": list(PROTOCOLS), "noise": args.noise,
           "spread": args.spread, "population": args.population,
           "generations": args.generations, "tolerance": args.tolerance,
           "passed": all(r["passed"] for r in runs),
           "worst_relative_difference": max(r["relative_difference"] for r in runs),
           "runs": runs}
    path = write(out, output_path(args, "fit_optimum"))
    print(f"{'all passed' if out['passed'] else 'FAILED'}; worst relative χ² difference "
          f"{out['worst_relative_difference']:+.2e}; {path}")
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
