"""What a fit gives back: :class:`FitResult`.

Examples
--------
>>> import numpy as np
>>> r = FitResult(path="run.h5", params=np.array([4.2]), values={"k1": 4.2},
...               units={"k1": "ms^-1"}, fitness=0.0123, errors={"deactivation": 0.0123},
...               amplitudes={"deactivation": 120.0}, generations=40,
...               reason="maximum generations (40)", history={}, polish=None,
...               features={}, timings={}, evaluations=20480, backend="cpu", device="2 cores")
>>> print(r.summary().splitlines()[0])
kingen fit: 40 generations, 20480 candidates on cpu (2 cores); stopped: maximum generations (40)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


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
    converged, convergence
        Whether the search converged (it stopped on stagnation or at the target error, not
        at a maximum), and the summary line that says so with the reason (also in the run
        file's ``/run/finished``; see :func:`kingen.fitting.engine.verdict`).
    history
        ``best`` and ``median`` fitness per generation.
    polish
        ``{"fitness_before", "fitness_after", "evaluations", "accepted", "message"}`` or None.
    features
        ``{protocol: {"fit": {...}, "data": {...}}}`` (see
        :func:`kingen.experiment.features.protocol_features`).
    timings
        Per-generation timings (lists of seconds: ``solver_s``, ``kernel_s``,
        ``objective_s`` (of which ``params_s``: genes to rate constants), ``ga_s`` (of which
        ``ga_variation_s``, ``ga_hof_s``, ``ga_select_s``, ``ga_stats_s``), ``io_s``,
        ``total_s``, and in a sharded fit ``dask_*``; NaN where a generation has no such
        part) and ``wall_s``.
    uncertainty
        Local uncertainty at the best (standard errors, correlations, noise model and its
        ``table`` of intervals; see :func:`kingen.identify.local.local_at_best`), or None.
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
    uncertainty: dict[str, Any] | None = None
    converged: bool | None = None
    convergence: str = ""

    def summary(self) -> str:
        """A plain-text summary: parameters with units, error per protocol, features."""
        lines = [f"kingen fit: {self.generations} generations, {self.evaluations} candidates "
                 f"on {self.backend} ({self.device}); stopped: {self.reason}",
                 f"best fitness {self.fitness:.6g}  (run file {self.path})"]
        if self.convergence:
            lines.insert(1, self.convergence)
        p = self.polish or {}
        if "chi2_after" in p and p.get("starts"):
            lines.append(f"refinement: χ² {p['chi2_before']:.6g} -> {p['chi2_after']:.6g} "
                         f"({p['starts']} starts, {p['evaluations']} evaluations; stopped on "
                         f"its {p['stopped']})")
        elif "fitness_before" in p:  # a run written before the fit minimised the likelihood
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
        lines.extend(self._uncertainty_lines())
        return "\n".join(lines)

    def _uncertainty_lines(self) -> list[str]:
        u = self.uncertainty
        if not u or not u.get("table"):
            return []
        from kingen.identify.table import strong_correlations, table

        out = ["", table(u["table"], float(u.get("level", 0.95)), what="local (Fisher)"),
               "(standard errors at the best, a quadratic approximation: `kingen profile "
               f"{self.path}` gives profile-likelihood intervals)"]
        out += [f"strongly correlated: {p}" for p in strong_correlations(u)]
        out += [f"note: {n}" for n in (u.get("noise") or {}).get("notes", [])]
        return out
