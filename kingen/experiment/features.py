"""Summary features of currents: peaks, steady states, time constants, recovery, dose-response.

The same functions measure simulated traces and recorded data, so they know nothing of
models: they see sample times (ms), currents (pA) and, for :func:`protocol_features`, the
:class:`~kingen.experiment.protocol.Protocol` that says where the agonist pulses are.

Sign convention. AMPA currents at negative holding potentials are inward (negative). Every
amplitude-based feature is measured on the *sign-corrected* current: the direction of the
response is the sign of the largest baseline-subtracted excursion, peaks are extrema in that
direction, and ratios (steady state / peak, I2 / I1) are therefore positive for either sign.
``peak_pA`` itself is reported signed (negative for an inward current), baseline-subtracted.

Failure policy. A fit that cannot be made (flat current, too few points, no convergence)
gives NaN for its keys; nothing here raises on data. Only a protocol/current shape mismatch,
which is a caller's mistake, raises :class:`~kingen.errors.KingenError`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, stats

from kingen.errors import KingenError
from kingen.experiment.protocol import EDGE_HALF_WIDTH_SIGMAS, Protocol, Pulse, Sweep

NAN = float("nan")
# A 10-90 % edge spans 2 * 1.2815516 sigma of the Gaussian CDF (as in kingen.experiment.protocol).
_TEN_NINETY_SIGMAS = 2.0 * 1.2815515655446004
# Fraction of a pulse averaged for its steady state (the last 5 %, before the decay edge).
STEADY_STATE_FRACTION = 0.05
# Two exponentials are kept only if they cut the residual sum of squares by this factor ...
TWO_EXP_MIN_SSE_RATIO = 0.9
# ... and the extra parameters pass an F-test at this level.
TWO_EXP_F_ALPHA = 0.01
# Below this relative residual a fit is exact to rounding; adding terms then fits noise.
_EXACT_RELATIVE_SSE = 1e-20
# The steady state is "not reached" when a line through the last 5 % of the pulse changes
# by more than this fraction of the steady state across that window, and significantly
# (beyond
# SS_DRIFT_SIGMAS standard errors of its slope, so that noise alone does not count).
SS_DRIFT_FRACTION = 0.01
SS_DRIFT_SIGMAS = 3.0
# Residual bootstrap of dose-response fits: resamples, seed (reproducible), interval level.
BOOTSTRAP_RESAMPLES = 200
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.95
_FIT_ERRORS = (ValueError, RuntimeError, FloatingPointError, np.linalg.LinAlgError,
               OverflowError, ZeroDivisionError)


# --------------------------------------------------------------------------- results

@dataclass(frozen=True)
class DecayFit:
    """A fit of ``y(t) = offset + sum_i a_i exp(-(t - t0) / tau_i)``.

    Attributes
    ----------
    tau_ms
        Weighted time constant ``sum a_i tau_i / sum a_i``, ms (NaN if the fit failed).
    taus_ms, amplitudes
        The components, fastest first; amplitudes at ``t0`` in the units of ``y``.
    offset
        The constant the decay tends to (0 when it was fixed).
    n_exp
        Number of exponentials used (0 if the fit failed).
    sse
        Residual sum of squares.
    """

    tau_ms: float
    taus_ms: tuple[float, ...] = ()
    amplitudes: tuple[float, ...] = ()
    offset: float = 0.0
    n_exp: int = 0
    sse: float = NAN

    @property
    def ok(self) -> bool:
        """Whether the fit produced a finite weighted time constant."""
        return math.isfinite(self.tau_ms)


@dataclass(frozen=True)
class RecoveryFit:
    """A fit of ``r(dt) = 1 - (1 - r0) exp(-dt / tau)``; NaN fields if it failed."""

    tau_ms: float
    r0: float = NAN
    sse: float = NAN


@dataclass(frozen=True)
class HillFit:
    """A fit of ``y(c) = top / (1 + (ec50 / c) ** hill)``; NaN fields if it failed."""

    ec50_mM: float
    hill: float = NAN
    top: float = NAN
    sse: float = NAN


@dataclass(frozen=True)
class PulseResponse:
    """Measurements of the response to one pulse (sign-corrected unless stated).

    Attributes
    ----------
    baseline
        Current the response is measured from, pA (signed, raw).
    sign
        +1 for an outward response, -1 for an inward one.
    peak_pA
        Signed, baseline-subtracted peak, pA.
    time_to_peak_ms
        From the pulse start (50 % of its rise) to the peak, ms.
    t_peak_ms
        Absolute time of the peak in the sweep, ms.
    """

    baseline: float
    sign: float
    peak_pA: float
    time_to_peak_ms: float
    t_peak_ms: float
    extra: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- basics

def _as_xy(time_ms: Any, current: Any) -> tuple[np.ndarray, np.ndarray]:
    """Float arrays of equal length with non-finite samples dropped."""
    t = np.asarray(time_ms, dtype=float).ravel()
    y = np.asarray(current, dtype=float).ravel()
    n = min(t.size, y.size)
    t, y = t[:n], y[:n]
    keep = np.isfinite(t) & np.isfinite(y)
    return t[keep], y[keep]


def edge_half_width(ten_ninety_ms: float) -> float:
    """Half-width of a finite exchange edge: beyond it the concentration is constant, ms."""
    return EDGE_HALF_WIDTH_SIGMAS * max(ten_ninety_ms, 0.0) / _TEN_NINETY_SIGMAS


def baseline(time_ms: np.ndarray, current: np.ndarray, before_ms: float) -> float:
    """Mean current of the samples strictly before ``before_ms``; 0 when there are none.

    A trace simulated from rest has no pre-pulse sample at all when the pulse starts at 0, and
    its baseline is exactly 0; a recording normally has a pre-pulse stretch.
    """
    t, y = _as_xy(time_ms, current)
    pre = y[t < before_ms]
    return float(pre.mean()) if pre.size else 0.0


def response_sign(current: np.ndarray, baseline_pA: float = 0.0) -> float:
    """+1 if the largest excursion from ``baseline_pA`` is outward, -1 if inward.

    A flat trace gives -1 (the AMPA convention at negative holding potentials).
    """
    y = np.asarray(current, dtype=float)
    y = y[np.isfinite(y)] - baseline_pA
    if y.size == 0:
        return -1.0
    i = int(np.argmax(np.abs(y)))
    return 1.0 if y[i] > 0 else -1.0


def peak(
    time_ms: np.ndarray,
    current: np.ndarray,
    *,
    start_ms: float = -math.inf,
    end_ms: float = math.inf,
    baseline_pA: float = 0.0,
    sign: float | None = None,
) -> tuple[float, float]:
    """Peak of a response in a window.

    Parameters
    ----------
    time_ms, current
        Sample times (ms) and current (pA).
    start_ms, end_ms
        The window searched (inclusive).
    baseline_pA
        Subtracted before searching.
    sign
        Direction of the response (+1 outward, -1 inward); found from the window if None.

    Returns
    -------
    peak_pA, t_peak_ms
        The signed baseline-subtracted extremum in the direction of the response and its
        time; (NaN, NaN) when the window holds no sample.
    """
    t, y = _as_xy(time_ms, current)
    inside = (t >= start_ms) & (t <= end_ms)
    if not inside.any():
        return NAN, NAN
    tw, yw = t[inside], y[inside] - baseline_pA
    s = response_sign(yw) if sign is None else (1.0 if sign >= 0 else -1.0)
    i = int(np.argmax(s * yw))
    return float(yw[i]), float(tw[i])


def steady_state(
    time_ms: np.ndarray,
    current: np.ndarray,
    pulse: Pulse,
    *,
    baseline_pA: float = 0.0,
    fraction: float = STEADY_STATE_FRACTION,
) -> float:
    """Mean baseline-subtracted current over the last ``fraction`` of a pulse, pA (signed).

    The window ends where the pulse's decay edge begins (``pulse.end`` for an ideal step), so
    that solution exchange does not leak into the steady state. NaN if it holds no sample.
    """
    t, y = _as_xy(time_ms, current)
    stop = pulse.end - edge_half_width(pulse.decay)
    begin = stop - fraction * pulse.duration
    inside = (t >= begin) & (t <= stop)
    if not inside.any():
        return NAN
    return float(np.mean(y[inside]) - baseline_pA)


def steady_state_drift(time_ms: np.ndarray, current: np.ndarray, pulse: Pulse, *,
                       baseline_pA: float = 0.0, fraction: float = STEADY_STATE_FRACTION
                       ) -> float | None:
    """How much the current still changes over the steady-state window, as a fraction of
    the steady state, when it changes significantly; None when the steady state is reached.

    A line is fitted to the window :func:`steady_state` averages; its change across the
    window counts when it exceeds :data:`SS_DRIFT_FRACTION` of the steady state (the
    window's mean less ``baseline_pA``) and :data:`SS_DRIFT_SIGMAS` standard errors of the
    slope (noise alone is not a drift). A current still relaxing with time constant tau
    changes by about 5 ms / tau of its remaining distance over the last 5 ms of a 100 ms
    pulse, so 1 % flags a steady state still 1 % or more away from its end value for any
    tau up to 0.5 s.
    """
    t, y = _as_xy(time_ms, current)
    stop = pulse.end - edge_half_width(pulse.decay)
    begin = stop - fraction * pulse.duration
    inside = (t >= begin) & (t <= stop)
    if inside.sum() < 4:
        return None
    tw, yw = t[inside] - t[inside].mean(), y[inside]
    level = abs(float(yw.mean()) - baseline_pA)
    if not level > 0.0:
        return None
    sxx = float(tw @ tw)
    if sxx <= 0.0:
        return None
    slope = float(tw @ (yw - yw.mean())) / sxx
    resid = yw - yw.mean() - slope * tw
    se = math.sqrt(float(resid @ resid) / (tw.size - 2) / sxx)
    change = abs(slope) * float(tw[-1] - tw[0]) / level
    if change > SS_DRIFT_FRACTION and abs(slope) > SS_DRIFT_SIGMAS * se:
        return change
    return None


def not_reached(change: float) -> str:
    """The reason given for a steady-state feature whose steady state is not reached."""
    return (f"not determined: the current still changes by {100 * change:.2g} % over the "
            f"last {100 * STEADY_STATE_FRACTION:g} % of the pulse (no steady state)")


def rise_time(time_ms: np.ndarray, current: np.ndarray, onset_ms: float, t_peak_ms: float,
              peak_pA: float, baseline_pA: float = 0.0, low: float = 0.1, high: float = 0.9
              ) -> float:
    """10-90 % rise time (``low``-``high`` of the peak) from the onset to the peak, ms.

    Each crossing is the first sample pair that brackets the level, interpolated linearly;
    NaN when the peak is 0 or a level is not crossed.
    """
    t, y = _as_xy(time_ms, current)
    if not (math.isfinite(peak_pA) and peak_pA != 0.0 and math.isfinite(t_peak_ms)):
        return NAN
    inside = (t >= onset_ms) & (t <= t_peak_ms)
    tw, yw = t[inside], (y[inside] - baseline_pA) / peak_pA  # rises from ~0 to 1
    crossings = []
    for level in (low, high):
        above = np.flatnonzero(yw >= level)
        if above.size == 0:
            return NAN
        i = int(above[0])
        if i == 0:
            crossings.append(float(tw[0]))
            continue
        y0, y1 = yw[i - 1], yw[i]
        crossings.append(float(tw[i - 1] + (level - y0) * (tw[i] - tw[i - 1]) / (y1 - y0)))
    return crossings[1] - crossings[0]


def _ratio(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0.0:
        return NAN
    return float(a / b)


# --------------------------------------------------------------------------- decays

def _design(t: np.ndarray, taus: np.ndarray, with_offset: bool) -> np.ndarray:
    cols = [np.exp(-t / tau) for tau in taus]
    if with_offset:
        cols.append(np.ones_like(t))
    return np.column_stack(cols)


def _varpro(t: np.ndarray, y: np.ndarray, taus: np.ndarray, with_offset: bool
            ) -> tuple[np.ndarray, np.ndarray]:
    """Best linear coefficients for fixed time constants, and the residuals."""
    a = _design(t, taus, with_offset)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return coef, a @ coef - y


def _fit_exponentials(t: np.ndarray, y: np.ndarray, n_exp: int, with_offset: bool
                      ) -> DecayFit:
    """Least-squares fit of n_exp exponentials by variable projection.

    The time constants are searched on a log grid (robust start, no user guesses), then
    polished by Levenberg-Marquardt on log tau with the amplitudes solved linearly at every
    step: on exact data this recovers the time constants to rounding.
    """
    span = float(t[-1] - t[0])
    step = float(np.min(np.diff(t)))
    lo, hi = math.log(step / 4.0), math.log(span * 20.0)
    grid = np.exp(np.linspace(lo, hi, 36 if n_exp == 1 else 24))

    def sse(taus: np.ndarray) -> float:
        return float(np.sum(_varpro(t, y, taus, with_offset)[1] ** 2))

    if n_exp == 1:
        candidates = [np.array([g]) for g in grid]
    else:
        candidates = [np.array([a, b]) for i, a in enumerate(grid) for b in grid[i + 1:]]
    start = min(candidates, key=sse)

    def residuals(log_taus: np.ndarray) -> np.ndarray:
        return _varpro(t, y, np.exp(log_taus), with_offset)[1]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = optimize.least_squares(residuals, np.log(start), method="lm",
                                        xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=4000)
    taus = np.exp(result.x)
    coef, res = _varpro(t, y, taus, with_offset)
    order = np.argsort(taus)
    taus, amps = taus[order], coef[:n_exp][order]
    offset = float(coef[-1]) if with_offset else 0.0
    total = float(np.sum(amps))
    if not np.all(np.isfinite(taus)) or total == 0.0 or not np.all(np.isfinite(amps)):
        return DecayFit(NAN)
    weighted = float(np.sum(amps * taus) / total)
    return DecayFit(weighted, tuple(float(x) for x in taus), tuple(float(x) for x in amps),
                    offset, n_exp, float(np.sum(res ** 2)))


def fit_decay(
    time_ms: np.ndarray,
    current: np.ndarray,
    *,
    n_exp: int | None = None,
    offset: bool = True,
    min_points: int = 6,
) -> DecayFit:
    """Fit a decay with one or two exponentials and give its weighted time constant.

    The model is ``y = c + sum_i a_i exp(-(t - t0) / tau_i)`` with ``t0`` the first sample;
    the weighted time constant is ``sum a_i tau_i / sum a_i``.

    Parameters
    ----------
    time_ms, current
        The decaying part of the trace only (from the peak, or from the pulse end).
    n_exp
        1 or 2 to force the number of exponentials; None chooses: two are kept when they
        cut the residual sum of squares by at least 10 %, the F-test for the two extra
        parameters gives p < 0.01, and both components decay in the same direction
        (otherwise the "weighted" tau would mix a rise into a decay).
    offset
        Fit the constant ``c`` (a decay to a steady state, e.g. desensitization); False
        fixes it to 0 (a decay to a known baseline, e.g. deactivation after subtraction).
    min_points
        Fewer finite samples than this give a failed (NaN) fit.

    Returns
    -------
    DecayFit
        With ``tau_ms`` NaN when the data are flat, too short or the fit fails.
    """
    t, y = _as_xy(time_ms, current)
    if n_exp not in (None, 1, 2):
        raise ValueError(f"n_exp must be 1, 2 or None, not {n_exp!r}")
    if t.size < min_points or np.any(np.diff(t) <= 0):
        return DecayFit(NAN)
    t = t - t[0]
    scale = float(np.max(np.abs(y - (np.mean(y) if offset else 0.0))))
    if not math.isfinite(scale) or scale <= 1e-12 * max(1.0, float(np.max(np.abs(y)))):
        return DecayFit(NAN)  # flat: no decay to measure
    y_scaled = y / scale  # unit-scale data keep the solver's tolerances meaningful
    try:
        one = _fit_exponentials(t, y_scaled, 1, offset)
        wanted = n_exp or 2
        if wanted == 1 or t.size < min_points + 2:
            best = one
        else:
            two = _fit_exponentials(t, y_scaled, 2, offset)
            best = two if n_exp == 2 else _choose(one, two, y_scaled, t.size, offset)
    except _FIT_ERRORS:
        return DecayFit(NAN)
    if not best.ok:
        return DecayFit(NAN)
    return DecayFit(best.tau_ms, best.taus_ms, tuple(a * scale for a in best.amplitudes),
                    best.offset * scale, best.n_exp, best.sse * scale ** 2)


def _choose(one: DecayFit, two: DecayFit, y: np.ndarray, n: int, offset: bool) -> DecayFit:
    """One exponential unless two are clearly better (see :func:`fit_decay`)."""
    if not two.ok:
        return one
    if not one.ok:
        return two
    same_direction = all(a * sum(two.amplitudes) > 0 for a in two.amplitudes)
    if not same_direction:
        return one
    if one.sse <= _EXACT_RELATIVE_SSE * float(np.sum(y ** 2)):
        return one
    if two.sse > TWO_EXP_MIN_SSE_RATIO * one.sse:
        return one
    dof = n - (4 + int(offset))
    if dof <= 0:
        return one
    if two.sse <= 0.0:
        return two
    f = ((one.sse - two.sse) / 2.0) / (two.sse / dof)
    return two if stats.f.sf(f, 2, dof) < TWO_EXP_F_ALPHA else one


# --------------------------------------------------------------------------- recovery

def recovery_ratios(
    time_ms: np.ndarray,
    current: np.ndarray,
    first: Pulse,
    second: Pulse,
    *,
    end_ms: float = math.inf,
) -> tuple[float, float, float]:
    """Paired-pulse recovery ratio I2 / I1 of one sweep.

    I1 is the peak of the response to ``first`` from the pre-pulse baseline; I2 is the peak
    of the response to ``second`` measured from the current just before the second pulse
    (the last sample before its rising edge starts), so that a first response that has not
    yet decayed at short intervals is not counted twice.

    Returns
    -------
    ratio, i1_pA, i2_pA
        The ratio (positive for either sign; NaN when I1 is 0) and the two signed
        amplitudes.
    """
    t, y = _as_xy(time_ms, current)
    on1 = first.start - edge_half_width(first.rise)
    on2 = second.start - edge_half_width(second.rise)
    base = baseline(t, y, on1)
    i1, _ = peak(t, y, start_ms=on1, end_ms=on2, baseline_pA=base)
    before = y[t < on2]
    if before.size == 0 or not math.isfinite(i1):
        return NAN, i1, NAN
    sign = 1.0 if i1 > 0 else -1.0
    i2, _ = peak(t, y, start_ms=on2, end_ms=end_ms, baseline_pA=float(before[-1]), sign=sign)
    return _ratio(i2, i1), i1, i2


def recovery_model(interval_ms: np.ndarray, tau_ms: float, r0: float = 0.0) -> np.ndarray:
    """``1 - (1 - r0) exp(-interval / tau)``: recovery from r0 at zero interval to 1."""
    return 1.0 - (1.0 - r0) * np.exp(-np.asarray(interval_ms, dtype=float) / tau_ms)


def fit_recovery(
    interval_ms: Sequence[float] | np.ndarray,
    ratio: Sequence[float] | np.ndarray,
    *,
    r0: float | None = None,
) -> RecoveryFit:
    """Fit ``r(dt) = 1 - (1 - r0) exp(-dt / tau)`` to recovery ratios.

    Parameters
    ----------
    interval_ms, ratio
        Interpulse intervals (ms, pulse end to next pulse start) and I2 / I1.
    r0
        The ratio at zero interval; None fits it (the form used throughout kingen, since a
        finite pulse leaves some receptors undesensitized); 0 gives the classical
        ``1 - exp(-dt / tau)``.

    Returns
    -------
    RecoveryFit
        NaN fields when fewer than 2 (3 with r0 free) finite points remain or the fit fails.
    """
    x, r = _as_xy(interval_ms, ratio)
    order = np.argsort(x)
    x, r = x[order], r[order]
    free = r0 is None
    if x.size < (3 if free else 2) or np.ptp(r) == 0.0 or np.any(x < 0):
        return RecoveryFit(NAN)
    positive = x[x > 0]
    lo = math.log(max(float(positive.min()) if positive.size else 1e-3, 1e-6) / 20.0)
    hi = math.log(max(float(x.max()), 1e-6) * 20.0)

    def solve_b(tau: float) -> tuple[float, np.ndarray]:
        # r = 1 - b e^{-x/tau}: b = 1 - r0 is linear given tau.
        e = np.exp(-x / tau)
        if free:
            denom = float(e @ e)
            b = float(e @ (1.0 - r)) / denom if denom > 0 else 0.0
        else:
            b = 1.0 - float(r0)
        return b, 1.0 - b * e - r

    def residuals(log_tau: np.ndarray) -> np.ndarray:
        return solve_b(math.exp(log_tau[0]))[1]

    try:
        grid = np.linspace(lo, hi, 60)
        start = min(grid, key=lambda g: float(np.sum(residuals(np.array([g])) ** 2)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = optimize.least_squares(residuals, [start], method="lm", xtol=1e-15,
                                            ftol=1e-15, gtol=1e-15, max_nfev=2000)
    except _FIT_ERRORS:
        return RecoveryFit(NAN)
    tau = math.exp(float(result.x[0]))
    b, res = solve_b(tau)
    if not (math.isfinite(tau) and math.isfinite(b)):
        return RecoveryFit(NAN)
    return RecoveryFit(tau, 1.0 - b, float(np.sum(res ** 2)))


# --------------------------------------------------------------------------- dose-response

def hill_model(concentration_mM: np.ndarray, ec50_mM: float, hill: float, top: float = 1.0
               ) -> np.ndarray:
    """``top / (1 + (ec50 / c) ** hill)``, evaluated in log space (0 at c = 0)."""
    c = np.asarray(concentration_mM, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        z = hill * (np.log(ec50_mM) - np.log(c))
        return top / (1.0 + np.exp(np.minimum(z, 700.0)))


def fit_hill(
    concentration_mM: Sequence[float] | np.ndarray,
    response: Sequence[float] | np.ndarray,
    *,
    normalize: bool = True,
    fit_top: bool | None = None,
) -> HillFit:
    """Fit a Hill equation to a dose-response curve, in log concentration.

    Parameters
    ----------
    concentration_mM
        Agonist concentrations (> 0; others are dropped).
    response
        Peak or steady-state responses, either sign (the sign-corrected magnitude is fitted).
    normalize
        Divide by the largest magnitude first, so that ``top`` is relative to it.
    fit_top
        Fit the maximum ``top`` (default when there are at least 4 points: a curve that has
        not saturated at the highest dose would otherwise bias EC50 low); False fixes it to 1.

    Returns
    -------
    HillFit
        ``ec50_mM``, ``hill`` (slope), ``top``; NaN when fewer than 3 points remain, the
        responses are flat or the fit fails.
    """
    c, y = _as_xy(concentration_mM, response)
    keep = c > 0
    c, y = c[keep], y[keep]
    order = np.argsort(c)
    c, y = c[order], y[order]
    if c.size < 3 or np.unique(c).size < 3:
        return HillFit(NAN)
    sign = response_sign(y)
    y = sign * y
    ymax = float(np.max(y))
    if not ymax > 0 or np.ptp(y) <= 1e-12 * ymax:
        return HillFit(NAN)
    if normalize:
        y = y / ymax
    scale = float(np.max(y))
    free_top = (c.size >= 4) if fit_top is None else fit_top
    x = np.log(c)
    x_mid = _half_crossing(x, y / scale)

    def unpack(p: np.ndarray) -> tuple[float, float, float]:
        top = p[2] if free_top else scale
        return p[0], p[1], top

    def residuals(p: np.ndarray) -> np.ndarray:
        log_ec50, n, top = unpack(p)
        return hill_model(c, math.exp(log_ec50), n, top) - y

    lower = [x[0] - 7.0, 0.05] + ([0.0] if free_top else [])
    upper = [x[-1] + 7.0, 20.0] + ([20.0 * scale] if free_top else [])
    best = None
    try:
        for n0 in (1.0, 0.5, 2.0, 4.0):
            p0 = [min(max(x_mid, lower[0]), upper[0]), n0] + ([scale] if free_top else [])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = optimize.least_squares(residuals, p0, bounds=(lower, upper),
                                                xtol=1e-15, ftol=1e-15, gtol=1e-15,
                                                max_nfev=5000)
            if best is None or result.cost < best.cost:
                best = result
    except _FIT_ERRORS:
        return HillFit(NAN)
    log_ec50, n, top = unpack(best.x)
    ec50 = math.exp(log_ec50)
    if not (math.isfinite(ec50) and math.isfinite(n)):
        return HillFit(NAN)
    return HillFit(ec50, float(n), float(top), float(2.0 * best.cost))


def fit_hill_batch(conc_mM: np.ndarray, y: np.ndarray, *, chunk: int = 256
                   ) -> tuple[np.ndarray, np.ndarray]:
    """EC50 (mM) and Hill coefficient of top/(1 + (EC50/c)^n) fitted to each row of ``y``.

    The sign of each row is taken from its largest |value|; ``top`` is solved in closed form
    on a grid of (log EC50, n), refined once on a finer grid around the best point.
    """
    c = np.asarray(conc_mM, dtype=float)
    yy = np.asarray(y, dtype=float)
    sign = np.sign(yy[np.arange(yy.shape[0]), np.argmax(np.abs(yy), axis=1)])
    yy = yy * np.where(sign == 0, 1.0, sign)[:, None]
    lc = np.log10(c)
    ec_grid = np.linspace(lc.min() - 1.0, lc.max() + 1.0, 81)
    n_grid = np.linspace(0.3, 4.0, 38)
    ec50 = np.full(yy.shape[0], np.nan)
    hill = np.full(yy.shape[0], np.nan)
    for s in range(0, yy.shape[0], chunk):
        block = yy[s: s + chunk]
        e1, n1 = _hill_grid(lc, block, ec_grid[None, :].repeat(block.shape[0], 0),
                            n_grid[None, :].repeat(block.shape[0], 0))
        d_ec, d_n = ec_grid[1] - ec_grid[0], n_grid[1] - n_grid[0]
        fine = np.linspace(-1.0, 1.0, 11)
        e2, n2 = _hill_grid(lc, block, e1[:, None] + fine[None, :] * d_ec,
                            np.maximum(n1[:, None] + fine[None, :] * d_n, 0.05))
        ec50[s: s + chunk] = 10.0 ** e2
        hill[s: s + chunk] = n2
    bad = ~np.all(np.isfinite(yy), axis=1)
    ec50[bad] = np.nan
    hill[bad] = np.nan
    return ec50, hill


def _hill_grid(lc: np.ndarray, y: np.ndarray, ec: np.ndarray, n: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    # shape f: (B, E, H, M)
    with np.errstate(all="ignore"):
        f = 1.0 / (1.0 + 10.0 ** ((ec[:, :, None, None] - lc[None, None, None, :])
                                  * n[:, None, :, None]))
        ff = (f * f).sum(-1)
        fy = (f * y[:, None, None, :]).sum(-1)
        sse = (y * y).sum(-1)[:, None, None] - fy * fy / np.where(ff > 0, ff, np.inf)
    sse = np.where(np.isfinite(sse), sse, np.inf).reshape(y.shape[0], -1)
    best = np.argmin(sse, axis=1)
    ie, ih = np.unravel_index(best, (ec.shape[1], n.shape[1]))
    rows = np.arange(y.shape[0])
    return ec[rows, ie], n[rows, ih]


def hill_interval(concentration_mM: Sequence[float] | np.ndarray,
                  response: Sequence[float] | np.ndarray, fit: HillFit, *,
                  resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                  level: float = BOOTSTRAP_LEVEL
                  ) -> tuple[tuple[float, float], tuple[float, float], str | None]:
    """Residual-bootstrap intervals of a Hill fit's EC50 and coefficient.

    The residuals of ``fit`` (from :func:`fit_hill` on the same points) are resampled with
    replacement onto its curve ``resamples`` times, with a fixed seed, and every resample is
    refitted at once by :func:`fit_hill_batch`. That fit is on a grid, so the percentile
    interval is taken relative to the resamples' median and placed around ``fit`` (ratios
    for EC50, differences for the coefficient).

    Returns
    -------
    ec50_interval, hill_interval, why_not
        ``(low, high)`` pairs, and None, or the reason the EC50 is not determined: the
        interval reaches the edge of the searched range (a decade beyond the tested
        concentrations), i.e. is unbounded, or is wider than the tested range.
    """
    nan2 = (NAN, NAN)
    c, y = _as_xy(concentration_mM, response)
    keep = c > 0
    c, y = c[keep], y[keep]
    if not (fit.ec50_mM > 0 and math.isfinite(fit.hill)) or c.size < 3:
        return nan2, nan2, None
    y = response_sign(y) * y
    ymax = float(np.max(y))
    curve = hill_model(c, fit.ec50_mM, fit.hill, fit.top) * ymax
    resid = y - curve
    rng = np.random.default_rng(seed)
    boot = curve[None, :] + resid[rng.integers(0, c.size, (resamples, c.size))]
    ec, n = fit_hill_batch(c, boot)
    ok = np.isfinite(ec) & np.isfinite(n)
    if ok.sum() < resamples // 2:
        return nan2, nan2, "not determined: the bootstrap refits failed"
    ec, n = np.log10(ec[ok]), n[ok]
    q = [50.0 * (1.0 - level), 50.0 * (1.0 + level)]
    p_lo, p_hi = np.percentile(ec, q)
    e_lo, e_hi = p_lo - np.median(ec), p_hi - np.median(ec)
    n_lo, n_hi = np.percentile(n, q) - np.median(n)
    ec50_ci = (fit.ec50_mM * 10.0 ** e_lo, fit.ec50_mM * 10.0 ** e_hi)
    hill_ci = (fit.hill + n_lo, fit.hill + n_hi)
    lc = np.log10(c)
    edge = 0.99  # decades: the batch fit searches one decade beyond the tested range
    span = float(lc.max() - lc.min())
    why = None
    if p_lo <= lc.min() - edge or p_hi >= lc.max() + edge:
        why = (f"not determined: its {100 * level:g} % bootstrap interval is unbounded "
               f"(it reaches a decade beyond the tested concentrations)")
    elif e_hi - e_lo > span:
        why = (f"not determined: its {100 * level:g} % bootstrap interval "
               f"[{ec50_ci[0]:.3g}, {ec50_ci[1]:.3g}] mM is wider than the tested "
               f"concentrations [{c.min():.3g}, {c.max():.3g}] mM")
    return ec50_ci, hill_ci, why


def _half_crossing(x: np.ndarray, y: np.ndarray) -> float:
    """Log concentration where y first crosses half its maximum (robust initial EC50)."""
    above = np.nonzero(y >= 0.5)[0]
    if above.size == 0:
        return float(x[-1] + 1.0)
    i = int(above[0])
    if i == 0:
        return float(x[0] - 1.0)
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    return float(x0 + (0.5 - y0) * (x1 - x0) / (y1 - y0)) if y1 != y0 else float(x1)


# --------------------------------------------------------------------------- per sweep

def _onset(pulse: Pulse) -> float:
    """Where a pulse's rising edge begins (its start for an ideal step)."""
    return pulse.start - edge_half_width(pulse.rise)


def _stimulus_starts(sweep: Sweep) -> list[float]:
    starts = [p.start for p in sweep.pulses] + [tr.start for tr in sweep.transients]
    return sorted(starts)


def pulse_response(time_ms: np.ndarray, current: np.ndarray, sweep: Sweep, index: int = 0
                   ) -> PulseResponse:
    """Peak and time to peak of the response to one pulse (or transient) of a sweep.

    The window runs from the pulse's onset to the onset of the next pulse (or the end of the
    sweep), so a peak that comes after a short pulse has ended is still found. The baseline
    is the mean current before the first stimulus. A sweep without stimuli is measured over
    its whole length from t = 0.
    """
    t, y = _as_xy(time_ms, current)
    events = sorted([(p.start, _onset(p)) for p in sweep.pulses]
                    + [(tr.start, tr.start) for tr in sweep.transients])
    if not events:
        events = [(0.0, -math.inf)]
    start, onset = events[index]
    stop = events[index + 1][1] if index + 1 < len(events) else math.inf
    base = baseline(t, y, events[0][1])
    p, tp = peak(t, y, start_ms=onset, end_ms=stop, baseline_pA=base)
    sign = 1.0 if (math.isfinite(p) and p > 0) else -1.0
    return PulseResponse(base, sign, p, tp - start if math.isfinite(tp) else NAN, tp)


def _deactivation_tau(t: np.ndarray, y: np.ndarray, pulse: Pulse, base: float,
                      n_exp: int | None) -> float:
    """Weighted tau of the decay after the pulse ends, to the pre-pulse baseline."""
    after = pulse.end + edge_half_width(pulse.decay)
    inside = t >= after
    if inside.sum() < 2:
        return NAN
    tw, yw = t[inside], y[inside] - base
    # A slow receptor may still be rising when the agonist leaves: fit from the extremum on.
    sign = response_sign(yw)
    i = int(np.argmax(sign * yw))
    return fit_decay(tw[i:], yw[i:], n_exp=n_exp, offset=False).tau_ms


def _desensitization_tau(t: np.ndarray, y: np.ndarray, pulse: Pulse, t_peak: float,
                         n_exp: int | None) -> float:
    """Weighted tau of the decay from the peak to the steady state during the pulse."""
    stop = pulse.end - edge_half_width(pulse.decay)
    inside = (t >= t_peak) & (t <= stop)
    return fit_decay(t[inside], y[inside], n_exp=n_exp, offset=True).tau_ms


# --------------------------------------------------------------------------- entry point

def _sweep_arrays(protocol: Protocol, time_ms: Any, currents: Any
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pair every sweep of the protocol with its time and current arrays."""
    if isinstance(currents, np.ndarray) and currents.ndim == 1:
        currents = [currents]
    rows = [np.asarray(c, dtype=float).ravel() for c in currents]
    if len(rows) != protocol.n_sweeps:
        raise KingenError(f"{len(rows)} current sweeps for a protocol of {protocol.n_sweeps}",
                          file=protocol.source, field="currents", value=protocol.name)
    if time_ms is None:
        times = [s.times() for s in protocol.sweeps]
    elif isinstance(time_ms, np.ndarray) and time_ms.ndim == 1:
        times = [time_ms] * len(rows)
    elif isinstance(time_ms, np.ndarray) and time_ms.ndim == 2:
        times = list(time_ms)
    elif (isinstance(time_ms, Sequence) and time_ms
          and np.ndim(time_ms[0]) == 1):
        times = [np.asarray(t, dtype=float) for t in time_ms]
    else:
        times = [np.asarray(time_ms, dtype=float).ravel()] * len(rows)
    if len(times) != len(rows):
        raise KingenError(f"{len(times)} time arrays for {len(rows)} sweeps",
                          file=protocol.source, field="time_ms", value=protocol.name)
    return [_as_xy(t, y) for t, y in zip(times, rows, strict=True)]


def _finite(x: float) -> float:
    return float(x) if x is not None and math.isfinite(x) else NAN


def protocol_features(
    protocol: Protocol,
    time_ms: np.ndarray | Sequence[np.ndarray] | None,
    currents: np.ndarray | Sequence[np.ndarray],
    *,
    n_exp: int | None = None,
) -> dict[str, Any]:
    """The summary features of one protocol's currents.

    Parameters
    ----------
    protocol
        Says where the pulses are and which features apply (``protocol.kind``).
    time_ms
        Sample times in ms: one array for all sweeps (cut to each sweep's length), one per
        sweep, or None for the protocol's own grids (``Sweep.times()``).
    currents
        Currents in pA: shape (n_sweeps, n_samples), or a list of 1-D arrays when sweeps
        differ in length. Non-finite samples (e.g. NaN padding) are ignored.
    n_exp
        Force 1 or 2 exponentials in the decay fits (None chooses, see :func:`fit_decay`).

    Returns
    -------
    dict
        JSON-serialisable (floats, lists of floats; NaN where a fit fails), by kind:

        - ``deactivation``: ``peak_pA``, ``time_to_peak_ms``, ``tau_deact_ms``
        - ``desensitization``: ``peak_pA``, ``time_to_peak_ms``, ``ss_to_peak``,
          ``end_to_peak`` (the same ratio, of the mean over the pulse's last
          :data:`STEADY_STATE_FRACTION`, kept where the current has not settled and
          ``ss_to_peak`` is not determined), ``tau_des_ms``
        - ``recovery``: ``peak_pA``, ``time_to_peak_ms`` (first pulse of the first sweep),
          ``recovery`` ([[interval_ms, I2/I1], ...] in the protocol's sweep order),
          ``tau_rec_ms`` (fit of ``1 - (1 - r0) exp(-dt/tau)``, r0 free)
        - ``dose_response``: ``peak_pA`` (at the highest concentration),
          ``dose_response`` ([[concentration_mM, peak_pA, ss_pA], ...]), ``ec50_peak_mM``,
          ``hill_peak``, ``ec50_ss_mM``, ``hill_ss``
        - ``train`` and ``custom``: ``peak_pA`` and ``time_to_peak_ms`` as lists, one
          value per sweep (the largest response over the sweep, time from its first
          stimulus)

        Times to peak are from the 50 % point of the pulse's rise (``Pulse.start``).

    Raises
    ------
    KingenError
        If the number of sweeps does not match the protocol.
    """
    data = _sweep_arrays(protocol, time_ms, currents)
    kind = protocol.kind
    if kind == "deactivation":
        return _single_pulse(protocol.sweeps[0], *data[0], n_exp, deactivation=True)
    if kind == "desensitization":
        return _single_pulse(protocol.sweeps[0], *data[0], n_exp, deactivation=False)
    if kind == "recovery":
        return _recovery(protocol, data)
    if kind == "dose_response":
        return _dose_response(protocol, data)
    return _per_sweep(protocol, data)


def _single_pulse(sweep: Sweep, t: np.ndarray, y: np.ndarray, n_exp: int | None,
                  *, deactivation: bool) -> dict[str, Any]:
    if not sweep.pulses:
        return _per_sweep_one(sweep, t, y)
    pulse = sweep.pulses[0]
    r = pulse_response(t, y, sweep, 0)
    out: dict[str, Any] = {"peak_pA": _finite(r.peak_pA),
                           "time_to_peak_ms": _finite(r.time_to_peak_ms),
                           "rise_10_90_ms": _finite(rise_time(t, y, _onset(pulse), r.t_peak_ms,
                                                              r.peak_pA, r.baseline))}
    if deactivation:
        out["tau_deact_ms"] = _finite(_deactivation_tau(t, y, pulse, r.baseline, n_exp))
        out["tau_deact_single_ms"] = _finite(_deactivation_tau(t, y, pulse, r.baseline, 1))
    else:
        ss = steady_state(t, y, pulse, baseline_pA=r.baseline)
        out["ss_to_peak"] = _finite(_ratio(ss, r.peak_pA))
        # what papers report as the ratio at the pulse's end, steady or not
        out["end_to_peak"] = out["ss_to_peak"]
        change = steady_state_drift(t, y, pulse, baseline_pA=r.baseline)
        if change is not None:
            out["ss_to_peak"] = NAN
            out["not_determined"] = {"ss_to_peak": not_reached(change)}
        ok = math.isfinite(r.t_peak_ms)
        out["tau_des_ms"] = _finite(_desensitization_tau(t, y, pulse, r.t_peak_ms, n_exp)
                                    if ok else NAN)
        out["tau_des_single_ms"] = _finite(_desensitization_tau(t, y, pulse, r.t_peak_ms, 1)
                                           if ok else NAN)
    return out


def _per_sweep_one(sweep: Sweep, t: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    r = pulse_response(t, y, sweep, 0)
    return {"peak_pA": _finite(r.peak_pA), "time_to_peak_ms": _finite(r.time_to_peak_ms)}


def _recovery(protocol: Protocol, data: list[tuple[np.ndarray, np.ndarray]]
              ) -> dict[str, Any]:
    pairs: list[list[float]] = []
    out: dict[str, Any] = {"peak_pA": NAN, "time_to_peak_ms": NAN}
    for k, (sweep, (t, y)) in enumerate(zip(protocol.sweeps, data, strict=True)):
        if k == 0:
            out.update(_per_sweep_one(sweep, t, y))
        if len(sweep.pulses) < 2:
            continue
        first, second = sweep.pulses[0], sweep.pulses[1]
        stop = _onset(sweep.pulses[2]) if len(sweep.pulses) > 2 else math.inf
        ratio, _, _ = recovery_ratios(t, y, first, second, end_ms=stop)
        interval = sweep.x if sweep.x is not None else second.start - first.end
        pairs.append([float(interval), _finite(ratio)])
    out["recovery"] = pairs
    if pairs:
        fit = fit_recovery([p[0] for p in pairs], [p[1] for p in pairs])
        out["tau_rec_ms"] = _finite(fit.tau_ms)
    else:
        out["tau_rec_ms"] = NAN
    return out


def _dose_response(protocol: Protocol, data: list[tuple[np.ndarray, np.ndarray]]
                   ) -> dict[str, Any]:
    table: list[list[float]] = []
    unsteady: list[tuple[float, float]] = []  # (concentration, change) of unsteady sweeps
    for sweep, (t, y) in zip(protocol.sweeps, data, strict=True):
        if not sweep.pulses:
            continue
        pulse = sweep.pulses[0]
        conc = sweep.x if sweep.x is not None else max(p.concentration for p in sweep.pulses)
        r = pulse_response(t, y, sweep, 0)
        # Low doses give tiny currents whose sign the data alone cannot tell: the direction
        # is taken from the largest response of the series, below.
        ss = steady_state(t, y, pulse, baseline_pA=r.baseline)
        change = steady_state_drift(t, y, pulse, baseline_pA=r.baseline)
        if change is not None:
            unsteady.append((float(conc), change))
        table.append([float(conc), _finite(r.peak_pA), _finite(ss), r.baseline])
    if not table:
        return {"peak_pA": NAN, "dose_response": [], "ec50_peak_mM": NAN, "hill_peak": NAN,
                "ec50_ss_mM": NAN, "hill_ss": NAN}
    # Re-measure the peaks in the series' direction (a low-dose sweep of pure noise could
    # otherwise report an excursion of the opposite sign).
    top = max(table, key=lambda row: abs(row[1]) if math.isfinite(row[1]) else -1.0)
    sign = 1.0 if top[1] > 0 else -1.0
    rows = []
    for (sweep, (t, y)), row in zip(((s, d) for s, d in zip(protocol.sweeps, data, strict=True)
                                     if s.pulses), table, strict=True):
        pulse = sweep.pulses[0]
        p, _ = peak(t, y, start_ms=_onset(pulse), end_ms=math.inf, baseline_pA=row[3],
                    sign=sign)
        rows.append([row[0], _finite(p), row[2]])
    conc = np.array([r[0] for r in rows])
    peaks = np.array([r[1] for r in rows])
    sss = np.array([r[2] for r in rows])
    highest = rows[int(np.argmax(conc))]
    out: dict[str, Any] = {"peak_pA": highest[1], "dose_response": rows}
    why: dict[str, str] = {}
    for column, values in (("peak", peaks), ("ss", sss)):
        fit = fit_hill(conc, sign * values)
        ec50_ci, hill_ci, reason = hill_interval(conc, sign * values, fit)
        ec50_key, hill_key = f"ec50_{column}_mM", f"hill_{column}"
        out.update({ec50_key: _finite(fit.ec50_mM), hill_key: _finite(fit.hill),
                    f"{ec50_key}_ci": [_finite(v) for v in ec50_ci],
                    f"{hill_key}_ci": [_finite(v) for v in hill_ci]})
        if column == "ss" and unsteady:
            reason = ("not determined: no steady state at " + ", ".join(
                f"{c:g} mM (still changing by {100 * d:.2g} % over the last "
                f"{100 * STEADY_STATE_FRACTION:g} % of the pulse)" for c, d in unsteady))
        if reason is not None and math.isfinite(fit.ec50_mM):
            why[ec50_key] = why[hill_key] = reason
            out[ec50_key] = out[hill_key] = NAN
    if why:
        out["not_determined"] = why
    return out


def _per_sweep(protocol: Protocol, data: list[tuple[np.ndarray, np.ndarray]]
               ) -> dict[str, Any]:
    peaks, times = [], []
    for sweep, (t, y) in zip(protocol.sweeps, data, strict=True):
        starts = _stimulus_starts(sweep)
        first = starts[0] if starts else 0.0
        onset = min([_onset(p) for p in sweep.pulses] + [first]) if starts else -math.inf
        base = baseline(t, y, onset)
        p, tp = peak(t, y, start_ms=onset, baseline_pA=base)
        peaks.append(_finite(p))
        times.append(_finite(tp - first))
    return {"peak_pA": peaks, "time_to_peak_ms": times}
