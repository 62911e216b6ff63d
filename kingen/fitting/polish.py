"""Local polish of one candidate by least squares on the objective's relative residuals.

A fit no longer ends with it: it ends with the Levenberg–Marquardt refinement on the
likelihood (:mod:`kingen.identify.refine`). One candidate is refined by
``scipy.optimize.least_squares``
(trust region reflective) in gene space, within the bounds; the Jacobian is by forward
differences, all perturbed candidates in ONE solver call. The refined candidate is kept
only if its fitness is lower.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kingen.fitting.config import FitConfig
from kingen.fitting.objective import Objective


def polish(objective: Objective, cfg: FitConfig, genes: np.ndarray, fitness: float,
           max_evaluations: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Refine one candidate by ``scipy.optimize.least_squares`` in gene (log) space.

    The Jacobian is by forward differences, all perturbed candidates in ONE solver call.

    Returns
    -------
    genes, report
        The refined genes (the input if not better) and ``{"fitness_before",
        "fitness_after", "evaluations", "accepted", "message"}``.
    """
    from scipy.optimize import least_squares

    pmap = cfg.pmap
    lo, hi = pmap.lower, pmap.upper
    span = hi - lo
    h = (1e-3 if cfg.precision == "float32" else 1e-6) * span
    x0 = np.clip(genes, lo + 1e-9 * span, hi - 1e-9 * span)
    cache: dict[bytes, np.ndarray] = {}
    calls = {"n": 0}

    def fun(x: np.ndarray) -> np.ndarray:
        key = x.tobytes()
        if key not in cache:
            cache.clear()
            cache[key] = objective.residuals(pmap.to_params(x[None, :]))[0]
            calls["n"] += 1
        return cache[key]

    def jac(x: np.ndarray) -> np.ndarray:
        r0 = fun(x)
        step = np.where(x + h > hi, -h, h)
        xs = x[None, :] + np.diag(step)
        rs = objective.residuals(pmap.to_params(xs))
        calls["n"] += xs.shape[0]
        return ((rs - r0[None, :]) / step[:, None]).T

    try:
        sol = least_squares(fun, x0, jac=jac, bounds=(lo, hi), method="trf",
                            max_nfev=max_evaluations, x_scale="jac")
        x, msg = sol.x, str(sol.message)
    except (ValueError, np.linalg.LinAlgError) as exc:
        x, msg = x0, f"least squares failed: {exc}"
    after = objective.evaluate(pmap.to_params(x[None, :]))[0].fitness[0]
    accepted = bool(np.isfinite(after) and after < fitness)
    report = {"fitness_before": float(fitness), "fitness_after": float(after),
              "evaluations": int(calls["n"]), "accepted": accepted, "message": msg}
    return (x if accepted else genes), report
