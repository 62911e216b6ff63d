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
import unicodedata
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import erf

from kingen.base.files import read_text
from kingen.errors import KingenError
from kingen.model import limits, units
from kingen.model.fields import MISSING, Fields, loads_toml

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
# Beyond these no patch-clamp experiment goes (10 V, 10 M); inside them every current and
# every rate times concentration stays finite.
MAX_POTENTIAL_MV = 1e4
MAX_CONCENTRATION_MM = 1e4


@dataclass(frozen=True)
class MeasuredEdge:
    """A measured exchange edge as a rising shape: 0 up to ``times[0]``, then ``values``
    (non-decreasing, from 0 to 1) linearly between ``times``, 1 from ``times[-1]`` on.

    Times are ms from the edge's 50 % point. A falling edge is stored as 1 minus its course
    (see :mod:`kingen.experiment.exchange`, which reads them from a junction current).

    Examples
    --------
    >>> e = MeasuredEdge((-0.1, 0.0, 0.1), (0.0, 0.5, 1.0))
    >>> e.at(np.array([-1.0, 0.05, 2.0])).tolist(), round(e.ten_ninety, 3)
    ([0.0, 0.75, 1.0], 0.16)
    """

    times: tuple[float, ...]
    values: tuple[float, ...]

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.times, dtype=float), np.asarray(self.values, dtype=float)

    def at(self, s: np.ndarray) -> np.ndarray:
        """The edge's value at ``s`` ms from its 50 % point."""
        t, v = self._arrays
        return np.interp(s, t, v, left=0.0, right=1.0)

    @property
    def lo(self) -> float:
        """Where the edge leaves 0, ms from its 50 % point (≤ 0)."""
        return self.times[0]

    @property
    def hi(self) -> float:
        """Where the edge reaches 1, ms from its 50 % point (≥ 0)."""
        return self.times[-1]

    @property
    def ten_ninety(self) -> float:
        """Its 10-90 % time, ms."""
        t, v = self._arrays
        return float(np.interp(0.9, v, t) - np.interp(0.1, v, t))


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
        10–90 % exchange times of the edges, ms; 0 means an ideal step. With a measured
        edge, the 10–90 % time of an error-function edge that spans as long.
    rise_shape, decay_shape
        Measured edges (:mod:`kingen.experiment.exchange`) in place of error functions;
        None: error functions (or ideal steps).
    """

    start: float
    duration: float
    concentration: float
    rise: float = 0.0
    decay: float = 0.0
    rise_shape: MeasuredEdge | None = None
    decay_shape: MeasuredEdge | None = None

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
        a, t_peak = self._rise()
        value = math.exp(-t_peak / self.tau_decay) * -math.expm1(-a * t_peak)
        return 1.0 / value, t_peak

    def _rise(self) -> tuple[float, float]:
        """(1/τr − 1/τd, time of the peak), computed from τd − τr, which floats hold
        exactly where τr and τd are close (they are within a factor 2 of each other)."""
        td, tr = self.tau_decay, self.tau_rise
        delta = (td - tr) / tr  # > 0: the protocol reader refuses tau_rise >= tau_decay
        return delta / td, td * math.log1p(delta) / delta

    def shape(self, s: np.ndarray | float) -> np.ndarray:
        """c(t) / peak at ``s`` = t − start >= 0 ms.

        e^{−s/τd} − e^{−s/τr} is a difference of nearly equal numbers when τr is close to
        τd: computed so, its rounding is a noise a millionth of the peak, which stalled the
        stiff solver of ``kingen simulate`` (past 60 s). It is written e^{−s/τd}·(−expm1(−a
        s)) with a = 1/τr − 1/τd, exact to rounding, whose limit as τr → τd is the alpha
        function (s/τ)·e^{1 − s/τ}.

        Examples
        --------
        >>> tr = Transient(start=0.0, peak=1.0, tau_decay=1.0, tau_rise=1.0 - 1e-12)
        >>> s = np.array([0.5, 1.0, 3.0])
        >>> bool(np.allclose(tr.shape(s), s * np.exp(1 - s), rtol=1e-11, atol=0))
        True
        """
        s = np.asarray(s, dtype=float)
        if self.tau_rise <= 0.0:
            return np.exp(-s / self.tau_decay)
        a, t_peak = self._rise()
        return np.exp(-(s - t_peak) / self.tau_decay) * (np.expm1(-a * s)
                                                         / math.expm1(-a * t_peak))

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
            up = _pulse_edge(t, ts, p.start, p.rise, p.rise_shape)
            down = _pulse_edge(t, ts, p.end, p.decay, p.decay_shape)
            c = c + p.concentration * up * (1.0 - down)
        for tr in self.transients:
            s = t - tr.start
            on = (s >= 0) & (t <= tr.end)
            c = c + np.where(on, tr.peak * tr.shape(np.where(on, s, 0.0)), 0.0)
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
            for t0, tau, shape in ((p.start, p.rise, p.rise_shape),
                                   (p.end, p.decay, p.decay_shape)):
                if shape is not None:
                    smooth_spans.append((t0 + shape.lo, t0 + shape.hi))
                elif tau > 0:
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


def _pulse_edge(t: np.ndarray, ts: np.ndarray, t0: float, ten_ninety: float,
                shape: MeasuredEdge | None) -> np.ndarray:
    """A pulse's edge at ``t0``: measured, an error function, or an ideal step (taken at
    ``ts``: see :meth:`Sweep.concentration`)."""
    if shape is not None:
        return shape.at(t - t0)
    if ten_ninety > 0:
        return _edge(t - t0, ten_ninety)
    return _edge(ts - t0, 0.0)


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
    force: bool = False,
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
    force
        Lift the limits of :mod:`kingen.model.limits` (samples per sweep).

    Examples
    --------
    >>> import kingen
    >>> p = kingen.standard_protocol("recovery", exchange=0.2)
    >>> p.n_sweeps, p.sweeps[0].label, p.sweeps[-1].label
    (9, '5ms', '2000ms')
    """
    protocol = _standard_protocol(name, exchange=exchange, dt=dt, holding=holding,
                                  reversal=reversal, concentration=concentration)
    check_size(protocol, file=None, field="dt", value=dt, force=force)
    return protocol


def _standard_protocol(name: str, *, exchange: float, dt: float, holding: float,
                       reversal: float, concentration: float) -> Protocol:
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

def load_protocol(spec: str | Path, *, force: bool = False) -> Protocol:
    """A protocol by standard name or from a TOML file.

    The file format (times in the units of ``[units]``, default ms and mM)::

        [protocol]
        name = "paired"
        kind = "recovery"          # optional, default "custom"
        dt = 0.02                  # sampling interval
        holding = -60              # mV
        reversal = 0               # mV
        exchange = 0.2             # default 10-90 % time of every edge, or a measured
                                   # waveform: { file = "tip.csv", mode = "template" }

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

    ``force`` lifts the limits of :mod:`kingen.model.limits` (samples and pulses per sweep).

    Raises
    ------
    KingenError
        If the name is unknown, the file is unreadable or malformed, a field is wrong, or
        the protocol is larger than the limits.

    Examples
    --------
    >>> import kingen
    >>> p = kingen.load_protocol("data/recovery.toml")
    >>> p.kind, p.n_sweeps, [s.label for s in p.sweeps][:3]
    ('recovery', 5, ['5ms', '15ms', '40ms'])
    >>> kingen.load_protocol("deactivation").sweeps[0].label
    '1ms'
    """
    text_spec = str(spec)
    path = Path(text_spec)
    if text_spec in STANDARD_PROTOCOLS:
        return standard_protocol(text_spec, force=force)
    if not path.suffix and not path.exists():
        return standard_protocol(text_spec, force=force)
    text = read_text(text_spec, what="protocol file")
    return protocol_from_dict(loads_toml(text, text_spec), source=text_spec, force=force)


def check_size(protocol: Protocol, *, file: str | None, field: str | None = None,
               value: Any = None, force: bool = False) -> None:
    """Refuse a protocol whose sweeps need more samples than :mod:`kingen.model.limits` allows,
    before any sample array is made."""
    limits.check(protocol.n_sweeps, limits.MAX_SWEEPS, "sweeps", force=force, file=file,
                 field="sweeps", hint="split the protocol (kingen.model.limits.MAX_SWEEPS)")
    for i, s in enumerate(protocol.sweeps):
        samples = s.duration / s.dt + 1.0  # a float: an int of it may be astronomically big
        limits.check(samples, limits.MAX_SAMPLES_PER_SWEEP, "samples in one sweep",
                     force=force, file=file, field=field or f"sweeps[{i}]",
                     value=value if field else None,
                     hint=f"sweep '{s.label}' lasts {s.duration:g} ms sampled every "
                          f"{s.dt:g} ms: raise dt or shorten the sweep "
                          "(kingen.model.limits.MAX_SAMPLES_PER_SWEEP)")


_PULSE_KEYS = ("start", "duration", "concentration", "rise", "decay", "exchange")
_KEYS = {
    "": ("protocol", "units", "sweeps", "paired", "dose", "train"),
    "protocol": ("name", "kind", "dt", "holding", "reversal", "exchange", "description"),
    "units": ("time", "concentration"),
    "sweep": ("label", "duration", "pulses", "transients", "holding", "reversal", "x",
              "description"),
    "pulse": _PULSE_KEYS,
    "transient": ("start", "peak", "tau_decay", "tau_rise"),
    "paired": _PULSE_KEYS + ("intervals", "tail"),
    "dose": ("start", "duration", "rise", "decay", "exchange", "concentrations", "tail"),
    "train": _PULSE_KEYS + ("n", "frequency", "tail"),
}


def protocol_from_dict(doc: dict[str, Any], *, source: str = "<protocol>",
                       force: bool = False) -> Protocol:
    """Build a protocol from a parsed TOML document (see :func:`load_protocol`)."""
    r = _Reader(source, force)
    f = r.f
    f.keys(doc, _KEYS[""], "")
    head = f.table(doc, "protocol")
    f.keys(head, _KEYS["protocol"], "protocol")
    unit_table = f.table(doc, "units")
    f.keys(unit_table, _KEYS["units"], "units")
    r.tf = tf = units.factor("time", f.string(unit_table, "time", "units", "ms"),
                             file=source, field="units.time")
    r.cf = cf = units.factor("concentration",
                             f.string(unit_table, "concentration", "units", "mM"),
                             file=source, field="units.concentration")
    name = f.string(head, "name", "protocol", Path(source).stem)
    kind = f.choice(head, "kind", PROTOCOL_KINDS, "protocol", "custom")
    dt = r.time(head, "dt", "protocol", 0.02 / tf, gt=0.0)
    holding = r.potential(head, "holding", "protocol", -60.0)
    reversal = r.potential(head, "reversal", "protocol", 0.0)
    measured = None
    if isinstance(head.get("exchange"), dict):  # a measured waveform, applied at the end
        from kingen.experiment.exchange import read_exchange_spec

        measured = read_exchange_spec(f, head["exchange"], "protocol.exchange",
                                      Path(source).parent)
    else:
        r.exchange = r.time(head, "exchange", "protocol", 0.0, ge=0.0)
    common = dict(dt=dt, holding=holding, reversal=reversal)

    sweeps: list[Sweep] = []
    origins: list[_Origin] = []  # where each sweep's label comes from, for the error
    for i, s in enumerate(f.array(doc, "sweeps", tables=True)):
        where = f"sweeps[{i}]"
        f.keys(s, _KEYS["sweep"], where)
        pulses = tuple(r.pulse(p, f"{where}.pulses[{j}]")
                       for j, p in enumerate(r.items(s, "pulses", where)))
        transients = tuple(r.transient(p, f"{where}.transients[{j}]")
                           for j, p in enumerate(r.items(s, "transients", where)))
        duration = r.time(s, "duration", where, gt=0.0)
        # x is an interval (time units) for recovery, a concentration for dose_response
        x = None if s.get("x") is None else f.number(
            s, "x", where, factor=tf if kind == "recovery" else
            cf if kind == "dose_response" else 1.0)
        label = s.get("label", i)
        if isinstance(label, (dict, list)):
            raise f.error("must be a string", f"{where}.label", label)
        label = str(label)
        if not label.strip() or any(unicodedata.category(ch) in ("Cc", "Zl", "Zp")
                                    for ch in label):
            # a label names a CSV column and an NWB series: a blank one reads back as
            # another sweep's, a line break splits the CSV header (a no-break space, as in a
            # pasted "10 µM", is fine)
            raise f.error("must be a non-empty label without control characters (tabs, line "
                          "breaks)", f"{where}.label", label)
        origins.append(_Origin(f"{where}.label" if "label" in s else where,
                               label if "label" in s else None, "sweep"))
        sweeps.append(Sweep(label, duration, pulses=pulses, transients=transients, x=x,
                            **{**common,
                               "holding": r.potential(s, "holding", where, holding),
                               "reversal": r.potential(s, "reversal", where, reversal)}))
    if "paired" in doc:
        t = f.table(doc, "paired")
        f.keys(t, _KEYS["paired"], "paired")
        base = r.pulse(t, "paired")
        intervals = f.numbers(t, "intervals", "paired", gt=0.0, factor=tf, unit="ms")
        limits.check(len(intervals), limits.MAX_SWEEPS, "sweeps", force=force, file=source,
                     field="paired.intervals")
        tail = r.time(t, "tail", "paired", 20.0 / tf, ge=0.0)
        labels = _number_labels(t["intervals"])
        for k, interval in enumerate(intervals):
            second = replace(base, start=base.end + interval)
            origins.append(_Origin(f"paired.intervals[{k}]", t["intervals"][k], "paired"))
            sweeps.append(Sweep(labels[k], second.end + tail,
                                pulses=(base, second), x=interval, **common))
        kind = f.choice(head, "kind", PROTOCOL_KINDS, "protocol", "recovery")
    if "dose" in doc:
        t = f.table(doc, "dose")
        f.keys(t, _KEYS["dose"], "dose")
        f.numbers(t, "concentrations", "dose", gt=0.0, factor=cf, unit="mM")
        limits.check(len(t["concentrations"]), limits.MAX_SWEEPS, "sweeps", force=force,
                     file=source, field="dose.concentrations")
        tail = r.time(t, "tail", "dose", 20.0 / tf, ge=0.0)
        labels = _number_labels(t["concentrations"])
        for k, c in enumerate(t["concentrations"]):
            pulse = r.pulse({**t, "concentration": c}, "dose",
                            concentration_field=f"dose.concentrations[{k}]")
            origins.append(_Origin(f"dose.concentrations[{k}]", c, "dose"))
            sweeps.append(Sweep(labels[k], pulse.end + tail, pulses=(pulse,),
                                x=pulse.concentration, **common))
        kind = f.choice(head, "kind", PROTOCOL_KINDS, "protocol", "dose_response")
    if "train" in doc:
        t = f.table(doc, "train")
        f.keys(t, _KEYS["train"], "train")
        base = r.pulse(t, "train")
        n = f.integer(t, "n", "train", ge=1)
        # before a tuple of n pulses is made
        limits.check(n, limits.MAX_PULSES_PER_SWEEP, "pulses in one sweep", force=force,
                     file=source, field="train.n", value=n,
                     hint="fewer pulses (kingen.model.limits.MAX_PULSES_PER_SWEEP)")
        period = 1000.0 / f.number(t, "frequency", "train", gt=0.0)  # Hz -> ms
        last = base.start + (n - 1) * period
        if not math.isfinite(last + base.duration):
            raise f.error("the train lasts longer than any float can count in ms",
                          "train.frequency", t["frequency"])
        pulses = tuple(replace(base, start=base.start + k * period) for k in range(n))
        tail = r.time(t, "tail", "train", 50.0 / tf, ge=0.0)
        origins.append(_Origin("train", None, "train"))
        sweeps.append(Sweep("train", pulses[-1].end + tail, pulses=pulses, **common))
        kind = f.choice(head, "kind", PROTOCOL_KINDS, "protocol", "train")
    if not sweeps:
        raise KingenError("no sweeps: give [[sweeps]], [paired], [dose] or [train]",
                          file=source, field="sweeps")
    _check_labels(sweeps, origins, source)
    for i, s in enumerate(sweeps):
        if not math.isfinite(s.duration):
            raise KingenError("the sweep lasts longer than any float can count in ms "
                              "(its pulses end too late)", file=source, field=f"sweeps[{i}]")
        if s.dt > s.duration:
            raise KingenError("sampling interval longer than the sweep", file=source,
                              field=f"sweeps[{i}].duration", value=s.duration)
    protocol = Protocol(str(name), kind, tuple(sweeps), source=source)
    check_size(protocol, file=source, force=force)
    if measured is not None:
        from kingen.experiment.exchange import apply_exchange

        protocol = apply_exchange(protocol, measured)
    return protocol


@dataclass(frozen=True)
class _Origin:
    """Where a sweep's label comes from: the field, its value in the file (None for a
    default label) and the part of the file (``sweep``, ``paired``, ``dose``, ``train``)."""

    field: str
    value: Any
    part: str


def _number_labels(values: list[Any]) -> list[str]:
    """The labels of a generated series: each interval or concentration as written, to 6
    significant digits (``f"{v:g}"``, the labels recordings already carry); in full only
    where that would give two different numbers one label (5.0000001 and 5.0000002 both
    print as '5'); and a value listed again (a control dose repeated at the end) labelled
    ``<value>_2``, ``_3``, ... (:func:`distinct_labels`)."""
    short = [f"{v:g}" for v in values]
    numbers: dict[str, set[float]] = {}
    for text, v in zip(short, values, strict=True):
        numbers.setdefault(text, set()).add(float(v))
    return distinct_labels([repr(float(v)).removesuffix(".0") if len(numbers[text]) > 1
                            else text for text, v in zip(short, values, strict=True)])


def distinct_labels(labels: list[str]) -> list[str]:
    """``labels`` with each repeat renamed ``<label>_2``, ``_3``, ... (a name no other sweep
    has), so that every sweep gets a CSV column and NWB series of its own (a generated
    series that lists a value twice; an export of a run made before labels had to differ).

    Parameters
    ----------
    labels
        Sweep labels in protocol order.

    Returns
    -------
    list of str
        The same labels where they are distinct; otherwise the first of each is kept.

    Examples
    --------
    >>> from kingen.experiment.protocol import distinct_labels
    >>> distinct_labels(["1", "3", "1", "1_2"])
    ['1', '3', '1_3', '1_2']
    """
    taken = set(labels)
    seen: set[str] = set()
    out = []
    for label in labels:
        new, n = label, 1
        # a new name must not be another sweep's own label, even one still to come
        while new in seen or (n > 1 and new in taken):
            n += 1
            new = f"{label}_{n}"
        seen.add(new)
        out.append(new)
    return out


def _check_labels(sweeps: list[Sweep], origins: list[_Origin], source: str) -> None:
    """Refuse two sweeps with one label: a label names the sweep's CSV column and NWB
    series, and pairs a recorded sweep with its protocol sweep, so a repeat would write a
    CSV no reader takes and could fit one sweep's data to another."""
    seen: dict[str, _Origin] = {}
    for sweep, here in zip(sweeps, origins, strict=True):
        first = seen.setdefault(sweep.label, here)
        if first is here:
            continue
        named = [o for o in (here, first) if o.part == "sweep"]
        if named:
            field = named[0].field.removesuffix(".label")
            hint = (f"give {field} another label" if named[0].value is not None else
                    f"give {field} a label (it is labelled by its index)")
        else:
            hint = ("[paired] and [dose] sweeps are labelled by their numbers alone: put "
                    "the two series in protocols of their own")
        earlier = first.field if first.value is not None or first.part != "sweep" else \
            f"{first.field}, labelled by its index"
        raise KingenError(f"duplicate sweep label {sweep.label!r} (also that of "
                          f"{earlier}); every sweep needs its own label, which names its "
                          f"CSV column and NWB series: {hint}", file=source,
                          field=here.field, value=here.value)


class _Reader:
    """Protocol fields in internal units, read with :class:`kingen.model.fields.Fields`."""

    def __init__(self, source: str, force: bool = False) -> None:
        self.source = source
        self.force = force
        self.f = Fields(source)
        self.tf = 1.0  # file time unit -> ms
        self.cf = 1.0  # file concentration unit -> mM
        self.exchange = 0.0  # the protocol's default edge, ms

    def time(self, t: dict, key: str, where: str, default: Any = None, **limits: Any
             ) -> float:
        """A time, ms (``default`` in file units; None: required)."""
        return self.f.number(t, key, where, MISSING if default is None else default,
                             factor=self.tf, unit="ms", **limits)

    def potential(self, t: dict, key: str, where: str, default: float) -> float:
        """A potential, mV."""
        return self.f.number(t, key, where, default, ge=-MAX_POTENTIAL_MV,
                             le=MAX_POTENTIAL_MV)

    def concentration(self, t: dict, key: str, where: str, *, gt: float | None = None,
                      ge: float | None = None, field: str | None = None) -> float:
        """A concentration, mM, at most :data:`MAX_CONCENTRATION_MM`."""
        value = self.f.number(t, key, where, gt=gt, ge=ge, factor=self.cf, unit="mM")
        if value > MAX_CONCENTRATION_MM:
            raise self.f.error(f"more than {MAX_CONCENTRATION_MM:g} mM once converted: not "
                               "a solution", field or f"{where}.{key}", t[key])
        return value

    def items(self, s: dict, key: str, where: str) -> list:
        """The pulses or transients of a sweep, at most the limit's number."""
        value = self.f.array(s, key, where, tables=True)
        limits.check(len(value), limits.MAX_PULSES_PER_SWEEP, f"{key} in one sweep",
                     force=self.force, file=self.source, field=f"{where}.{key}",
                     hint="fewer pulses (kingen.model.limits.MAX_PULSES_PER_SWEEP)")
        return value

    def pulse(self, p: dict, where: str, concentration_field: str | None = None) -> Pulse:
        if not isinstance(p, dict):
            raise self.f.error("must be a table", where, p)
        if where.startswith("sweeps"):
            self.f.keys(p, _KEYS["pulse"], where)

        def edge(key: str) -> float:
            # a pulse's own rise/decay, else its exchange, else the protocol's exchange
            name = key if key in p else "exchange"
            if name not in p:
                return self.exchange
            return self.time(p, name, where, ge=0.0)

        return Pulse(
            start=self.time(p, "start", where, ge=0.0),
            duration=self.time(p, "duration", where, gt=0.0),
            concentration=self.concentration(p, "concentration", where, ge=0.0,
                                             field=concentration_field),
            rise=edge("rise"),
            decay=edge("decay"),
        )

    def transient(self, p: dict, where: str) -> Transient:
        if not isinstance(p, dict):
            raise self.f.error("must be a table", where, p)
        self.f.keys(p, _KEYS["transient"], where)
        tau_rise = self.time(p, "tau_rise", where, 0.0, ge=0.0)
        tau_decay = self.time(p, "tau_decay", where, gt=0.0)
        if tau_rise >= tau_decay:
            raise self.f.error("tau_rise must be shorter than tau_decay", f"{where}.tau_rise",
                               p.get("tau_rise"))
        return Transient(self.time(p, "start", where, ge=0.0), self.concentration(
            p, "peak", where, gt=0.0), tau_decay, tau_rise)
