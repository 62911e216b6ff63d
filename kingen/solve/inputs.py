"""A batch's rate constants in the solvers' layout, checked in the same compiled pass.

The solvers read parameters as (n_params, N): one row per rate constant, candidates along
it. Every generation the host turns the (N, n_params) batch into that layout and marks the
candidates whose rates are not all positive numbers. As NumPy array code that was two
passes over the batch on one core; here it is one, on all cores from
:data:`kingen.solve.rest.PARALLEL_FROM_WORK` values on. With the survivors of the GA taken
without building their pool (:func:`kingen.search.operators.take_survivors`), the solver's
host preparation of a 65,536-candidate R&H generation on the H100 machine fell from
12.7–15.1 to 6.8–8.5 ms (``benchmarks/results/h100/fit_gpu/session13_*_65536_*.json``).
"""

from __future__ import annotations

import numba
import numpy as np

from kingen.solve import rest


@numba.njit(cache=True, nogil=True, inline="always")
def _one_row(params, out, bad, c) -> None:  # pragma: no cover - compiled
    ok = True
    for j in range(params.shape[1]):
        v = params[c, j]
        ok = ok and v > 0.0 and v < np.inf  # NaN fails both
        out[j, c] = v
    bad[c] = not ok


# Two functions, not one compiled twice: numba's cache keys a function by its name and
# bytecode, not by ``parallel`` (as in kingen.solve.rest).
@numba.njit(parallel=True, cache=True, nogil=True)
def _parallel(params, out, bad) -> None:  # pragma: no cover - compiled
    for c in numba.prange(params.shape[0]):
        _one_row(params, out, bad, c)


@numba.njit(cache=True, nogil=True)
def _serial(params, out, bad) -> None:  # pragma: no cover - compiled
    for c in range(params.shape[0]):
        _one_row(params, out, bad, c)


def checked_transpose(params: np.ndarray, dtype: np.dtype | str = np.float64
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``params`` (N, n_params) as a C-ordered (n_params, N) array of ``dtype``, and which
    rows hold a rate that is not a positive number (0, negative, infinite or NaN).

    The values are cast to ``dtype`` as NumPy's ``astype`` casts them; the check reads the
    float64 values, before the cast.

    Examples
    --------
    >>> p = np.array([[1.0, 2.0], [3.0, -1.0], [np.nan, 5.0]])
    >>> out, bad = checked_transpose(p)
    >>> out.tolist()[0][:2], bad.tolist()
    ([1.0, 3.0], [False, True, True])
    >>> bool(np.array_equal(out, p.T, equal_nan=True))
    True
    """
    p = np.asarray(params, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"params must be 2-D (N, n_params), got shape {p.shape}")
    out = np.empty((p.shape[1], p.shape[0]), dtype=dtype)
    bad = np.empty(p.shape[0], dtype=np.bool_)
    if p.size:
        run = _parallel if p.size >= rest.PARALLEL_FROM_WORK else _serial
        run(p, out, bad)
    return out, bad
