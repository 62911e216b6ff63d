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

:func:`solver_inputs` makes all a solve reads of a batch's rates: the parameters in that
layout, the resting occupancies (:mod:`kingen.solve.rest`) and the rows that fail; it is
:func:`solver_rates` then :func:`solver_rest`, which a GPU call runs apart.
"""

from __future__ import annotations

import numba
import numpy as np

from kingen.errors import KingenError
from kingen.model.scheme import Scheme
from kingen.solve.rest import rest_occupancy_batch


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


def checked_shape(scheme: Scheme, params: np.ndarray) -> np.ndarray:
    """``params`` as a float64 (N, n_params) array of ``scheme``'s rates (one row: 2-D).

    Raises
    ------
    KingenError
        Not one column per rate constant of the scheme.

    Examples
    --------
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> checked_shape(s, s.values).shape == (1, s.n_params)
    True
    """
    p = np.atleast_2d(np.asarray(params, dtype=np.float64))
    if p.ndim != 2 or p.shape[-1] != scheme.n_params:
        raise KingenError(f"params must have {scheme.n_params} columns "
                          f"({', '.join(scheme.param_names)})", field="params",
                          value=f"shape {p.shape}")
    return p


def solver_rates(scheme: Scheme, params: np.ndarray, dtype: np.dtype | str = np.float64,
                 *, complete: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first half of :func:`solver_inputs`: the parameters (n_params, N) in ``dtype``,
    the float64 rates (N, n_params) that :func:`solver_rest` solves from (the refused rows
    hold the scheme's own values there), and the rows refused. ``params`` is never written
    into.

    A GPU call uploads the rates and starts the matrix builds before it solves the resting
    occupancies, which the builds do not read: the host's solve then overlaps them.

    Examples
    --------
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> P, p, bad = solver_rates(s, np.vstack([s.values, -s.values]))
    >>> P.shape == (s.n_params, 2), bool(np.array_equal(p[1], s.values)), bad.tolist()
    (True, True, [False, True])
    """
    p = checked_shape(scheme, params)
    if complete:
        with np.errstate(all="ignore"):
            p = scheme.complete(p)
    dtype = np.dtype(dtype)
    P, bad = checked_transpose(p, dtype)
    if bad.any():
        if not complete:  # the caller's array is never written into
            p = p.copy()
        p[bad] = scheme.values
        P[:, bad] = scheme.values.astype(dtype)[:, None]
    return P, p, bad


def solver_rest(scheme: Scheme, p: np.ndarray, bad: np.ndarray,
                dtype: np.dtype | str = np.float64, *, rest: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """The second half of :func:`solver_inputs`: the initial occupancies (n_states, N) in
    ``dtype`` of :func:`solver_rates`'s rates ``p`` and refused rows ``bad``, and the rows
    refused now (``bad`` and those whose resting state cannot be solved; ``bad`` itself is
    not written into). ``rest`` as for :func:`solver_inputs`.

    Examples
    --------
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> P, p, bad = solver_rates(s, np.vstack([s.values, -s.values]))
    >>> S0, bad = solver_rest(s, p, bad)
    >>> S0.shape == (s.n_states, 2), bool(np.allclose(S0.sum(axis=0), 1.0)), bad.tolist()
    (True, True, [False, True])
    """
    if rest is not None and np.shape(rest) != (p.shape[0], scheme.n_states):
        raise KingenError(f"rest must be one row of {scheme.n_states} occupancies per row "
                          f"of params ({p.shape[0]})", field="rest",
                          value=f"shape {np.shape(rest)}")
    if rest is None:
        init = rest_occupancy_batch(scheme, p)
        replace = ~np.all(np.isfinite(init), axis=1)
    else:  # a failed row's were solved from its own rates, not the scheme's values
        init = np.asarray(rest, dtype=np.float64)
        replace = bad | ~np.all(np.isfinite(init), axis=1)
    if replace.any():
        bad = bad | replace
        init = init.copy() if rest is not None else init
        init[replace] = scheme.rest_occupancy(scheme.values)
    return np.ascontiguousarray(init.T, dtype=dtype), bad


def solver_inputs(scheme: Scheme, params: np.ndarray, dtype: np.dtype | str = np.float64,
                  *, complete: bool = True, rest: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's parameters (n_params, N) and initial occupancies (n_states, N) in the
    solvers' layout and ``dtype``, and its rows that fail without being solved.

    A row fails when one of its rates is not a positive number (``params`` itself is never
    written into) or its resting state cannot be solved; it is solved with the scheme's
    own values in its place, and its result is discarded.

    Parameters
    ----------
    scheme
        The scheme the rates belong to.
    params
        (N, n_params) rates, internal units.
    dtype
        The solve's precision.
    complete
        Recompute the derived rates first (False: ``params`` holds them already).
    rest
        The rows' resting occupancies (N, n_states), already solved by
        :func:`~kingen.solve.rest.rest_occupancy_batch` from the same rates; None: solve
        them here. Several GPUs' blocks take their slices of one solve on the caller's
        thread (:mod:`kingen.fitting.gpus`).

    Examples
    --------
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> p = np.vstack([s.values, -s.values])
    >>> P, S0, bad = solver_inputs(s, p)
    >>> P.shape == (s.n_params, 2), S0.shape == (s.n_states, 2), bad.tolist()
    (True, True, [False, True])
    >>> bool(np.array_equal(solver_inputs(s, p, rest=rest_occupancy_batch(s, p))[1], S0))
    True
    """
    P, p, bad = solver_rates(scheme, params, dtype, complete=complete)
    S0, bad = solver_rest(scheme, p, bad, dtype, rest=rest)
    return P, S0, bad
