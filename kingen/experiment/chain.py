"""The recording chain: what a rig does to the channels' current before it reaches the file.

A recording is not the channels' current. The amplifier's low-pass filter (an analog Bessel
or Butterworth filter, typically 4 or 8 poles at 2-10 kHz) shapes every fast edge before
the digitizer samples it; the baseline carries a DC offset; the number of channels runs
down from sweep to sweep. :class:`Chain` says what a protocol's recording went through, and
the fit passes the model's current through the same chain before comparing it
(:mod:`kingen.fitting.objective`). The chain belongs to the recording, not to the scheme: exports
carry the unfiltered model.

The filter
----------
Declared by its analog prototype (``kind``, ``poles``, ``cutoff_khz``: the -3 dB frequency
that amplifier settings give; Bessel with ``norm="mag"``), or measured
(:func:`read_response`). The analog filter is discretised at the sweep's sampling interval
T by the *first-order hold* (:func:`design_sos`): the exact output, at the sample times,
of the analog filter driven by an input that is linear between samples. An amplifier
followed by a digitizer samples the analog filter's output of a current that is smooth on
the scale of T, which the straight line between samples follows to O(T²·g''). The bilinear
transform (Tustin), the other usual choice, maps the frequency axis non-linearly
(tan(ωT/2)) and its step response is not the sampled analog one. For an 8-pole Bessel
filter and a current that rises with τ = 0.1 ms and decays with 2 ms, against the analog
filter's output computed on a 50× finer grid, the largest error is, of the peak: 0.27 %
(first-order hold) against 1.7 % (bilinear) and 2.0 % (bilinear pre-warped to the cutoff)
at 5 kHz sampled at 50 kHz; 1.1 % against 3.8 % and 2.6 % at 2 kHz sampled at 20 kHz.
Seen as a frequency response, the hold multiplies the analog filter's by the straight
line's own low-pass, about sinc²(f·T): at 5 kHz sampled at 50 kHz the discrete gain is
0.684 where the analog filter's is 0.707 (a sine there is not linear between samples);
channel currents carry their power well below the cutoff, where the errors above hold.
The discrete filter runs as second-order sections (``scipy.signal.sosfilt``'s
form: b0 b1 b2 1 a1 a2 per section, transposed direct form II) inside the solver's kernel,
two state values per section per (candidate, sweep).

The filter's state at a sweep's first sample is the steady state for that sample's
current (``scipy.signal.sosfilt_zi`` scaled by it): the recording started long before the
sweep, at the resting current, and the filter had settled on it.

Offset and amplitude
--------------------
``offset`` adds a constant to the model current (none, one per sweep, or one per
protocol); ``amplitude`` scales it (one number of channels per protocol, one per sweep, or
a linear rundown A_k = A·(1 + ρ·k) over the sweeps k = 0, 1, ...). Both are solved in
closed form by linear least squares for every candidate
(:func:`kingen.fitting.objective.solve_scales`);
each counts as a fitted parameter in AIC and BIC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.model.fields import Fields, join

FILTER_KINDS = ("bessel", "butterworth")
MIN_POLES, MAX_POLES = 2, 8
OFFSETS = ("none", "per-sweep", "per-protocol")
AMPLITUDES = ("per-protocol", "per-sweep", "rundown")
# A measured response longer than this is a filter no amplifier has at its own sampling
# rate (the step response of an 8-pole Bessel at a tenth of the sampling rate is within
# 1e-4 of its final value after 16 samples), or a noisy tail that would be fitted as filter.
MAX_RESPONSE_SAMPLES = 64
RESPONSE_KINDS = ("step", "impulse")
# Values per section the kernel reads: b0, b1, b2, a1, a2 and the initial state's two
# values for a unit input (sosfilt_zi).
SECTION_VALUES = 7
# The discrete filter's impulse response must equal the measured one to this (relative to
# its largest tap), or the response is refused.
_FIR_TOLERANCE = 1e-9
_FILTER_KEYS = ("kind", "poles", "cutoff_khz", "response")


@dataclass(frozen=True)
class Filter:
    """A recording's low-pass filter: an analog prototype or a measured response.

    Attributes
    ----------
    kind
        ``bessel``, ``butterworth`` or ``response`` (measured).
    poles, cutoff_khz
        The analog prototype's order and -3 dB frequency, kHz.
    impulse
        A measured filter's impulse response, one tap per sample, summing to 1.
    response_dt
        The sampling interval the response was measured at, ms.
    source
        The file the response was read from (as the configuration names it), and whether
        it held a ``step`` or an ``impulse`` response (``measured``).

    Examples
    --------
    >>> f = Filter("bessel", poles=8, cutoff_khz=5.0)
    >>> f.label
    '8-pole Bessel, 5 kHz'
    >>> f.sections(0.02).shape  # four second-order sections at 50 kHz
    (4, 7)
    """

    kind: str
    poles: int = 0
    cutoff_khz: float = 0.0
    impulse: tuple[float, ...] = ()
    response_dt: float = 0.0
    source: str = ""
    measured: str = ""

    @property
    def label(self) -> str:
        """The filter in words."""
        if self.kind == "response":
            return f"measured {self.measured} response ({Path(self.source).name})"
        return f"{self.poles}-pole {self.kind.capitalize()}, {self.cutoff_khz:g} kHz"

    def sos(self, dt: float) -> np.ndarray:
        """The discrete filter at sampling interval ``dt`` (ms) as second-order sections,
        (n_sections, 6) rows b0 b1 b2 1 a1 a2 (``scipy.signal.sosfilt``'s layout)."""
        if self.kind == "response":
            if not math.isclose(dt, self.response_dt, rel_tol=1e-6):
                raise KingenError(f"the response was measured every {self.response_dt:g} ms, "
                                  f"the sweeps are sampled every {dt:g} ms", file=self.source,
                                  field="time")
            return fir_sos(self.impulse)
        return design_sos(self.kind, self.poles, self.cutoff_khz, dt)

    def sections(self, dt: float) -> np.ndarray:
        """What the kernel reads per section (n_sections, 7): b0, b1, b2, a1, a2, then the
        initial state for a unit input (``scipy.signal.sosfilt_zi``)."""
        from scipy import signal

        sos = self.sos(dt)
        return np.column_stack([sos[:, [0, 1, 2, 4, 5]], signal.sosfilt_zi(sos)])

    def apply(self, current: np.ndarray, dt: float) -> np.ndarray:
        """``current`` (one sweep, or (N, samples)) filtered along its last axis, from the
        steady state for its first sample, as the kernel filters the model current.

        >>> y = Filter("butterworth", 4, 2.0).apply(np.r_[np.zeros(5), np.ones(95)], 0.05)
        >>> float(y[0]), round(float(y[-1]), 6)
        (0.0, 1.0)
        """
        from scipy import signal

        x = np.atleast_2d(np.asarray(current, dtype=np.float64))
        sos = self.sos(dt)
        zi = signal.sosfilt_zi(sos)[:, None, :] * x[None, :, :1]
        y, _ = signal.sosfilt(sos, x, axis=-1, zi=zi)
        return y.reshape(np.shape(current))

    def to_dict(self) -> dict[str, Any]:
        """The filter as JSON-able values (the run file's record of it)."""
        if self.kind == "response":
            return {"kind": "response", "measured": self.measured, "source": self.source,
                    "dt_ms": self.response_dt, "impulse": list(self.impulse)}
        return {"kind": self.kind, "poles": self.poles, "cutoff_khz": self.cutoff_khz}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Filter:
        """The filter :meth:`to_dict` wrote."""
        if d["kind"] == "response":
            return cls("response", impulse=tuple(float(x) for x in d["impulse"]),
                       response_dt=float(d["dt_ms"]), source=str(d["source"]),
                       measured=str(d["measured"]))
        return cls(str(d["kind"]), int(d["poles"]), float(d["cutoff_khz"]))


@dataclass(frozen=True)
class Chain:
    """A recording's chain: its filter, offset and amplitude (see the module docstring).

    Examples
    --------
    >>> chain = Chain(Filter("bessel", 4, 2.0), offset="per-sweep", amplitude="rundown")
    >>> chain.scale_parameters(n_sweeps=5)   # A and ρ, and 5 offsets
    7
    >>> Chain.from_dict(chain.to_dict()) == chain
    True
    >>> Chain().plain
    True
    """

    filter: Filter | None = None
    offset: str = "none"
    amplitude: str = "per-protocol"

    @property
    def plain(self) -> bool:
        """No filter, no offset, one amplitude: the model current as it is."""
        return self.filter is None and self.offset == "none" and self.amplitude == AMPLITUDES[0]

    def scale_parameters(self, n_sweeps: int, fixed_amplitude: bool = False) -> int:
        """Amplitudes and offsets fitted to a recording of ``n_sweeps`` sweeps (for AIC and
        BIC); none for the amplitude when the configuration fixes it."""
        amps = 0 if fixed_amplitude else {"per-protocol": 1, "per-sweep": n_sweeps,
                                          "rundown": 2}[self.amplitude]
        offsets = {"none": 0, "per-protocol": 1, "per-sweep": n_sweeps}[self.offset]
        return amps + offsets

    def to_dict(self) -> dict[str, Any]:
        """JSON-able values (the run file's record of the chain)."""
        return {"filter": None if self.filter is None else self.filter.to_dict(),
                "offset": self.offset, "amplitude": self.amplitude}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Chain:
        """The chain :meth:`to_dict` wrote; ``None`` (a run file older than chains) is the
        plain chain."""
        if not d:
            return cls()
        f = d.get("filter")
        return cls(None if f is None else Filter.from_dict(f), str(d.get("offset", "none")),
                   str(d.get("amplitude", AMPLITUDES[0])))


# ------------------------------------------------------------------------------- design

def design_sos(kind: str, poles: int, cutoff_khz: float, dt: float) -> np.ndarray:
    """An analog low-pass prototype discretised at ``dt`` (ms) by the first-order hold, as
    second-order sections (see the module docstring for why this discretisation).

    The prototype is ``scipy.signal.bessel(poles, 2π·fc, analog=True, norm="mag")`` or
    ``butter(...)``. It is written in real modal form (one 1×1 or 2×2 block per real pole or
    complex pair, the residues as outputs), which keeps the state space well conditioned
    where the companion form of ``zpk2ss`` is not (condition 1e14 for 8 poles), and
    discretised by ``scipy.signal.cont2discrete(..., method="foh")``. The discrete poles are
    exp(p·T); the zeros are the finite generalised eigenvalues of the discrete system's
    pencil; the gain makes the DC gain the analog one (1).

    Examples
    --------
    >>> sos = design_sos("bessel", 8, 5.0, 0.02)
    >>> sos.shape
    (4, 6)
    >>> from scipy import signal
    >>> w, h = signal.sosfreqz(sos, worN=[0.0, 1.0, 5.0], fs=50.0)   # kHz
    >>> np.round(np.abs(h), 3).tolist()    # unit DC gain; at 5 kHz see the module docstring
    [1.0, 0.985, 0.684]
    """
    return _design_sos(kind, int(poles), float(cutoff_khz), float(dt)).copy()


@lru_cache(maxsize=256)
def _design_sos(kind: str, poles: int, cutoff_khz: float, dt: float) -> np.ndarray:
    from scipy import linalg, signal

    wc = 2.0 * math.pi * cutoff_khz  # rad/ms
    if kind == "bessel":
        _, p, k = signal.bessel(poles, wc, analog=True, norm="mag", output="zpk")
    elif kind == "butterworth":
        _, p, k = signal.butter(poles, wc, analog=True, output="zpk")
    else:
        raise ValueError(f"unknown filter kind {kind!r}")
    p = np.asarray(p, dtype=complex)
    residues = np.array([k / np.prod(np.delete(pi - p, i)) for i, pi in enumerate(p)])
    blocks, b_col, c_row = [], [], []
    for pi, ri in zip(p, residues, strict=True):
        if abs(pi.imag) <= 1e-12 * abs(pi):
            blocks.append(np.array([[pi.real]]))
            b_col += [1.0]
            c_row += [ri.real]
        elif pi.imag > 0:
            # a + ib of the mode ξ' = p ξ + u; its conjugate's output doubles the real part
            blocks.append(np.array([[pi.real, -pi.imag], [pi.imag, pi.real]]))
            b_col += [1.0, 0.0]
            c_row += [2.0 * ri.real, -2.0 * ri.imag]
    a_c = linalg.block_diag(*blocks)
    n = a_c.shape[0]
    a_d, b_d, c_d, d_d, _ = signal.cont2discrete(
        (a_c, np.array(b_col)[:, None], np.array(c_row)[None, :], np.zeros((1, 1))), dt,
        method="foh")
    pencil = np.block([[a_d, b_d], [c_d, d_d]])
    ident = np.zeros_like(pencil)
    ident[:n, :n] = np.eye(n)
    ev = linalg.eigvals(pencil, ident)
    zeros = ev[np.isfinite(ev)]
    real = np.abs(zeros.imag) <= 1e-9 * np.abs(zeros)
    upper = zeros[~real & (zeros.imag > 0)]
    zeros = np.concatenate([zeros[real].real, upper, upper.conj()])
    poles_d = np.exp(p * dt)
    dc = float((c_d @ np.linalg.solve(np.eye(n) - a_d, b_d) + d_d)[0, 0])
    gain = float((dc * np.prod(1.0 - poles_d) / np.prod(1.0 - zeros)).real)
    sos = signal.zpk2sos(zeros, poles_d, gain)
    sos.flags.writeable = False  # cached: shared by every caller
    return sos


def fir_sos(impulse: tuple[float, ...]) -> np.ndarray:
    """A measured impulse response (one tap per sample) as second-order sections.

    The response is an FIR filter, y[n] = Σ h[k]·x[n − k]; its polynomial's roots pair
    into sections with poles at 0 (``scipy.signal.tf2sos``), and leading zero taps into
    delay sections. :func:`read_response` checks that the sections reproduce the taps.

    >>> sos = fir_sos((0.25, 0.5, 0.25))
    >>> sos.shape, float(sos[:, :3].sum())
    ((1, 6), 1.0)
    """
    return _fir_sos(tuple(float(x) for x in impulse)).copy()


@lru_cache(maxsize=64)
def _fir_sos(impulse: tuple[float, ...]) -> np.ndarray:
    from scipy import signal

    h = np.array(impulse)
    # leading zero taps are a delay, which the polynomial's roots do not carry: one section
    # per two samples of it (b = 0, 0, 1) or one (b = 0, 1, 0)
    lead = int(np.argmax(h != 0.0))
    core = h[lead:]
    if core.size == 1:
        sos = np.array([[core[0], 0.0, 0.0, 1.0, 0.0, 0.0]])
    else:
        sos = signal.tf2sos(core, np.r_[1.0, np.zeros(core.size - 1)])
    delays = [[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]] * (lead // 2) + \
        [[0.0, 1.0, 0.0, 1.0, 0.0, 0.0]] * (lead % 2)
    if delays:
        sos = np.vstack([sos, delays])
    sos.flags.writeable = False
    return sos


# ------------------------------------------------------------------------------- reading

def read_response(path: Path, *, file: str | None, field: str, value: Any = None) -> Filter:
    """A measured filter from a CSV file: a time column ``time_<unit>`` starting at 0 and
    one column ``step`` or ``impulse`` (the name says which response it is; a unit suffix
    such as ``step_pA`` is allowed and ignored: the response is normalised).

    A step response s (the output for an input stepping from 0 to 1 at time 0) becomes the
    impulse response h[k] = (s[k] − s[k − 1]) / s[-1]; an impulse response is divided by its
    sum. Either way the filter passes a constant current unchanged. The response must be
    sampled at the sweeps' interval, hold 2 to :data:`MAX_RESPONSE_SAMPLES` samples, and be
    normalisable (a final value or sum clearly not 0).

    Raises
    ------
    KingenError
        Naming the file, the field and the value (``value``: the file as the user wrote
        it), for every problem above.
    """
    from kingen.experiment.recordings.csv import (
        csv_unit_factor,
        parse_csv_column,
        read_csv_table,
        split_column_name,
    )

    value = str(path) if value is None else value
    table = read_csv_table(path)
    if len(table.header) != 2:
        raise KingenError("a response file has two columns, time_<unit> and step or impulse",
                          file=str(path), field="header", value=",".join(table.header))
    quantity, unit, _ = split_column_name(table.header[0], table.name)
    if quantity != "time":
        raise KingenError("the first column must be the time (time_ms)", file=str(path),
                          field="header", value=table.header[0])
    t = parse_csv_column(table, 0, allow_trailing_blank=False,
                         factor=csv_unit_factor(table, table.header[0], "time", unit), unit="ms")
    what = split_column_name(table.header[1], table.name)[0]
    if what not in RESPONSE_KINDS:
        raise KingenError("the second column must be named step or impulse (which response "
                          "it is)", file=str(path), field="header", value=table.header[1])
    y = parse_csv_column(table, 1, allow_trailing_blank=False)
    if not 2 <= y.size <= MAX_RESPONSE_SAMPLES:
        raise KingenError(f"{y.size} sample{'s' if y.size != 1 else ''}: a response needs "
                          f"2 to {MAX_RESPONSE_SAMPLES} "
                          "(give it up to where it has settled)", file=file, field=field,
                          value=value)
    dts = np.diff(t)
    dt = float(dts.mean())
    if abs(t[0]) > 1e-9 or not dt > 0 or np.abs(dts - dt).max() > 1e-6 * dt:
        raise KingenError("the time column must start at 0 and step evenly (one row per "
                          "sample)", file=str(path), field=table.header[0],
                          value=f"{t[0]:g}, {t[1]:g}, ...")
    scale = float(y[-1]) if what == "step" else float(y.sum())
    size = float(np.abs(y).max())
    if not (math.isfinite(scale) and abs(scale) > 1e-6 * size):
        name = "final value" if what == "step" else "sum"
        raise KingenError(f"not normalisable: its {name} is {scale:.3g} (the filter must pass "
                          "a constant current)", file=file, field=field, value=value)
    h = (np.diff(y, prepend=0.0) if what == "step" else y) / scale
    _check_fir(h, file=file, field=field, value=value)
    return Filter("response", impulse=tuple(float(x) for x in h), response_dt=dt,
                  source=str(value), measured=what)


def _check_fir(h: np.ndarray, *, file: str | None, field: str, value: Any) -> None:
    """Refuse a response whose second-order sections do not reproduce its taps (the roots of
    a long, noisy polynomial can be too ill-conditioned)."""
    from scipy import signal

    sos = fir_sos(tuple(float(x) for x in h))
    pulse = np.zeros(h.size)
    pulse[0] = 1.0
    err = float(np.abs(signal.sosfilt(sos, pulse) - h).max())
    if not err <= _FIR_TOLERANCE * float(np.abs(h).max()):
        raise KingenError("the response cannot be run as second-order sections to 1e-9 of "
                          "its taps: shorten it to where it has settled", file=file,
                          field=field, value=value)


def read_filter(fields: Fields, spec: Any, where: str, base: Path) -> Filter:
    """A ``filter = {...}`` table of a configuration: ``{ kind = "bessel", poles = 8,
    cutoff_khz = 5 }`` or ``{ response = "file.csv" }`` (relative to ``base``)."""
    if not isinstance(spec, dict):
        raise fields.error('must be a table such as { kind = "bessel", poles = 8, '
                           'cutoff_khz = 5 } or { response = "step.csv" }', where, spec)
    fields.keys(spec, _FILTER_KEYS, where)
    if "response" in spec:
        extra = [k for k in spec if k != "response"]
        if extra:
            raise fields.error("give kind, poles and cutoff_khz, or a response file, not both",
                               join(where, extra[0]), spec[extra[0]])
        name = fields.string(spec, "response", where)
        path = Path(name) if Path(name).is_absolute() else base / name
        if not path.is_file():
            raise fields.error("file not found", join(where, "response"), name)
        return read_response(path, file=fields.file, field=join(where, "response"),
                             value=name)
    if "kind" not in spec:
        raise fields.error(f"missing: the filter's kind ({', '.join(FILTER_KINDS)}) or a "
                           "response file", join(where, "kind"))
    kind = fields.choice(spec, "kind", FILTER_KINDS, where)
    poles = fields.integer(spec, "poles", where, ge=MIN_POLES, le=MAX_POLES)
    cutoff = fields.number(spec, "cutoff_khz", where, gt=0.0)
    return Filter(kind, poles, cutoff)


def read_chain(fields: Fields, t: dict, where: str, base: Path) -> Chain:
    """The chain of a protocol entry: its ``filter``, ``offset`` and ``amplitude`` (when a
    string; a number fixes the amplitude and is read by the configuration)."""
    flt = read_filter(fields, t["filter"], join(where, "filter"), base) if "filter" in t \
        else None
    offset = fields.choice(t, "offset", OFFSETS, where, "none")
    amplitude = AMPLITUDES[0]
    if isinstance(t.get("amplitude"), str):
        amplitude = fields.choice(t, "amplitude", AMPLITUDES, where)
    return Chain(flt, offset, amplitude)


def parse_filter(text: str, *, field: str = "--filter") -> Filter:
    """A filter written on one line: ``KIND:POLES:CUTOFF_KHZ`` (``bessel:8:5``) or a
    response CSV file (see :func:`read_response`).

    >>> parse_filter("bessel:8:5").label
    '8-pole Bessel, 5 kHz'
    >>> parse_filter("butterworth:4:2") == Filter("butterworth", 4, 2.0)
    True
    """
    parts = text.strip().split(":")
    if len(parts) == 3 and parts[0].lower() in FILTER_KINDS:
        kind, poles, cutoff = parts[0].lower(), parts[1].strip(), parts[2].strip()
        if not poles.isdigit() or not MIN_POLES <= int(poles) <= MAX_POLES:
            raise KingenError(f"the poles must be {MIN_POLES} to {MAX_POLES}", field=field,
                              value=text)
        try:
            fc = float(cutoff)
        except ValueError:
            fc = math.nan
        if not (math.isfinite(fc) and fc > 0):
            raise KingenError("the cutoff must be a number > 0 (kHz)", field=field, value=text)
        return Filter(kind, int(poles), fc)
    path = Path(text)
    if path.suffix.lower() == ".csv":
        if not path.is_file():
            raise KingenError("file not found", field=field, value=text)
        return read_response(path, file=None, field=field, value=text)
    raise KingenError(f"write KIND:POLES:CUTOFF_KHZ ({' or '.join(FILTER_KINDS)}, e.g. "
                      "bessel:8:5) or a response CSV file", field=field, value=text)


def check_filter(flt: Filter, dts: list[float], *, file: str | None, field: str,
                 value: Any = None) -> None:
    """Refuse a filter the sweeps' sampling intervals ``dts`` (ms) cannot carry: a cutoff at
    or above their Nyquist frequency, or a response measured at another interval. The
    error names ``field`` (and its ``.cutoff_khz``), or ``field`` = ``value`` when a value
    is given (a filter written on one line).

    >>> check_filter(Filter("bessel", 8, 30.0), [0.02], file="fit.toml", field="filter")
    Traceback (most recent call last):
    ...
    kingen.errors.KingenError: fit.toml: filter.cutoff_khz = 30.0: at or above the Nyquist \
frequency (25 kHz) of sweeps sampled every 0.02 ms
    """
    for dt in sorted(set(dts)):
        if flt.kind == "response":
            if not math.isclose(dt, flt.response_dt, rel_tol=1e-6):
                raise KingenError(f"the response is sampled every {flt.response_dt:g} ms, the "
                                  f"protocol's sweeps every {dt:g} ms", file=file,
                                  field=f"{field}.response" if value is None else field,
                                  value=flt.source if value is None else value)
            continue
        nyquist = 0.5 / dt
        if flt.cutoff_khz >= nyquist:
            raise KingenError(f"at or above the Nyquist frequency ({nyquist:g} kHz) of sweeps "
                              f"sampled every {dt:g} ms", file=file,
                              field=f"{field}.cutoff_khz" if value is None else field,
                              value=flt.cutoff_khz if value is None else value)


__all__ = ["AMPLITUDES", "FILTER_KINDS", "MAX_POLES", "MAX_RESPONSE_SAMPLES", "MIN_POLES",
           "OFFSETS", "SECTION_VALUES", "Chain", "Filter", "check_filter", "design_sos",
           "fir_sos", "parse_filter", "read_chain", "read_filter", "read_response"]


def filter_sections(protocols: list, filters: list | None) -> np.ndarray | None:
    """Each sweep's filter as the kernels read it: (n_sweeps, n_sections, 7), the sections
    of :meth:`kingen.experiment.chain.Filter.sections` at the sweep's sampling interval,
    padded with pass-through sections (b = 1, 0, 0; a = 1, 0, 0: exactly y = x) where a
    sweep's filter has fewer, or it has none. None when no protocol has a filter.

    >>> from kingen.experiment.protocol import standard_protocol
    >>> p = [standard_protocol("deactivation"), standard_protocol("desensitization")]
    >>> f = filter_sections(p, [Filter("bessel", 4, 2.0), None])
    >>> f.shape, f[1].tolist()
    ((2, 2, 7), [[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    """
    if filters is None or all(f is None for f in filters):
        return None
    if len(filters) != len(protocols):
        raise ValueError(f"{len(filters)} filters for {len(protocols)} protocols")
    per_sweep = [None if f is None else f.sections(s.dt)
                 for p, f in zip(protocols, filters, strict=True) for s in p.sweeps]
    width = max(x.shape[0] for x in per_sweep if x is not None)
    out = np.zeros((len(per_sweep), width, SECTION_VALUES))
    out[:, :, 0] = 1.0
    for k, x in enumerate(per_sweep):
        if x is not None:
            out[k, : x.shape[0]] = x
    return out
