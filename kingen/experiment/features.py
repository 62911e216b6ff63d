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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kingen.errors import KingenError

# the measures and curve fits these features are made of: each public name of theirs
# is importable from here too, as it was before they had modules of their own
from kingen.experiment.curvefits import (
    BOOTSTRAP_LEVEL,
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    TWO_EXP_F_ALPHA,
    TWO_EXP_MIN_SSE_RATIO,
    DecayFit,
    HillFit,
    RecoveryFit,
    fit_decay,
    fit_hill,
    fit_hill_batch,
    fit_recovery,
    hill_interval,
    hill_model,
    recovery_model,
    recovery_ratios,
)
from kingen.experiment.measures import (
    NAN,
    SS_DRIFT_FRACTION,
    SS_DRIFT_SIGMAS,
    STEADY_STATE_FRACTION,
    baseline,
    edge_half_width,
    finite_ratio,
    finite_xy,
    not_reached,
    peak,
    response_sign,
    rise_time,
    steady_state,
    steady_state_drift,
)
from kingen.experiment.protocol import Protocol, Pulse, Sweep

__all__ = [
    "NAN", "STEADY_STATE_FRACTION", "TWO_EXP_MIN_SSE_RATIO", "TWO_EXP_F_ALPHA",
    "SS_DRIFT_FRACTION", "SS_DRIFT_SIGMAS", "BOOTSTRAP_RESAMPLES", "BOOTSTRAP_SEED",
    "BOOTSTRAP_LEVEL", "DecayFit", "RecoveryFit", "HillFit", "PulseResponse",
    "edge_half_width", "baseline", "response_sign", "peak", "steady_state",
    "steady_state_drift", "not_reached", "rise_time", "fit_decay", "recovery_ratios",
    "recovery_model", "fit_recovery", "hill_model", "fit_hill", "fit_hill_batch",
    "hill_interval", "pulse_response", "protocol_features",
]

# --------------------------------------------------------------------------- results

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
    t, y = finite_xy(time_ms, current)
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
    return [finite_xy(t, y) for t, y in zip(times, rows, strict=True)]


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
        out["ss_to_peak"] = _finite(finite_ratio(ss, r.peak_pA))
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
