"""Selection and survival of (μ + λ) as array code: the tournament, elitism, and the rows
that survive into the next generation.

DEAP's ``tools.selTournament`` picks each survivor as the best of ``tournsize`` aspirants
drawn with replacement; :func:`np_sel_tournament` does the same on a fitness array, and
:func:`keep_best` then gives the pool's best the worst survivor's place (elitism), so the
population's best never gets worse. The survivors' rows are read from the parents and the
new offspring by index (:func:`take_survivors`, :func:`pool_origin`, :func:`take_pool`),
without building the concatenated pool.

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
