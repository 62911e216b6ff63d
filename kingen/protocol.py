"""Experimental protocols: agonist concentration waveforms, sweeps and sampling grids.

A sweep's concentration is the sum of square pulses (with error-function edges for finite
solution exchange; ideal steps when the 10–90 % times are 0) and synaptic exponential
transients. A protocol is a named list of sweeps. Times are in ms, concentrations in mM,
potentials in mV.

The solvers see a sweep as a list of :class:`Segment` objects: intervals on which the
concentration is constant (solved exactly by a matrix exponential, and by RK4 with constant
rates) or smooth (concentration evaluated at each stage time).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import erf

from kingen import units
from kingen.errors import KingenError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# A Gaussian-CDF edge goes from 10 % to 90 % over 2 * 1.2815516 sigma.
_TEN_NINETY_SIGMAS = 2.0 * 1.2815515655446004
# Edges are truncated at this many sigma, where they differ from 0 or 1 by < 1e-9,
# so that outside them the concentration is exactly constant.
EDGE_HALF_WIDTH_SIGMAS = 6.0
# Synaptic transients are cut to zero once below this fraction of their peak.
TRANSIENT_CUTOFF = 1e-9

STANDARD_RECOVERY_INTERVALS_MS = (5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
STANDARD_DOSES_MM = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
PROTOCOL_KINDS = ("deactivation", "desensitization", "recovery", "dose_response", "train",
                  "custom")


@dataclass(frozen=True)
class Pulse:
    """A square agonist pulse.

    Attributes
    ----------
    start
        Time of the 50 % point of the rising edge, ms.
    duration
        Time from the 50 % point of the rise to the 50 % point of the decay, ms.
    concentration
        Plateau concentration, mM.
    rise, decay
        10–90 % exchange times of the edges, ms; 0 means an ideal step.
    """

    start: float
    duration: float
    concentration: float
    rise: float = 0.0
    decay: float = 0.0

    @property
    def end(self) -> float:
        """Time of the 50 % point of the decay edge, ms."""
        return self.start + self.duration


@dataclass(frozen=True)
class Transient:
    """A synaptic concentration transient: c(t) = peak·(1 − e^{−t/τr})·e^{−t/τd} shape.

    With ``tau_rise`` = 0 the rise is instantaneous and c(t) = peak·exp(−(t−start)/tau_decay).
    With ``tau_rise`` > 0 the curve is normalised so that its maximum equals ``peak``.
    """

    start: float
    peak: float
    tau_decay: float
    tau_rise: float = 0.0

    def _norm(self) -> tuple[float, float]:
        if self.tau_rise <= 0.0:
            return 1.0, math.inf
        td, tr = self.tau_decay, self.tau_rise
        t_peak = td * tr / (td - tr) * math.log(td / tr) if td != tr else td
        value = math.exp(-t_peak / td) - math.exp(-t_peak / tr)
        return 1.0 / value, t_peak

    @property
    def end(self) -> float:
        """Time after which the transient is cut to zero (below 1e-9 of its peak), ms."""
        return self.start + self.tau_decay * -math.log(TRANSIENT_CUTOFF) + 10 * self.tau_rise


@dataclass(frozen=True)
class Segment:
    """An interval of a sweep on which the solver treats the concentration one way.

    ``smooth`` False: the concentration is ``concentration`` throughout.
    ``smooth`` True: the concentration varies and must be evaluated at each time.
    """

    start: float
    end: float
    smooth: bool
    concentration: float = 0.0


@dataclass(frozen=True)
class Sweep:
    """One sweep: a concentration waveform, its sampling grid and its potentials.

    Attributes
    ----------
    label
        Short name, used in CSV column names (``current_pA_<label>``).
    duration
        Length of the sweep, ms; samples run from 0 to ``duration`` inclusive.
    dt
        Sampling interval, ms.
    pulses, transients
        The parts of the concentration waveform (summed).
    holding
        Holding potential, mV.
    reversal
        Reversal potential of the current, mV.
    x
        The independent variable this sweep stands for in its protocol (the interval in
        ms for recovery, the concentration in mM for dose-response), else None.
    """

    label: str
    duration: float
    dt: float
    pulses: tuple[Pulse, ...] = ()
    transients: tuple[Transient, ...] = ()
    holding: float = -60.0
    reversal: float = 0.0
    x: float | None = None

    @property
    def n_samples(self) -> int:
        """Number of samples, including t = 0 and t = duration."""
        # floor, not round: a last sample past ``duration`` would never be solved
        return int(math.floor(self.duration / self.dt + 1e-6)) + 1

    def times(self) -> np.ndarray:
        """Sample times, ms."""
        return np.arange(self.n_samples) * self.dt

    @property
    def driving_force(self) -> float:
        """Holding minus reversal potential, mV."""
        return self.holding - self.reversal

    def concentration(self, t: np.ndarray | float, steps_at: float | None = None,
                      ) -> np.ndarray:
        """Agonist concentration at times ``t`` (ms), mM.

        ``steps_at``: evaluate ideal (zero exchange time) steps at this time instead of
        ``t``. Solvers pass the middle of the piece they integrate, so that an ideal step
        at the piece's end is not seen by the piece's last stage.
        """
        t = np.asarray(t, dtype=float)
        ts = t if steps_at is None else np.full_like(t, steps_at)
        c = np.zeros_like(t)
        for p in self.pulses:
            up = _edge(t - p.start, p.rise) if p.rise > 0 else _edge(ts - p.start, 0.0)
            down = _edge(t - p.end, p.decay) if p.decay > 0 else _edge(ts - p.end, 0.0)
            c = c + p.concentration * up * (1.0 - down)
        for tr in self.transients:
            norm, _ = tr._norm()
            s = t - tr.start
            on = (s >= 0) & (t <= tr.end)
            sp = np.where(on, s, 0.0)
            shape = np.exp(-sp / tr.tau_decay)
            if tr.tau_rise > 0:
                shape = shape - np.exp(-sp / tr.tau_rise)
            c = c + np.where(on, tr.peak * norm * shape, 0.0)
        return c

    def segments(self) -> list[Segment]:
        """Split [0, duration] into constant and smooth segments.

        Breakpoints are every ideal step, the truncation limits of every finite edge and the
        start and cut-off of every transient. Adjacent smooth pieces are merged; a constant
        piece's concentration is evaluated at its midpoint (exact, since it is constant).
        """
        points = {0.0, self.duration}
        # discontinuities: solvers evaluate ideal steps at a segment's midpoint, so a
        # smooth segment must never be merged across one
        jumps: set[float] = set()
        smooth_spans: list[tuple[float, float]] = []
        for p in self.pulses:
            for t0, tau in ((p.start, p.rise), (p.end, p.decay)):
                if tau > 0:
                    half = EDGE_HALF_WIDTH_SIGMAS * tau / _TEN_NINETY_SIGMAS
                    smooth_spans.append((t0 - half, t0 + half))
                else:
                    points.add(t0)
                    jumps.add(t0)
        for tr in self.transients:
            points.add(tr.start)
            jumps.add(tr.start)
            smooth_spans.append((tr.start, tr.end))
        for a, b in smooth_spans:
            points.update((a, b))
        cuts = sorted(t for t in points if 0.0 <= t <= self.duration)
        segments: list[Segment] = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            if b - a <= 1e-12:
                continue
            mid = 0.5 * (a + b)
            smooth = any(lo < mid < hi for lo, hi in smooth_spans)
            conc = 0.0 if smooth else float(self.concentration(mid))
            if segments and segments[-1].smooth and smooth and a not in jumps:
                segments[-1] = replace(segments[-1], end=b)
            elif (segments and not smooth and not segments[-1].smooth
                  and segments[-1].concentration == conc):
                segments[-1] = replace(segments[-1], end=b)
            else:
                segments.append(Segment(a, b, smooth, conc))
        return segments


@dataclass(frozen=True)
class Protocol:
    """A named experiment: one or more sweeps of the same kind.

    ``kind`` says which features describe it: ``deactivation``, ``desensitization``,
    ``recovery``, ``dose_response``, ``train`` or ``custom``.
    """

    name: str
    kind: str
    sweeps: tuple[Sweep, ...]
    source: str = "<built-in>"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def n_sweeps(self) -> int:
        """Number of sweeps."""
        return len(self.sweeps)

    def x_values(self) -> np.ndarray:
        """The sweeps' independent variable (intervals or concentrations), NaN where unset."""
        return np.array([np.nan if s.x is None else s.x for s in self.sweeps])


def _edge(s: np.ndarray, ten_ninety: float) -> np.ndarray:
    """A unit step at s = 0: ideal when ``ten_ninety`` is 0, else a truncated Gaussian CDF."""
    if ten_ninety <= 0:
        return (s >= 0).astype(float)
    sigma = ten_ninety / _TEN_NINETY_SIGMAS
    z = s / sigma
    value = 0.5 * (1.0 + erf(z / math.sqrt(2.0)))
    return np.where(z <= -EDGE_HALF_WIDTH_SIGMAS, 0.0,
                    np.where(z >= EDGE_HALF_WIDTH_SIGMAS, 1.0, value))


# --------------------------------------------------------------------------- standard set

def standard_protocol(
    name: str,
    *,
    exchange: float = 0.0,
    dt: float = 0.02,
    holding: float = -60.0,
    reversal: float = 0.0,
    concentration: float = 10.0,
) -> Protocol:
    """One of the standard AMPA protocols, by name.

    Parameters
    ----------
    name
        ``deactivation`` (1 ms of 10 mM), ``desensitization`` (100 ms of 10 mM), ``recovery``
        (two 100 ms pulses of 10 mM at intervals 5–2000 ms) or ``dose_response`` (100 ms
        pulses from 1 µM to 10 mM).
    exchange
        10–90 % solution-exchange time of every edge, ms (0: ideal steps).
    dt
        Sampling interval, ms.
    holding, reversal
        Holding and reversal potentials, mV.
    concentration
        Agonist concentration of the deactivation, desensitization and recovery pulses, mM.
    """
    if not (math.isfinite(float(dt)) and dt > 0):
        raise KingenError("sampling interval must be > 0 ms", field="dt", value=dt)
    if not (math.isfinite(float(exchange)) and exchange >= 0):
        raise KingenError("exchange time must be >= 0 ms", field="exchange", value=exchange)
    onset = 2.0
    common = dict(dt=dt, holding=holding, reversal=reversal)
    if name == "deactivation":
        sweep = Sweep("1ms", duration=30.0, pulses=(Pulse(onset, 1.0, concentration, exchange,
                                                          exchange),), **common)
        return Protocol(name, "deactivation", (sweep,))
    if name == "desensitization":
        sweep = Sweep("100ms", duration=150.0,
                      pulses=(Pulse(onset, 100.0, concentration, exchange, exchange),), **common)
        return Protocol(name, "desensitization", (sweep,))
    if name == "recovery":
        sweeps = []
        for interval in STANDARD_RECOVERY_INTERVALS_MS:
            first = Pulse(onset, 100.0, concentration, exchange, exchange)
            second = Pulse(first.end + interval, 100.0, concentration, exchange, exchange)
            sweeps.append(Sweep(f"{interval:g}ms", duration=second.end + 20.0,
                                pulses=(first, second), x=interval, **common))
        return Protocol(name, "recovery", tuple(sweeps))
    if name == "dose_response":
        sweeps = [
            Sweep(f"{c:g}mM", duration=120.0, pulses=(Pulse(onset, 100.0, c, exchange,
                                                            exchange),),
                  x=c, **common)
            for c in STANDARD_DOSES_MM
        ]
        return Protocol(name, "dose_response", tuple(sweeps))
    raise KingenError(
        "unknown protocol (standard protocols are deactivation, desensitization, recovery, "
        "dose_response; or give a protocol TOML file)", field="protocol", value=name)


STANDARD_PROTOCOLS = ("deactivation", "desensitization", "recovery", "dose_response")


def standard_set(*, exchange: float = 0.0, dt: float = 0.02) -> list[Protocol]:
    """The four standard AMPA protocols."""
    return [standard_protocol(n, exchange=exchange, dt=dt) for n in STANDARD_PROTOCOLS]


# --------------------------------------------------------------------------- TOML files

def load_protocol(spec: str | Path) -> Protocol:
    """A protocol by standard name or from a TOML file.

    The file format (times in the units of ``[units]``, default ms and mM)::

        [protocol]
        name = "paired"
        kind = "recovery"          # optional, default "custom"
        dt = 0.02                  # sampling interval
        holding = -60              # mV
        reversal = 0               # mV
        exchange = 0.2             # default 10-90 % time of every edge

        [units]
        time = "ms"
        concentration = "mM"

        [[sweeps]]                 # explicit sweeps ...
        label = "a"
        duration = 200
        pulses = [{start = 2, duration = 100, concentration = 10}]
        transients = [{start = 5, peak = 1, tau_decay = 1.2, tau_rise = 0.1}]

        [paired]                   # ... or generated ones: one sweep per interval
        start = 2
        duration = 100
        concentration = 10
        intervals = [5, 10, 20]

        [dose]                     # one sweep per concentration
        start = 2
        duration = 100
        concentrations = [0.01, 0.1, 1, 10]

        [train]                    # one sweep, n pulses at a frequency (Hz)
        start = 2
        duration = 1
        concentration = 10
        n = 10
        frequency = 50

    Raises
    ------
    KingenError
        If the name is unknown, the file is unreadable or malformed, or a field is wrong.
    """
    text_spec = str(spec)
    path = Path(text_spec)
    if text_spec in STANDARD_PROTOCOLS:
        return standard_protocol(text_spec)
    if not path.suffix and not path.exists():
        return standard_protocol(text_spec)
    if not path.is_file():
        raise KingenError("protocol file not found", file=text_spec)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise KingenError(f"malformed TOML: {exc}", file=text_spec) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KingenError(f"cannot read: {exc}", file=text_spec) from None
    return protocol_from_dict(doc, source=text_spec)


def protocol_from_dict(doc: dict[str, Any], *, source: str = "<protocol>") -> Protocol:
    """Build a protocol from a parsed TOML document (see :func:`load_protocol`)."""
    reader = _Reader(source)
    head = reader.table(doc, "protocol", required=False)
    unit_table = reader.table(doc, "units", required=False)
    tf = units.factor("time", unit_table.get("time", "ms"), file=source, field="units.time")
    cf = units.factor("concentration", unit_table.get("concentration", "mM"), file=source,
                      field="units.concentration")
    name = str(head.get("name", Path(source).stem))
    kind = head.get("kind", "custom")
    if kind not in PROTOCOL_KINDS:
        raise KingenError(f"unknown kind (use one of {', '.join(PROTOCOL_KINDS)})", file=source,
                          field="protocol.kind", value=kind)
    dt = reader.positive(head, "dt", 0.02 / tf, "protocol") * tf
    holding = reader.number(head, "holding", -60.0, "protocol")
    reversal = reader.number(head, "reversal", 0.0, "protocol")
    exchange = reader.nonnegative(head, "exchange", 0.0, "protocol") * tf
    common = dict(dt=dt, holding=holding, reversal=reversal)

    sweeps: list[Sweep] = []
    for i, s in enumerate(doc.get("sweeps", [])):
        where = f"sweeps[{i}]"
        if not isinstance(s, dict):
            raise KingenError("must be a table", file=source, field=where)
        pulses = tuple(reader.pulse(p, f"{where}.pulses[{j}]", tf, cf, exchange)
                       for j, p in enumerate(s.get("pulses", [])))
        transients = tuple(reader.transient(p, f"{where}.transients[{j}]", tf, cf)
                           for j, p in enumerate(s.get("transients", [])))
        duration = reader.positive(s, "duration", None, where) * tf
        # x is an interval (time units) for recovery, a concentration for dose_response
        x = None if s.get("x") is None else reader.number(s, "x", None, where) * (
            tf if kind == "recovery" else cf if kind == "dose_response" else 1.0)
        sweeps.append(Sweep(str(s.get("label", i)), duration, pulses=pulses,
                            transients=transients,
                            x=x, **{**common,
                                            "holding": reader.number(s, "holding", holding,
                                                                     where),
                                            "reversal": reader.number(s, "reversal",
                                                                      reversal, where)}))
    if "paired" in doc:
        t = reader.table(doc, "paired")
        base = reader.pulse(t, "paired", tf, cf, exchange)
        intervals = reader.number_list(t, "intervals", "paired")
        tail = reader.nonnegative(t, "tail", 20.0 / tf, "paired") * tf
        for interval in intervals:
            second = replace(base, start=base.end + interval * tf)
            sweeps.append(Sweep(f"{interval:g}", second.end + tail, pulses=(base, second),
                                x=interval * tf, **common))
        kind = head.get("kind", "recovery")
    if "dose" in doc:
        t = reader.table(doc, "dose")
        concs = reader.number_list(t, "concentrations", "dose")
        tail = reader.nonnegative(t, "tail", 20.0 / tf, "dose") * tf
        for c in concs:
            pulse = reader.pulse({**t, "concentration": c}, "dose", tf, cf, exchange)
            sweeps.append(Sweep(f"{c:g}", pulse.end + tail, pulses=(pulse,), x=c * cf,
                                **common))
        kind = head.get("kind", "dose_response")
    if "train" in doc:
        t = reader.table(doc, "train")
        base = reader.pulse(t, "train", tf, cf, exchange)
        n = int(reader.positive(t, "n", None, "train"))
        period = 1000.0 / reader.positive(t, "frequency", None, "train")  # Hz -> ms
        pulses = tuple(replace(base, start=base.start + k * period) for k in range(n))
        tail = reader.nonnegative(t, "tail", 50.0 / tf, "train") * tf
        sweeps.append(Sweep("train", pulses[-1].end + tail, pulses=pulses, **common))
        kind = head.get("kind", "train")
    if not sweeps:
        raise KingenError("no sweeps: give [[sweeps]], [paired], [dose] or [train]",
                          file=source, field="sweeps")
    for i, s in enumerate(sweeps):
        if s.dt > s.duration:
            raise KingenError("sampling interval longer than the sweep", file=source,
                              field=f"sweeps[{i}].duration", value=s.duration)
    return Protocol(name, kind, tuple(sweeps), source=source)


class _Reader:
    """Field readers that name the file and field in their errors."""

    def __init__(self, source: str) -> None:
        self.source = source

    def table(self, doc: dict, key: str, required: bool = True) -> dict:
        value = doc.get(key)
        if value is None:
            if required:
                raise KingenError("missing table", file=self.source, field=key)
            return {}
        if not isinstance(value, dict):
            raise KingenError("must be a table", file=self.source, field=key)
        return value

    def number(self, t: dict, key: str, default: float | None, where: str) -> float:
        value = t.get(key, default)
        if value is None:
            raise KingenError("missing", file=self.source, field=f"{where}.{key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value):
            raise KingenError("must be a finite number", file=self.source,
                              field=f"{where}.{key}", value=value)
        return float(value)

    def positive(self, t: dict, key: str, default: float | None, where: str) -> float:
        value = self.number(t, key, default, where)
        if value <= 0:
            raise KingenError("must be > 0", file=self.source, field=f"{where}.{key}",
                              value=value)
        return value

    def nonnegative(self, t: dict, key: str, default: float | None, where: str) -> float:
        value = self.number(t, key, default, where)
        if value < 0:
            raise KingenError("must be >= 0", file=self.source, field=f"{where}.{key}",
                              value=value)
        return value

    def number_list(self, t: dict, key: str, where: str) -> list[float]:
        values = t.get(key)
        if not isinstance(values, list) or not values:
            raise KingenError("must be a non-empty list of numbers", file=self.source,
                              field=f"{where}.{key}", value=values)
        return [self.positive({key: v}, key, None, where) for v in values]

    def pulse(self, p: dict, where: str, tf: float, cf: float, exchange: float) -> Pulse:
        if not isinstance(p, dict):
            raise KingenError("must be a table", file=self.source, field=where)

        def edge(key: str) -> float:
            # a pulse's own rise/decay, else its exchange, else the protocol's exchange
            name = key if key in p else "exchange"
            if name not in p:
                return exchange
            return self.nonnegative(p, name, None, where) * tf

        return Pulse(
            start=self.nonnegative(p, "start", None, where) * tf,
            duration=self.positive(p, "duration", None, where) * tf,
            concentration=self.nonnegative(p, "concentration", None, where) * cf,
            rise=edge("rise"),
            decay=edge("decay"),
        )

    def transient(self, p: dict, where: str, tf: float, cf: float) -> Transient:
        if not isinstance(p, dict):
            raise KingenError("must be a table", file=self.source, field=where)
        tau_rise = self.nonnegative(p, "tau_rise", 0.0, where) * tf
        tau_decay = self.positive(p, "tau_decay", None, where) * tf
        if tau_rise >= tau_decay:
            raise KingenError("tau_rise must be shorter than tau_decay", file=self.source,
                              field=f"{where}.tau_rise", value=p.get("tau_rise"))
        return Transient(self.nonnegative(p, "start", None, where) * tf,
                         self.positive(p, "peak", None, where) * cf, tau_decay, tau_rise)
