"""The resting occupancies of a batch of candidates, solved on all CPU cores.

Every generation the fit needs, for every candidate, the equilibrium of its scheme with no
agonist: the row vector p with p·Q(0) = 0 and Σp = 1. NumPy's batched ``solve`` handles the
small systems one after another on one core (230 ms for 65,536 16-state candidates, a
third of a GPU generation's host time); here each candidate's system is eliminated in a
``prange`` loop, with partial pivoting, giving NumPy's answer to rounding.
"""

from __future__ import annotations

import numba
import numpy as np

from kingen.scheme import Scheme


@numba.njit(parallel=True, cache=True, nogil=True)
def _stationary(params: np.ndarray, source: np.ndarray, target: np.ndarray,
                param: np.ndarray, factor: np.ndarray, s: int,
                out: np.ndarray) -> None:  # pragma: no cover - compiled
    n = params.shape[0]
    for c in numba.prange(n):
        a = np.zeros((s, s))
        for m in range(source.size):
            k = factor[m] * params[c, param[m]]
            # Qᵀ: row j balances the flux into j against the flux out of it
            a[target[m], source[m]] += k
            a[source[m], source[m]] -= k
        for j in range(s):
            a[s - 1, j] = 1.0  # one balance equation replaced by Σp = 1
        x = np.zeros(s)
        x[s - 1] = 1.0
        ok = True
        for k in range(s):
            piv = k
            for i in range(k + 1, s):
                if abs(a[i, k]) > abs(a[piv, k]):
                    piv = i
            if not (abs(a[piv, k]) > 0.0):
                ok = False
                break
            if piv != k:
                for j in range(s):
                    a[k, j], a[piv, j] = a[piv, j], a[k, j]
                x[k], x[piv] = x[piv], x[k]
            for i in range(k + 1, s):
                f = a[i, k] / a[k, k]
                if f != 0.0:
                    for j in range(k, s):
                        a[i, j] -= f * a[k, j]
                    x[i] -= f * x[k]
        if not ok:
            for j in range(s):
                out[c, j] = np.nan
            continue
        for k in range(s - 1, -1, -1):
            acc = x[k]
            for j in range(k + 1, s):
                acc -= a[k, j] * x[j]
            x[k] = acc / a[k, k]
        total = 0.0
        for j in range(s):
            x[j] = min(max(x[j], 0.0), 1.0)
            total += x[j]
        for j in range(s):
            out[c, j] = x[j] / total


def rest_occupancy_batch(scheme: Scheme, params: np.ndarray) -> np.ndarray:
    """:meth:`Scheme.rest_occupancy` for (N, n_params) parameters, on all cores.

    Candidates whose system is singular come back as NaN rows, as from the scheme's own
    method; schemes with a file-given initial state or a resting sink take the scheme's
    (cheap) path.

    Examples
    --------
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> p = np.vstack([s.values, s.values * 1.5])
    >>> bool(np.allclose(rest_occupancy_batch(s, p), s.rest_occupancy(p), atol=1e-13))
    True
    """
    p = np.atleast_2d(np.asarray(params, dtype=np.float64))
    if scheme.initial is not None or scheme.rest_sink() is not None or p.shape[0] < 64:
        return scheme.rest_occupancy(p)
    # with no agonist only the agonist-free transitions carry a rate
    free = [t for t in scheme.transitions if not t.agonist]
    out = np.empty((p.shape[0], scheme.n_states))
    _stationary(np.ascontiguousarray(p), np.array([t.source for t in free], np.int64),
                np.array([t.target for t in free], np.int64),
                np.array([t.param for t in free], np.int64),
                np.array([t.factor for t in free], np.float64), scheme.n_states, out)
    return out
