"""The resting occupancies of a batch of candidates, solved in compiled loops.

Every generation the fit needs, for every candidate, the equilibrium of its scheme with no
agonist: the row vector p with p·Q(0) = 0 and Σp = 1. NumPy's batched ``solve`` handles the
small systems one after another on one core (230 ms for 65,536 16-state candidates, a
third of a GPU generation's host time); here each candidate's system is eliminated in a
compiled loop, with partial pivoting, giving NumPy's answer to rounding. The system is the
resting class's alone (:func:`resting_class`): the states receptors can rest in, 2 of
R&H's 16. The whole 16-state system took 36 ms of one process's 65,536-candidate solve on
the H100 machine's host, and 21 ms of a 32,768-candidate shard's
(``solver_prepare_s`` in ``benchmarks/results/h100/dask_scaling/2026-11-24_3a7aaf9_shard_*``);
the resting class takes 1.4–2.2 ms there on all cores (back to back, after idling)
(``benchmarks/results/h100/rest_state/2026-11-24_5bbd686_65536.json``).
Small batches run on one thread, large ones on all cores (:data:`PARALLEL_FROM_WORK`).
"""

from __future__ import annotations

import numba
import numpy as np

from kingen.model.scheme import Scheme, closed_classes


@numba.njit(cache=True, nogil=True, inline="always")
def _solve_one(params: np.ndarray, rate_param: np.ndarray, source: np.ndarray,
               target: np.ndarray, param: np.ndarray, factor: np.ndarray,
               states: np.ndarray, out: np.ndarray, c: int
               ) -> None:  # pragma: no cover - compiled
    s = states.size
    ok = True
    for m in range(rate_param.size):  # every agonist-free rate a positive number
        v = params[c, rate_param[m]]
        if not (v > 0.0 and v < np.inf):
            ok = False
    a = np.zeros((s, s))
    x = np.zeros(s)
    if ok:
        for m in range(source.size):
            k = factor[m] * params[c, param[m]]
            # Qᵀ: row j balances the flux into j against the flux out of it
            a[target[m], source[m]] += k
            a[source[m], source[m]] -= k
        for j in range(s):
            a[s - 1, j] = 1.0  # one balance equation replaced by Σp = 1
        x[s - 1] = 1.0
    for k in range(s if ok else 0):
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
        for j in range(out.shape[0]):
            out[j, c] = np.nan
        return
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
        out[states[j], c] = x[j] / total


# Two functions, not one compiled twice: numba's cache keys a function by its name and
# bytecode, not by ``parallel``, so one function's two builds would share one cache entry.
@numba.njit(parallel=True, cache=True, nogil=True)
def _stationary_parallel(params, rate_param, source, target, param, factor, states,
                         out) -> None:  # pragma: no cover - compiled
    for c in numba.prange(params.shape[0]):
        _solve_one(params, rate_param, source, target, param, factor, states, out, c)


@numba.njit(cache=True, nogil=True)
def _stationary_serial(params, rate_param, source, target, param, factor, states,
                       out) -> None:  # pragma: no cover - compiled
    for c in range(params.shape[0]):
        _solve_one(params, rate_param, source, target, param, factor, states, out, c)


# From this much elimination work (candidates × states³) on, all cores: 32,768 R&H
# candidates (2 resting states) and up. The rest_state suite, R&H
# (benchmarks/results/<device>/rest_state/2026-11-24_5bbd686_*.json), one thread against all:
# - a GPU host, after 0.3 s of sleep as through a GPU solve: waking numba's threads costs
#   less than one core's loop. On the H100 machine's 16-core host 65,536 candidates take
#   19.8 against 2.2 ms, 32,768 take 11.1 against 4.4.
# - a CPU fit, threads awake from the solve: on the 2-core CI machine 65,536 take 6.0
#   against 2.3 ms. (After idling there, all threads lose by 1 ms: 6.4 against 7.4.)
# Smaller batches stay on one thread, where the wake-up would weigh more.
PARALLEL_FROM_WORK = 1 << 18


def rest_occupancy_batch(scheme: Scheme, params: np.ndarray) -> np.ndarray:
    """:meth:`Scheme.rest_occupancy` for (N, n_params) parameters, on all cores.

    Only the states of the resting class (:func:`resting_class`) can hold receptors at
    rest; the system is solved over those alone (2 of R&H's 16 states), the others are 0.
    Candidates with an agonist-free rate that is not a positive number, or whose system is
    singular, come back as NaN rows; schemes with a file-given initial state or a resting
    sink take the scheme's (cheap) path.

    Returns an (N, n_states) view of a C-ordered (n_states, N) array: the layout the
    solvers take.

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
    states = resting_class(scheme)
    index = {int(j): k for k, j in enumerate(states)}
    inside = [t for t in free if t.source in index and t.target in index]
    out = np.zeros((scheme.n_states, p.shape[0]))
    solve = (_stationary_parallel if p.shape[0] * states.size ** 3 >= PARALLEL_FROM_WORK
             else _stationary_serial)
    solve(np.ascontiguousarray(p), np.array(sorted({t.param for t in free}), np.int64),
                np.array([index[t.source] for t in inside], np.int64),
                np.array([index[t.target] for t in inside], np.int64),
                np.array([t.param for t in inside], np.int64),
                np.array([t.factor for t in inside], np.float64), states, out)
    return out.T


def resting_class(scheme: Scheme) -> np.ndarray:
    """The states where receptors rest with no agonist: the closed class of the
    agonist-free transitions (sorted state indices).

    A state the agonist-free transitions can leave for good (every bound state, by
    unbinding) holds no receptor at rest: the equilibrium lies in the one closed class (a
    scheme file with several is refused when loaded, unless it gives initial occupancies).

    Examples
    --------
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> [s.states[i] for i in resting_class(s)]
    ['C0', 'D0']
    """
    edges = [(t.source, t.target) for t in scheme.transitions if not t.agonist]
    classes = closed_classes(scheme.n_states, edges)
    if len(classes) != 1:  # no unique equilibrium: the whole scheme's system is singular
        return np.arange(scheme.n_states, dtype=np.int64)
    return np.array(sorted(classes[0]), dtype=np.int64)
