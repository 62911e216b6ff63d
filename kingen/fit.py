"""Fit a scheme's rate constants: DEAP's (μ + λ) or CMA-ES, one batched solve per generation.

:func:`fit` runs a configuration (:mod:`kingen.fit_config`) to its end and returns a
:class:`FitResult`; :func:`resume` continues a run file from its last completed generation.

``kingen.fit`` names both this module and, called, its :func:`fit`: ``kingen.fit(config)``
runs a fit, while ``kingen.fit.FitResult`` and ``import kingen.fit`` still reach the
module (see :class:`_CallableModule` at the end).

Search. Genes are log10 rate constants (linear for ``scale = "linear"``) inside the bounds
(:mod:`kingen.params`). ``mu_plus_lambda`` is DEAP's (μ + λ): ``algorithms.varOr`` with
``tools.cxSimulatedBinaryBounded`` and ``tools.mutPolynomialBounded``, survival by
``tools.selTournament`` over parents and offspring, a ``tools.HallOfFame``. The toolbox's
``map`` is replaced by a batched evaluator, so every individual a generation must evaluate
goes to the solver in ONE call. From ``NUMPY_OPERATORS_FROM`` offspring on (or with
``operators = "numpy"``), varOr, the two operators and the tournament run as array code
(numpy, and compiled loops for the per-gene arithmetic) with the same formulas and
probabilities (DEAP spends more time in its per-individual Python than the GPU spends
solving at such sizes); given the same random numbers, the children are DEAP's exactly.
``cmaes`` is
``deap.cma.Strategy`` in genes scaled to [0, 1] per gene (samples outside are clipped for
evaluation and penalised by their squared distance).

Reproducibility. ``random``, numpy's global generator (used by DEAP's CMA-ES) and the
fit's own numpy generator are seeded from ``seed``; their states are stored with every
generation, so the same seed, backend and precision give the same result, and a resumed run
ends as an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import platform
import random
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numba
import numpy as np

from kingen.errors import KingenError
from kingen.fit_config import (
    NUMPY_OPERATORS_FROM,
    FitConfig,
    GASettings,
    StopSettings,
    load_config,
    loads_config,
)
from kingen.objective import Evaluation, Objective
from kingen.params import to_file_units

STATE_VERSION = 2  # 2: plain arrays in the run file (1 was a pickle)
CMA_PENALTY = 1.0  # fitness added per unit of squared distance outside the [0, 1] box

# The resume state's scalars, and the attributes of DEAP's cma.Strategy that change as it
# runs (the rest are constants DEAP computes from λ, μ and the dimension).
_STATE_INTS = ("version", "generation", "since_improvement", "evaluations")
_STATE_FLOATS = ("best", "reference", "elapsed")
_CMA_VECTORS = ("centroid", "pc", "ps", "diagD")
_CMA_MATRICES = ("C", "B", "BD")
_CMA_FLOATS = ("sigma", "cond")
_CMA_INTS = ("update_count", "lambda_", "mu")
_U64 = (1 << 64) - 1


# ---------------------------------------------------------------------- results

@dataclass
class FitResult:
    """The outcome of a fit.

    Attributes
    ----------
    path
        The run file.
    params
        Best parameters, internal units (ms⁻¹, mM⁻¹ ms⁻¹), scheme order.
    values, units
        Best parameters in each parameter's file unit, and those units, by name.
    fitness
        Fitness of the best (Σ weight · error).
    errors, amplitudes
        Error and amplitude (channels) per protocol.
    generations
        Generations completed (the initial population is generation 0).
    reason
        Why the search stopped.
    history
        ``best`` and ``median`` fitness per generation.
    polish
        ``{"fitness_before", "fitness_after", "evaluations", "accepted", "message"}`` or None.
    features
        ``{protocol: {"fit": {...}, "data": {...}}}`` (see :func:`protocol_features`).
    timings
        Per-generation timings (lists of seconds: ``solver_s``, ``kernel_s``,
        ``objective_s``, ``ga_s``, ``io_s``, ``total_s``) and ``wall_s``.
    """

    path: str
    params: np.ndarray
    values: dict[str, float]
    units: dict[str, str]
    fitness: float
    errors: dict[str, float]
    amplitudes: dict[str, float]
    generations: int
    reason: str
    history: dict[str, np.ndarray]
    polish: dict[str, Any] | None
    features: dict[str, dict]
    timings: dict[str, Any]
    free: list[str] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    evaluations: int = 0
    backend: str = ""
    device: str = ""

    def summary(self) -> str:
        """A plain-text summary: parameters with units, error per protocol, features."""
        lines = [f"kingen fit: {self.generations} generations, {self.evaluations} candidates "
                 f"on {self.backend} ({self.device}); stopped: {self.reason}",
                 f"best fitness {self.fitness:.6g}  (run file {self.path})"]
        if self.polish:
            p = self.polish
            lines.append(f"polish: fitness {p['fitness_before']:.6g} -> {p['fitness_after']:.6g}"
                         f" ({p['evaluations']} evaluations, "
                         f"{'accepted' if p['accepted'] else 'not better, kept GA best'})")
        lines.append("")
        lines.append(f"{'parameter':<12}{'value':>14}  {'unit':<14}{'bounds':<24}status")
        for name, v in self.values.items():
            lo, hi = self.bounds.get(name, (math.nan, math.nan))
            status = ("free" if name in self.free else self.status.get(name, "fixed"))
            lines.append(f"{name:<12}{v:>14.6g}  {self.units[name]:<14}"
                         f"{f'[{lo:.4g}, {hi:.4g}]':<24}{status}")
        lines.append("")
        lines.append(f"{'protocol':<20}{'error':>12}{'amplitude (channels)':>24}")
        for name, e in self.errors.items():
            a = self.amplitudes.get(name, math.nan)
            lines.append(f"{name:<20}{e:>12.4g}{a:>24.5g}")
        rows: list[str] = []
        notes: list[str] = []
        for name, f in self.features.items():
            fit, data = f.get("fit", {}), f.get("data", {})
            undetermined = {**(fit.get("not_determined") or {}),
                            **(data.get("not_determined") or {})}

            def cell(side: dict, key: str) -> str:
                if key in (side.get("not_determined") or {}):
                    return f"{'n.d.':>12}"
                return f"{side[key]:>12.4g}"

            for key, v in fit.items():
                if isinstance(v, (int, float)) and key in data and isinstance(
                        data[key], (int, float)):
                    rows.append(f"{name:<20}{key:<18}{cell(fit, key)}{cell(data, key)}")
            notes.extend(f"{name} {key}: {why}" for key, why in undetermined.items())
        if rows:
            lines.append("")
            lines.append(f"{'protocol':<20}{'feature':<18}{'fit':>12}{'data':>12}")
            lines.extend(rows)
            lines.extend(f"n.d. = {n}" for n in notes)
        return "\n".join(lines)


# ---------------------------------------------------------------------- progress

class Progress:
    """A live progress line: one ``\\r``-updated line on a terminal, plain lines otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._width = 0

    def update(self, generation: int, best: float, median: float, rate: float, eta_s: float
               ) -> None:
        """Show one generation's figures."""
        if not self.enabled:
            return
        eta = "?" if not math.isfinite(eta_s) else _duration(eta_s)
        line = (f"gen {generation}/{self.total}  best {best:.5g}  median {median:.5g}  "
                f"{rate:,.0f} cand/s  ETA {eta}")
        if self.tty:
            pad = max(self._width - len(line), 0)
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (ends the live line first)."""
        if not self.enabled:
            return
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the live line."""
        if self.enabled and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def _duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


# ---------------------------------------------------------------------- vectorised operators

# The operators' per-gene arithmetic runs in compiled loops that read the parents from the
# population and write each child straight into the offspring array: as numpy array code,
# the temporaries, masks and gathers cost more than the arithmetic at 65k offspring. The
# loops run on all cores (each child is computed alone, so the result does not depend on
# their number). The random numbers are still drawn by the caller's numpy generator, as
# whole arrays, in a fixed order.
_KERNEL = {"cache": True, "nogil": True, "parallel": True, "error_model": "numpy"}

# Below this many genes to write, the operators run on the calling thread alone. In a fit
# the CPU idles while the GPU solves, numba's OpenMP workers fall asleep, and waking them
# costs more (about 10 ms on the H100 machine's 16-core host: benchmarks/h100/session6.sh)
# than the whole serial loop at these sizes.
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
                   low: np.ndarray, up: np.ndarray, rng: np.random.Generator,
                   out: np.ndarray | None = None, rows: np.ndarray | None = None
                   ) -> np.ndarray:
    """First child of ``tools.cxSimulatedBinaryBounded`` for each pair of parents.

    Same formulas and probabilities as DEAP: each gene crosses with probability 0.5 (and only
    if the parents differ by more than 1e-14); the two children's genes swap with
    probability 0.5. Three (n, m) arrays of uniform numbers are drawn from ``rng``, in this
    order: crossing, the spread factor, swapping.

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
    """
    pop = np.ascontiguousarray(pop, dtype=np.float64)
    first = _indices(first, pop.shape[0], "first")
    second = _indices(second, pop.shape[0], "second")
    n, m = first.size, pop.shape[1]
    draws = rng.random((3, n, m))
    out, rows = _destination(out, rows, n, m)
    with _threads_for(n * m):
        _sbx_kernel(pop, first, second, float(eta), *_bounds(low, up, m), draws, out, rows)
    return out


def np_poly_bounded(pop: np.ndarray, parents: np.ndarray, eta: float, low: np.ndarray,
                    up: np.ndarray, indpb: float, rng: np.random.Generator,
                    out: np.ndarray | None = None, rows: np.ndarray | None = None
                    ) -> np.ndarray:
    """``tools.mutPolynomialBounded`` applied to copies of rows of ``pop`` (same formulas).

    Two (n, m) arrays of uniform numbers are drawn from ``rng``, in this order: whether the
    gene mutates, the perturbation.

    Parameters
    ----------
    pop
        (μ, m) genes of the parents.
    parents
        (n,) rows of ``pop`` to mutate.
    out, rows
        Where the mutants go: mutant k is written to ``out[rows[k]]``. By default, a new
        (n, m) array in the order of ``parents``.
    """
    pop = np.ascontiguousarray(pop, dtype=np.float64)
    parents = _indices(parents, pop.shape[0], "parents")
    n, m = parents.size, pop.shape[1]
    draws = rng.random((2, n, m))
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
                      rng: np.random.Generator) -> np.ndarray:
    """Indices chosen by ``tools.selTournament`` (minimisation; first best wins ties)."""
    aspirants = rng.integers(0, fitness.size, size=(k, tournsize))
    return _tournament_winners(np.asarray(fitness, dtype=np.float64), aspirants)


def np_var_or(pop: np.ndarray, lambda_: int, cxpb: float, mutpb: float, eta_cx: float,
              eta_mut: float, indpb: float, low: np.ndarray, up: np.ndarray,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``algorithms.varOr`` as array code.

    Returns the offspring genes (λ, n) and, per offspring, the index of the parent it is an
    unchanged copy of (reproduction) or -1 (new, must be evaluated).
    """
    mu = pop.shape[0]
    u = rng.random(lambda_)
    cx = u < cxpb
    mut = (~cx) & (u < cxpb + mutpb)
    out = np.empty((lambda_, pop.shape[1]))
    source = np.full(lambda_, -1, dtype=np.int64)
    rows = np.flatnonzero(cx)
    if rows.size:
        a = rng.integers(0, mu, rows.size)
        b = (a + rng.integers(1, mu, rows.size)) % mu  # two distinct parents, as random.sample
        np_sbx_bounded(pop, a, b, eta_cx, low, up, rng, out=out, rows=rows)
    rows = np.flatnonzero(mut)
    if rows.size:
        np_poly_bounded(pop, rng.integers(0, mu, rows.size), eta_mut, low, up, indpb, rng,
                        out=out, rows=rows)
    rows = np.flatnonzero(~(cx | mut))
    if rows.size:
        idx = rng.integers(0, mu, rows.size)
        out[rows] = pop.take(idx, axis=0)
        source[rows] = idx
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


# ---------------------------------------------------------------------- the engine

def _store_class():
    """The run store (imported late: the fit layer only writes through it)."""
    from kingen.store import RunStore

    return RunStore


def _environment(objective: Objective, precision: str) -> dict[str, str]:
    import deap
    import scipy

    from kingen._version import __version__

    env = {"kingen": __version__, "python": platform.python_version(),
           "platform": platform.platform(), "numpy": np.__version__,
           "scipy": scipy.__version__, "numba": numba.__version__, "deap": deap.__version__,
           "backend": objective.simulator.backend, "device": objective.simulator.device,
           "precision": precision, "cpu_count": str(os.cpu_count())}
    try:
        import h5py

        env["h5py"] = h5py.__version__
    except ImportError:  # pragma: no cover
        pass
    return env


def state_fields(cfg: FitConfig, n_protocols: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The resume state's arrays, name -> (dtype, typical shape), as the run file keeps them.

    Plain numbers only: the population, the hall of fame, the CMA-ES strategy, the random
    generators' states (see the README, "The run file").
    """
    ga = cfg.ga
    n, r, k = cfg.pmap.n_genes, n_protocols, ga.hall_of_fame
    mu = ga.lambda_ if ga.algorithm == "cmaes" else ga.population
    fields = {name: ("i8", ()) for name in _STATE_INTS}
    fields.update({name: ("f8", ()) for name in _STATE_FLOATS})
    fields.update({
        "genes": ("f8", (mu, n)), "fitness": ("f8", (mu,)), "errors": ("f8", (mu, r)),
        "fail": ("i8", (mu,)), "hof_genes": ("f8", (k, n)), "hof_fitness": ("f8", (k,)),
        # Python's random: (version, 624 Mersenne Twister words and the position,
        # the cached Gaussian or None)
        "python_random": ("i8", (625,)), "python_random_version": ("i8", ()),
        "python_random_has_gauss": ("i8", ()), "python_random_gauss": ("f8", ()),
        # numpy's global (legacy) generator, which DEAP's CMA-ES draws from
        "np_global_key": ("u4", (624,)), "np_global_pos": ("i8", ()),
        "np_global_has_gauss": ("i8", ()), "np_global_gauss": ("f8", ()),
        # the fit's PCG64: 128-bit state and increment as (high, low) 64-bit words
        "rng_pcg64": ("u8", (4,)), "rng_has_uint32": ("i8", ()),
        "rng_uinteger": ("u8", ()),
    })
    if ga.algorithm == "cmaes":
        fields.update({f"cma_{a}": ("f8", (n,)) for a in _CMA_VECTORS})
        fields.update({f"cma_{a}": ("f8", (n, n)) for a in _CMA_MATRICES})
        fields.update({f"cma_{a}": ("f8", ()) for a in _CMA_FLOATS})
        fields.update({f"cma_{a}": ("i8", ()) for a in _CMA_INTS})
    return fields


def checked_state(arrays: dict[str, np.ndarray], cfg: FitConfig, n_protocols: int,
                  path: str) -> tuple[dict[str, Any], tuple, tuple, dict[str, Any]]:
    """Check a run file's resume arrays before any is used; nothing in them is executed.

    Every array must have the type and shape this configuration implies; the random
    generators' states are tried on throw-away generators.

    Returns
    -------
    state, python_random, np_global, pcg64
        The search state's scalars and arrays, and the three generators' states in the form
        ``random.setstate``, ``np.random.set_state`` and ``PCG64.state`` take.

    Raises
    ------
    KingenError
        Naming the array that is missing or malformed.
    """
    want = state_fields(cfg, n_protocols)
    k = cfg.ga.hall_of_fame
    for name, (dtype, shape) in want.items():
        if name not in arrays:
            raise KingenError("malformed resume state: missing", file=path,
                              field=f"/resume/{name}")
        arr = arrays[name]
        ok_shape = arr.shape == shape or (name.startswith("hof_") and arr.ndim == len(
            shape) and arr.shape[0] <= k and arr.shape[1:] == shape[1:])
        if np.dtype(arr.dtype) != np.dtype(dtype) or not ok_shape:
            raise KingenError(f"malformed resume state: {arr.dtype} of shape {arr.shape} "
                              f"where this run needs {np.dtype(dtype)} of shape {shape}",
                              file=path, field=f"/resume/{name}")
    extra = sorted(set(arrays) - set(want))
    if extra:
        raise KingenError("malformed resume state: fields this run does not have",
                          file=path, field="/resume", value=extra)
    if int(arrays["version"]) != STATE_VERSION:
        raise KingenError("resume state of another kingen version; cannot resume",
                          file=path, field="/resume/version", value=int(arrays["version"]))
    s: dict[str, Any] = {name: int(arrays[name]) for name in _STATE_INTS}
    s.update({name: float(arrays[name]) for name in _STATE_FLOATS})
    if not math.isfinite(s["reference"]):
        del s["reference"]  # never set: no finite best yet
    for name in ("genes", "fitness", "errors", "fail", "hof_genes", "hof_fitness"):
        s[name] = np.array(arrays[name])
    gauss = (float(arrays["python_random_gauss"])
             if int(arrays["python_random_has_gauss"]) else None)
    python_state = (int(arrays["python_random_version"]),
                    tuple(int(v) for v in arrays["python_random"]), gauss)
    np_state = ("MT19937", np.array(arrays["np_global_key"]), int(arrays["np_global_pos"]),
                int(arrays["np_global_has_gauss"]), float(arrays["np_global_gauss"]))
    pcg = [int(v) for v in arrays["rng_pcg64"]]
    pcg_state = {"bit_generator": "PCG64",
                 "state": {"state": pcg[0] << 64 | pcg[1], "inc": pcg[2] << 64 | pcg[3]},
                 "has_uint32": int(arrays["rng_has_uint32"]),
                 "uinteger": int(arrays["rng_uinteger"])}
    try:
        random.Random().setstate(python_state)
        np.random.RandomState().set_state(np_state)
        np.random.PCG64().state = pcg_state
    except (ValueError, TypeError, OverflowError) as exc:
        raise KingenError(f"malformed resume state: a random generator's state is invalid "
                          f"({' '.join(str(exc).split())})", file=path, field="/resume"
                          ) from None
    return s, python_state, np_state, pcg_state


class _Engine:
    """One run of the search: state, one generation at a time, written through the store."""

    def __init__(self, cfg: FitConfig, objective: Objective, store: Any,
                 progress: Progress) -> None:
        self.cfg = cfg
        self.ga: GASettings = cfg.ga
        self.stop: StopSettings = cfg.stop
        self.obj = objective
        self.store = store
        self.progress = progress
        self.pmap = cfg.pmap
        self.low, self.up = self.pmap.lower, self.pmap.upper
        self.n = self.pmap.n_genes
        self.lambda_ = self.ga.lambda_
        self.indpb = self.ga.indpb or 1.0 / self.n
        self.numpy_ops = (self.ga.operators == "numpy" or (
            self.ga.operators == "auto" and self.lambda_ >= NUMPY_OPERATORS_FROM))
        self.rng = np.random.Generator(np.random.PCG64(cfg.seed))
        self.timings: list[dict[str, float]] = []
        self.evaluations = 0
        self._eval_clock: dict[str, float] = {}
        self._toolbox = None
        self._writer = None
        self._queued: Callable[[], None] | None = None
        self._pending = None

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, genes: np.ndarray) -> Evaluation:
        """Score rows of genes: ONE batched solver call."""
        t0 = time.perf_counter()
        params = self.pmap.to_params(genes, clip=True)
        # The last generation's write runs during the solve, not during the array work here.
        self._start_write()
        # to_params has just computed the derived rates, from the objective's scheme
        ev, res = self.obj.evaluate(params, complete=False)
        c = self._eval_clock
        c["solver_s"] = c.get("solver_s", 0.0) + res.timings.get("total_s", 0.0)
        c["kernel_s"] = c.get("kernel_s", 0.0) + res.timings.get("solve_s", 0.0)
        c["evaluate_s"] = c.get("evaluate_s", 0.0) + time.perf_counter() - t0
        self.evaluations += genes.shape[0]
        return ev

    # ------------------------------------------------------------------ state
    def initial(self) -> dict[str, Any]:
        random.seed(self.cfg.seed)
        np.random.seed(self.cfg.seed % (2 ** 32))  # noqa: NPY002 - DEAP's CMA-ES draws from it
        state: dict[str, Any] = {"version": STATE_VERSION, "generation": 0, "best": math.inf,
                                 "since_improvement": 0, "elapsed": 0.0, "evaluations": 0,
                                 "hof_genes": np.zeros((0, self.n)), "hof_fitness": np.zeros(0)}
        if self.ga.algorithm == "cmaes":
            from deap import cma

            centroid = (self._to_unit(self.pmap.start_genes()) if self.ga.start_from_model
                        else np.full(self.n, 0.5))
            state["cma"] = cma.Strategy(centroid=list(centroid), sigma=self.ga.sigma,
                                        lambda_=self.lambda_, mu=max(1, self.lambda_ // 2))
            return self._cma_generation(state)
        genes = self.rng.uniform(self.low, self.up, size=(self.ga.population, self.n))
        if self.ga.start_from_model:
            genes[0] = self.pmap.start_genes()
        ev = self.evaluate(genes)
        state.update(genes=genes, fitness=ev.fitness, errors=ev.errors, fail=ev.fail)
        self._update_hof(state, genes, ev.fitness)
        return state

    def _update_hof(self, state: dict, genes: np.ndarray, fitness: np.ndarray) -> None:
        k = self.ga.hall_of_fame
        if fitness.size > k:
            # Only the k best of a batch can enter: keeps the row-unique step small at large λ.
            keep = np.argpartition(np.where(np.isfinite(fitness), fitness, np.inf), k)[:k]
            keep.sort()
            genes, fitness = genes[keep], fitness[keep]
        g = np.vstack([state["hof_genes"], genes])
        f = np.concatenate([state["hof_fitness"], fitness])
        ok = np.isfinite(f)
        g, f = g[ok], f[ok]
        _, first = np.unique(g, axis=0, return_index=True)  # distinct candidates only
        first = np.sort(first)
        g, f = g[first], f[first]
        order = np.argsort(f, kind="stable")[:k]
        state["hof_genes"], state["hof_fitness"] = g[order], f[order]

    # ------------------------------------------------------------------ (μ + λ)
    def _toolbox_get(self):
        if self._toolbox is None:
            from deap import base, creator, tools

            if not hasattr(creator, "KingenFitness"):
                creator.create("KingenFitness", base.Fitness, weights=(-1.0,))
            if not hasattr(creator, "KingenIndividual"):
                creator.create("KingenIndividual", list, fitness=creator.KingenFitness)
            tb = base.Toolbox()
            low, up = list(self.low), list(self.up)
            tb.register("mate", tools.cxSimulatedBinaryBounded, eta=self.ga.eta_cx, low=low,
                        up=up)
            tb.register("mutate", tools.mutPolynomialBounded, eta=self.ga.eta_mut, low=low,
                        up=up, indpb=self.indpb)
            tb.register("select", tools.selTournament, tournsize=self.ga.tournament)
            tb.register("evaluate", _no_single_evaluation)
            tb.register("map", self._batched_map)
            self._toolbox = tb
            self._creator = creator
        return self._toolbox

    def _batched_map(self, func, individuals: list) -> list[tuple[float]]:
        """The toolbox's ``map``: every individual of the call in ONE solver call."""
        if not individuals:
            return []
        ev = self.evaluate(np.array([list(ind) for ind in individuals], dtype=float))
        for i, ind in enumerate(individuals):
            ind.errors = ev.errors[i]
            ind.fail = int(ev.fail[i])
        return [(float(f),) for f in ev.fitness]

    def _individuals(self, genes: np.ndarray, fitness: np.ndarray, errors: np.ndarray,
                     fail: np.ndarray) -> list:
        cls = self._creator.KingenIndividual
        out = []
        for g, f, e, fl in zip(genes, fitness, errors, fail, strict=True):
            ind = cls(float(x) for x in g)
            ind.fitness.values = (float(f),)
            ind.errors = np.asarray(e)
            ind.fail = int(fl)
            out.append(ind)
        return out

    def mu_plus_lambda_generation(self, state: dict) -> dict:
        """One generation of DEAP's (μ + λ)."""
        if self.numpy_ops:
            kids, source = np_var_or(state["genes"], self.lambda_, self.ga.cxpb, self.ga.mutpb,
                                     self.ga.eta_cx, self.ga.eta_mut, self.indpb, self.low,
                                     self.up, self.rng)
            fit = np.empty(self.lambda_)
            err = np.empty((self.lambda_, self.obj.n_protocols))
            fail = np.zeros(self.lambda_, dtype=np.int64)
            copied = np.flatnonzero(source >= 0)
            parent = source[copied]
            fit[copied] = state["fitness"].take(parent)
            err[copied] = state["errors"].take(parent, axis=0)
            fail[copied] = state["fail"].take(parent)
            new = np.flatnonzero(source < 0)
            new_genes = kids.take(new, axis=0)
            if new.size:
                ev = self.evaluate(new_genes)
                fit[new], err[new], fail[new] = ev.fitness, ev.errors, ev.fail
            self._update_hof(state, new_genes, fit.take(new))
            pool_f = np.concatenate([state["fitness"], fit])
            t = time.perf_counter()
            chosen = np_sel_tournament(pool_f, self.ga.population, self.ga.tournament, self.rng)
            self._eval_clock["select_s"] = time.perf_counter() - t
            # take, not fancy indexing: several times faster for whole rows
            state.update({key: np.concatenate([state[key], offspring]).take(chosen, axis=0)
                          for key, offspring in (("genes", kids), ("errors", err),
                                                 ("fail", fail))},
                         fitness=pool_f.take(chosen))
            return state
        from deap import algorithms

        tb = self._toolbox_get()
        pop = self._individuals(state["genes"], state["fitness"], state["errors"],
                                state["fail"])
        offspring = algorithms.varOr(pop, tb, self.lambda_, self.ga.cxpb, self.ga.mutpb)
        invalid = [ind for ind in offspring if not ind.fitness.valid]
        for ind, fit in zip(invalid, tb.map(tb.evaluate, invalid), strict=True):
            ind.fitness.values = fit
        kids = np.array([list(ind) for ind in invalid]).reshape(-1, self.n)
        self._update_hof(state, kids, np.array([ind.fitness.values[0] for ind in invalid]))
        pop = tb.select(pop + offspring, self.ga.population)
        state.update(genes=np.array([list(i) for i in pop], dtype=float),
                     fitness=np.array([i.fitness.values[0] for i in pop]),
                     errors=np.array([i.errors for i in pop]),
                     fail=np.array([i.fail for i in pop], dtype=np.int64))
        return state

    # ------------------------------------------------------------------ CMA-ES
    def _to_unit(self, genes: np.ndarray) -> np.ndarray:
        return (genes - self.low) / (self.up - self.low)

    def _cma_generation(self, state: dict) -> dict:
        from deap import base, creator

        if not hasattr(creator, "KingenFitness"):
            creator.create("KingenFitness", base.Fitness, weights=(-1.0,))
        if not hasattr(creator, "KingenIndividual"):
            creator.create("KingenIndividual", list, fitness=creator.KingenFitness)
        strategy = state["cma"]
        inds = strategy.generate(creator.KingenIndividual)
        u = np.array([list(i) for i in inds], dtype=float)
        inside = np.clip(u, 0.0, 1.0)
        genes = self.low + inside * (self.up - self.low)
        ev = self.evaluate(genes)
        penalty = CMA_PENALTY * ((u - inside) ** 2).sum(axis=1)
        for ind, f, p in zip(inds, ev.fitness, penalty, strict=True):
            # A failed candidate must still be rankable: worst, but finite for CMA's sort.
            ind.fitness.values = (float(f + p) if math.isfinite(f) else 1e300,)
        strategy.update(inds)
        state.update(genes=genes, fitness=ev.fitness, errors=ev.errors, fail=ev.fail)
        self._update_hof(state, genes, ev.fitness)
        return state

    # ------------------------------------------------------------------ the loop
    def snapshot(self, state: dict) -> dict[str, np.ndarray]:
        """The resume state as of now, as plain arrays (written later, on the writer's thread).

        The random generators' states are copied now. The population arrays are shared
        with ``state``: a generation replaces them and never writes into them. CMA-ES's
        strategy is updated in place, so its arrays are copied.
        """
        out: dict[str, Any] = {name: np.int64(state.get(name, 0)) for name in _STATE_INTS}
        out["version"] = np.int64(STATE_VERSION)
        out["evaluations"] = np.int64(self.evaluations)
        out.update({name: np.float64(state.get(name, math.inf)) for name in _STATE_FLOATS})
        for name in ("genes", "fitness", "errors", "fail", "hof_genes", "hof_fitness"):
            out[name] = state[name]
        version, words, gauss = random.getstate()
        out["python_random"] = np.array(words, dtype=np.int64)
        out["python_random_version"] = np.int64(version)
        out["python_random_has_gauss"] = np.int64(gauss is not None)
        out["python_random_gauss"] = np.float64(0.0 if gauss is None else gauss)
        _, key, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002
        out.update(np_global_key=np.array(key, dtype=np.uint32), np_global_pos=np.int64(pos),
                   np_global_has_gauss=np.int64(has_gauss),
                   np_global_gauss=np.float64(cached))
        st = self.rng.bit_generator.state
        words128 = [st["state"]["state"], st["state"]["inc"]]
        out["rng_pcg64"] = np.array([w >> s & _U64 for w in words128 for s in (64, 0)],
                                    dtype=np.uint64)
        out["rng_has_uint32"] = np.int64(st["has_uint32"])
        out["rng_uinteger"] = np.uint64(st["uinteger"])
        if "cma" in state:
            cma = state["cma"]
            for a in _CMA_VECTORS + _CMA_MATRICES + _CMA_FLOATS:
                out[f"cma_{a}"] = np.array(getattr(cma, a), dtype=np.float64)
            for a in _CMA_INTS:
                out[f"cma_{a}"] = np.int64(getattr(cma, a))
        return out

    def unpack(self, arrays: dict[str, np.ndarray], path: str) -> dict:
        """The search state from a run file's resume arrays (checked by
        :func:`checked_state`), with the random generators set to their stored states."""
        s, python_state, np_state, pcg_state = checked_state(arrays, self.cfg,
                                                             self.obj.n_protocols, path)
        random.setstate(python_state)
        np.random.set_state(np_state)  # noqa: NPY002
        self.rng.bit_generator.state = pcg_state
        if self.ga.algorithm == "cmaes":
            s["cma"] = self._strategy(arrays)
        self.evaluations = s["evaluations"]
        return s

    def _strategy(self, arrays: dict[str, np.ndarray]) -> Any:
        """A CMA-ES strategy with the stored state (its constants are recomputed by DEAP
        from λ, μ and the dimension, exactly as the run computed them)."""
        from deap import cma

        strategy = cma.Strategy(centroid=list(arrays["cma_centroid"]),
                                sigma=float(arrays["cma_sigma"]),
                                lambda_=int(arrays["cma_lambda_"]), mu=int(arrays["cma_mu"]))
        for a in _CMA_VECTORS + _CMA_MATRICES:
            setattr(strategy, a, np.array(arrays[f"cma_{a}"]))
        for a in _CMA_FLOATS:
            setattr(strategy, a, np.float64(arrays[f"cma_{a}"]))
        strategy.update_count = int(arrays["cma_update_count"])
        return strategy

    def record(self, state: dict, t_start: float) -> dict[str, float]:
        """Write the generation through the store; returns the generation's statistics.

        The write (the population's parameters, the resume state's arrays, compression,
        flush) runs on a background thread during the next generation's solver call; the
        next generation's record waits for it to finish.
        """
        f = state["fitness"]
        finite = f[np.isfinite(f)]
        best = float(state["hof_fitness"][0]) if state["hof_fitness"].size else math.inf
        ref = state.get("reference", math.inf)
        if math.isfinite(best) and (not math.isfinite(ref)
                                    or best < ref * (1.0 - self.stop.min_improvement)):
            state["reference"] = best
            state["since_improvement"] = 0
        elif state["generation"] > 0:
            state["since_improvement"] += 1
        state["best"] = best
        stats = {"best": best, "median": float(np.median(finite)) if finite.size else math.inf,
                 "mean": float(finite.mean()) if finite.size else math.inf,
                 "population_best": float(finite.min()) if finite.size else math.inf,
                 "n_failed": float(int((state["fail"] != 0).sum())),
                 "evaluations": float(self.evaluations)}
        t_io = time.perf_counter()
        state["elapsed"] += t_io - t_start
        snapshot = self.snapshot(state)
        self.flush()
        now = time.perf_counter()
        io = now - t_io
        state["elapsed"] += io
        c = self._eval_clock
        timing = {"solver_s": c.get("solver_s", 0.0), "kernel_s": c.get("kernel_s", 0.0),
                  "objective_s": c.get("evaluate_s", 0.0) - c.get("solver_s", 0.0),
                  "io_s": io, "total_s": now - t_start}
        timing["ga_s"] = max(timing["total_s"] - c.get("evaluate_s", 0.0) - io, 0.0)
        self.timings.append(dict(timing))
        self._eval_clock = {}
        index = len(self.timings) - 1

        def write() -> None:
            t = time.perf_counter()
            self.store.append_generation(
                generation=snapshot["generation"], population=self.pmap.to_params(
                    snapshot["genes"]), errors=snapshot["errors"], fitness=snapshot["fitness"],
                fail=snapshot["fail"], stats=stats, timings=timing, state=snapshot)
            self.timings[index]["write_s"] = time.perf_counter() - t

        self._queued = write
        return stats

    def _start_write(self) -> None:
        if self._queued is not None:
            job, self._queued = self._queued, None
            if self._writer is None:
                job()
            else:
                self._pending = self._writer.submit(job)

    def flush(self) -> None:
        """Finish the last generation's write (and raise its error, if any)."""
        self._start_write()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def stop_reason(self, state: dict) -> str | None:
        s = self.stop
        if s.target_error > 0 and state["best"] <= s.target_error:
            return f"target error {s.target_error:g} reached"
        if s.patience > 0 and state["since_improvement"] >= s.patience:
            return f"no improvement for {s.patience} generations"
        if s.wall_time > 0 and state["elapsed"] >= s.wall_time:
            return f"wall-time limit {s.wall_time:g} s"
        if state["generation"] >= self.ga.generations:
            return f"maximum generations ({self.ga.generations})"
        return None

    def run(self, state: dict | None) -> tuple[dict, str]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kingen-store") as pool:
            self._writer = pool
            try:
                t0 = time.perf_counter()
                if self.numpy_ops and self.ga.algorithm != "cmaes":
                    warm_up_operators(self.n)
                if state is None:
                    state = self.initial()
                    self._show(state, self.record(state, t0))
                while True:
                    reason = self.stop_reason(state)
                    if reason is not None:
                        return state, reason
                    t0 = time.perf_counter()
                    state["generation"] += 1
                    if self.ga.algorithm == "cmaes":
                        state = self._cma_generation(state)
                    else:
                        state = self.mu_plus_lambda_generation(state)
                    self._show(state, self.record(state, t0))
            finally:
                self.flush()
                self._writer = None

    def _show(self, state: dict, stats: dict[str, float]) -> None:
        t = self.timings[-1]
        n_eval = self.lambda_ if state["generation"] else len(state["fitness"])
        rate = n_eval / max(t["total_s"], 1e-9)
        recent = [x["total_s"] for x in self.timings[-5:]]
        left = self.ga.generations - state["generation"]
        eta = left * float(np.mean(recent))
        if self.stop.wall_time > 0:
            eta = min(eta, max(self.stop.wall_time - state["elapsed"], 0.0))
        self.progress.update(state["generation"], stats["best"], stats["median"], rate, eta)


def _no_single_evaluation(*_args: Any) -> None:
    raise RuntimeError("individuals are evaluated in batches by the toolbox's map")


# ---------------------------------------------------------------------- polish

def polish(objective: Objective, cfg: FitConfig, genes: np.ndarray, fitness: float,
           max_evaluations: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Refine one candidate by ``scipy.optimize.least_squares`` in gene (log) space.

    The Jacobian is by forward differences, all perturbed candidates in ONE solver call.

    Returns
    -------
    genes, report
        The refined genes (the input if not better) and ``{"fitness_before",
        "fitness_after", "evaluations", "accepted", "message"}``.
    """
    from scipy.optimize import least_squares

    pmap = cfg.pmap
    lo, hi = pmap.lower, pmap.upper
    span = hi - lo
    h = (1e-3 if cfg.precision == "float32" else 1e-6) * span
    x0 = np.clip(genes, lo + 1e-9 * span, hi - 1e-9 * span)
    cache: dict[bytes, np.ndarray] = {}
    calls = {"n": 0}

    def fun(x: np.ndarray) -> np.ndarray:
        key = x.tobytes()
        if key not in cache:
            cache.clear()
            cache[key] = objective.residuals(pmap.to_params(x[None, :]))[0]
            calls["n"] += 1
        return cache[key]

    def jac(x: np.ndarray) -> np.ndarray:
        r0 = fun(x)
        step = np.where(x + h > hi, -h, h)
        xs = x[None, :] + np.diag(step)
        rs = objective.residuals(pmap.to_params(xs))
        calls["n"] += xs.shape[0]
        return ((rs - r0[None, :]) / step[:, None]).T

    try:
        sol = least_squares(fun, x0, jac=jac, bounds=(lo, hi), method="trf",
                            max_nfev=max_evaluations, x_scale="jac")
        x, msg = sol.x, str(sol.message)
    except (ValueError, np.linalg.LinAlgError) as exc:
        x, msg = x0, f"least squares failed: {exc}"
    after = objective.evaluate(pmap.to_params(x[None, :]))[0].fitness[0]
    accepted = bool(np.isfinite(after) and after < fitness)
    report = {"fitness_before": float(fitness), "fitness_after": float(after),
              "evaluations": int(calls["n"]), "accepted": accepted, "message": msg}
    return (x if accepted else genes), report


# ---------------------------------------------------------------------- public entry points

def fit(config: FitConfig | str | os.PathLike[str], *, overwrite: bool = False,
        progress: bool = True, overrides: dict[str, Any] | None = None,
        stream: TextIO | None = None) -> FitResult:
    """Run a fit to its end.

    Parameters
    ----------
    config
        A configuration file or a loaded :class:`~kingen.fit_config.FitConfig`.
    overwrite
        Replace an existing run file.
    progress
        Show the live progress line (on ``stream``, default stderr).
    overrides
        Command-line values replacing the file's (see :func:`load_config`).

    Raises
    ------
    KingenError
        For any problem with the configuration, its files or the output, before any
        simulation.

    Examples
    --------
    The bundled demo, briefly (a few seconds on a laptop's CPU):

    >>> import kingen
    >>> result = kingen.fit(kingen.demo_config(), overwrite=True, progress=False,
    ...                     overrides={"output": "demo.h5", "generations": 2,
    ...                                "population": 8})  # doctest: +SKIP
    >>> print(result.summary())  # doctest: +SKIP
    kingen fit: 2 generations, ...
    """
    cfg = config if isinstance(config, FitConfig) else load_config(config, overrides=overrides)
    objective = _objective(cfg)
    _warn(_start_warnings(cfg, objective), stream)
    mu = cfg.ga.lambda_ if cfg.ga.algorithm == "cmaes" else cfg.ga.population
    store = _store_class().create(
        cfg.output, config_text=cfg.text, config=cfg.settings, scheme=cfg.scheme,
        protocols=objective.protocols, recordings=cfg.recordings, targets=cfg.targets,
        free_mask=cfg.pmap.free_mask, population_size=mu,
        environment=_environment(objective, cfg.precision),
        state_fields=state_fields(cfg, objective.n_protocols), inputs=_inputs(cfg),
        overwrite=overwrite)
    with store:
        return _search(cfg, objective, store, None, progress, stream)


def resume(path: str | os.PathLike[str], *, progress: bool = True,
           generations: int | None = None, stream: TextIO | None = None) -> FitResult:
    """Continue a run file from its last completed generation.

    The configuration is rebuilt from the text stored in the run file, with the settings
    the run started with, and with the scheme stored in the run file (not the model file
    on disk, which may have been edited since: a line on ``stream`` says so when it
    differs). The protocols' data files are read again from the original configuration's
    folder.

    The run file is checked whole first (every checksum, every counter) and locked against
    a second writer; a damaged file is never written to.

    Parameters
    ----------
    path
        The run file.
    generations
        A new maximum number of generations (default: the run's own).

    Examples
    --------
    >>> import kingen
    >>> result = kingen.resume("demo.h5", generations=4, progress=False)  # doctest: +SKIP
    """
    # Everything is read and checked (every checksum, the resume state) before the file is
    # opened for writing: a damaged or malformed file is never written to. A second writer
    # is refused by the lock taken then.
    with _store_class().open(path, mode="r") as reader:
        finished = reader.finished  # opening to append clears it: read it first
        if finished and generations is None:
            raise KingenError(f"the run has already finished ({finished}); give "
                              "--generations to continue it further", file=str(path))
        settings = reader.config
        cfg_path = settings.get("config_path", "<config>")
        base = Path(cfg_path).parent if cfg_path[:1] != "<" else Path(".")
        scheme = reader.scheme()
        # the size limits were passed (or lifted) when the run started
        cfg = loads_config(reader.config_text, path=cfg_path, base=base, scheme=scheme,
                           overrides={"force": True})
        _, arrays = reader.last_state()
    cfg.ga = GASettings(**settings["ga"])
    if generations is not None:
        cfg.ga.generations = int(generations)
    cfg.stop = StopSettings(**settings["stop"])
    cfg.seed, cfg.backend, cfg.precision = (settings["seed"], settings["backend"],
                                            settings["precision"])
    cfg.output = str(path)
    cfg.settings = settings
    objective = _objective(cfg)
    checked_state(arrays, cfg, objective.n_protocols, str(path))
    _say_if_model_changed(scheme, cfg.model_path, stream)
    _warn(_start_warnings(cfg, objective), stream)
    store = _store_class().open(path, mode="a", verify=False)
    with store:
        _, arrays = store.last_state()  # the same, unless another run wrote in between
        return _search(cfg, objective, store, arrays, progress, stream)


def _say_if_model_changed(scheme: Any, model_path: str, stream: TextIO | None) -> None:
    """One line (also with ``progress=False``: it is not progress) when the model file on
    disk is not the scheme the run stored."""
    p = Path(model_path)
    try:
        same = p.read_text(encoding="utf-8") == scheme.text
        what = "differs from"
    except (OSError, UnicodeDecodeError):
        same, what = False, "cannot be read; it is not needed:"
    if not same:
        out = stream if stream is not None else sys.stderr
        out.write(f"kingen: note: the model file {model_path} {what} the scheme stored in the "
                  "run file; resuming with the stored scheme\n")
        out.flush()


def _start_warnings(cfg: FitConfig, objective: Objective) -> list[str]:
    """What a user must hear before a fit starts: cycles the fit can take out of
    microscopic reversibility (see :meth:`~kingen.scheme.Scheme.reversibility_warnings`),
    recordings with an offset the model cannot fit (:attr:`Objective.warnings`)."""
    varied = set(cfg.pmap.gene_names) | set(cfg.ties)
    return cfg.scheme.reversibility_warnings(varied) + objective.warnings


def _warn(lines: list[str], stream: TextIO | None) -> None:
    """``kingen: <line>`` on ``stream`` (default stderr), also with ``progress=False``."""
    if not lines:
        return
    out = stream if stream is not None else sys.stderr
    for line in lines:
        out.write(f"kingen: {line}\n")
    out.flush()


def _inputs(cfg: FitConfig) -> dict[str, str]:
    """The fit's input files (path -> what it is), which its output must never replace."""
    out = {} if cfg.path[:1] == "<" else {cfg.path: "configuration"}
    out[cfg.model_path] = "model file"
    for item in cfg.protocols:
        if Path(item.protocol.source).is_file():
            out[item.protocol.source] = "protocol file"
        if item.recording is not None:
            for f in item.recording.meta.get("files", [item.recording.source]):
                out[str(f)] = "recording"
        if item.targets is not None:
            for f in item.targets.sources:
                out[str(f)] = "targets file"
    return {k: v for k, v in out.items() if Path(k).exists()}


def _objective(cfg: FitConfig) -> Objective:
    return Objective(cfg.scheme, cfg.protocols, backend=cfg.backend, precision=cfg.precision,
                     step=cfg.step, courant=cfg.courant)


def _search(cfg: FitConfig, objective: Objective, store: Any,
            blob: dict[str, np.ndarray] | None,
            show: bool, stream: TextIO | None) -> FitResult:
    wall0 = time.perf_counter()
    progress = Progress(cfg.ga.generations, stream=stream, enabled=show)
    engine = _Engine(cfg, objective, store, progress)
    state = engine.unpack(blob, cfg.output) if blob is not None else None
    state, reason = engine.run(state)
    progress.close()
    hof_g, hof_f = state["hof_genes"], state["hof_fitness"]
    if hof_f.size == 0:
        store.mark_finished(f"{reason}; every candidate failed")
        raise KingenError("every candidate failed to simulate (see the failure codes in the "
                          "run file); check the bounds and the step", file=cfg.output)
    store.write_hall_of_fame(cfg.pmap.to_params(hof_g), hof_f)
    best_genes, best_fit = hof_g[0], float(hof_f[0])
    report = None
    if cfg.polish:
        progress.message(f"polishing the best (fitness {best_fit:.6g}) by least squares ...")
        best_genes, report = polish(objective, cfg, best_genes, best_fit,
                                    cfg.polish_evaluations)
        if report["accepted"]:
            best_fit = report["fitness_after"]
    params = cfg.pmap.to_params(best_genes[None, :])[0]
    ev, _ = objective.evaluate(params[None, :])
    errors = {n: float(e) for n, e in zip(objective.names, ev.errors[0], strict=True)}
    traces, amps = objective.traces(params)
    features = _features(objective, traces)
    store.write_best(params=params, fitness=float(ev.fitness[0]), errors=errors,
                     amplitudes=amps, traces=traces, features=features, polish=report)
    store.mark_finished(reason)
    hist = store.history() if hasattr(store, "history") else {}
    timings = {k: [t[k] for t in engine.timings] for k in engine.timings[0]} if \
        engine.timings else {}
    timings["wall_s"] = time.perf_counter() - wall0
    scheme = cfg.scheme
    lo, hi = to_file_units(scheme, scheme.lower), to_file_units(scheme, scheme.upper)
    return FitResult(
        path=cfg.output, params=params, values=to_file_units(scheme, params),
        units={p.name: p.unit for p in scheme.parameters}, fitness=float(ev.fitness[0]),
        errors=errors, amplitudes=amps, generations=int(state["generation"]), reason=reason,
        history={"best": np.asarray(hist.get("best", [])),
                 "median": np.asarray(hist.get("median", []))},
        polish=report, features=features, timings=timings, free=cfg.pmap.gene_names,
        bounds={n: (lo[n], hi[n]) for n in lo},
        status={p.name: ("derived" if p.derived else "tied" if p.name in cfg.ties else
                         "free" if p.name in cfg.pmap.gene_names else "fixed")
                for p in scheme.parameters},
        evaluations=engine.evaluations, backend=objective.simulator.backend,
        device=objective.simulator.device)


def _features(objective: Objective, traces: dict[str, dict]) -> dict[str, dict]:
    from kingen.features import protocol_features

    out: dict[str, dict] = {}
    for item in objective.items:
        name = item.protocol.name
        tr = traces[name]
        entry: dict[str, dict] = {}
        try:
            entry["fit"] = protocol_features(item.protocol, tr["time_ms"], tr["fit_pA"])
            if tr["data_pA"] is not None:
                entry["data"] = protocol_features(item.protocol, tr["time_ms"], tr["data_pA"])
            elif item.targets is not None:
                entry["data"] = item.targets.values()
        except KingenError:
            pass
        out[name] = entry
    return out


# ---------------------------------------------------------------------- kingen.fit(...)

class _CallableModule(types.ModuleType):
    """This module's class: calling the module calls :func:`fit`.

    ``kingen.fit`` is the public entry point of the search layer, and also the name of this
    module; Python binds ``kingen.fit`` to the module as soon as anything imports it, so the
    module itself is made to behave as the function.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> FitResult:
        return fit(*args, **kwargs)


__signature__ = inspect.signature(fit)
sys.modules[__name__].__class__ = _CallableModule
