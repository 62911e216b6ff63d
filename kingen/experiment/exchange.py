"""Measured solution exchange: the concentration's time course from an open-tip junction current.

An open patch pipette moved between the two solutions of a fast-perfusion system records a
junction current that follows the exchange. Normalised (baseline 0, plateau 1) it is the
time course of the concentration the patch saw, edges included; an error function is only a
guess at it.

The file is a CSV file (comma-separated, '.' decimal mark, ``#`` comment lines allowed): a
time column ``time_ms`` (or ``time_s``, ``time_us``), strictly increasing, then the junction
current in any unit (it is normalised; its sign does not matter). Two modes:

``template``
    One column holding one pulse: baseline, rise, plateau, fall, baseline. Its rising and
    falling edges replace the edges of every pulse of the protocol, each placed at the
    pulse's 50 % points and scaled to the pulse's concentration.
``sweep``
    One column per sweep (or one column for every sweep), each the whole sweep's junction
    current on the sweep's time base. Each pulse of a sweep takes the edges measured where
    it is (the k-th rise and fall of the waveform go to the sweep's k-th pulse, whose start
    and end move to the measured 50 % points), each normalised to its own plateau.

An edge is the stretch where the normalised current passes from the baseline's noise band
to the plateau's (the band is 4 σ of the baseline noise, at least 2 % of the step). Inside
it the shape is made non-decreasing and stretched to run exactly from 0 to 1; outside it
the concentration is exactly constant, so the solver propagates there as with ideal steps.
Synaptic transients are not exchange and keep their own shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.experiment.protocol import (
    MeasuredEdge,
    Protocol,
    Pulse,
    Sweep,
    ten_ninety_spanning,
)

EXCHANGE_MODES = ("template", "sweep")
# The normalised baseline's noise may be at most this (σ, fraction of the step): beyond it
# the plateau and baseline bands would swallow the edges' feet.
MAX_NOISE = 0.05
# The 10-90 % rise must span at least this many sampling intervals of the file: a coarser
# waveform says nothing about the edge's shape between its samples.
MIN_EDGE_SAMPLES = 2.0
# Samples taken as the baseline at the start of a waveform (at least), and the plateau the
# waveform must hold between its edges, in samples.
_BASELINE_SAMPLES = 5
_MIN_PLATEAU_SAMPLES = 2
_PLATEAU_TOLERANCE = 0.1
_MIN_BAND = 0.02
_NOISE_BANDS = 4.0

__all__ = ["EXCHANGE_MODES", "ExchangeSpec", "MeasuredEdge", "apply_exchange",
           "read_exchange_spec", "restore_exchange"]


@dataclass(frozen=True)
class ExchangeSpec:
    """A measured exchange as declared: the waveform file and how it applies.

    ``value`` is the file as the user wrote it (for messages); ``file`` and ``field`` say
    where it was declared (the configuration or protocol file, and its field).
    """

    path: Path
    mode: str = "template"
    value: str = ""
    file: str | None = None
    field: str = "exchange"

    @property
    def where(self) -> str:
        """The field the file was given in."""
        return f"{self.field}.file" if self.file is not None else self.field


@dataclass
class _Waveform:
    """A column of the file, normalised: baseline 0, step 1, upward."""

    name: str
    t: np.ndarray
    u: np.ndarray
    band: float
    source: str
    noise: float = 0.0
    rises: list[float] = field(default_factory=list)
    falls: list[float] = field(default_factory=list)


def read_exchange_spec(fields: Any, spec: Any, where: str, base: Path) -> ExchangeSpec:
    """The ``exchange = { file = "tip.csv", mode = "template" }`` table of a protocol entry
    or protocol file (``file`` relative to ``base``, the declaring file's folder)."""
    if not isinstance(spec, dict):
        raise fields.error('must be a time (ms) or a table such as { file = "tip.csv", '
                           'mode = "template" }', where, spec)
    fields.keys(spec, ("file", "mode"), where)
    name = fields.string(spec, "file", where, None)
    if name is None:
        raise fields.error("missing: the measured waveform's CSV file", f"{where}.file")
    mode = fields.choice(spec, "mode", EXCHANGE_MODES, where, "template")
    path = Path(name) if Path(name).is_absolute() else base / name
    if not path.is_file():
        raise fields.error("file not found", f"{where}.file", name)
    return ExchangeSpec(path, mode, name, fields.file, where)


def apply_exchange(protocol: Protocol, spec: ExchangeSpec) -> Protocol:
    """The protocol with the measured edges of ``spec`` in place of its pulses' edges.

    Raises
    ------
    KingenError
        One line naming the waveform file, the column and the value, when the file cannot
        be used: wrong length or number of columns, times not increasing, not normalisable
        (flat, no plateau, not back at its baseline, too noisy), sampled too coarsely for
        its edges, edges that do not match the sweep's pulses.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from kingen.experiment.protocol import standard_protocol
    >>> t = np.arange(0.0, 5.0, 0.005)
    >>> edge = lambda s: 0.5 * (1 + np.tanh(s / 0.05))
    >>> y = -300.0 * edge(t - 1.0) * (1 - edge(t - 3.0))  # pA: sign and unit do not matter
    >>> with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    ...     _ = f.write("time_ms,junction_pA\\n" + "".join(f"{a},{b}\\n" for a, b in zip(t, y)))
    >>> p = apply_exchange(standard_protocol("deactivation"), ExchangeSpec(Path(f.name)))
    >>> pulse = p.sweeps[0].pulses[0]
    >>> round(float(p.sweeps[0].concentration(pulse.start)), 3), pulse.rise_shape is not None
    (5.0, True)
    """
    columns = _read_columns(spec)
    if spec.mode == "template":
        if len(columns) != 1:
            raise _error(spec, f"a template holds one pulse: one current column, not "
                               f"{len(columns)}", "header", ",".join(c.name for c in columns))
        wave = columns[0]
        _edges(wave, spec)
        if len(wave.rises) != 1:
            raise _error(spec, f"a template holds one pulse; the waveform has "
                               f"{len(wave.rises)}", wave.name, f"{len(wave.rises)} pulses")
        rise, fall = _shape(wave, wave.rises[0], 1), _shape(wave, wave.falls[0], -1)
        _check_plateau(wave, spec, rise, fall, wave.rises[0],
                       wave.falls[0] - wave.rises[0])
        sweeps = tuple(replace(s, pulses=tuple(_with_shapes(p, rise, fall, s, spec)
                                               for p in s.pulses)) for s in protocol.sweeps)
    else:
        if len(columns) not in (1, protocol.n_sweeps):
            raise _error(spec, f"one current column for every sweep, or one per sweep "
                               f"({protocol.n_sweeps}); the file has {len(columns)}", "header",
                         ",".join(c.name for c in columns))
        sweeps = tuple(_sweep_edges(s, columns[i if len(columns) > 1 else 0], spec)
                       for i, s in enumerate(protocol.sweeps))
    out = replace(protocol, sweeps=sweeps)
    meta = dict(protocol.meta)
    meta["exchange"] = _describe(out, spec)
    return replace(out, meta=meta)


def restore_exchange(protocol: Protocol) -> Protocol:
    """A protocol read back from a run file with its measured edges, as
    :func:`apply_exchange` recorded them in its ``meta``; any other protocol unchanged."""
    info = protocol.meta.get("exchange")
    if not info:
        return protocol
    shapes = [MeasuredEdge(tuple(t), tuple(v)) for t, v in info["shapes"]]
    sweeps = [list(s.pulses) for s in protocol.sweeps]
    for i, j, r, f in info["pulses"]:
        sweeps[i][j] = replace(sweeps[i][j], rise_shape=shapes[r], decay_shape=shapes[f])
    return replace(protocol, sweeps=tuple(replace(s, pulses=tuple(p)) for s, p in
                                          zip(protocol.sweeps, sweeps, strict=True)))


# ----------------------------------------------------------------------------- internals

def _error(spec: ExchangeSpec, message: str, column: str, value: Any) -> KingenError:
    return KingenError(message, file=str(spec.path), field=column, value=value)


def _read_columns(spec: ExchangeSpec) -> list[_Waveform]:
    """The file's current columns, each normalised (see :func:`_normalise`)."""
    from kingen.experiment.recordings.csv import (
        csv_unit_factor,
        parse_csv_column,
        read_csv_table,
        split_column_name,
    )

    table = read_csv_table(spec.path)
    quantity, unit, _ = split_column_name(table.header[0], table.name)
    if quantity != "time" or len(table.header) < 2:
        raise _error(spec, "the first column must be the time (time_ms), then the junction "
                           "current", "header", ",".join(table.header))
    t = parse_csv_column(table, 0, allow_trailing_blank=False,
                      factor=csv_unit_factor(table, table.header[0], "time", unit), unit="ms")
    ys = [parse_csv_column(table, j, allow_trailing_blank=False)
          for j in range(1, len(table.header))]
    if t.size < 4 * _BASELINE_SAMPLES:
        raise _error(spec, f"{t.size} samples: too short for a waveform (at least "
                           f"{4 * _BASELINE_SAMPLES})", table.header[0], t.size)
    steps = np.diff(t)
    if not (steps > 0).all():
        k = int(np.argmin(steps > 0))
        raise _error(spec, "the time must increase from row to row", f"{table.header[0]} row "
                     f"{table.first_row + k + 1}", f"{t[k]:g} then {t[k + 1]:g}")
    return [_normalise(spec, table.header[j + 1], t, y) for j, y in enumerate(ys)]


def _normalise(spec: ExchangeSpec, name: str, t: np.ndarray, y: np.ndarray) -> _Waveform:
    """Baseline (the first samples) to 0, plateau (the median of the samples beyond half
    the largest excursion) to 1; refused when flat, too noisy or not back at the baseline."""
    n0 = max(_BASELINE_SAMPLES, y.size // 25)
    base = float(np.median(y[:n0]))
    dev = y - base
    peak = float(dev[np.argmax(np.abs(dev))])
    noise = float(np.std(y[:n0]))
    if not abs(peak) > 10.0 * noise or peak == 0.0:
        raise _error(spec, "not normalisable: flat (no step above the baseline's noise)",
                     name, f"range {float(y.min()):g} to {float(y.max()):g}")
    s = dev / peak
    plateau = float(np.median(s[s > 0.5]))
    u = s / plateau
    sigma = noise / abs(peak * plateau)
    if sigma > MAX_NOISE:
        raise _error(spec, f"too noisy to normalise: baseline noise {100 * sigma:.1f} % of the "
                           f"step (at most {100 * MAX_NOISE:g} %: average more sweeps)", name,
                     f"{sigma:.3g}")
    band = max(_MIN_BAND, _NOISE_BANDS * sigma)
    end = float(np.median(u[-n0:]))
    if abs(end) > 2 * band:
        raise _error(spec, f"not normalisable: it does not return to its baseline (it ends "
                           f"at {100 * end:.0f} % of the step)", name, f"{float(y[-1]):g}")
    return _Waveform(name, t, u, band, str(spec.path), noise=sigma)


def _edges(wave: _Waveform, spec: ExchangeSpec) -> None:
    """The 50 % crossings of the normalised waveform, rises and falls in turn."""
    wave.rises, wave.falls = [], []
    high = wave.u > 0.5
    flips = np.nonzero(high[1:] != high[:-1])[0]
    t, u = wave.t, wave.u
    for k in flips:
        # the crossing, interpolated between the two samples around it
        at = float(t[k] + (0.5 - u[k]) * (t[k + 1] - t[k]) / (u[k + 1] - u[k]))
        (wave.rises if high[k + 1] else wave.falls).append(at)
    if not wave.rises or len(wave.falls) != len(wave.rises):
        raise _error(spec, "not normalisable: no pulse that rises and falls back (no "
                           "plateau)", wave.name, f"{len(wave.rises)} rises, "
                                                  f"{len(wave.falls)} falls")


def _shape(wave: _Waveform, at: float, sign: int) -> MeasuredEdge:
    """The edge around the crossing at ``at`` as a rising shape from 0 to 1 (a fall as
    1 minus its course), times relative to the crossing."""
    t, u = wave.t, wave.u if sign > 0 else 1.0 - wave.u
    k = int(np.searchsorted(t, at))
    lo = k - 1
    while lo > 0 and u[lo] > wave.band:
        lo -= 1
    hi = k
    while hi < t.size - 1 and u[hi] < 1.0 - wave.band:
        hi += 1
    v = np.maximum.accumulate(u[lo:hi + 1])
    v = (v - v[0]) / (v[-1] - v[0])
    return MeasuredEdge(tuple(float(x) for x in t[lo:hi + 1] - at), tuple(float(x) for x in v))


def _check_plateau(wave: _Waveform, spec: ExchangeSpec, rise: MeasuredEdge,
                   fall: MeasuredEdge, up: float, length: float) -> None:
    """Refuse edges that meet without a flat plateau between them (within 10 % of it, or
    6 σ of the noise), or that are sampled so coarsely that their shape is unknown."""
    for edge, what in ((rise, "rise"), (fall, "fall")):
        dt = float(np.median(np.diff(edge.times))) if len(edge.times) > 1 else math.inf
        if not edge.ten_ninety >= MIN_EDGE_SAMPLES * dt:
            raise _error(spec, f"sampled too coarsely: the {what}'s 10-90 % time "
                               f"({edge.ten_ninety:.3g} ms) spans fewer than "
                               f"{MIN_EDGE_SAMPLES:g} samples of {dt:.3g} ms (sample the "
                               "junction current faster)", wave.name, f"dt {dt:g} ms")
    dt = float(np.median(np.diff(wave.t)))
    a, b = up + rise.hi, up + length + fall.lo
    flat = wave.u[(wave.t >= a) & (wave.t <= b)]
    if (rise.hi - fall.lo + _MIN_PLATEAU_SAMPLES * dt > length or not flat.size
            or np.abs(flat - 1.0).max() > max(_PLATEAU_TOLERANCE, 6.0 * wave.noise)):
        raise _error(spec, "not normalisable: no plateau between the rise and the fall",
                     wave.name, f"pulse of {length:.3g} ms")


def _with_shapes(p: Pulse, rise: MeasuredEdge, fall: MeasuredEdge, sweep: Sweep,
                 spec: ExchangeSpec) -> Pulse:
    """A pulse with measured edges at its 50 % points."""
    if rise.hi - fall.lo > p.duration:
        raise KingenError(f"the measured edges ({rise.hi - fall.lo:.3g} ms from the rise's "
                          "50 % point to the fall's start) are longer than a pulse of sweep "
                          f"'{sweep.label}' ({p.duration:g} ms): measure a shorter pulse",
                          file=spec.file or str(spec.path), field=spec.where, value=spec.value)
    return replace(p, rise=_equivalent(rise), decay=_equivalent(fall), rise_shape=rise,
                   decay_shape=fall)


def _equivalent(edge: MeasuredEdge) -> float:
    """The 10-90 % time of an error-function edge as wide as ``edge`` reaches from its 50 %
    point, so that whatever skips an edge's span (the features' windows) skips this one."""
    return ten_ninety_spanning(max(-edge.lo, edge.hi))


def _sweep_edges(sweep: Sweep, wave: _Waveform, spec: ExchangeSpec) -> Sweep:
    """A sweep whose pulses take the edges of its own waveform, each normalised to its
    pulse's plateau."""
    if wave.t[0] > 1e-9 or wave.t[-1] < sweep.duration - sweep.dt:
        raise _error(spec, f"wrong length: the waveform runs from {wave.t[0]:g} to "
                           f"{wave.t[-1]:g} ms, the sweep '{sweep.label}' from 0 to "
                           f"{sweep.duration:g} ms", wave.name,
                     f"{wave.t.size} samples")
    _edges(wave, spec)
    pulses = sorted(sweep.pulses, key=lambda p: p.start)
    if len(wave.rises) != len(pulses):
        raise _error(spec, f"the waveform has {len(wave.rises)} pulses, sweep '{sweep.label}' "
                           f"{len(pulses)}", wave.name, f"{len(wave.rises)} pulses")
    out = []
    for k, p in enumerate(pulses):
        level = _plateau(wave, wave.rises[k], wave.falls[k])
        local = _Waveform(wave.name, wave.t, wave.u / level, wave.band, wave.source,
                          noise=wave.noise / level)
        # the 50 % points of this pulse's own step, between its neighbours' crossings
        up = _crossing(local, wave.falls[k - 1] if k else -math.inf, wave.falls[k], True)
        down = _crossing(local, up, wave.rises[k + 1] if k + 1 < len(pulses) else math.inf,
                         False)
        rise, fall = _shape(local, up, 1), _shape(local, down, -1)
        _check_plateau(local, spec, rise, fall, up, down - up)
        out.append(replace(p, start=up, duration=down - up, rise=_equivalent(rise),
                           decay=_equivalent(fall), rise_shape=rise, decay_shape=fall))
    return replace(sweep, pulses=tuple(out))


def _crossing(wave: _Waveform, after: float, before: float, rising: bool) -> float:
    """Where the waveform first crosses 0.5 upward (``rising``) or downward in
    (``after``, ``before``), interpolated between samples."""
    t, u = wave.t, wave.u
    high = u > 0.5
    turn = high[1:] & ~high[:-1] if rising else ~high[1:] & high[:-1]
    inside = np.nonzero(turn & (t[1:] > after) & (t[:-1] < before))[0]
    if not inside.size:  # at half its own plateau it is the sweep-wide crossing's
        return after if not rising else before
    i = int(inside[0]) + 1
    return float(t[i - 1] + (0.5 - u[i - 1]) * (t[i] - t[i - 1]) / (u[i] - u[i - 1]))


def _plateau(wave: _Waveform, up: float, down: float) -> float:
    """The median level of the middle half of a pulse (its own normalisation)."""
    a, b = up + 0.25 * (down - up), down - 0.25 * (down - up)
    inside = wave.u[(wave.t >= a) & (wave.t <= b)]
    return float(np.median(inside)) if inside.size else 1.0


def _describe(protocol: Protocol, spec: ExchangeSpec) -> dict[str, Any]:
    """What a run file keeps of the measured edges (JSON: the distinct shapes, and per
    pulse the indices of its two)."""
    shapes: list[MeasuredEdge] = []
    index: dict[MeasuredEdge, int] = {}
    pulses = []
    for i, s in enumerate(protocol.sweeps):
        for j, p in enumerate(s.pulses):
            ids = []
            for edge in (p.rise_shape, p.decay_shape):
                if edge not in index:
                    index[edge] = len(shapes)
                    shapes.append(edge)
                ids.append(index[edge])
            pulses.append([i, j, *ids])
    return {"file": spec.value or str(spec.path), "mode": spec.mode,
            "shapes": [[list(e.times), list(e.values)] for e in shapes], "pulses": pulses}
