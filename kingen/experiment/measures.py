"""Measures of one current: baseline, direction, peak, steady state (and whether it was
reached), rise time, and the edge width of a pulse; the building blocks of the features.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kingen.experiment.protocol import EDGE_HALF_WIDTH_SIGMAS, Pulse

NAN = float("nan")


# A 10-90 % edge spans 2 * 1.2815516 sigma of the Gaussian CDF (as in kingen.experiment.protocol).
_TEN_NINETY_SIGMAS = 2.0 * 1.2815515655446004


# Fraction of a pulse averaged for its steady state (the last 5 %, before the decay edge).
STEADY_STATE_FRACTION = 0.05


# The steady state is "not reached" when a line through the last 5 % of the pulse changes
# by more than this fraction of the steady state across that window, and significantly
# (beyond
# SS_DRIFT_SIGMAS standard errors of its slope, so that noise alone does not count).
SS_DRIFT_FRACTION = 0.01


SS_DRIFT_SIGMAS = 3.0


def finite_xy(time_ms: Any, current: Any) -> tuple[np.ndarray, np.ndarray]:
    """Float arrays of equal length with non-finite samples dropped.

    >>> finite_xy([0, 1, 2, 3], [5.0, float("nan"), 7.0])
    (array([0., 2.]), array([5., 7.]))
    """
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
    t, y = finite_xy(time_ms, current)
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
    t, y = finite_xy(time_ms, current)
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
    t, y = finite_xy(time_ms, current)
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
    t, y = finite_xy(time_ms, current)
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
    t, y = finite_xy(time_ms, current)
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


def finite_ratio(a: float, b: float) -> float:
    """``a / b``, or NaN where either is not finite or ``b`` is 0.

    >>> finite_ratio(-30.0, -120.0), finite_ratio(1.0, 0.0)
    (0.25, nan)
    """
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0.0:
        return NAN
    return float(a / b)
