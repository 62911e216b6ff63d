"""Selection and survival of (μ + λ) as array code: the tournament, elitism, and the rows
that survive into the next generation.

DEAP's ``tools.selTournament`` picks each survivor as the best of ``tournsize`` aspirants
drawn with replacement; :func:`np_sel_tournament` does the same on a fitness array, and
:func:`keep_best` then gives the pool's best the worst survivor's place (elitism), so the
population's best never gets worse. The survivors' rows are read from the parents and the
new offspring by index (:func:`take_survivors`, :func:`pool_origin`, :func:`take_pool`),
without building the concatenated pool. A fit's generation does all of it in two passes over
the rows (:func:`survivors`): one choosing, one copying each survivor's row of every array.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> fitness = np.array([3.0, 1.0, 2.0, 5.0])
>>> chosen = keep_best(fitness, np_sel_tournament(fitness, 2, 3, rng))
>>> bool(1 in chosen.tolist())  # the best survives
True
"""

from __future__ import annotations

import numba
import numpy as np

from kingen.fitting.params import PARALLEL_FROM_ROWS, serial_and_parallel


def checked_indices(idx: np.ndarray, size: int, what: str) -> np.ndarray:
    """``idx`` as the compiled kernels take it; they do not check bounds, so it is checked
    here.

    >>> checked_indices([0, 2], 3, "rows").tolist()
    [0, 2]
    """
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise IndexError(f"{what} out of range [0, {size})")
    return idx


@numba.njit(cache=True, nogil=True)
def _tournament_winners(fitness: np.ndarray, aspirants: np.ndarray) -> np.ndarray:
    out = np.empty(aspirants.shape[0], dtype=np.int64)
    for i in range(aspirants.shape[0]):
        best = aspirants[i, 0]
        for t in range(1, aspirants.shape[1]):
            c = aspirants[i, t]
            # np.argmin's choice: the first lowest, and the first NaN before any number
            if fitness[c] < fitness[best] or (fitness[c] != fitness[c]
                                              and fitness[best] == fitness[best]):
                best = c
        out[i] = best
    return out


def np_sel_tournament(fitness: np.ndarray, k: int, tournsize: int,
                      rng: np.random.Generator | None,
                      aspirants: np.ndarray | None = None) -> np.ndarray:
    """Indices chosen by ``tools.selTournament`` (minimisation; first best wins ties).

    ``aspirants`` are the (k, tournsize) indices drawn beforehand (see
    :func:`draw_aspirants`; ``rng`` is then not used).

    Pseudocode::

        repeat k times:
            aspirants = tournsize indices drawn uniformly, with replacement
            choose the aspirant of lowest fitness (the first one on ties; NaN first)
    """
    if aspirants is None:
        if rng is None:
            raise ValueError("give a generator or the aspirants drawn from one")
        aspirants = draw_aspirants(rng, fitness.size, k, tournsize)
    elif aspirants.shape != (k, tournsize) or (
            aspirants.size and (aspirants.min() < 0 or aspirants.max() >= fitness.size)):
        raise ValueError(f"aspirants of shape {aspirants.shape} for ({k}, {tournsize}) "
                         f"among {fitness.size}")
    return _tournament_winners(np.asarray(fitness, dtype=np.float64), aspirants)


def keep_best(fitness: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """``chosen`` (indices into the pool ``fitness``) with the pool's best among them:
    elitism. Tournaments may pass the best over; it then takes the place of the worst
    chosen (the first of equals; NaN counts as worst), so the population's best never gets
    worse. No random number is drawn. Unchanged when the best is chosen or none is finite.

    Examples
    --------
    >>> keep_best(np.array([3.0, 0.5, 2.0, np.inf]), np.array([0, 3, 2])).tolist()
    [0, 1, 2]
    >>> keep_best(np.array([3.0, 0.5, 2.0]), np.array([1, 0])).tolist()
    [1, 0]
    """
    f = np.asarray(fitness, dtype=np.float64)
    finite = np.isfinite(f)
    if not finite.any():
        return chosen
    best = int(np.argmin(np.where(finite, f, np.inf)))
    if (chosen == best).any():
        return chosen
    picked = f.take(chosen)
    worst = int(np.argmax(np.where(np.isnan(picked), np.inf, picked)))
    out = np.array(chosen, copy=True)
    out[worst] = best
    return out


def draw_aspirants(rng: np.random.Generator, pool: int, k: int, tournsize: int
                   ) -> np.ndarray:
    """The random numbers of :func:`np_sel_tournament`: (k, tournsize) indices of a pool of
    ``pool`` individuals, drawn uniformly with replacement."""
    return rng.integers(0, pool, size=(k, tournsize))


# On the calling thread, as kingen.solve.inputs' pass and for its reason: a copy with no
# arithmetic gains little from cores that must first wake from the solve's idling.
@numba.njit(cache=True, nogil=True)
def _survivor_rows(parents: np.ndarray, offspring: np.ndarray, chosen: np.ndarray,
                   out: np.ndarray) -> None:
    mu = parents.shape[0]
    for i in range(chosen.size):
        c = chosen[i]
        if c < mu:
            for j in range(out.shape[1]):
                out[i, j] = parents[c, j]
        else:
            for j in range(out.shape[1]):
                out[i, j] = offspring[c - mu, j]


def take_survivors(parents: np.ndarray, offspring: np.ndarray, chosen: np.ndarray
                   ) -> np.ndarray:
    """Rows ``chosen`` of the pool ``parents`` then ``offspring``, as
    ``np.concatenate([parents, offspring]).take(chosen, axis=0)`` gives them, without
    building the pool: one copy of the survivors, not a copy of every parent and child
    first (10 MB of genes alone at 65,536 R&H candidates).

    Examples
    --------
    >>> take_survivors(np.array([[1, 2], [3, 4]]), np.array([[5, 6]]),
    ...                np.array([2, 0, 2])).tolist()
    [[5, 6], [1, 2], [5, 6]]
    >>> take_survivors(np.array([0.5, 0.25]), np.array([0.125]), np.array([1, 2])).tolist()
    [0.25, 0.125]
    """
    dtype = np.result_type(parents, offspring)  # concatenate's
    a = np.ascontiguousarray(parents, dtype=dtype)
    b = np.ascontiguousarray(offspring, dtype=dtype)
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(f"parents {a.shape} and offspring {b.shape} differ in shape")
    chosen = checked_indices(chosen, a.shape[0] + b.shape[0], "chosen")
    out = np.empty((chosen.size,) + a.shape[1:], dtype=a.dtype)
    width = int(np.prod(a.shape[1:], dtype=np.int64))
    _survivor_rows(a.reshape(a.shape[0], width), b.reshape(b.shape[0], width), chosen,
                   out.reshape(chosen.size, width))
    return out


@numba.njit(cache=True, nogil=True)
def _pool_origin(mu: int, source: np.ndarray) -> np.ndarray:
    origin = np.empty(mu + source.size, dtype=np.int64)
    new = 0
    for i in range(mu):
        origin[i] = i
    for i in range(source.size):
        if source[i] >= 0:
            origin[mu + i] = source[i]
        else:
            origin[mu + i] = -1 - new
            new += 1
    return origin


def pool_origin(mu: int, source: np.ndarray) -> np.ndarray:
    """Where each of the (μ + λ) pool's rows lives, as :func:`np_var_or_new` leaves them:
    ``r >= 0`` the parents' row r (a parent, or a copy of one), ``-1 - r`` the new
    offspring's row r.

    Examples
    --------
    >>> pool_origin(2, np.array([-1, 0, -1])).tolist()
    [0, 1, -1, 0, -2]
    """
    source = np.asarray(source, dtype=np.int64)
    if source.size and source.max() >= mu:
        raise IndexError(f"source out of range [0, {mu})")
    return _pool_origin(int(mu), source)


# On the calling thread, as kingen.solve.inputs' pass and for its reason: a copy with no
# arithmetic gains little from cores that must first wake from the solve's idling.
@numba.njit(cache=True, nogil=True)
def _rows_through(origin: np.ndarray, rows: np.ndarray, parents: np.ndarray,
                  new: np.ndarray, out: np.ndarray) -> None:
    for i in range(rows.size):
        o = origin[rows[i]]
        if o >= 0:
            for j in range(out.shape[1]):
                out[i, j] = parents[o, j]
        else:
            for j in range(out.shape[1]):
                out[i, j] = new[-1 - o, j]


def take_pool(origin: np.ndarray, rows: np.ndarray, parents: np.ndarray, new: np.ndarray
              ) -> np.ndarray:
    """Rows ``rows`` of the pool whose rows ``origin`` (:func:`pool_origin`) places in
    ``parents`` and ``new``: :func:`take_survivors` of the pool with the copies never
    built (one copy of the rows taken, in the dtype concatenating them gives).

    Examples
    --------
    >>> origin = pool_origin(2, np.array([-1, 0]))
    >>> take_pool(origin, np.array([3, 2, 1]), np.array([1.0, 2.0]), np.array([9.0])).tolist()
    [1.0, 9.0, 2.0]
    """
    dtype = np.result_type(parents, new)
    a = np.ascontiguousarray(parents, dtype=dtype)
    b = np.ascontiguousarray(new, dtype=dtype)
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(f"parents {a.shape} and new rows {b.shape} differ in shape")
    rows = checked_indices(rows, origin.size, "rows")
    low = int(origin.min()) if origin.size else 0
    if origin.size and (low < -b.shape[0] or origin.max() >= a.shape[0]):
        raise IndexError("origin out of range of the parents and new rows")
    out = np.empty((rows.size,) + a.shape[1:], dtype=dtype)
    width = int(np.prod(a.shape[1:], dtype=np.int64))
    _rows_through(origin, rows, a.reshape(a.shape[0], width), b.reshape(b.shape[0], width),
                  out.reshape(rows.size, width))
    return out


# (mu + lambda) survival in two passes over the rows, each row computed alone so that the
# result is the same, bit for bit, however the rows are shared out: from PARALLEL_FROM_ROWS
# rows on numba's threads (at 65,536 the gathers are memory-bound work that one core does
# in several ms), below on the calling thread.
_PASSES = {"cache": True, "nogil": True}


# A pool row's fitness is read where it lives, ``parent_f[o] if o >= 0 else new_f[-1 - o]``
# for its origin o, written out in each loop below rather than called: through a helper,
# even one numba inlines, elitism's scans took 2.1 ms against 0.3 at 65,536 candidates
# (2 AMD cores), and a generation's selection 4.4 against 2.6 ms
# (``python -m benchmarks host_work --population 65536 --generations 8``).


def _choose(parent_f: np.ndarray, new_f: np.ndarray, origin: np.ndarray,
            aspirants: np.ndarray, out: np.ndarray) -> None:
    """_tournament_winners on the pool's fitness read where it lives (see take_pool)."""
    for i in numba.prange(aspirants.shape[0]):
        best = aspirants[i, 0]
        o = origin[best]
        fb = parent_f[o] if o >= 0 else new_f[-1 - o]
        for t in range(1, aspirants.shape[1]):
            c = aspirants[i, t]
            o = origin[c]
            fc = parent_f[o] if o >= 0 else new_f[-1 - o]
            if fc < fb or (fc != fc and fb == fb):  # np.argmin's choice
                best, fb = c, fc
        out[i] = best


def _gather(origin: np.ndarray, chosen: np.ndarray, parent_f: np.ndarray,
            new_f: np.ndarray, parent_g: np.ndarray, new_g: np.ndarray, parent_e: np.ndarray,
            new_e: np.ndarray, parent_fail: np.ndarray, new_fail: np.ndarray,
            out_f: np.ndarray, out_g: np.ndarray, out_e: np.ndarray,
            out_fail: np.ndarray) -> None:
    """Every array of the survivors' rows, row by row (take_pool of each)."""
    for i in numba.prange(chosen.size):
        o = origin[chosen[i]]
        if o >= 0:
            out_f[i] = parent_f[o]
            out_fail[i] = parent_fail[o]
            for j in range(out_g.shape[1]):
                out_g[i, j] = parent_g[o, j]
            for j in range(out_e.shape[1]):
                out_e[i, j] = parent_e[o, j]
        else:
            r = -1 - o
            out_f[i] = new_f[r]
            out_fail[i] = new_fail[r]
            for j in range(out_g.shape[1]):
                out_g[i, j] = new_g[r, j]
            for j in range(out_e.shape[1]):
                out_e[i, j] = new_e[r, j]


_choose_serial, _choose_parallel = serial_and_parallel(_choose, **_PASSES)
_gather_serial, _gather_parallel = serial_and_parallel(_gather, **_PASSES)


# keep_best's two scans, of the pool (131,072 rows at 65,536 candidates) and of the chosen,
# each cut into _LANES spans scanned side by side: one scan's first lowest (first highest)
# is a chain of dependent compares, 4.3 ns a row; side by side the spans' chains overlap,
# and their results compared in order give the row one scan gives. On the calling thread:
# with every core busy, a parallel region waits for a descheduled worker (on 2 cores, the
# scans on numba's threads took the selection from 15 to 41 ms).
_LANES = 8


@numba.njit(cache=True, nogil=True)
def _elite(parent_f: np.ndarray, new_f: np.ndarray, origin: np.ndarray,
           chosen: np.ndarray) -> tuple[int, int]:
    """keep_best's (pool best, place of the worst chosen) on the pool read through
    ``origin``; (-1, -1) where keep_best leaves ``chosen`` as it is."""
    n, k = origin.size, chosen.size
    step = (n + _LANES - 1) // _LANES
    lane_best = np.full(_LANES, -1, dtype=np.int64)
    lane_f = np.full(_LANES, np.inf)
    for t in range(step):
        for s in range(_LANES):
            r = s * step + t
            if r < n:
                o = origin[r]
                f = parent_f[o] if o >= 0 else new_f[-1 - o]
                if f < lane_f[s] and f > -np.inf:  # the first lowest finite one
                    lane_best[s], lane_f[s] = r, f
    best, fbest = -1, np.inf
    for s in range(_LANES):
        if lane_best[s] >= 0 and lane_f[s] < fbest:
            best, fbest = lane_best[s], lane_f[s]
    if best < 0:
        return -1, -1
    step = (k + _LANES - 1) // _LANES
    lane_worst = np.full(_LANES, -1, dtype=np.int64)
    lane_f[:] = -np.inf
    for t in range(step):
        for s in range(_LANES):
            i = s * step + t
            if i < k:
                c = chosen[i]
                if c == best:
                    return -1, -1
                o = origin[c]
                f = parent_f[o] if o >= 0 else new_f[-1 - o]
                if f != f:
                    f = np.inf
                if f > lane_f[s] or t == 0:  # the first highest, NaN as the highest
                    lane_worst[s], lane_f[s] = i, f
    worst, fworst = -1, -np.inf
    for s in range(_LANES):
        if lane_worst[s] >= 0 and (lane_f[s] > fworst or worst < 0):
            worst, fworst = lane_worst[s], lane_f[s]
    return best, max(worst, 0)


def survivors(origin: np.ndarray, aspirants: np.ndarray,
              parents: tuple[np.ndarray, ...], new: tuple[np.ndarray, ...]
              ) -> tuple[np.ndarray, ...]:
    """(μ + λ) survival: tournaments among ``aspirants`` (rows of the pool), the pool's
    best kept, and the survivors' (fitness, genes, errors, fail), with the rows, choices
    and values that :func:`np_sel_tournament`, :func:`keep_best` and :func:`take_pool` of
    each array give; in one pass that chooses and one that gathers each survivor's row,
    never building the pool.

    ``parents`` and ``new`` are (fitness (N,), genes (N, n), errors (N, P), fail (N,)) of
    the parents and of the new offspring that ``origin`` (:func:`pool_origin`) places.

    Examples
    --------
    >>> origin = pool_origin(2, np.array([-1, 0]))       # pool: p0, p1, new0, p0
    >>> parents = (np.array([3.0, 1.0]), np.array([[0.0], [1.0]]), np.zeros((2, 1)),
    ...            np.zeros(2, int))
    >>> new = (np.array([2.0]), np.array([[9.0]]), np.zeros((1, 1)), np.zeros(1, int))
    >>> f, g, e, fail = survivors(origin, np.array([[0, 3], [2, 0]]), parents, new)
    >>> f.tolist(), g[:, 0].tolist()          # tournaments 0 and 2 won; the best, 1, kept
    ([1.0, 2.0], [1.0, 9.0])
    """
    pf, pg, pe, pfail = _rows_of(parents)
    nf, ng, ne, nfail = _rows_of(new)
    if pg.shape[1:] != ng.shape[1:] or pe.shape[1:] != ne.shape[1:]:
        raise ValueError("parents and new rows differ in shape")
    aspirants = np.ascontiguousarray(aspirants, dtype=np.int64)
    checked_indices(aspirants, origin.size, "aspirants")
    origin = np.ascontiguousarray(origin, dtype=np.int64)
    if origin.size and (origin.min() < -nf.size or origin.max() >= pf.size):
        raise IndexError("origin out of range of the parents and new rows")
    k = aspirants.shape[0]
    threads = k >= PARALLEL_FROM_ROWS
    chosen = np.empty(k, dtype=np.int64)
    (_choose_parallel if threads else _choose_serial)(pf, nf, origin, aspirants, chosen)
    best, worst = _elite(pf, nf, origin, chosen)
    if best >= 0:
        chosen[worst] = best
    out = (np.empty(k), np.empty((k, pg.shape[1])), np.empty((k, pe.shape[1])),
           np.empty(k, dtype=np.int64))
    (_gather_parallel if threads else _gather_serial)(origin, chosen, pf, nf, pg, ng, pe,
                                                        ne, pfail, nfail, *out)
    return out


def _rows_of(arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """(fitness, genes, errors, fail) as the passes take them: contiguous float64 and
    int64, one row count."""
    f, g, e, fail = arrays
    out = (np.ascontiguousarray(f, dtype=np.float64), np.ascontiguousarray(g, dtype=np.float64),
           np.ascontiguousarray(e, dtype=np.float64), np.ascontiguousarray(fail, dtype=np.int64))
    if any(a.shape[0] != out[0].shape[0] for a in out) or out[1].ndim != 2 or out[2].ndim != 2:
        raise ValueError("fitness (N,), genes (N, n), errors (N, P) and fail (N,) of one N")
    return out
