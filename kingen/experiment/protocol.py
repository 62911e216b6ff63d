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
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import erf

from kingen.base.files import read_text
from kingen.errors import KingenError
from kingen.model import limits
from kingen.model.fields import loads_toml

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


def ten_ninety_spanning(half_width: float) -> float:
    """The 10–90 % time (ms) of an error-function edge that reaches ``half_width`` ms from
    its 50 % point before it is cut to a constant.

    >>> round(ten_ninety_spanning(EDGE_HALF_WIDTH_SIGMAS * 0.1 / _TEN_NINETY_SIGMAS), 12)
    0.1
    """
    return half_width * _TEN_NINETY_SIGMAS / EDGE_HALF_WIDTH_SIGMAS


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
    from kingen.experiment.protocol_file import protocol_from_dict

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
