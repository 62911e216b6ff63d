"""Local uncertainty at the optimum: the Fisher information in log space.

With χ²(θ) = Σ r² = −2 log L + const (:mod:`kingen.identify.likelihood`) and genes x = log10
of the rates, the Fisher information is F = JᵀJ (J = ∂r/∂x, by forward differences, every
column a candidate of the same batched solver call; JᵀJ is summed where the traces are
made, :mod:`kingen.identify.gauss_newton`), the covariance of x is F⁻¹, and the
standard error of a gene is √(F⁻¹)ᵢᵢ in decades. Directions F cannot see (eigenvalues below
:data:`RCOND` × the largest, where the eigen-decomposition itself is noise) have infinite
standard errors; nearly flat directions give large finite ones. This is the quadratic
approximation of the likelihood at its optimum; the profiles
(:mod:`kingen.identify.profile`) test it.

>>> import numpy as np
>>> jac = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
>>> u = local_uncertainty(jac.T @ jac, ["a", "b"])
>>> u["se_log10"], u["correlation"]
([1.0, 0.5], [[1.0, 0.0], [0.0, 1.0]])
>>> local_uncertainty(np.ones((2, 2)), ["a", "b"])["se_log10"]
[inf, inf]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

RCOND = 1e-12
BLIND_WEIGHT = 1e-2


def fd_step(precision: str) -> float:
    """The forward-difference step in genes (decades) for the solver's precision."""
    return 1e-3 if precision == "float32" else 1e-5


def perturbations(x: np.ndarray, upper: np.ndarray, h: float, free: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Rows x + hᵢ eᵢ for each gene i where ``free``; hᵢ = −h where x + h passes ``upper``.

    Returns the rows (m, n) and the steps (m,).
    """
    cols = np.flatnonzero(free)
    steps = np.where(x[cols] + h > upper[cols], -h, h)
    rows = np.repeat(x[None, :], cols.size, axis=0)
    rows[np.arange(cols.size), cols] += steps
    return rows, steps


def embed(jtj: np.ndarray, jtr: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """JᵀJ (n, n) and Jᵀr (n,) from those over the ``free`` genes (m × m and m, in order;
    entries beyond m are unread); rows and columns of the others are 0.

    >>> a, g = embed(np.array([[2.0]]), np.array([1.0]), np.array([False, True]))
    >>> a.tolist(), g.tolist()
    ([[0.0, 0.0], [0.0, 2.0]], [0.0, 1.0])
    """
    n = free.size
    cols = np.flatnonzero(free)
    m = cols.size
    a = np.zeros((n, n))
    g = np.zeros(n)
    a[np.ix_(cols, cols)] = jtj[:m, :m]
    g[cols] = jtr[:m]
    return a, g


def normal_equations(r0: np.ndarray, r_cols: np.ndarray, steps: np.ndarray,
                     free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """JᵀJ (n, n) and Jᵀr (n,) from the base residuals r0 (R,) and the perturbed rows
    (m, R); rows and columns of genes not ``free`` are 0. The steps form them without
    the residual vectors (:mod:`kingen.identify.gauss_newton`); this is their reference."""
    n = free.size
    jac_t = (r_cols - r0[None, :]) / steps[:, None]  # (m, R)
    cols = np.flatnonzero(free)
    a = np.zeros((n, n))
    g = np.zeros(n)
    a[np.ix_(cols, cols)] = jac_t @ jac_t.T
    g[cols] = jac_t @ r0
    return a, g


def covariance(fisher: np.ndarray) -> np.ndarray:
    """F⁻¹ by eigen-decomposition; infinite variance along directions F cannot see."""
    f = 0.5 * (fisher + fisher.T)
    n = f.shape[0]
    if n == 0:
        return np.zeros((0, 0))
    w, v = np.linalg.eigh(f)
    top = max(float(w.max()), 0.0)
    ok = w > RCOND * top if top > 0 else np.zeros(n, dtype=bool)
    cov = (v[:, ok] / w[ok]) @ v[:, ok].T
    # genes with a real part (1 % of their variance direction) in an unseen direction
    blind = (v[:, ~ok] ** 2).sum(axis=1) > BLIND_WEIGHT
    cov[blind, :] = np.inf
    cov[:, blind] = np.inf
    return cov


def local_uncertainty(fisher: np.ndarray, names: list[str]) -> dict[str, Any]:
    """Standard errors (decades) and the correlation matrix from the Fisher information.

    Returns
    -------
    dict
        ``names``, ``se_log10`` (inf where not determined), ``correlation`` (NaN where a
        standard error is infinite), ``fisher``.
    """
    cov = covariance(np.asarray(fisher, dtype=float))
    se = np.sqrt(np.maximum(np.diag(cov), 0.0)) if cov.size else np.zeros(0)
    with np.errstate(all="ignore"):
        corr = cov / np.outer(se, se)
    corr[~np.isfinite(corr)] = math.nan
    np.fill_diagonal(corr, 1.0)
    return {"names": list(names), "se_log10": [float(v) for v in se],
            "correlation": [[float(v) for v in row] for row in corr],
            "fisher": [[float(v) for v in row] for row in np.asarray(fisher, dtype=float)]}
