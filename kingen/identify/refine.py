"""One objective from the fit to the interval: the fit's noise model, and the refinement that
ends every fit.

:func:`start_noise` gives a new (or resumed) fit's objective its noise model before the
search: σ and τ of each recorded protocol from its baseline before the first pulse
(:mod:`kingen.identify.noise`), where the data give them; where they do not (no baseline,
summary targets without an sd), provisionally from the residuals at the search's start. The
search then minimises Σ_p weight_p · χ²_p (:mod:`kingen.fitting.objective`), χ² itself with
the default weights.

:func:`finish` ends the fit: the noise model is estimated again at the search's best (the
same estimate ``kingen profile`` made before it was stored), the hall of fame is scored
again on that χ², and a batched Levenberg–Marquardt descent (the profile's own,
:meth:`~kingen.identify.profile.ProfileEngine.descend`) runs from its best few members
together, to convergence or its iteration limit. The lowest χ² found is the run's best;
the noise model is stored with it, so that ``kingen profile`` computes the same χ² for the
same parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kingen.identify.likelihood import Likelihood, noise_weights
from kingen.identify.noise import NoiseModel, estimate_noise
from kingen.identify.profile import DONE, ProfileEngine

STARTS = 4            # hall-of-fame members the refinement starts from
MAX_ITER = 40         # Levenberg–Marquardt iterations of each start
REL_TOL = 1e-10       # χ² decrease, relative to χ², below which a start has converged
ABS_TOL = 1e-9        # ... and its floor (χ² near 0: data without noise)
# How the descent's stopping reasons read as convergence (the others: iteration limit, no
# finite start)
CONVERGED_WHY = ("χ² tolerance", "gradient tolerance", "step tolerance")
OBJECTIVE = "chi2"    # the objective a run file's best records (absent: "relative")
PASSES = 3            # noise estimates at the best, each followed by a refinement
NOISE_RTOL = 1e-3     # σ and τ that moved less than this (relative) hold still


def start_noise(objective: Any, pmap: Any, genes: np.ndarray) -> NoiseModel:
    """Give ``objective`` its noise model at ``genes`` (the search's start) and return it.

    Examples
    --------
    >>> import kingen
    >>> cfg = kingen.load_config(kingen.demo_config())
    >>> objective = kingen.Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu"))
    >>> noise = start_noise(objective, cfg.pmap, cfg.pmap.start_genes())
    >>> objective.fitness_kind, noise.source
    ('chi2', ['baseline', 'baseline', 'baseline', 'baseline'])
    """
    x = np.asarray(genes, dtype=float)
    noise = estimate_noise(objective, pmap.to_params(x[None, :]))
    objective.set_noise(noise_weights(Likelihood(objective, pmap, noise, x)))
    return noise


@dataclass
class Finish:
    """What :func:`finish` found.

    Attributes
    ----------
    genes, chi2
        The best genes and their χ² (−2 log L + const).
    hof_genes, hof_chi2
        The hall of fame scored on that χ², the refined starts among them, best first.
    noise
        The noise model (stored with the best).
    converged
        Whether the best's descent stopped on a tolerance (not on its iteration limit).
    report
        JSON-able: ``objective``, ``noise``, ``starts``, ``chi2_before`` (the hall of
        fame's best), ``chi2_after``, ``iterations``, ``evaluations``, ``stopped`` (why
        the best's descent stopped), ``converged``, ``updates`` (notes of later updates).
    """

    genes: np.ndarray
    chi2: float
    hof_genes: np.ndarray
    hof_chi2: np.ndarray
    noise: NoiseModel
    converged: bool
    report: dict[str, Any] = field(default_factory=dict)


def finish(objective: Any, pmap: Any, hof_genes: np.ndarray, *, starts: int = STARTS,
           max_iter: int = MAX_ITER, refine: bool = True) -> Finish:
    """Score the hall of fame on the likelihood at its best, and refine its best
    ``starts`` members together by Levenberg–Marquardt (see the module docstring).

    ``objective`` is left scoring that likelihood.

    Examples
    --------
    >>> import kingen
    >>> cfg = kingen.load_config(kingen.demo_config())
    >>> objective = kingen.Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu"))
    >>> truth = cfg.pmap.to_genes(cfg.scheme.values[None, :])
    >>> done = finish(objective, cfg.pmap, truth, max_iter=2)
    >>> done.chi2 <= done.report["chi2_before"], done.report["objective"]
    (True, 'chi2')
    """
    hof = np.atleast_2d(np.asarray(hof_genes, dtype=float))
    report: dict[str, Any] = {"objective": OBJECTIVE, "noise": None, "starts": 0,
                              "chi2_before": None, "chi2_after": None, "iterations": 0,
                              "evaluations": 0, "stopped": "not refined", "converged": False,
                              "passes": 0, "updates": []}
    converged, noise, last, lik = False, None, None, None
    first = hof[:1].copy()  # the search's best
    for _ in range(PASSES):
        # the noise estimated at the best so far; where it comes from the residuals, it
        # moves with the best: scored and refined again until it holds still
        estimate = estimate_noise(objective, pmap.to_params(hof[:1]))
        key = np.concatenate([estimate.sigma, estimate.tau])
        if last is not None and np.allclose(key, last, rtol=NOISE_RTOL, equal_nan=True):
            break
        noise, last = estimate, key
        lik = Likelihood(objective, pmap, noise, hof[0])
        objective.set_noise(noise_weights(lik))
        chi2 = lik.chi2(hof)
        if not report["passes"]:
            before = float(chi2[0])  # the search's best, on this noise model
        order = np.argsort(chi2, kind="stable")
        hof, chi2 = hof[order], chi2[order]
        report["passes"] += 1
        k = min(int(starts), int(np.isfinite(chi2).sum())) if refine else 0
        if not k:
            break
        tol = max(REL_TOL * float(chi2[0]), ABS_TOL) if np.isfinite(chi2[0]) else ABS_TOL
        eng = ProfileEngine.from_starts(lik, hof[:k], max_iter=max_iter, tol=tol)
        while eng.descend():
            pass
        best = int(np.argmin(np.where(np.isfinite(eng.chi2), eng.chi2, np.inf)))
        why = eng.why.get(best, "")
        converged = bool(eng.status[best] == DONE and why.startswith(CONVERGED_WHY))
        # the refined starts replace those they started from; the order is χ²'s
        hof = np.vstack([eng.x, hof[k:]])
        chi2 = np.concatenate([eng.chi2, chi2[k:]])
        order = np.argsort(chi2, kind="stable")
        hof, chi2 = hof[order], chi2[order]
        report.update(starts=k, iterations=int(eng.iters[best]), stopped=why,
                      evaluations=report["evaluations"] + int(eng.candidates),
                      converged=converged)
    # the search's best on the final likelihood: what the refinement gained
    report["chi2_before"] = (before if report["passes"] == 1 else
                             float(lik.chi2(first)[0]))
    report["chi2_after"] = float(chi2[0])
    report["noise"] = noise.to_dict()
    return Finish(genes=hof[0].copy(), chi2=float(chi2[0]), hof_genes=hof, hof_chi2=chi2,
                  noise=noise, converged=converged, report=report)


def stored_noise(best: dict[str, Any] | None) -> NoiseModel | None:
    """The noise model a run's best was found with (its ``polish`` record), or None for
    a run written before kingen fitted the likelihood (its fitness is the weighted
    relative error).

    Examples
    --------
    >>> stored_noise({"polish": {"fitness_before": 1.0}}) is None
    True
    """
    rec = (best or {}).get("polish") or {}
    if rec.get("objective") != OBJECTIVE or not isinstance(rec.get("noise"), dict):
        return None
    return NoiseModel.from_dict(rec["noise"])
