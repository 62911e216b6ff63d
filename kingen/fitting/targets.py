"""Summary targets: the kernel windows of each sweep, and the model's features from them.

Summary targets (:class:`~kingen.experiment.recordings.Targets`) are mapped onto kernel
windows of each sweep (op 0: the sample of largest ``|g|`` in a range, op 1: the sum over a range):

- peak: largest ``|g|`` from the pulse's onset to the next pulse's onset (or the sweep's end),
  minus the resting current (the first sample); time to peak from the pulse's 50 % rise;
- steady state: the mean over the last 5 % of the pulse before its decay edge;
- τ_deact and τ_des by the integral method, τ = ∫(I − I_ss) dt / (I_0 − I_ss), which equals
  the amplitude-weighted τ of a multi-exponential decay: τ_deact from the end of the pulse's
  decay edge (I_ss = the resting current), τ_des from the peak to the pulse's decay edge
  (I_ss = the steady state; the area of the rising phase, onset to peak, is taken as a
  triangle);
- recovery ratio of a paired pulse: (peak 2 − the current just before pulse 2) / peak 1;
  τ_rec by fitting 1 − (1 − r0)·exp(−Δt/τ) to the ratios (log-spaced grid with parabolic
  refinement, vectorised over candidates);
- dose-response tables: per-sweep peak and steady state, matched to the table's
  concentrations; EC50 and Hill coefficient by a vectorised grid fit of top/(1 + (EC50/c)^n).

A target's error is ((model − target) / scale)² with scale the target's ``sd`` when given,
else ``|target|`` (a relative error); recovery ratios use scale 1 and dose-response columns the
largest ``|value|`` of their column. The target error of a protocol is the weighted mean over
its targets. Current-valued targets scale with A: without a recording, A is solved by
weighted least squares over them (or fixed by the configuration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kingen.codegen import N_WINDOWS
from kingen.errors import KingenError
from kingen.experiment.features import STEADY_STATE_FRACTION, edge_half_width, fit_hill_batch
from kingen.experiment.protocol import Sweep
from kingen.experiment.recordings import Targets

OP_NONE, OP_PEAK, OP_SUM = -1, 0, 1
# Window slots of a sweep: peak of pulse 1, sum (area) or peak of pulse 2, steady state or
# the sample before pulse 2, resting current.
W_PEAK, W_AREA, W_SS, W_BASE = 0, 1, 2, 3
W_PEAK2, W_PRE2 = 1, 2
# Features each protocol kind can be fitted to
# (keys of kingen.experiment.features.protocol_features).
TARGET_KEYS = {
    "deactivation": ("peak_pA", "time_to_peak_ms", "tau_deact_ms"),
    "desensitization": ("peak_pA", "time_to_peak_ms", "ss_to_peak", "end_to_peak",
                        "tau_des_ms"),
    "recovery": ("peak_pA", "time_to_peak_ms", "tau_rec_ms"),
    "dose_response": ("peak_pA", "ec50_peak_mM", "hill_peak", "ec50_ss_mM", "hill_ss"),
}
_CURRENT_KEYS = ("peak_pA",)


@dataclass
class Target:
    key: str           # feature key, "recovery[i]", "dose_peak[i]" or "dose_ss[i]"
    value: float
    scale: float
    weight: float
    current: bool      # scales with the amplitude
    sweep: int = -1    # sweep index inside the protocol, for table entries


def _sample_at_or_after(t: float, dt: float, n: int) -> int:
    return int(min(max(math.ceil(t / dt - 1e-9), 0), n - 1))


def _sample_at_or_before(t: float, dt: float, n: int) -> int:
    return int(min(max(math.floor(t / dt + 1e-9), 0), n - 1))


def onset(sweep: Sweep, i: int) -> float:
    p = sweep.pulses[i]
    return p.start - edge_half_width(p.rise)


def _stop(sweep: Sweep, i: int) -> float:
    p = sweep.pulses[i]
    return p.end - edge_half_width(p.decay)


def sweep_windows(sweep: Sweep, kind: str) -> np.ndarray:
    """The four kernel windows (first sample, last sample, op) of one sweep for ``kind``."""
    n, dt = sweep.n_samples, sweep.dt
    win = np.full((N_WINDOWS, 3), 0, dtype=np.int64)
    win[:, 2] = OP_NONE
    win[W_BASE] = (0, 0, OP_PEAK)
    if not sweep.pulses:
        return win
    on = _sample_at_or_after(onset(sweep, 0), dt, n)
    last = n - 1
    if kind == "recovery" and len(sweep.pulses) >= 2:
        on2_t = onset(sweep, 1)
        on2 = _sample_at_or_after(on2_t, dt, n)
        end2 = (_sample_at_or_before(onset(sweep, 2), dt, n) if len(sweep.pulses) > 2
                else last)
        pre2 = max(_sample_at_or_after(on2_t, dt, n) - 1, 0)
        win[W_PEAK] = (on, _sample_at_or_before(on2_t, dt, n), OP_PEAK)
        win[W_PEAK2] = (on2, end2, OP_PEAK)
        win[W_PRE2] = (pre2, pre2, OP_PEAK)
        return win
    stop_peak = (_sample_at_or_before(onset(sweep, 1), dt, n) if len(sweep.pulses) > 1
                 else last)
    stop = _sample_at_or_before(_stop(sweep, 0), dt, n)
    pulse = sweep.pulses[0]
    ss_begin = _sample_at_or_after(_stop(sweep, 0) - STEADY_STATE_FRACTION * pulse.duration,
                                   dt, n)
    if kind == "desensitization":
        win[W_PEAK] = (on, stop, OP_PEAK)
        win[W_AREA] = (on, stop, OP_SUM)
    elif kind == "deactivation":
        # As kingen.experiment.features: the decay is measured once the agonist is gone (the end of
        # the decay edge), where the current is its value at that sample.
        after = _sample_at_or_after(pulse.end + edge_half_width(pulse.decay), dt, n)
        win[W_PEAK] = (on, stop_peak, OP_PEAK)
        win[W_AREA] = (after, stop_peak, OP_SUM)
        win[W_SS] = (after, after, OP_PEAK)
        return win
    else:
        win[W_PEAK] = (on, stop_peak, OP_PEAK)
        win[W_AREA] = (on, stop_peak, OP_SUM)
    win[W_SS] = (ss_begin, max(stop, ss_begin), OP_SUM)
    return win


def host_windows(traces: np.ndarray, sample_start: np.ndarray, windows: np.ndarray
                 ) -> np.ndarray:
    """Window values computed on the host from traces, as the kernel computes them.

    Returns (N, n_sweeps, 4, 2): value and sample index (peak) per window.
    """
    n = traces.shape[0]
    out = np.zeros((n, windows.shape[0], N_WINDOWS, 2))
    out[..., 1] = -1
    for k in range(windows.shape[0]):
        base = sample_start[k]
        for q in range(N_WINDOWS):
            a, b, op = windows[k, q]
            if op == OP_NONE:
                continue
            seg = traces[:, base + a: base + b + 1]
            if op == OP_PEAK:
                i = np.argmax(np.abs(seg), axis=1)
                out[:, k, q, 0] = seg[np.arange(n), i]
                out[:, k, q, 1] = a + i
            else:
                out[:, k, q, 0] = seg.sum(axis=1)
    return out


def switched_off(windows: np.ndarray) -> np.ndarray:
    """Kernel windows with op −1: a protocol no summary target reads has its windows
    reduced by no kernel (a fit to recordings carries only the two sums per pair)."""
    off = windows.copy()
    off[:, :, 2] = -1
    return off


class ProtocolPlan:
    """Everything one protocol needs to turn window values into target errors."""

    def __init__(self, item: Any, first_sweep: int) -> None:
        self.item = item
        self.protocol = item.protocol
        self.first = first_sweep
        self.kind = self.protocol.kind
        self.targets: list[Target] = []
        self.windows = np.stack([sweep_windows(s, self.kind) for s in self.protocol.sweeps])
        if item.targets is not None:
            self._compile_targets(item.targets)

    # ------------------------------------------------------------------ targets
    def _error(self, message: str, field: str, value: Any = None) -> KingenError:
        return KingenError(message, file=self.item.source,
                           field=f"protocols.{self.protocol.name}.{field}", value=value)

    def _compile_targets(self, targets: Targets) -> None:
        allowed = TARGET_KEYS.get(self.kind)
        if allowed is None:
            raise self._error(f"summary targets are not supported for a protocol of kind "
                              f"'{self.kind}' (use a recording)", "targets", self.kind)
        sweeps = self.protocol.sweeps
        for key, t in targets.features.items():
            if key not in allowed:
                raise self._error(f"feature not available for a {self.kind} protocol "
                                  f"(use {', '.join(allowed)})", "targets", key)
            scale = t.sd if t.sd else abs(t.value)
            if not scale > 0:
                raise self._error("target of 0 needs an sd (its relative error is undefined)",
                                  "targets", key)
            self.targets.append(Target(key, float(t.value), float(scale), float(t.weight),
                                        key in _CURRENT_KEYS))
        xs = self.protocol.x_values()
        if targets.recovery is not None:
            if self.kind != "recovery":
                raise self._error("a recovery table needs a recovery protocol", "targets",
                                  self.kind)
            for dt_ms, ratio in zip(targets.recovery.interval_ms, targets.recovery.ratio,
                                    strict=True):
                k = self._match(xs, float(dt_ms), "interval", "ms")
                self.targets.append(Target(f"recovery[{sweeps[k].label}]", float(ratio),
                                            1.0, 1.0, False, k))
        if targets.dose_response is not None:
            if self.kind != "dose_response":
                raise self._error("a dose-response table needs a dose_response protocol",
                                  "targets", self.kind)
            d = targets.dose_response
            columns = [("dose_peak", d.peak_pA)]
            if d.ss_pA is not None:
                columns.append(("dose_ss", d.ss_pA))
            for name, col in columns:
                finite = np.asarray(col, dtype=float)
                scale = float(np.nanmax(np.abs(finite))) if finite.size else 0.0
                if not scale > 0:
                    raise self._error("dose-response column is all zero", "targets", name)
                for c, v in zip(d.concentration_mM, finite, strict=True):
                    if not math.isfinite(v):
                        continue
                    k = self._match(xs, float(c), "concentration", "mM")
                    self.targets.append(Target(f"{name}[{sweeps[k].label}]", float(v), scale,
                                                1.0, True, k))
        if not self.targets:
            raise self._error("the targets give nothing to fit", "targets")

    def _match(self, xs: np.ndarray, x: float, what: str, unit: str) -> int:
        close = np.flatnonzero(np.isclose(xs, x, rtol=1e-6, atol=1e-12))
        if close.size == 0:
            have = ", ".join(f"{v:g}" for v in xs if math.isfinite(v))
            raise self._error(f"no sweep of the protocol has this {what} (it has {have} "
                              f"{unit})", "targets", f"{x:g} {unit}")
        return int(close[0])

    # ------------------------------------------------------------------ model features
    def model_values(self, win: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Model values of every target, one-channel units, (N, n_targets); and a mask of
        targets that scale with the amplitude."""
        n = win.shape[0]
        sweeps = self.protocol.sweeps
        w = win[:, self.first: self.first + len(sweeps)]  # (N, S, 4, 2)
        cols = []
        cache: dict[str, np.ndarray] = {}

        def feat(key: str) -> np.ndarray:
            if key not in cache:
                cache[key] = self._feature(key, w, cache)
            return cache[key]

        for t in self.targets:
            if t.sweep >= 0:
                name = t.key.split("[")[0]
                cols.append(feat(name)[:, t.sweep])
            else:
                cols.append(feat(t.key))
        values = np.column_stack(cols) if cols else np.zeros((n, 0))
        return values, np.array([t.current for t in self.targets], dtype=bool)

    def _feature(self, key: str, w: np.ndarray, cache: dict[str, np.ndarray]) -> np.ndarray:
        sweeps = self.protocol.sweeps
        base = w[:, :, W_BASE, 0]
        peak = w[:, :, W_PEAK, 0] - base
        with np.errstate(all="ignore"):
            if key == "peak_pA":
                if self.kind == "dose_response":
                    x = self.protocol.x_values()
                    k = int(np.nanargmax(np.where(np.isfinite(x), x, -np.inf))) if np.isfinite(
                        x).any() else len(sweeps) - 1
                    return peak[:, k]
                return peak[:, 0]
            s0 = sweeps[0]
            if key == "time_to_peak_ms":
                return w[:, 0, W_PEAK, 1] * s0.dt - s0.pulses[0].start
            if key in ("ss", "dose_ss"):
                n_ss = np.array([wi[W_SS, 1] - wi[W_SS, 0] + 1 for wi in self.windows])
                return w[:, :, W_SS, 0] / n_ss - base
            if key == "dose_peak":
                return peak
            if key in ("ss_to_peak", "end_to_peak"):  # one window: the pulse's end
                ss = cache.setdefault("ss", self._feature("ss", w, cache))
                return ss[:, 0] / peak[:, 0]
            if key in ("tau_deact_ms", "tau_des_ms"):
                win = self.windows[0]
                dt = s0.dt
                n_area = win[W_AREA, 1] - win[W_AREA, 0] + 1
                area = (w[:, 0, W_AREA, 0] - base[:, 0] * n_area) * dt
                if key == "tau_deact_ms":
                    start = w[:, 0, W_SS, 0] - base[:, 0]
                    # trapezoid: the first sample counts half
                    return (area - 0.5 * start * dt) / start
                on_t = win[W_AREA, 0] * dt
                t_peak = w[:, 0, W_PEAK, 1] * dt
                after_peak = area - 0.5 * (t_peak - on_t) * peak[:, 0]
                ss = cache.setdefault("ss", self._feature("ss", w, cache))[:, 0]
                end_t = win[W_AREA, 1] * dt
                return (after_peak - ss * (end_t - t_peak)) / (peak[:, 0] - ss)
            if key == "recovery":
                pre = w[:, :, W_PRE2, 0]
                return (w[:, :, W_PEAK2, 0] - pre) / peak
            if key == "tau_rec_ms":
                ratios = cache.setdefault("recovery", self._feature("recovery", w, cache))
                x = self.protocol.x_values()
                return fit_recovery_batch(x, ratios)
            if key in ("ec50_peak_mM", "hill_peak", "ec50_ss_mM", "hill_ss"):
                which = "peak" if "peak" in key else "ss"
                name = f"hill_fit_{which}"
                if name not in cache:
                    y = peak if which == "peak" else cache.setdefault(
                        "dose_ss", self._feature("dose_ss", w, cache))
                    cache[name] = np.stack(fit_hill_batch(self.protocol.x_values(), y))
                ec50, hill = cache[name]
                return ec50 if key.startswith("ec50") else hill
        raise KeyError(key)  # pragma: no cover - keys are validated at construction


def fit_recovery_batch(interval_ms: np.ndarray, ratios: np.ndarray) -> np.ndarray:
    """τ of r = 1 − (1 − r0)·exp(−Δt/τ) fitted to each row of ``ratios`` (N, n_intervals).

    For each τ of a log grid (1 ms to 10 s) r0 is solved in closed form; the best grid point
    is refined by a parabola in log τ. NaN where a row has non-finite ratios.
    """
    x = np.asarray(interval_ms, dtype=float)
    taus = np.logspace(0.0, 4.0, 161)
    e = np.exp(-x[None, :] / taus[:, None])                     # (G, M)
    y = 1.0 - np.asarray(ratios, dtype=float)                   # (N, M)
    ee = (e * e).sum(axis=1)                                    # (G,)
    ye = y @ e.T                                                # (N, G)
    sse = (y * y).sum(axis=1, keepdims=True) - ye * ye / ee[None, :]
    return _refine_log_grid(np.log(taus), sse)


def _refine_log_grid(log_grid: np.ndarray, sse: np.ndarray) -> np.ndarray:
    bad = ~np.all(np.isfinite(sse), axis=1)
    sse = np.where(np.isfinite(sse), sse, np.inf)
    i = np.clip(np.argmin(sse, axis=1), 1, log_grid.size - 2)
    rows = np.arange(sse.shape[0])
    a, b, c = sse[rows, i - 1], sse[rows, i], sse[rows, i + 1]
    h = log_grid[1] - log_grid[0]
    with np.errstate(all="ignore"):
        denom = a - 2 * b + c
        shift = np.where(denom > 0, 0.5 * (a - c) / denom, 0.0)
    out = np.exp(log_grid[i] + np.clip(shift, -1.0, 1.0) * h)
    out[bad] = np.nan
    return out
