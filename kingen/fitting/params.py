"""Genes ↔ rate constants.

A fit searches a box of *genes*, one per free parameter: log10 of the rate for parameters
with ``scale = "log"`` (the default) and the rate itself for ``scale = "linear"``, between the
parameter's bounds. :class:`ParameterMap` turns a batch of genes into full parameter arrays
(internal units, the layout of :class:`~kingen.model.scheme.Scheme`):

- free parameters take their gene;
- fixed parameters keep their value;
- tied parameters are ``factor × (another parameter)`` (``tied = { k_b = "k_a" }`` in the
  fit configuration, or ``{ k_b = { to = "k_a", factor = 2 } }``);
- derived parameters are recomputed by :meth:`Scheme.complete`, so every cycle of the
  scheme stays microscopically reversible exactly, whatever the genes.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from kingen.errors import KingenError
from kingen.model.scheme import Scheme, check_rate_range
from kingen.model.units import parse_rate_unit

_LN10 = math.log(10.0)

# Batches from this many rows are cut into pieces of at least this many rows, computed on
# a pool of threads: at 65,536 candidates the genes-to-rates map took 10 ms of each
# generation on one core of the H100 machine's host, serial work while the GPU waits.
ROWS_PER_PIECE = 8192
_MAX_THREADS = 8
_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _cores() -> int:
    """The cores this process may run on (a batch system's share, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _row_pieces(n: int) -> list[slice]:
    """Row slices of a batch of ``n`` rows, one per thread (one slice below 2 pieces)."""
    k = min(n // ROWS_PER_PIECE, _MAX_THREADS, _cores())
    if k < 2:
        return [slice(0, n)]
    bounds = np.linspace(0, n, k + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _pool() -> ThreadPoolExecutor:
    """This process's pool (a child process made by fork builds its own)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=min(_MAX_THREADS, _cores()),
                                                 thread_name_prefix="kingen-params"))
    return _POOL[1]


@dataclass(frozen=True)
class Tie:
    """``params[target] = factor * params[source]``."""

    target: int
    source: int
    factor: float = 1.0


class ParameterMap:
    """The map between genes and full parameter arrays for one scheme.

    Parameters
    ----------
    scheme
        The scheme with the fit's overrides already applied (values, bounds, scales and
        ``fixed`` flags; see :func:`apply_overrides`).
    ties
        ``{target: (source, factor)}`` by parameter name. A tied parameter is neither free
        nor derived; its source must be free or fixed.
    """

    def __init__(self, scheme: Scheme, ties: dict[str, tuple[str, float]] | None = None
                 ) -> None:
        names = scheme.param_names
        self.scheme = scheme
        self.ties: list[Tie] = []
        tied = set()
        for target, (source, factor) in (ties or {}).items():
            t, s = names.index(target), names.index(source)
            self.ties.append(Tie(t, s, float(factor)))
            tied.add(t)
        self.free_index = np.array([i for i, p in enumerate(scheme.parameters)
                                    if p.free and i not in tied], dtype=np.int64)
        self.log = np.array([scheme.parameters[i].scale == "log" for i in self.free_index],
                            dtype=bool)
        self.base = scheme.values
        lo, hi = scheme.lower[self.free_index], scheme.upper[self.free_index]
        self.lower = np.where(self.log, np.log10(lo), lo)
        self.upper = np.where(self.log, np.log10(hi), hi)

    # ------------------------------------------------------------------ sizes
    @property
    def n_genes(self) -> int:
        """Number of free parameters (genes)."""
        return int(self.free_index.size)

    @property
    def gene_names(self) -> list[str]:
        """Names of the free parameters, in gene order."""
        return [self.scheme.parameters[i].name for i in self.free_index]

    @property
    def free_mask(self) -> np.ndarray:
        """True for the parameters the genes set (length n_params)."""
        mask = np.zeros(self.scheme.n_params, dtype=bool)
        mask[self.free_index] = True
        return mask

    # ------------------------------------------------------------------ maps
    def to_params(self, genes: np.ndarray, *, clip: bool = False, threads: bool = True
                  ) -> np.ndarray:
        """Full parameter arrays (N, n_params), internal units, from genes (N, n_genes).

        Parameters
        ----------
        genes
            (N, n_genes) genes.
        clip
            Clip the genes into the bounds first (as :meth:`clip`); by default genes outside
            the bounds are taken as given.
        threads
            Cut a large batch into pieces computed on a pool of threads (the same result);
            False for work in the background, which must leave the cores to the solver.
        """
        g = np.atleast_2d(np.asarray(genes, dtype=np.float64))
        if g.shape[-1] != self.n_genes:
            raise ValueError(f"genes must have {self.n_genes} columns, got {g.shape}")
        out = np.empty((g.shape[0], self.scheme.n_params))
        pieces = _row_pieces(g.shape[0]) if threads else [slice(0, g.shape[0])]
        if len(pieces) == 1:
            self._fill(g, out, clip)
        else:
            # numpy's loops let go of the GIL: the pieces run at once. Each row is computed
            # alone, so the result is the same, bit for bit, however the rows are cut.
            for done in [_pool().submit(self._fill, g[s], out[s], clip) for s in pieces]:
                done.result()
        return out

    def _fill(self, g: np.ndarray, out: np.ndarray, clip: bool) -> None:
        """:meth:`to_params` of the rows ``g`` into ``out``."""
        out[...] = self.base
        # One temporary of the genes' shape, worked in place: at 65k candidates fresh pages
        # cost as much as the arithmetic.
        values = self.clip(g) if clip else g.copy()
        linear = None if self.log.all() else values[:, ~self.log]
        with np.errstate(all="ignore"):
            # exp(g ln 10): 10**g to 1e-15 relative, at a third of the cost
            np.multiply(values, _LN10, out=values)
            np.exp(values, out=values)
            out[:, self.free_index] = values
            if linear is not None:
                out[:, self.free_index[~self.log]] = linear
            for tie in self.ties:
                out[:, tie.target] = tie.factor * out[:, tie.source]
            self.scheme.complete(out, copy=False)

    def to_genes(self, params: np.ndarray) -> np.ndarray:
        """Genes (N, n_genes) of parameter arrays (N, n_params) (inverse of :meth:`to_params`)."""
        p = np.atleast_2d(np.asarray(params, dtype=np.float64))[:, self.free_index]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.log, np.log10(p), p)

    def clip(self, genes: np.ndarray) -> np.ndarray:
        """Genes clipped into the bounds."""
        return np.clip(genes, self.lower, self.upper)

    def start_genes(self) -> np.ndarray:
        """Genes of the scheme's own values (clipped into the bounds), shape (n_genes,)."""
        return self.clip(self.to_genes(self.base)[0])


def apply_overrides(scheme: Scheme, overrides: dict[str, dict], *, file: str = "<config>"
                    ) -> Scheme:
    """A copy of ``scheme`` with per-parameter overrides from a fit configuration.

    Parameters
    ----------
    scheme
        The scheme as loaded.
    overrides
        ``{name: {"value": v, "bounds": [lo, hi], "fixed": bool, "scale": "log"|"linear"}}``
        with values and bounds in the scheme file's units for that parameter.
    file
        The configuration file, for error messages.

    Raises
    ------
    KingenError
        Unknown parameter, inverted or non-positive bounds, a value outside its bounds, or an
        attempt to free or fix a derived parameter.
    """
    params = list(scheme.parameters)
    names = scheme.param_names
    for name, spec in overrides.items():
        where = f"parameters.{name}"
        if name not in names:
            raise KingenError(f"unknown parameter (parameters are {', '.join(names)})",
                              file=file, field=where, value=name)
        i = names.index(name)
        p = params[i]
        factor = file_unit_factor(p)
        if p.derived and ("fixed" in spec or "value" in spec):
            raise KingenError("is derived (computed for microscopic reversibility); it cannot "
                              "be fixed or given a value", file=file, field=where)
        value, lower, upper = p.value, p.lower, p.upper
        if "bounds" in spec:
            lo, hi = spec["bounds"]
            if lo <= 0 or hi <= 0:
                raise KingenError("bounds must be > 0", file=file, field=f"{where}.bounds",
                                  value=spec["bounds"])
            if lo >= hi:
                raise KingenError("lower bound must be below the upper bound", file=file,
                                  field=f"{where}.bounds", value=spec["bounds"])
            lower, upper = lo * factor, hi * factor
            for k, bound in enumerate((lower, upper) if p.order else ()):
                check_rate_range(bound, p.internal_unit, file=file,
                                 field=f"{where}.bounds[{k}]", value=spec["bounds"][k])
        if "value" in spec:
            if spec["value"] <= 0:
                what = "rate constants" if p.order else "Q10s and activation energies"
                raise KingenError(f"{what} must be > 0", file=file,
                                  field=f"{where}.value", value=spec["value"])
            value = spec["value"] * factor
            if p.order:
                check_rate_range(value, p.internal_unit, file=file, field=f"{where}.value",
                                 value=spec["value"])
        if not p.derived and not (lower * (1 - 1e-12) <= value <= upper * (1 + 1e-12)):
            if "value" in spec or "bounds" not in spec:
                raise KingenError(f"value outside its bounds [{lower / factor:g}, "
                                  f"{upper / factor:g}] {p.unit}", file=file,
                                  field=f"{where}.value", value=value / factor)
            # New bounds that exclude the file's value: start from the nearest bound.
            value = min(max(value, lower), upper)
        params[i] = replace(p, value=value, lower=lower, upper=upper,
                            fixed=bool(spec.get("fixed", p.fixed)),
                            scale=str(spec.get("scale", p.scale)))
    return replace(scheme, parameters=params)


def apply_ties(scheme: Scheme, ties: dict[str, tuple[str, float]]) -> Scheme:
    """A copy of ``scheme`` whose tied parameters take ``factor ×`` their source's value
    and bounds (so that the solver's step plan covers them)."""
    params = list(scheme.parameters)
    names = scheme.param_names
    for target, (source, factor) in ties.items():
        s = params[names.index(source)]
        i = names.index(target)
        params[i] = replace(params[i], value=s.value * factor, lower=s.lower * factor,
                            upper=s.upper * factor)
    return replace(scheme, parameters=params)


def file_unit_factor(p) -> float:
    """Multiplier from the parameter's file unit to internal units (1 for a Q10 or an
    activation energy, which are kept in the file's units)."""
    if p.order == 0:
        return 1.0
    factor, _ = parse_rate_unit(p.unit)
    return factor


def file_factors(scheme: Scheme) -> np.ndarray:
    """Per parameter: the factor from its file unit to the internal unit."""
    return np.array([file_unit_factor(p) for p in scheme.parameters])


def to_file_units(scheme: Scheme, params: np.ndarray) -> dict[str, float]:
    """Parameter values in each parameter's file unit, by name."""
    return {p.name: float(params[i]) / file_unit_factor(p)
            for i, p in enumerate(scheme.parameters)}
