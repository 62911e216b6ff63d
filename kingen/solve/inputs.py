"""A batch's rate constants in the solvers' layout, checked in the same compiled pass.

The solvers read parameters as (n_params, N): one row per rate constant, candidates along
it. Every generation the host turns the (N, n_params) batch into that layout and marks the
candidates whose rates are not all positive numbers. As NumPy array code that was two
passes over the batch and their temporaries; here it is one compiled pass.

It stays on the calling thread: the pass moves memory and does little arithmetic, a GPU
fit's threads would first have to wake from the solve's idling, and a Dask worker's
threads share the host with the other workers' and the driver's. On all cores it did not
pay in the one device call that tried it: two workers sharing the H100, a shard's host
preparation 13.8–13.9 ms with NumPy's passes, 17.3–18.7 ms with the all-cores pass
(``benchmarks/results/h100/dask_scaling/2026-11-24_f8c3a58_cores_{old,new}_one_gpu_*.json``).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _checked_transpose(params, out, bad) -> None:  # pragma: no cover - compiled
    for c in range(params.shape[0]):
        ok = True
        for j in range(params.shape[1]):
            v = params[c, j]
            ok = ok and v > 0.0 and v < np.inf  # NaN fails both
            out[j, c] = v
        bad[c] = not ok


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
        _checked_transpose(p, out, bad)
    return out, bad
