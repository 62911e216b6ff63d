"""Local uncertainty at the end of a fit: the noise model, then the Fisher information at
the best, from ONE batched solver call (the best and its forward-difference perturbations).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kingen.identify.fisher import embed, fd_step, local_uncertainty
from kingen.identify.gauss_newton import Groups
from kingen.identify.likelihood import Likelihood
from kingen.identify.noise import NoiseModel, estimate_noise
from kingen.identify.table import local_rows

LEVEL = 0.95  # the confidence level of the intervals a fit reports


def local_at_best(objective, pmap, best_genes: np.ndarray, level: float = LEVEL,
                  noise: NoiseModel | None = None) -> dict[str, Any]:
    """Standard errors (decades) and correlations of the genes at ``best_genes``.

    Returns
    -------
    dict
        ``names``, ``best_log10`` (the genes), ``se_log10``, ``correlation``, ``fisher``,
        ``chi2`` (−2 log L + const at the best), ``noise``
        (:meth:`~kingen.identify.noise.NoiseModel.to_dict`), ``log`` (which genes are
        log10), ``level`` and ``table`` (:func:`~kingen.identify.table.local_rows`).
        ``noise``: the fit's noise model (default: estimated at the best).
    """
    x = np.asarray(best_genes, dtype=float)
    if noise is None:
        noise = estimate_noise(objective, pmap.to_params(x[None, :]))
    lik = Likelihood(objective, pmap, noise, x)
    free = np.ones(pmap.n_genes, dtype=bool)
    batch = Groups()
    batch.add_lm(x, pmap.upper, fd_step(objective.simulator.precision), free)
    chi2, jtj, jtr = batch.evaluate(lik)
    a, _ = embed(jtj[0], jtr[0], free)
    out = local_uncertainty(a, pmap.gene_names)
    out.update(best_log10=[float(v) for v in x], chi2=float(chi2[0]),
               noise=noise.to_dict(), log=[bool(v) for v in pmap.log], level=level)
    out["table"] = local_rows(out, objective.scheme, pmap, level)
    return out
