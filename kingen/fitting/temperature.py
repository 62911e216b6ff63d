"""Protocols at several temperatures: each simulated with its own rates.

A protocol entry of a fit configuration may give the temperature of its recording
(``temperature = 34``, °C); it is kept in the protocol's ``meta`` (``temperature_c``), so
the run file carries it and a resumed or profiled run finds it again. A protocol without
one is at the scheme's reference temperature.

The scheme's parameters hold at its reference temperature (:mod:`kingen.model.temperature`).
:func:`simulator_for` gives the objective one solver per temperature: the protocols at one
temperature are simulated together, with every candidate's rates taken to that
temperature by its own Q10s, and the results are put back in the protocols' order. With
one temperature (or a scheme without ``[temperature]``) it is the plain
:class:`~kingen.solve.batch.Simulator`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.experiment.protocol import Protocol
from kingen.experiment.recordings import Recording
from kingen.model.scheme import Scheme
from kingen.model.temperature import at_temperature, check_celsius, max_factor
from kingen.solve.batch import BatchResult, ObjectiveInputs, Simulator
from kingen.solve.options import SolverOptions
from kingen.solve.schedule import protocol_sweeps

META_KEY = "temperature_c"


def protocol_temperature(protocol: Protocol) -> float | None:
    """The temperature (°C) a protocol was recorded at, or None (the scheme's reference).

    >>> from kingen.experiment.protocol import standard_protocol
    >>> p = standard_protocol("deactivation")
    >>> protocol_temperature(p) is None
    True
    >>> protocol_temperature(with_temperature(p, {"temperature": 34}, "protocols[0]", "f"))
    34.0
    """
    value = protocol.meta.get(META_KEY)
    return None if value is None else float(value)


def with_temperature(protocol: Protocol, entry: dict[str, Any], where: str, file: str,
                     recording: Recording | None = None) -> Protocol:
    """``protocol`` with the temperature of its configuration entry (``temperature``), else
    that of its recording (``meta["temperature_c"]``, where its format carries one);
    unchanged when neither gives one."""
    value = entry.get("temperature")
    field, source = f"{where}.temperature", file
    if value is None and recording is not None:
        value = recording.meta.get(META_KEY)
        field, source = "temperature", recording.source
    if value is None:
        return protocol
    celsius = check_celsius(value, file=source, field=field)
    return replace(protocol, meta={**protocol.meta, META_KEY: celsius})


def check_temperatures(scheme: Scheme, protocols: list[Protocol], file: str) -> None:
    """Refuse protocols at different temperatures for a scheme whose rates do not depend
    on temperature: one set of rates cannot be right at both."""
    temps = sorted({t for t in map(protocol_temperature, protocols) if t is not None})
    if len(temps) > 1 and scheme.temperature is None:
        raise KingenError(
            f"the protocols are at {', '.join(f'{t:g}' for t in temps)} °C but the scheme "
            f"has no [temperature] table: give its rates Q10s (see the "
            "documentation's 'Temperature' how-to)", file=file, field="protocols.temperature",
            value=temps[-1])


def temperature_groups(scheme: Scheme, protocols: list[Protocol]) -> dict[float, list[int]]:
    """The protocols (indices) at each temperature, a protocol without one at the scheme's
    reference; ``{}`` when the scheme's rates do not depend on temperature."""
    if scheme.temperature is None:
        return {}
    out: dict[float, list[int]] = {}
    for i, p in enumerate(protocols):
        t = protocol_temperature(p)
        out.setdefault(scheme.temperature.reference_c if t is None else t, []).append(i)
    return out


def simulator_for(scheme: Scheme, protocols: list[Protocol],
                  options: SolverOptions | None = None, *, rates_of: Scheme | None = None,
                  objective: ObjectiveInputs | None = None, filters: list | None = None) -> Any:
    """The solver of ``protocols``: a :class:`Simulator`, or a :class:`TemperatureSimulator`
    when the protocols are at temperatures other than the scheme's reference.

    ``rates_of`` is the scheme whose derived rules take derived rates to a temperature
    (the objective's solver scheme has its derived rates as plain parameters).
    """
    rates_of = rates_of or scheme
    groups = temperature_groups(rates_of, protocols)
    reference = None if rates_of.temperature is None else rates_of.temperature.reference_c
    if not groups or list(groups) == [reference]:
        return Simulator(scheme, protocols, options, objective=objective, filters=filters)
    return TemperatureSimulator(scheme, protocols, groups, options, rates_of=rates_of,
                                objective=objective, filters=filters)


@dataclass
class _Grid:
    """The sample grid of all the protocols together (what callers read of a schedule)."""

    sample_start: np.ndarray

    @property
    def n_samples(self) -> int:
        return int(self.sample_start[-1])


@dataclass
class _Part:
    """One temperature's solver and where its sweeps and samples sit in the whole."""

    celsius: float
    simulator: Simulator
    sweeps: np.ndarray
    samples: np.ndarray


class TemperatureSimulator:
    """One :class:`Simulator` per temperature, run as one: the same ``run`` and results.

    Examples
    --------
    >>> import numpy as np
    >>> from kingen.experiment.protocol import standard_protocol
    >>> from kingen.model.scheme import Scheme
    >>> s = Scheme.loads(open("models/jonas_1993.toml").read() +
    ...     '\\n[temperature]\\nreference_c = 22\\n[temperature.all]\\n'
    ...     'rates = ["k01", "k10"]\\nq10 = 3.0\\n')
    >>> cold = standard_protocol("deactivation")
    >>> warm = with_temperature(cold, {"temperature": 32}, "p", "f")
    >>> sim = simulator_for(s, [replace(cold, name="c"), replace(warm, name="w")],
    ...                     SolverOptions(backend="cpu"))
    >>> type(sim).__name__, sim.n_sweeps
    ('TemperatureSimulator', 2)
    >>> res = sim.run(s.values[None], "traces")
    >>> bool(np.abs(res.sweep_trace(0, 1)).max() > np.abs(res.sweep_trace(0, 0)).max())
    True
    """

    def __init__(self, scheme: Scheme, protocols: list[Protocol],
                 groups: dict[float, list[int]], options: SolverOptions | None = None, *,
                 rates_of: Scheme, objective: ObjectiveInputs | None = None,
                 filters: list | None = None) -> None:
        sweeps, spans = protocol_sweeps(protocols)
        start = np.concatenate([[0], np.cumsum([s.n_samples for s in sweeps])]).astype(np.int64)
        self.scheme = scheme
        self.rates_of = rates_of
        self.schedule = _Grid(start)
        self.parts: list[_Part] = []
        for celsius, members in groups.items():
            sweep_idx = np.concatenate([np.arange(*spans[i]) for i in members]).astype(np.int64)
            sample_idx = np.concatenate([np.arange(start[k], start[k + 1]) for k in sweep_idx])
            inputs = None if objective is None else ObjectiveInputs(
                objective.data[sample_idx], objective.weight[sample_idx],
                objective.windows[sweep_idx], objective.sum_g)
            sim = Simulator(self._stepped(celsius), [protocols[i] for i in members], options,
                            objective=inputs,
                            filters=None if filters is None else [filters[i] for i in members])
            self.parts.append(_Part(celsius, sim, sweep_idx, sample_idx))
        first = self.parts[0].simulator
        self.backend, self.device, self.precision = first.backend, first.device, first.precision
        self.options = first.options

    def _stepped(self, celsius: float) -> Scheme:
        """The scheme with its bounds taken to ``celsius``: the solver's steps are chosen
        for the fastest rates a candidate in bounds has there."""
        factor = max_factor(self.rates_of, celsius)
        params = [p if p.order == 0 else replace(p, upper=p.upper * factor[k],
                                                 value=p.value * factor[k],
                                                 lower=p.lower * factor[k])
                  for k, p in enumerate(self.scheme.parameters)]
        return replace(self.scheme, parameters=params)

    @property
    def n_sweeps(self) -> int:
        """Sweeps in the batch."""
        return int(self.schedule.sample_start.size - 1)

    @property
    def n_sections(self) -> int:
        """Second-order sections of the longest filter (0: no filter)."""
        return max(part.simulator.n_sections for part in self.parts)

    def run(self, params: np.ndarray, mode: str = "objective", *,
            while_solving: Any = None, **kwargs: Any) -> BatchResult:
        """:meth:`Simulator.run` of every temperature, each with its own rates; the results
        in the protocols' order."""
        p = np.atleast_2d(np.asarray(params, dtype=np.float64))
        results = []
        for k, part in enumerate(self.parts):
            rates = at_temperature(self.rates_of, p, part.celsius)
            results.append(part.simulator.run(rates, mode, while_solving=(
                while_solving if k == 0 else None), **kwargs))
        return self._merge(results, p.shape[0])

    def _merge(self, results: list[BatchResult], n: int) -> BatchResult:
        first = results[0]
        out = BatchResult(first.backend, first.device, first.precision, self.schedule,
                          np.zeros((n, self.n_sweeps), dtype=first.fail.dtype))
        for name in ("sgg", "sgd", "sg", "windows", "traces", "occupancy"):
            parts = [getattr(r, name) for r in results]
            if any(x is None for x in parts):
                continue
            axis = "samples" if name in ("traces", "occupancy") else "sweeps"
            size = self.schedule.n_samples if axis == "samples" else self.n_sweeps
            shape = (n, size) + np.broadcast_shapes(parts[0].shape)[2:]
            whole = np.zeros(shape, dtype=parts[0].dtype)
            for part, x in zip(self.parts, parts, strict=True):
                whole[:, getattr(part, axis)] = x
            setattr(out, name, whole)
        for part, r in zip(self.parts, results, strict=True):
            out.fail[:, part.sweeps] = r.fail
            for key, value in r.timings.items():
                out.timings[key] = out.timings.get(key, 0.0) + value
        return out
