"""The genetic operators of (μ + λ) as array code: crossover, mutation, selection, varOr.

DEAP's operators work on one individual at a time, in Python; at tens of thousands of
offspring per generation that costs more than the GPU spends solving. These are the same
operators with the same formulas and probabilities, on whole populations as arrays (the
per-gene arithmetic in compiled loops). Given the same random numbers, the children are
DEAP's exactly (``tests/test_fit.py`` checks each against DEAP's own).

Grouped by kind, as DEAP groups them:

======================  ====================================  ==============================
kind                    function                              DEAP's
======================  ====================================  ==============================
crossover               :func:`np_sbx_bounded`                ``tools.cxSimulatedBinaryBounded``
mutation                :func:`np_poly_bounded`               ``tools.mutPolynomialBounded``
selection               :func:`np_sel_tournament`             ``tools.selTournament``
variation               :func:`np_var_or`                     ``algorithms.varOr``
survival                :func:`take_survivors`                the ``+`` of (μ + λ)
======================  ====================================  ==============================

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> low, up = np.zeros(3), np.ones(3)
>>> pop = rng.uniform(low, up, size=(6, 3))
>>> kids, source = np_var_or(pop, 4, 0.5, 0.3, 20.0, 20.0, 1 / 3, low, up, rng)
>>> kids.shape, bool(((kids >= low) & (kids <= up)).all())
((4, 3), True)
>>> np_sel_tournament(np.array([3.0, 1.0, 2.0]), 2, 3, rng).shape
(2,)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numba
import numpy as np

# The operators' per-gene arithmetic runs in compiled loops that read the parents from the
# population and write each child straight into the offspring array: as numpy array code,
# the temporaries, masks and gathers cost more than the arithmetic at 65k offspring. The
# loops run on all cores (each child is computed alone, so the result does not depend on
# their number). The random numbers are still drawn by the caller's numpy generator, as
# whole arrays, in a fixed order.
_KERNEL = {"cache": True, "nogil": True, "parallel": True, "error_model": "numpy"}

# Below this many genes to write, the operators run on the calling thread alone. In a fit
# the CPU idles while the GPU solves, numba's OpenMP workers fall asleep, and waking them
# costs more (about 10 ms on the H100 machine's 16-core host; the ga_step suite,
# benchmarks/results/h100/ga_step/) than the whole serial loop at these sizes.
PARALLEL_FROM_GENES = 1 << 18


@contextlib.contextmanager
def _threads_for(n_genes_written: int):
    if n_genes_written >= PARALLEL_FROM_GENES:
        yield
        return
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


@numba.njit(**_KERNEL)
def _sbx_kernel(pop: np.ndarray, first: np.ndarray, second: np.ndarray, eta: float,
                low: np.ndarray, up: np.ndarray, draws: np.ndarray, out: np.ndarray,
                rows: np.ndarray) -> None:
    e1 = 1.0 / (eta + 1.0)
    for k in numba.prange(first.size):
        p, q, i = first[k], second[k], rows[k]
        for j in range(pop.shape[1]):
            x, y = pop[p, j], pop[q, j]
            if not (draws[0, k, j] <= 0.5 and abs(x - y) > 1e-14):
                out[i, j] = x
                continue
            x1, x2 = min(x, y), max(x, y)
            lo, hi, r = low[j], up[j], draws[1, k, j]
            span = x2 - x1
            # Only the child that ends up first is built: DEAP's second child (c2) when the
            # pair swaps, else its first (c1); both use the same random number.
            swap = draws[2, k, j] <= 0.5
            beta = 1.0 + 2.0 * ((hi - x2) if swap else (x1 - lo)) / span
            alpha = 2.0 - beta ** -(eta + 1.0)
            ra = r * alpha
            beta_q = (ra if r <= 1.0 / alpha else 1.0 / (2.0 - ra)) ** e1
            step = beta_q * span
            c = 0.5 * (x1 + x2 + (step if swap else -step))
            out[i, j] = min(max(c, lo), hi)


@numba.njit(**_KERNEL)
def _poly_kernel(pop: np.ndarray, parents: np.ndarray, eta: float, low: np.ndarray,
                 up: np.ndarray, indpb: float, draws: np.ndarray, out: np.ndarray,
                 rows: np.ndarray) -> None:
    mut_pow = 1.0 / (eta + 1.0)
    for k in numba.prange(parents.size):
        p, i = parents[k], rows[k]
        for j in range(pop.shape[1]):
            v = pop[p, j]
            if not draws[0, k, j] <= indpb:
                out[i, j] = v
                continue
            lo, hi, r = low[j], up[j], draws[1, k, j]
            if r < 0.5:
                xy = 1.0 - (v - lo) / (hi - lo)
                val = 2.0 * r + (1.0 - 2.0 * r) * xy ** (eta + 1.0)
                delta_q = val ** mut_pow - 1.0
            else:
                xy = 1.0 - (hi - v) / (hi - lo)
                val = 2.0 * (1.0 - r) + 2.0 * (r - 0.5) * xy ** (eta + 1.0)
                delta_q = 1.0 - val ** mut_pow
            out[i, j] = min(max(v + delta_q * (hi - lo), lo), hi)


def _uniforms(rng: np.random.Generator | None, draws: np.ndarray | None,
              shape: tuple[int, ...]) -> np.ndarray:
    """``draws`` (checked against ``shape``), or that many uniform numbers from ``rng``."""
    if draws is None:
        if rng is None:
            raise ValueError("give a generator or the numbers drawn from one")
        return rng.random(shape)
    if draws.shape != shape or draws.dtype != np.float64:
        raise ValueError(f"draws of shape {draws.shape}, expected {shape} (float64)")
    return draws


def _indices(idx: np.ndarray, size: int, what: str) -> np.ndarray:
    """``idx`` as the kernels take it; they do not check bounds, so it is checked here."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise IndexError(f"{what} out of range [0, {size})")
    return idx


def _bounds(low: np.ndarray, up: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = np.asarray(low, dtype=np.float64), np.asarray(up, dtype=np.float64)
    if lo.shape != (m,) or hi.shape != (m,):
        raise ValueError(f"low and up must have one bound per gene ({m})")
    return lo, hi


def _destination(out: np.ndarray | None, rows: np.ndarray | None, n: int, m: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    if out is None:
        return np.empty((n, m)), np.arange(n)
    if out.dtype != np.float64 or out.ndim != 2 or out.shape[1] != m:
        raise ValueError(f"out must be a float64 array of {m} columns")
    rows = _indices(rows, out.shape[0], "rows")
    if rows.size != n:
        raise ValueError(f"{rows.size} rows for {n} children")
    return out, rows


def np_sbx_bounded(pop: np.ndarray, first: np.ndarray, second: np.ndarray, eta: float,
                   low: np.ndarray, up: np.ndarray, rng: np.random.Generator | None,
                   out: np.ndarray | None = None, rows: np.ndarray | None = None,
                   draws: np.ndarray | None = None) -> np.ndarray:
    """First child of ``tools.cxSimulatedBinaryBounded`` for each pair of parents.

    Same formulas and probabilities as DEAP: each gene crosses with probability 0.5 (and only
    if the parents differ by more than 1e-14); the two children's genes swap with
    probability 0.5. Three (n, m) arrays of uniform numbers are drawn from ``rng``, in this
    order: crossing, the spread factor, swapping.

    Pseudocode, for pair k and gene j (x, y the parents' genes, [lo, hi] the bounds)::

        if u_cross <= 0.5 and |x - y| > 1e-14:
            x1, x2 = min(x, y), max(x, y)
            beta   = 1 + 2 (x1 - lo) / (x2 - x1)      # (hi - x2) for the swapped child
            alpha  = 2 - beta^-(eta + 1)
            beta_q = (u alpha)^(1/(eta+1))            if u <= 1/alpha
                     (1 / (2 - u alpha))^(1/(eta+1))  otherwise
            child  = clip(0.5 (x1 + x2 -+ beta_q (x2 - x1)), lo, hi)
        else:
            child  = x

    Parameters
    ----------
    pop
        (μ, m) genes of the parents.
    first, second
        (n,) rows of ``pop``: pair k is ``(pop[first[k]], pop[second[k]])``, in DEAP's
        argument order.
    out, rows
        Where the children go: pair k's child is written to ``out[rows[k]]``. By default, a
        new (n, m) array in pair order.
    draws
        The (3, n, m) uniform numbers, drawn beforehand (``rng`` is then not used).
    """
    pop = np.ascontiguousarray(pop, dtype=np.float64)
    first = _indices(first, pop.shape[0], "first")
    second = _indices(second, pop.shape[0], "second")
    n, m = first.size, pop.shape[1]
    draws = _uniforms(rng, draws, (3, n, m))
    out, rows = _destination(out, rows, n, m)
    with _threads_for(n * m):
        _sbx_kernel(pop, first, second, float(eta), *_bounds(low, up, m), draws, out, rows)
    return out


def np_poly_bounded(pop: np.ndarray, parents: np.ndarray, eta: float, low: np.ndarray,
                    up: np.ndarray, indpb: float, rng: np.random.Generator | None,
                    out: np.ndarray | None = None, rows: np.ndarray | None = None,
                    draws: np.ndarray | None = None) -> np.ndarray:
    """``tools.mutPolynomialBounded`` applied to copies of rows of ``pop`` (same formulas).

    Two (n, m) arrays of uniform numbers are drawn from ``rng``, in this order: whether the
    gene mutates, the perturbation.

    Pseudocode, for mutant k and gene j (v the parent's gene, [lo, hi] the bounds)::

        if u_mutate <= indpb:
            if u < 0.5:
                d = (2u + (1 - 2u) (1 - (v - lo)/(hi - lo))^(eta+1))^(1/(eta+1)) - 1
            else:
                d = 1 - (2(1 - u) + 2(u - 0.5) (1 - (hi - v)/(hi - lo))^(eta+1))^(1/(eta+1))
            v = clip(v + d (hi - lo), lo, hi)

    Parameters
    ----------
    pop
        (μ, m) genes of the parents.
    parents
        (n,) rows of ``pop`` to mutate.
    out, rows
        Where the mutants go: mutant k is written to ``out[rows[k]]``. By default, a new
        (n, m) array in the order of ``parents``.
    draws
        The (2, n, m) uniform numbers, drawn beforehand (``rng`` is then not used).
    """
    pop = np.ascontiguousarray(pop, dtype=np.float64)
    parents = _indices(parents, pop.shape[0], "parents")
    n, m = parents.size, pop.shape[1]
    draws = _uniforms(rng, draws, (2, n, m))
    out, rows = _destination(out, rows, n, m)
    with _threads_for(n * m):
        _poly_kernel(pop, parents, float(eta), *_bounds(low, up, m), float(indpb), draws,
                     out, rows)
    return out


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
    chosen = _indices(chosen, a.shape[0] + b.shape[0], "chosen")
    out = np.empty((chosen.size,) + a.shape[1:], dtype=a.dtype)
    width = int(np.prod(a.shape[1:], dtype=np.int64))
    _survivor_rows(a.reshape(a.shape[0], width), b.reshape(b.shape[0], width), chosen,
                   out.reshape(chosen.size, width))
    return out


@dataclass(frozen=True)
class VariationDraws:
    """The random numbers of one :func:`np_var_or` call, in the order they are drawn.

    Drawing depends only on the generator and the sizes (never on the population), so the
    numbers of a generation can be drawn ahead, while the previous one is solved, and
    give the children that drawing them in :func:`np_var_or` gives.
    """

    mu: int
    u: np.ndarray              # (λ,) the choice of operator per offspring
    cx_first: np.ndarray       # crossover parents
    cx_second: np.ndarray
    cx_uniforms: np.ndarray    # (3, n_cx, m)
    mut_parents: np.ndarray
    mut_uniforms: np.ndarray   # (2, n_mut, m)
    copied: np.ndarray         # parents of the reproduced offspring


def draw_variation(rng: np.random.Generator, mu: int, lambda_: int, cxpb: float,
                   mutpb: float, n_genes: int) -> VariationDraws:
    """Draw the random numbers of :func:`np_var_or` (same order, same numbers)."""
    u = rng.random(lambda_)
    cx = u < cxpb
    mut = (~cx) & (u < cxpb + mutpb)
    n_cx, n_mut = int(cx.sum()), int(mut.sum())
    first = second = np.zeros(0, dtype=np.int64)
    cx_uniforms = np.zeros((3, 0, n_genes))
    if n_cx:
        first = rng.integers(0, mu, n_cx)
        second = (first + rng.integers(1, mu, n_cx)) % mu  # two distinct, as random.sample
        cx_uniforms = rng.random((3, n_cx, n_genes))
    parents = np.zeros(0, dtype=np.int64)
    mut_uniforms = np.zeros((2, 0, n_genes))
    if n_mut:
        parents = rng.integers(0, mu, n_mut)
        mut_uniforms = rng.random((2, n_mut, n_genes))
    n_copy = lambda_ - n_cx - n_mut
    copied = rng.integers(0, mu, n_copy) if n_copy else np.zeros(0, dtype=np.int64)
    return VariationDraws(mu, u, first, second, cx_uniforms, parents, mut_uniforms, copied)


def np_var_or(pop: np.ndarray, lambda_: int, cxpb: float, mutpb: float, eta_cx: float,
              eta_mut: float, indpb: float, low: np.ndarray, up: np.ndarray,
              rng: np.random.Generator | None,
              draws: VariationDraws | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``algorithms.varOr`` as array code.

    Returns the offspring genes (λ, n) and, per offspring, the index of the parent it is an
    unchanged copy of (reproduction) or -1 (new, must be evaluated). ``draws`` are the
    random numbers drawn beforehand by :func:`draw_variation` (``rng`` is then not used).

    Pseudocode (each offspring draws u once)::

        for each of the λ offspring:
            u < cxpb:           crossover of two distinct random parents (first child)
            u < cxpb + mutpb:   mutation of a random parent
            otherwise:          a copy of a random parent (its fitness is reused)
    """
    mu = pop.shape[0]
    if draws is None:
        if rng is None:
            raise ValueError("give a generator or the numbers drawn from one")
        draws = draw_variation(rng, mu, lambda_, cxpb, mutpb, pop.shape[1])
    elif draws.mu != mu or draws.u.shape != (lambda_,):
        raise ValueError(f"draws for {draws.mu} parents and {draws.u.size} offspring, "
                         f"given {mu} and {lambda_}")
    cx = draws.u < cxpb
    mut = (~cx) & (draws.u < cxpb + mutpb)
    out = np.empty((lambda_, pop.shape[1]))
    source = np.full(lambda_, -1, dtype=np.int64)
    rows = np.flatnonzero(cx)
    if rows.size:
        np_sbx_bounded(pop, draws.cx_first, draws.cx_second, eta_cx, low, up, None, out=out,
                       rows=rows, draws=draws.cx_uniforms)
    rows = np.flatnonzero(mut)
    if rows.size:
        np_poly_bounded(pop, draws.mut_parents, eta_mut, low, up, indpb, None, out=out,
                        rows=rows, draws=draws.mut_uniforms)
    rows = np.flatnonzero(~(cx | mut))
    if rows.size:
        out[rows] = pop.take(draws.copied, axis=0)
        source[rows] = draws.copied
    return out, source


def warm_up_operators(n_genes: int) -> None:
    """Compile (or load from numba's cache) the array operators on a tiny population.

    Without it the first generation that varies the population pays the compilation
    (seconds on a cold cache) inside its GA time. It draws from its own generator, so the
    run's random stream is untouched.
    """
    rng = np.random.Generator(np.random.PCG64(0))
    low, up = np.zeros(n_genes), np.ones(n_genes)
    pop = rng.uniform(low, up, size=(4, n_genes))
    np_var_or(pop, 8, 0.5, 0.5, 20.0, 20.0, 1.0, low, up, rng)
    np_sel_tournament(rng.random(8), 4, 3, rng)


