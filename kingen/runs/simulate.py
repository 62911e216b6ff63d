"""One-shot simulation of a scheme under a protocol: :func:`simulate`.

This is what ``kingen simulate`` and a notebook call to see a model's currents: one
parameter set, every sweep of one protocol, with the exact reference solver (matrix
exponential per constant segment, SciPy for smooth waveforms) or the fitting solver
(batched RK4 on the CPU or GPU, :func:`kingen.solve.simulate_batch`). The GA never comes
here: it scores whole populations inside the solver (:class:`kingen.fitting.objective.Objective`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.experiment.chain import Filter, check_filter, parse_filter
from kingen.experiment.protocol import Protocol, load_protocol
from kingen.model import limits
from kingen.model.scheme import Scheme
from kingen.model.temperature import scheme_at_temperature

SOLVERS = ("exact", "rk4")


@dataclass
class Simulation:
    """The currents of one scheme under one protocol.

    Attributes
    ----------
    scheme, protocol
        What was simulated.
    times
        Sample times of each sweep, ms.
    currents
        Current of each sweep, pA (negative is inward).
    engine
        Which solver made them, in words (``"exact reference"``, ``"rk4 on cpu (...)"``).
    filter
        The recording filter the currents went through (a
        :class:`~kingen.experiment.chain.Filter`), or None.
    unfiltered
        With a filter, the currents before it, pA (None without one).
    """

    scheme: Scheme
    protocol: Protocol
    times: list[np.ndarray]
    currents: list[np.ndarray]
    engine: str
    filter: Filter | None = None
    unfiltered: list[np.ndarray] | None = None

    def concentrations(self) -> list[np.ndarray]:
        """Agonist concentration of each sweep at its sample times, mM."""
        return [s.concentration(t) for s, t in zip(self.protocol.sweeps, self.times)]

    def features(self) -> dict[str, Any]:
        """Peak, time constants, EC50... of the currents
        (:func:`kingen.experiment.features.protocol_features`)."""
        from kingen.experiment.features import protocol_features

        return protocol_features(self.protocol, self.times, self.currents)

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write the currents as a trace CSV
        (:func:`kingen.experiment.recordings.write_current_csv`)."""
        from kingen.experiment.recordings import write_current_csv

        path = Path(path)
        write_current_csv(path, self.protocol, self.times, self.currents)
        return path

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Draw the currents (and the concentration) into an image file (PNG, PDF, SVG);
        with a filter, the unfiltered currents beside them, lighter."""
        from kingen.outputs.plot import plot_traces

        title = f"{self.scheme.name}: {self.protocol.name}"
        if self.filter is not None:
            title += f" ({self.filter.label})"
        return plot_traces(self.times, self.currents, [s.label for s in self.protocol.sweeps],
                           title, Path(path), concentration_mM=self.concentrations(),
                           unfiltered_pA=self.unfiltered)


def simulate(scheme: Scheme | str | os.PathLike[str], protocol: Protocol | str | os.PathLike[str],
             *, solver: str = "exact", backend: str = "auto", precision: str = "float64",
             step: float | None = None, force: bool = False,
             filter: Filter | str | None = None, temperature: float | None = None
             ) -> Simulation:
    """Simulate every sweep of a protocol with the scheme's own parameter values.

    Parameters
    ----------
    scheme
        A :class:`~kingen.model.scheme.Scheme` or a scheme file.
    protocol
        A :class:`~kingen.experiment.protocol.Protocol`, a standard protocol's name
        (``deactivation``, ``desensitization``, ``recovery``, ``dose_response``) or a
        protocol file (see :func:`kingen.experiment.protocol.load_protocol`).
    solver
        ``"exact"`` (the reference: matrix exponential / SciPy) or ``"rk4"`` (the fitting
        solver).
    backend, precision, step
        For ``rk4``: where it runs (``auto``, ``cpu``, ``cuda``), ``float64`` or
        ``float32``, and a fixed step in ms (default: chosen from the rates).
    force
        Lift the size limits of :mod:`kingen.model.limits` (states, samples, RK4 steps).
    filter
        A recording filter the currents pass through, as a rig's amplifier would filter
        them: a :class:`~kingen.experiment.chain.Filter` or its one-line form
        (``"bessel:8:5"``: kind, poles, cutoff in kHz; or a response CSV file, see
        :func:`kingen.experiment.chain.parse_filter`). The filter starts at rest on each
        sweep's first sample, as in a fit.
    temperature
        °C: the rates at this temperature, by the scheme's Q10s or activation energies
        (its ``[temperature]`` table, :mod:`kingen.model.temperature`); default: the
        parameters' own values (the reference temperature).

    Returns
    -------
    Simulation
        Times (ms) and currents (pA) per sweep.

    Raises
    ------
    KingenError
        If a file is bad, the work is beyond the limits, the solver fails, or the current
        is not finite (naming the sweep and the time).

    Examples
    --------
    >>> import kingen
    >>> scheme = kingen.Scheme.load("models/jonas_1993.toml")
    >>> sim = kingen.simulate(scheme, kingen.standard_protocol("deactivation", dt=0.05))
    >>> sim.engine
    'exact reference'
    >>> len(sim.currents) == len(sim.times) == 1
    True
    >>> bool(sim.currents[0].min() < 0)  # an inward current at -60 mV
    True
    >>> slow = kingen.simulate(scheme, kingen.standard_protocol("deactivation", dt=0.05),
    ...                        filter="bessel:8:1")
    >>> bool(abs(slow.currents[0]).max() < abs(slow.unfiltered[0]).max())  # a lower peak
    True
    """
    if not isinstance(scheme, Scheme):
        scheme = Scheme.load(scheme, force=force)
    if not isinstance(protocol, Protocol):
        protocol = load_protocol(protocol, force=force)
    if temperature is not None:
        scheme = scheme_at_temperature(scheme, temperature)
    if solver not in SOLVERS:
        raise KingenError(f"unknown solver (use {' or '.join(SOLVERS)})", field="solver",
                          value=solver)
    if isinstance(filter, str):
        filter = parse_filter(filter, field="filter")
    if filter is not None:
        check_filter(filter, [s.dt for s in protocol.sweeps], file=None, field="filter",
                     value=filter.label)
    _check_memory(scheme, protocol, force)
    if solver == "exact":
        if step is not None:
            raise KingenError("applies to solver = 'rk4'", field="step", value=step)
        _check_exact_rates(scheme, protocol, force)
        times, currents, engine = _exact(scheme, protocol)
    else:
        _check_rk4_work(scheme, protocol, step, force)
        times, currents, engine = _rk4(scheme, protocol, backend, precision, step)
    _check_finite(scheme, protocol, times, currents)
    if filter is None:
        return Simulation(scheme, protocol, times, currents, engine)
    # the rig filters the channels' current: the same sections as a fit's kernels run
    filtered = [filter.apply(y, s.dt) for s, y in zip(protocol.sweeps, currents, strict=True)]
    return Simulation(scheme, protocol, times, filtered, engine, filter, currents)


def _exact(scheme: Scheme, protocol: Protocol) -> tuple[list[np.ndarray], list[np.ndarray], str]:
    from kingen.solve import simulate_exact

    try:
        trace = simulate_exact(scheme, protocol)
    except (RuntimeError, ValueError, FloatingPointError, np.linalg.LinAlgError) as exc:
        # SciPy's integrators and expm give up on absurdly stiff rates as raw errors
        raise KingenError(f"the exact solver failed ({type(exc).__name__}: {exc}); the "
                          f"rates or concentrations are too extreme for it, or try "
                          f"solver = 'rk4'", file=scheme.path,
                          field=f"protocol {protocol.name}") from None
    return [s.time for s in trace.sweeps], trace.currents, "exact reference"


def _check_exact_rates(scheme: Scheme, protocol: Protocol, force: bool) -> None:
    """Refuse rates too fast for the exact reference to resolve beside the slow ones (its
    answer there would be wrong, not an error)."""
    peak, state, at = 0.0, 0, 0.0
    for sweep in protocol.sweeps:
        for seg in sweep.segments():
            c = seg.concentration if not seg.smooth else float(
                sweep.concentration(np.linspace(seg.start, seg.end, 257)).max())
            exits = scheme.exit_rates(scheme.values, c)
            if exits.max() > peak:
                peak, state, at = float(exits.max()), int(exits.argmax()), c
    if force or peak <= limits.MAX_EXACT_RATE:
        return
    rates = scheme.rates(scheme.values, at)
    out = [m for m, t in enumerate(scheme.transitions) if t.source == state]
    fastest = scheme.transitions[max(out, key=lambda m: rates[m])]
    raise KingenError(
        f"state {scheme.states[state]} is left at {peak:.3g} /ms (at {at:g} mM; fastest "
        f"{scheme.states[fastest.source]} -> {scheme.states[fastest.target]}, parameter "
        f"{scheme.param_names[fastest.param]}); the exact solver resolves rates up to "
        f"{limits.MAX_EXACT_RATE:g} /ms beside slow ones, and no channel's kinetics come "
        "near it: check the parameters' values and units (kingen.model.limits.MAX_EXACT_RATE), or "
        "set force = True to try anyway", file=scheme.path, field=f"protocol {protocol.name}")


def _rk4(scheme: Scheme, protocol: Protocol, backend: str, precision: str,
         step: float | None) -> tuple[list[np.ndarray], list[np.ndarray], str]:
    from kingen.solve import simulate_batch
    from kingen.solve.options import SolverOptions

    result = simulate_batch(scheme, protocol, scheme.values[None, :], "traces",
                            options=SolverOptions(backend=backend, precision=precision, step=step))
    if result.fail.any():
        from kingen.codegen import FAILURE_NAMES

        code = int(result.fail.max())
        raise KingenError(f"rk4 failed on this scheme ({FAILURE_NAMES[code]}); try a smaller "
                          f"step or solver = 'exact'", file=scheme.path)
    times = [s.times() for s in protocol.sweeps]
    currents = [result.sweep_trace(0, k) * scheme.channels for k in range(protocol.n_sweeps)]
    return times, currents, f"rk4 on {result.backend} ({result.device}, {precision})"


def _check_rk4_work(scheme: Scheme, protocol: Protocol, step: float | None, force: bool
                    ) -> None:
    """Refuse an RK4 solve whose steps exceed the limit, before it starts."""
    from kingen.fitting.config import estimate_rk4_steps

    if step is not None and not (math.isfinite(step) and step > 0):
        raise KingenError("must be a finite number > 0 (ms)", field="step", value=step)
    steps = estimate_rk4_steps(scheme, list(protocol.sweeps), step=step)
    limits.check(steps, limits.MAX_STEPS_PER_CANDIDATE, "RK4 steps", force=force,
                 field="step" if step is not None else None, value=step,
                 hint="a larger step, a larger dt or shorter sweeps "
                      "(kingen.model.limits.MAX_STEPS_PER_CANDIDATE)")


def trace_bytes(scheme: Scheme, protocol: Protocol) -> float:
    """Bytes the traces of a simulation hold: at every sample the occupancy of each state,
    the time, the current and the concentration, as float64 (a float: an int of it may be
    astronomically big).

    Examples
    --------
    >>> import kingen
    >>> scheme = kingen.Scheme.load("models/jonas_1993.toml")
    >>> protocol = kingen.standard_protocol("deactivation", dt=0.05)
    >>> trace_bytes(scheme, protocol) == (protocol.sweeps[0].duration / 0.05 + 1) * 10 * 8
    True
    """
    samples = sum(s.duration / s.dt + 1.0 for s in protocol.sweeps)
    return samples * (scheme.n_states + 3) * 8.0


def _check_memory(scheme: Scheme, protocol: Protocol, force: bool) -> None:
    """Refuse a simulation whose traces would not fit in memory, before any is made (a
    dose protocol of 100,000 sweeps asked NumPy for 12 GiB, sweep after sweep)."""
    samples = sum(s.duration / s.dt + 1.0 for s in protocol.sweeps)
    in_file = Path(protocol.source).is_file()
    limits.check_memory(
        trace_bytes(scheme, protocol), f"the traces of {limits.count_text(protocol.n_sweeps)} "
        f"sweeps ({limits.count_text(samples)} samples)", force=force,
        file=protocol.source if in_file else None,
        field="sweeps" if in_file else f"protocol {protocol.name}",
        hint="fewer or shorter sweeps, or a larger dt")


def _check_finite(scheme: Scheme, protocol: Protocol, times: list[np.ndarray],
                  currents: list[np.ndarray]) -> None:
    """A current that overflowed is named here, not passed on as NaN features."""
    for sweep, t, y in zip(protocol.sweeps, times, currents):
        bad = ~np.isfinite(np.asarray(y, dtype=float))
        if bad.any():
            k = int(np.argmax(bad))
            raise KingenError(f"the simulated current is not finite from t = {t[k]:g} ms on "
                              f"(sweep '{sweep.label}'): the rates, conductances or "
                              f"potentials are too large to simulate", file=scheme.path,
                              field=f"protocol {protocol.name}")


__all__ = ["SOLVERS", "Simulation", "simulate"]
