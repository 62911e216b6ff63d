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
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numba
import numpy as np

from kingen.errors import KingenError
from kingen.model.scheme import Scheme, check_rate_range
from kingen.model.units import parse_rate_unit

_LN10 = math.log(10.0)

# From this many rows the map runs on all of numba's threads: at 65,536 candidates it is
# serial work of each generation while the GPU waits. Each row is computed alone, so the
# result is the same, bit for bit, however the rows are shared out.
PARALLEL_FROM_ROWS = 8192


def serial_and_parallel(fn: Callable[..., Any], **flags: Any) -> tuple[Any, Any]:
    """``fn`` compiled by numba twice, on the calling thread alone and on numba's threads
    (``parallel=True``), each with ``flags``.

    Numba's cache files a function's compiled code under its module, name and line, never
    under the flags it was compiled with: two dispatchers of one function share one entry,
    and with ``cache=True`` whichever compiled first is loaded for both. The parallel one is
    therefore compiled from a copy of ``fn`` named ``<name>_parallel``.

    Examples
    --------
    >>> serial, parallel = serial_and_parallel(_fill_rows, cache=False)
    >>> parallel.py_func.__qualname__
    '_fill_rows_parallel'
    """
    twin = types.FunctionType(fn.__code__, fn.__globals__, f"{fn.__name__}_parallel",
                              fn.__defaults__, fn.__closure__)
    twin.__qualname__ = f"{fn.__qualname__}_parallel"
    twin.__doc__ = fn.__doc__
    return numba.njit(**flags)(fn), numba.njit(parallel=True, **flags)(twin)


def _fill_rows(g: np.ndarray, clip: bool, lower: np.ndarray, upper: np.ndarray,
               log: np.ndarray, free: np.ndarray, base: np.ndarray, tie_target: np.ndarray,
               tie_source: np.ndarray, tie_factor: np.ndarray, rule_param: np.ndarray,
               rule_const: np.ndarray, term_start: np.ndarray, term_column: np.ndarray,
               term_exponent: np.ndarray, totals: np.ndarray, out: np.ndarray) -> None:
    """Rows of :meth:`ParameterMap.to_params`, each in one pass: the genes (clipped on
    request), 10**gene as exp(gene ln 10) for log genes, the ties in order, then the derived
    rates with :meth:`Scheme.complete`'s arithmetic (the logs of the rates read before any
    rule writes, a log of -inf taken as NaN, the terms summed in column order). Its exp and
    log are the C library's; NumPy's, on hosts with AVX-512, are its own SIMD code, so the
    two may differ in the last place."""
    for i in numba.prange(g.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = base[j]
        for j in range(free.size):
            v = g[i, j]
            if clip:  # np.clip's: NaN stays NaN
                if v < lower[j]:
                    v = lower[j]
                elif v > upper[j]:
                    v = upper[j]
            out[i, free[j]] = math.exp(v * _LN10) if log[j] else v
        for t in range(tie_target.size):
            out[i, tie_target[t]] = tie_factor[t] * out[i, tie_source[t]]
        for r in range(rule_param.size):
            total = rule_const[r]
            for k in range(term_start[r], term_start[r + 1]):
                lg = math.log(out[i, term_column[k]])
                if lg == -math.inf:
                    lg = math.nan
                total += term_exponent[k] * lg
            totals[i, r] = total
        for r in range(rule_param.size):
            out[i, rule_param[r]] = math.exp(totals[i, r])


_ROWS = {"cache": True, "nogil": True, "error_model": "numpy"}
_fill_serial, _fill_parallel = serial_and_parallel(_fill_rows, **_ROWS)


def _void(params: np.ndarray, columns: np.ndarray, low: np.ndarray, high: np.ndarray,
          copy: bool, out: np.ndarray) -> int:
    n = 0
    for i in numba.prange(params.shape[0]):
        inside = True
        for k in range(columns.size):
            v = params[i, columns[k]]
            inside &= v >= low[k] and v <= high[k]  # NaN: outside
        if not inside:
            n += 1
            for j in range(out.shape[1]):
                out[i, j] = math.nan
        elif copy:
            for j in range(out.shape[1]):
                out[i, j] = params[i, j]
    return n


# The objective's guard of every candidate of every generation: the check, the copy and the
# NaN rows in one pass, on numba's threads from PARALLEL_FROM_ROWS rows. As a check, then a
# copy and a masked write on the calling thread, they took 1.3 ms on two threads at 59,000
# rows (45 % of them outside, as in a GA's generation), 0.4 ms so.
_void_serial, _void_parallel = serial_and_parallel(_void, cache=True, nogil=True)


def void_outside(params: np.ndarray, columns: np.ndarray, low: np.ndarray,
                 high: np.ndarray, *, copy: bool = True) -> np.ndarray:
    """``params`` (N, n_params) with every row that has a value of ``columns`` outside
    ``[low, high]`` (NaN counts as outside) set to NaN, in one pass over the rows.

    Parameters
    ----------
    params
        (N, n_params) parameters.
    columns, low, high
        The columns checked and their bounds.
    copy
        Leave ``params`` as it is: the rows go to a new array (``params`` itself is returned
        when no row is outside). False: the rows outside are set to NaN in ``params``, which
        must then be a C-contiguous float64 array.

    Examples
    --------
    >>> p = np.array([[1.0, 5.0], [1.0, np.nan], [1.0, 2.0]])
    >>> void_outside(p, np.array([1]), np.array([1.0]), np.array([4.0])).tolist()
    [[nan, nan], [nan, nan], [1.0, 2.0]]
    >>> q = p[2:]
    >>> void_outside(q, np.array([1]), np.array([1.0]), np.array([4.0])) is q
    True
    """
    p = np.ascontiguousarray(params, dtype=np.float64)
    if not copy and p is not params:
        raise ValueError("copy=False needs a C-contiguous float64 array")
    out = np.empty_like(p) if copy else p
    kernel = _void_parallel if p.shape[0] >= PARALLEL_FROM_ROWS else _void_serial
    n = kernel(p, np.asarray(columns, dtype=np.int64), np.asarray(low, dtype=np.float64),
               np.asarray(high, dtype=np.float64), bool(copy), out)
    return out if n else params


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
        self._kernel_args = self._constants()

    def _constants(self) -> tuple[np.ndarray, ...]:
        """What :func:`_fill_rows` reads besides the genes: bounds, scales, layout, ties and
        the derived rules (the terms of rule r are ``term_start[r]:term_start[r + 1]``)."""
        rules = self.scheme.derived_rules
        columns = [np.flatnonzero(rule.exponents) for rule in rules]
        exponents = [rule.exponents[c] for rule, c in zip(rules, columns, strict=True)]
        start = np.cumsum([0] + [c.size for c in columns]).astype(np.int64)

        def joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        return (np.ascontiguousarray(self.lower, dtype=np.float64),
                np.ascontiguousarray(self.upper, dtype=np.float64), self.log.copy(),
                self.free_index, np.ascontiguousarray(self.base, dtype=np.float64),
                np.array([t.target for t in self.ties], dtype=np.int64),
                np.array([t.source for t in self.ties], dtype=np.int64),
                np.array([t.factor for t in self.ties], dtype=np.float64),
                np.array([rule.param for rule in rules], dtype=np.int64),
                np.array([rule.log_const for rule in rules], dtype=np.float64), start,
                joined(columns, np.int64), joined(exponents, np.float64))

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
            Share a large batch out to numba's threads (the same result); False for work in
            the background, which must leave the cores to the solver.
        """
        g = np.ascontiguousarray(np.atleast_2d(np.asarray(genes, dtype=np.float64)))
        if g.shape[-1] != self.n_genes:
            raise ValueError(f"genes must have {self.n_genes} columns, got {g.shape}")
        out = np.empty((g.shape[0], self.scheme.n_params))
        fill = _fill_parallel if threads and g.shape[0] >= PARALLEL_FROM_ROWS else _fill_serial
        totals = np.empty((g.shape[0], len(self.scheme.derived_rules)))
        fill(g, bool(clip), *self._kernel_args, totals, out)
        return out

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
