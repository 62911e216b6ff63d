"""The genetic operators of (μ + λ) as array code: crossover, mutation and varOr.

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
variation               :func:`np_var_or`                     ``algorithms.varOr``
======================  ====================================  ==============================

Selection and survival are in :mod:`kingen.fitting.selection`:

======================  ====================================  ==============================
kind                    function                              DEAP's
======================  ====================================  ==============================
selection               ``np_sel_tournament``                 ``tools.selTournament``
survival                ``take_survivors``                    the ``+`` of (μ + λ)
(μ + λ) survival        ``survivors``                         both, the pool's best kept
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

from kingen.fitting.params import serial_and_parallel
from kingen.fitting.selection import checked_indices, np_sel_tournament

# The operators' per-gene arithmetic runs in compiled loops that read the parents from the
# population and write each child straight into the offspring array: as numpy array code,
# the temporaries, masks and gathers cost more than the arithmetic at 65k offspring. The
# loops run on all cores (each child is computed alone, so the result does not depend on
# their number). The random numbers are still drawn by the caller's numpy generator, as
# whole arrays, in a fixed order.
_KERNEL = {"cache": True, "nogil": True, "parallel": True, "error_model": "numpy"}

# Below this many genes to write, the operators run on the calling thread alone, where
# sharing the work out costs more than it saves. (The 10 ms once measured for waking
# numba's workers on the H100 host was the serial kernel loaded from numba's cache in the
# parallel one's place; see serial_and_parallel. On the H200 host's 16 cores a kernel of
# 65,536 x 10 genes takes the same 1.4-1.6 ms after a 50 ms sleep as back to back.)
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


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _sbx_gene(x: float, y: float, lo: float, hi: float, u_cross: float, r: float,
              u_swap: float, eta: float) -> float:
    """The first child's gene of ``cxSimulatedBinaryBounded`` (see :func:`np_sbx_bounded`)."""
    if not (u_cross <= 0.5 and abs(x - y) > 1e-14):
        return x
    x1, x2 = min(x, y), max(x, y)
    span = x2 - x1
    # Only the child that ends up first is built: DEAP's second child (c2) when the pair
    # swaps, else its first (c1); both use the same random number.
    swap = u_swap <= 0.5
    beta = 1.0 + 2.0 * ((hi - x2) if swap else (x1 - lo)) / span
    alpha = 2.0 - beta ** -(eta + 1.0)
    ra = r * alpha
    beta_q = (ra if r <= 1.0 / alpha else 1.0 / (2.0 - ra)) ** (1.0 / (eta + 1.0))
    step = beta_q * span
    c = 0.5 * (x1 + x2 + (step if swap else -step))
    return min(max(c, lo), hi)


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _poly_gene(v: float, lo: float, hi: float, indpb: float, u_mutate: float, r: float,
               eta: float) -> float:
    """A gene of ``mutPolynomialBounded`` (see :func:`np_poly_bounded`)."""
    if not u_mutate <= indpb:
        return v
    mut_pow = 1.0 / (eta + 1.0)
    if r < 0.5:
        xy = 1.0 - (v - lo) / (hi - lo)
        val = 2.0 * r + (1.0 - 2.0 * r) * xy ** (eta + 1.0)
        delta_q = val ** mut_pow - 1.0
    else:
        xy = 1.0 - (hi - v) / (hi - lo)
        val = 2.0 * (1.0 - r) + 2.0 * (r - 0.5) * xy ** (eta + 1.0)
        delta_q = 1.0 - val ** mut_pow
    return min(max(v + delta_q * (hi - lo), lo), hi)


@numba.njit(**_KERNEL)
def _sbx_kernel(pop: np.ndarray, first: np.ndarray, second: np.ndarray, eta: float,
                low: np.ndarray, up: np.ndarray, draws: np.ndarray, out: np.ndarray,
                rows: np.ndarray) -> None:
    for k in numba.prange(first.size):
        p, q, i = first[k], second[k], rows[k]
        for j in range(pop.shape[1]):
            out[i, j] = _sbx_gene(pop[p, j], pop[q, j], low[j], up[j], draws[0, k, j],
                                  draws[1, k, j], draws[2, k, j], eta)


@numba.njit(**_KERNEL)
def _poly_kernel(pop: np.ndarray, parents: np.ndarray, eta: float, low: np.ndarray,
                 up: np.ndarray, indpb: float, draws: np.ndarray, out: np.ndarray,
                 rows: np.ndarray) -> None:
    for k in numba.prange(parents.size):
        p, i = parents[k], rows[k]
        for j in range(pop.shape[1]):
            out[i, j] = _poly_gene(pop[p, j], low[j], up[j], indpb, draws[0, k, j],
                                   draws[1, k, j], eta)


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
    rows = checked_indices(rows, out.shape[0], "rows")
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
    first = checked_indices(first, pop.shape[0], "first")
    second = checked_indices(second, pop.shape[0], "second")
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
    parents = checked_indices(parents, pop.shape[0], "parents")
    n, m = parents.size, pop.shape[1]
    draws = _uniforms(rng, draws, (2, n, m))
    out, rows = _destination(out, rows, n, m)
    with _threads_for(n * m):
        _poly_kernel(pop, parents, float(eta), *_bounds(low, up, m), float(indpb), draws,
                     out, rows)
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


@numba.njit(cache=True, nogil=True)
def _variation_plan(u: np.ndarray, cxpb: float, cx_or_mut: float, compact: bool,
                    kind: np.ndarray, slot: np.ndarray, dest: np.ndarray
                    ) -> tuple[int, int, int]:
    """Per offspring: its operator (``kind``: 0 crossover, 1 mutation, 2 copy, as
    :func:`draw_variation` compares ``u``), its rank among the offspring of that operator
    (``slot``) and the row it is written to (``dest``: its own; with ``compact`` its rank
    among the crossed and mutated ones, -1 for a copy). Returns the numbers of each."""
    # Without branches: u is random, so a branch per offspring was mispredicted about every
    # other time (0.39 ms at 65,536 offspring, on the calling thread however many cores).
    n_cx = n_mut = n_copy = 0
    for i in range(u.size):
        k = np.int64(not u[i] < cxpb) + np.int64(not u[i] < cx_or_mut)  # cxpb <= cx_or_mut
        kind[i] = k
        slot[i] = n_cx if k == 0 else (n_mut if k == 1 else n_copy)
        n_cx += k == 0
        n_mut += k == 1
        n_copy += k == 2
        if not compact:
            dest[i] = i
        else:
            dest[i] = -1 if k == 2 else n_cx + n_mut - 1
    return n_cx, n_mut, n_copy


def _var_or_rows(pop: np.ndarray, kind: np.ndarray, slot: np.ndarray, dest: np.ndarray,
                 first: np.ndarray, second: np.ndarray, cx_draws: np.ndarray,
                 parents: np.ndarray, mut_draws: np.ndarray, copied: np.ndarray,
                 eta_cx: float, eta_mut: float, indpb: float, low: np.ndarray, up: np.ndarray,
                 out: np.ndarray, source: np.ndarray) -> None:
    """Every offspring in one pass, crossed, mutated or copied as ``kind`` says (a copy's
    row is written only where ``dest`` gives it one)."""
    for i in numba.prange(kind.size):
        k, d = slot[i], dest[i]
        if kind[i] == 0:
            source[i] = -1
            p, q = first[k], second[k]
            for j in range(pop.shape[1]):
                out[d, j] = _sbx_gene(pop[p, j], pop[q, j], low[j], up[j], cx_draws[0, k, j],
                                      cx_draws[1, k, j], cx_draws[2, k, j], eta_cx)
        elif kind[i] == 1:
            source[i] = -1
            p = parents[k]
            for j in range(pop.shape[1]):
                out[d, j] = _poly_gene(pop[p, j], low[j], up[j], indpb, mut_draws[0, k, j],
                                       mut_draws[1, k, j], eta_mut)
        else:
            p = copied[k]
            source[i] = p
            if d >= 0:
                for j in range(pop.shape[1]):
                    out[d, j] = pop[p, j]


_var_or_serial, _var_or_parallel = serial_and_parallel(
    _var_or_rows, **{k: v for k, v in _KERNEL.items() if k != "parallel"})


def _vary(pop: np.ndarray, lambda_: int, cxpb: float, mutpb: float, eta_cx: float,
          eta_mut: float, indpb: float, low: np.ndarray, up: np.ndarray,
          rng: np.random.Generator | None, draws: VariationDraws | None, compact: bool
          ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`np_var_or`, or with ``compact`` its new offspring alone (see
    :func:`np_var_or_new`)."""
    pop = np.ascontiguousarray(pop, dtype=np.float64)
    mu, m = pop.shape
    if draws is None:
        if rng is None:
            raise ValueError("give a generator or the numbers drawn from one")
        draws = draw_variation(rng, mu, lambda_, cxpb, mutpb, m)
    elif draws.mu != mu or draws.u.shape != (lambda_,):
        raise ValueError(f"draws for {draws.mu} parents and {draws.u.size} offspring, "
                         f"given {mu} and {lambda_}")
    kind = np.empty(lambda_, dtype=np.int8)
    slot = np.empty(lambda_, dtype=np.int64)
    dest = np.empty(lambda_, dtype=np.int64)
    n_cx, n_mut, n_copy = _variation_plan(np.asarray(draws.u, dtype=np.float64), float(cxpb),
                                          float(cxpb + mutpb), compact, kind, slot, dest)
    first = checked_indices(draws.cx_first, mu, "first")
    second = checked_indices(draws.cx_second, mu, "second")
    parents = checked_indices(draws.mut_parents, mu, "parents")
    copied = checked_indices(draws.copied, mu, "copied")
    cx_draws = _uniforms(None, draws.cx_uniforms, (3, n_cx, m))
    mut_draws = _uniforms(None, draws.mut_uniforms, (2, n_mut, m))
    if (first.size, second.size, parents.size, copied.size) != (n_cx, n_cx, n_mut, n_copy):
        raise ValueError("draws of other numbers of crossed, mutated and copied offspring")
    out = np.empty((n_cx + n_mut if compact else lambda_, m))
    source = np.empty(lambda_, dtype=np.int64)
    kernel = _var_or_parallel if out.size >= PARALLEL_FROM_GENES else _var_or_serial
    kernel(pop, kind, slot, dest, first, second, cx_draws, parents, mut_draws, copied,
           float(eta_cx), float(eta_mut), float(indpb), *_bounds(low, up, m), out, source)
    return out, source


def np_var_or(pop: np.ndarray, lambda_: int, cxpb: float, mutpb: float, eta_cx: float,
              eta_mut: float, indpb: float, low: np.ndarray, up: np.ndarray,
              rng: np.random.Generator | None,
              draws: VariationDraws | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``algorithms.varOr`` as array code.

    Returns the offspring genes (λ, n) and, per offspring, the index of the parent it is an
    unchanged copy of (reproduction) or -1 (new, must be evaluated). ``draws`` are the
    random numbers drawn beforehand by :func:`draw_variation` (``rng`` is then not used).
    All offspring are made in one pass over them, each by :func:`np_sbx_bounded`'s or
    :func:`np_poly_bounded`'s formulas.

    Pseudocode (each offspring draws u once)::

        for each of the λ offspring:
            u < cxpb:           crossover of two distinct random parents (first child)
            u < cxpb + mutpb:   mutation of a random parent
            otherwise:          a copy of a random parent (its fitness is reused)
    """
    return _vary(pop, lambda_, cxpb, mutpb, eta_cx, eta_mut, indpb, low, up, rng, draws,
                 compact=False)


def np_var_or_new(pop: np.ndarray, lambda_: int, cxpb: float, mutpb: float, eta_cx: float,
                  eta_mut: float, indpb: float, low: np.ndarray, up: np.ndarray,
                  rng: np.random.Generator | None,
                  draws: VariationDraws | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`np_var_or` without building the copies: the new offspring's genes alone (the
    rows of :func:`np_var_or`'s whose source is -1, in order) and the same ``source``.

    A copy's genes are its parent's (``pop[source[i]]``); at 65,536 offspring the copies
    would be 0.5 MB written and read back for nothing.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> pop = rng.uniform(0.0, 1.0, (5, 2))
    >>> d = draw_variation(rng, 5, 6, 0.5, 0.3, 2)
    >>> kids, source = np_var_or(pop, 6, 0.5, 0.3, 20.0, 20.0, 0.5, np.zeros(2), np.ones(2),
    ...                          None, d)
    >>> new, same = np_var_or_new(pop, 6, 0.5, 0.3, 20.0, 20.0, 0.5, np.zeros(2),
    ...                           np.ones(2), None, d)
    >>> bool((same == source).all() and (new == kids[source < 0]).all())
    True
    """
    return _vary(pop, lambda_, cxpb, mutpb, eta_cx, eta_mut, indpb, low, up, rng, draws,
                 compact=True)


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


