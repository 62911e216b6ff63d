"""Curve fits of features: exponential decays (one or two, by an F-test), recovery from
desensitization, and Hill dose-response curves with bootstrap intervals.

Like :mod:`kingen.experiment.features`, which measures currents with them, they know
nothing of models, and a fit that cannot be made gives NaN fields, never an error.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from kingen.experiment.measures import (
    NAN,
    baseline,
    edge_half_width,
    finite_ratio,
    finite_xy,
    peak,
    response_sign,
)
from kingen.experiment.protocol import Pulse

# Two exponentials are kept only if they cut the residual sum of squares by this factor ...
TWO_EXP_MIN_SSE_RATIO = 0.9


# ... and the extra parameters pass an F-test at this level.
TWO_EXP_F_ALPHA = 0.01

# ... and neither time constant is over this many times the fitted window's length.
MAX_TAU_OVER_WINDOW = 10.0


# Below this relative residual a fit is exact to rounding; adding terms then fits noise.
_EXACT_RELATIVE_SSE = 1e-20


# Residual bootstrap of dose-response fits: resamples, seed (reproducible), interval level.
BOOTSTRAP_RESAMPLES = 200


BOOTSTRAP_SEED = 0


BOOTSTRAP_LEVEL = 0.95


_FIT_ERRORS = (ValueError, RuntimeError, FloatingPointError, np.linalg.LinAlgError,
               OverflowError, ZeroDivisionError)


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
        parameters gives p < 0.01, both components decay in the same direction
        (otherwise the "weighted" tau would mix a rise into a decay), and neither time
        constant is over ten times the window (a constant the data cannot tell apart).
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
    t, y = finite_xy(time_ms, current)
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
            best = two if n_exp == 2 else _choose(one, two, y_scaled, t.size, offset,
                                                  float(t[-1]))
    except _FIT_ERRORS:
        return DecayFit(NAN)
    if not best.ok:
        return DecayFit(NAN)
    return DecayFit(best.tau_ms, best.taus_ms, tuple(a * scale for a in best.amplitudes),
                    best.offset * scale, best.n_exp, best.sse * scale ** 2)


def _choose(one: DecayFit, two: DecayFit, y: np.ndarray, n: int, offset: bool,
            window_ms: float) -> DecayFit:
    """One exponential unless two are clearly better (see :func:`fit_decay`)."""
    if not two.ok:
        return one
    if not one.ok:
        return two
    same_direction = all(a * sum(two.amplitudes) > 0 for a in two.amplitudes)
    if not same_direction:
        return one
    # A component far slower than the window is a constant the data cannot tell from a
    # decay (a residual offset, a slow tail cut off by the sweep's end): its "time
    # constant" would swamp the weighted tau.
    if max(two.taus_ms) > MAX_TAU_OVER_WINDOW * window_ms:
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
    t, y = finite_xy(time_ms, current)
    on1 = first.start - edge_half_width(first.rise)
    on2 = second.start - edge_half_width(second.rise)
    base = baseline(t, y, on1)
    i1, _ = peak(t, y, start_ms=on1, end_ms=on2, baseline_pA=base)
    before = y[t < on2]
    if before.size == 0 or not math.isfinite(i1):
        return NAN, i1, NAN
    sign = 1.0 if i1 > 0 else -1.0
    i2, _ = peak(t, y, start_ms=on2, end_ms=end_ms, baseline_pA=float(before[-1]), sign=sign)
    return finite_ratio(i2, i1), i1, i2


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
    x, r = finite_xy(interval_ms, ratio)
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
    c, y = finite_xy(concentration_mM, response)
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

    The sign of each row is taken from its largest ``|value|``; ``top`` is solved in closed form
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
    c, y = finite_xy(concentration_mM, response)
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
