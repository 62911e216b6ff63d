"""What a candidate is scored on: errors per protocol against recordings and summary targets.

:class:`Objective` is built once per fit from the scheme and, per protocol, a recording
and/or summary targets. It prepares one :class:`~kingen.solve.batch.Simulator` whose kernel
reduces every (candidate, sweep) pair to Σw·g², Σw·g·d and four window values, and turns a
batch result into per-candidate, per-protocol errors.

Recordings. Each recorded sweep is resampled (``np.interp``) onto its protocol sweep's
sample grid; samples outside the recording or inside a user mask get weight 0, but a new
fit refuses a recording whose time starts after 0 (the protocol's start) unless the mask
covers the gap (:attr:`Objective.late_starts`), since it is most often a clock offset,
not a late start. The data
are compared as recorded by default (``baseline = "none"``): the model starts from rest,
where its current is that of the resting occupancies, normally 0, and a baseline estimated
from the few samples before the first pulse carries noise of its own, an offset constant
over the whole sweep that no rate can fit and that biases poorly determined rates (see the
README, "Fitting"). A recording with a real DC offset (leak) is fitted with ``baseline =
"pre-pulse"`` (one offset per protocol: the mean of every sweep's pre-pulse samples, so
its noise is that of all of them) or ``"per-sweep"`` (each sweep's own pre-pulse mean, for
a baseline that drifts between sweeps; the noisiest). With ``"none"``, a pre-pulse mean
that is clearly not 0 (more than 5 standard errors and 1 % of the largest current) is
reported in :attr:`Objective.warnings`. The amplitude A of a protocol
(number of channels: the fitted current is A × the one-channel current of the scheme) is
solved in closed form by least squares over all its sweeps, A = Σw·g·d / Σw·g², clamped
≥ 0, unless the configuration fixes it. The trace error of the protocol is the *relative
squared error*

    e_trace = Σ w (A g − d)² / Σ w d² = (Σw·d² − 2A Σw·g·d + A² Σw·g²) / Σw·d²,

0 for a perfect fit and 1 for a fit no better than zero current, whatever the number of
samples or the size of the current, so that protocols of different size are comparable.

A protocol's recording chain (:class:`~kingen.experiment.chain.Chain`) passes g through the
recording's filter inside the kernel, before every sum and window, and may fit the
amplitude per sweep or with a linear rundown, and an offset per sweep or per protocol:
A_k·g + c_k, solved jointly in closed form from the kernel's Σw·g², Σw·g·d and Σw·g
(:func:`solve_scales`); e_trace is then Σ w (A_k g + c_k − d)² / Σ w d².

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

A protocol's error is e_trace + e_targets (whichever it has); a candidate's fitness is
Σ_p weight_p · error_p. A candidate that fails in any sweep (``fail`` ≠ 0) gets fitness +inf
and its failure code; the rest of the batch is unaffected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from kingen.codegen import FAIL_NONFINITE, N_WINDOWS
from kingen.errors import KingenError
from kingen.experiment.chain import Chain, check_filter
from kingen.experiment.features import (
    STEADY_STATE_FRACTION,
    baseline,
    edge_half_width,
    fit_hill_batch,
)
from kingen.experiment.protocol import Protocol, Sweep
from kingen.experiment.recordings import Recording, Targets
from kingen.model.scheme import Scheme
from kingen.solve.batch import BatchResult, ObjectiveInputs, Simulator
from kingen.solve.schedule import DEFAULT_COURANT, protocol_sweeps

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
# What ProtocolData.baseline may be (see the module docstring).
BASELINES = ("none", "pre-pulse", "per-sweep")
# With baseline = "none", a pre-pulse mean this many standard errors from 0, and at least
# this fraction of the largest recorded current, is worth a warning.
OFFSET_WARN_SE = 5.0
OFFSET_WARN_FRACTION = 0.01
_TINY = 1e-300
# Channels a recording can plausibly hold: fewer than one is no current, more than a million
# is more than a whole neuron's AMPA receptors. Outside, the current's unit is most often
# wrong (nA under a pA header, or pA under an nA header).
PLAUSIBLE_CHANNELS = (1.0, 1e6)


@dataclass
class ProtocolData:
    """One protocol of a fit and what it is compared with.

    Attributes
    ----------
    protocol
        The protocol (its sweeps set the sample grids).
    recording
        Recorded sweeps, matched to the protocol's sweeps by label, else by order.
    targets
        Summary targets.
    weight
        Weight of this protocol's error in the fitness.
    amplitude
        Fixed amplitude (number of channels); None solves it by least squares.
    mask
        Time ranges (ms, from each sweep's start) whose samples are ignored.
    baseline
        What is subtracted from the recording first (:data:`BASELINES`): ``"none"``, the
        mean pre-pulse current of all sweeps (``"pre-pulse"``) or of each sweep
        (``"per-sweep"``).
    source
        Where this protocol was configured (for error messages).
    chain
        The recording chain (:class:`~kingen.experiment.chain.Chain`): the filter the
        model current passes through before it is compared, and how amplitudes and
        offsets are fitted.
    """

    protocol: Protocol
    recording: Recording | None = None
    targets: Targets | None = None
    weight: float = 1.0
    amplitude: float | None = None
    mask: list[tuple[float, float]] = field(default_factory=list)
    baseline: str = "none"
    source: str = "<config>"
    chain: Chain = field(default_factory=Chain)


@dataclass
class Evaluation:
    """Scores of a batch of candidates.

    Attributes
    ----------
    fitness
        (N,) Σ_p weight_p · error_p; +inf for a failed candidate.
    errors
        (N, n_protocols) error per protocol (see the module docstring).
    fail
        (N,) 0 ok, else the failure code of the first failing sweep.
    amplitudes
        (N, n_protocols) amplitude (channels) per protocol; NaN where none applies. With
        an amplitude per sweep, their mean; with rundown, the first sweep's.
    sweep_amplitudes, offsets
        (N, n_sweeps) amplitude and offset (pA) of every sweep, when a protocol's chain
        fits them (None otherwise: one amplitude per protocol, no offset).
    """

    fitness: np.ndarray
    errors: np.ndarray
    fail: np.ndarray
    amplitudes: np.ndarray
    sweep_amplitudes: np.ndarray | None = None
    offsets: np.ndarray | None = None


@dataclass
class _Target:
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


def _onset(sweep: Sweep, i: int) -> float:
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
    on = _sample_at_or_after(_onset(sweep, 0), dt, n)
    last = n - 1
    if kind == "recovery" and len(sweep.pulses) >= 2:
        on2_t = _onset(sweep, 1)
        on2 = _sample_at_or_after(on2_t, dt, n)
        end2 = (_sample_at_or_before(_onset(sweep, 2), dt, n) if len(sweep.pulses) > 2
                else last)
        pre2 = max(_sample_at_or_after(on2_t, dt, n) - 1, 0)
        win[W_PEAK] = (on, _sample_at_or_before(on2_t, dt, n), OP_PEAK)
        win[W_PEAK2] = (on2, end2, OP_PEAK)
        win[W_PRE2] = (pre2, pre2, OP_PEAK)
        return win
    stop_peak = (_sample_at_or_before(_onset(sweep, 1), dt, n) if len(sweep.pulses) > 1
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


def _switched_off(windows: np.ndarray) -> np.ndarray:
    """Kernel windows with op −1: a protocol no summary target reads has its windows
    reduced by no kernel (a fit to recordings carries only the two sums per pair)."""
    off = windows.copy()
    off[:, :, 2] = -1
    return off


class _ProtocolPlan:
    """Everything one protocol needs to turn window values into target errors."""

    def __init__(self, item: ProtocolData, first_sweep: int) -> None:
        self.item = item
        self.protocol = item.protocol
        self.first = first_sweep
        self.kind = self.protocol.kind
        self.targets: list[_Target] = []
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
            self.targets.append(_Target(key, float(t.value), float(scale), float(t.weight),
                                        key in _CURRENT_KEYS))
        xs = self.protocol.x_values()
        if targets.recovery is not None:
            if self.kind != "recovery":
                raise self._error("a recovery table needs a recovery protocol", "targets",
                                  self.kind)
            for dt_ms, ratio in zip(targets.recovery.interval_ms, targets.recovery.ratio,
                                    strict=True):
                k = self._match(xs, float(dt_ms), "interval", "ms")
                self.targets.append(_Target(f"recovery[{sweeps[k].label}]", float(ratio),
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
                    self.targets.append(_Target(f"{name}[{sweeps[k].label}]", float(v), scale,
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


@numba.njit(cache=True, nogil=True)
def _recording_errors(sgg: np.ndarray, sgd: np.ndarray, spans: np.ndarray, dd: np.ndarray,
                      recorded: np.ndarray, fixed: np.ndarray, errors: np.ndarray,
                      amps: np.ndarray) -> None:
    """Add each recorded protocol's trace error to ``errors`` and set its amplitude in
    ``amps`` (both (N, n_protocols)).

    The sums over the protocol's sweeps (in sweep order), the amplitude (``fixed[p]``
    unless NaN, else least squares clamped at 0) and e_trace as in the module docstring,
    with numpy's arithmetic, row by row: as array code over 65k rows, the sums over a few
    sweeps and the temporaries cost several times as much.
    """
    for i in range(sgg.shape[0]):
        for p in range(spans.shape[0]):
            if not recorded[p]:
                continue
            s_gg, s_gd = sgg[i, spans[p, 0]], sgd[i, spans[p, 0]]
            for k in range(spans[p, 0] + 1, spans[p, 1]):
                s_gg += sgg[i, k]
                s_gd += sgd[i, k]
            if fixed[p] == fixed[p]:
                amp = fixed[p]
            else:
                amp = s_gd / s_gg if s_gg > 0 else 0.0
                amp = amp if amp >= 0.0 or amp != amp else 0.0  # np.maximum(amp, 0.0)
            sse = dd[p] - 2.0 * amp * s_gd + amp * amp * s_gg
            errors[i, p] += (sse if sse >= 0.0 or sse != sse else 0.0) / dd[p]
            amps[i, p] = amp


def solve_scales(sgg: np.ndarray, sgd: np.ndarray, sg: np.ndarray | None, sd: np.ndarray,
                 sw: np.ndarray, sdd: np.ndarray, *, amplitude: str = "per-protocol",
                 offset: str = "none", fixed: float | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Amplitudes and offsets of one protocol's K sweeps by linear least squares, in closed
    form from per-sweep sums, for N candidates at once.

    The model of sweep k is a_k·g + c_k (g the one-channel current, through the
    recording's filter), fitted to the data d with weights w; ``sgg``, ``sgd``, ``sg``
    (N, K) are Σw·g², Σw·g·d, Σw·g from the kernel, ``sd``, ``sw``, ``sdd`` (K,) the data's
    Σw·d, Σw, Σw·d². ``amplitude``: one a for all sweeps (``per-protocol``), one per sweep
    (``per-sweep``) or a_k = A·(1 + ρ·k) (``rundown``, linear in A and A·ρ); ``fixed``
    holds it at a value. ``offset``: c_k = 0 (``none``), one c for all sweeps
    (``per-protocol``) or one per sweep (``per-sweep``). A per-sweep offset is eliminated
    sweep by sweep (the sums are centred on the sweep's weighted mean); a per-protocol one
    is solved jointly with the amplitude (a 2×2 or 3×3 system, or for per-sweep
    amplitudes a scalar equation). An amplitude below 0 is clamped to 0 (the offsets then
    refitted), as for one amplitude per protocol.

    Returns
    -------
    sse, amplitudes, offsets
        (N,) Σw·(a_k·g + c_k − d)² over the sweeps (≥ 0); (N, K) a_k; (N, K) c_k.

    Examples
    --------
    Two sweeps whose data are 3·g + 5 and 2·g − 1 (g = 1, 2, 3 on each):

    >>> g = np.array([1.0, 2.0, 3.0])
    >>> sums = lambda d: ((g * g).sum(), (g * d).sum(), g.sum(), d.sum(), 3.0, (d * d).sum())
    >>> s0, s1 = sums(3 * g + 5), sums(2 * g - 1)
    >>> cols = [np.array([[a, b]]) if i < 3 else np.array([a, b]) for i, (a, b)
    ...         in enumerate(zip(s0, s1))]
    >>> sse, a, c = solve_scales(*cols, amplitude="per-sweep", offset="per-sweep")
    >>> np.round(a, 9).tolist(), np.round(c, 9).tolist(), round(float(sse[0]), 9)
    ([[3.0, 2.0]], [[5.0, -1.0]], 0.0)
    """
    G = np.asarray(sgg, dtype=np.float64)
    X = np.asarray(sgd, dtype=np.float64)
    n, K = G.shape
    S = np.zeros_like(G) if sg is None else np.asarray(sg, dtype=np.float64)
    D, W, Y = (np.asarray(v, dtype=np.float64)[None, :] for v in (sd, sw, sdd))
    k = np.arange(K, dtype=np.float64)[None, :]
    with np.errstate(all="ignore"):
        if offset == "per-protocol":
            amp, off = _with_protocol_offset(G, X, S, D, W, k, amplitude, fixed)
        else:
            has = W > 0
            inv_w = np.where(has, 1.0 / np.where(has, W, 1.0), 0.0)
            if offset == "per-sweep":
                # c_k = (Σw·d − a_k Σw·g) / Σw: what is left for a_k is the centred sums
                Gc, Xc = G - S * S * inv_w, X - S * D * inv_w
            else:
                Gc, Xc = G, X
            amp = _amplitudes(Gc, Xc, k, amplitude, fixed)
            off = (D - amp * S) * inv_w if offset == "per-sweep" else np.zeros_like(G)
        sse = (Y - 2.0 * amp * X - 2.0 * off * D + amp * amp * G + 2.0 * amp * off * S
               + off * off * W).sum(axis=1)
    return np.where(sse >= 0.0, sse, np.where(np.isnan(sse), sse, 0.0)), amp, off


def _amplitudes(G: np.ndarray, X: np.ndarray, k: np.ndarray, mode: str,
                fixed: float | None) -> np.ndarray:
    """a_k minimising Σ_k (a_k² G_k − 2 a_k X_k) for the amplitude ``mode`` (see
    :func:`solve_scales`), clamped ≥ 0."""
    if fixed is not None:
        return np.full(G.shape, float(fixed))
    if mode == "per-sweep":
        return np.maximum(np.where(G > 0, X / np.where(G > 0, G, 1.0), 0.0), 0.0)
    m0, r0 = G.sum(axis=1), X.sum(axis=1)
    a = np.maximum(np.where(m0 > 0, r0 / np.where(m0 > 0, m0, 1.0), 0.0), 0.0)
    if mode != "rundown":
        return np.repeat(a[:, None], G.shape[1], axis=1)
    m1, m2, r1 = (k * G).sum(axis=1), (k * k * G).sum(axis=1), (k * X).sum(axis=1)
    det = m0 * m2 - m1 * m1
    # one sweep (or one with data) determines no slope: then a_k = a, the plain amplitude
    ok = det > 1e-12 * m0 * m2
    safe = np.where(ok, det, 1.0)
    A = np.where(ok, (r0 * m2 - r1 * m1) / safe, a)
    B = np.where(ok, (m0 * r1 - m1 * r0) / safe, 0.0)
    neg = ~(A >= 0.0)
    A, B = np.where(neg, 0.0, A), np.where(neg, 0.0, B)
    return A[:, None] + B[:, None] * k


def _with_protocol_offset(G: np.ndarray, X: np.ndarray, S: np.ndarray, D: np.ndarray,
                          W: np.ndarray, k: np.ndarray, mode: str, fixed: float | None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Amplitudes and the one offset of a protocol, solved jointly (:func:`solve_scales`)."""
    n, K = G.shape
    sw, sd = float(W.sum()), float(D.sum())
    c_alone = sd / sw if sw > 0 else 0.0
    if fixed is not None:
        amp = np.full(G.shape, float(fixed))
    elif mode == "per-sweep":
        # a_k = (X_k − c S_k) / G_k, then c from Σ_k: c (Σw − Σ S²/G) = Σw·d − Σ S X / G
        inv_g = np.where(G > 0, 1.0 / np.where(G > 0, G, 1.0), 0.0)
        den = sw - (S * S * inv_g).sum(axis=1)
        c = np.where(den > 0, (sd - (S * X * inv_g).sum(axis=1)) / np.where(den > 0, den,
                                                                          1.0), c_alone)
        amp = np.maximum((X - c[:, None] * S) * inv_g, 0.0)
    else:
        basis = [np.ones_like(k)] + ([k] if mode == "rundown" and K > 1 else [])
        m = len(basis) + 1
        M = np.empty((n, m, m))
        r = np.empty((n, m))
        for i, bi in enumerate(basis):
            for j, bj in enumerate(basis):
                M[:, i, j] = (bi * bj * G).sum(axis=1)
            M[:, i, -1] = M[:, -1, i] = (bi * S).sum(axis=1)
            r[:, i] = (bi * X).sum(axis=1)
        M[:, -1, -1] = sw
        r[:, -1] = sd
        det = np.linalg.det(M)
        ok = np.isfinite(det) & (np.abs(det) > 1e-12 * np.abs(np.prod(
            np.diagonal(M, axis1=1, axis2=2), axis=1)))
        theta = np.zeros((n, m))
        if ok.any():
            theta[ok] = np.linalg.solve(M[ok], r[ok][..., None])[..., 0]
        theta[~ok] = 0.0
        theta[~(theta[:, 0] >= 0.0)] = 0.0  # a negative (or undefined) amplitude: none
        amp = sum(theta[:, [i]] * b for i, b in enumerate(basis))
        amp = np.broadcast_to(amp, G.shape).copy()
    # the offset that goes with these amplitudes (after any clamp)
    c = (sd - (amp * S).sum(axis=1)) / sw if sw > 0 else np.zeros(n)
    return amp, np.repeat(c[:, None], K, axis=1)


@numba.njit(cache=True, nogil=True)
def _first_failure(fail: np.ndarray) -> np.ndarray:
    """(N,) int64: each row's first nonzero failure code (by sweep), 0 if none."""
    out = np.zeros(fail.shape[0], dtype=np.int64)
    for i in range(fail.shape[0]):
        for k in range(fail.shape[1]):
            if fail[i, k] != 0:
                out[i] = fail[i, k]
                break
    return out


def solver_scheme(scheme: Scheme) -> Scheme:
    """The scheme as the solver sees it: derived rates as plain parameters.

    :meth:`Objective.guard` has already computed every derived rate and failed the
    candidates that take one outside its bounds, so the solver must not recompute them
    (``Scheme.complete`` on every candidate, every generation).
    """
    from dataclasses import replace

    params = [replace(p, derived=False) for p in scheme.parameters]
    return replace(scheme, parameters=params, derived_rules=[])


def _late_start(t: np.ndarray, t_rec: np.ndarray, masked: np.ndarray, step: float,
                rec: Recording, where: str, label: str) -> KingenError | None:
    """The error for a recorded sweep that starts after the protocol's sweep (time 0) with
    the gap unmasked, or None: its first samples would be left out of the fit without a
    word, and a clock offset would shift every recorded event against the protocol's
    pulses. A first sample one sampling interval (``step``) after 0, as some rigs export,
    is no gap."""
    if not ((t < t_rec[0] - step - 1e-9) & ~masked).any():
        return None
    start = float(t_rec[0])
    last = float(t[(t < t_rec[0] - 1e-9) & ~masked][-1])
    return KingenError(f"the recorded time starts at {start:g} ms, not at 0 ms (the "
                       f"protocol's start): the protocol's samples from 0 to {last:g} ms have "
                       "no recorded data; time 0 of a recording is the start of the "
                       "protocol's sweep: shift the time column to start at 0 if the clock is "
                       f"offset, or add mask = [[0, {start:g}]] to the protocol's entry if "
                       "the recording begins late", file=rec.source, field=f"{where}.sweep",
                       value=label)


def _refuse_all_before_the_pulses(proto: Protocol, sweeps: list[tuple[np.ndarray, np.ndarray]],
                                  rec: Recording, where: str) -> None:
    """Refuse a recording none of whose samples reach its sweep's first pulse: it holds no
    response to fit (a fit of it ends at fitness 1 with amplitude 0), and most often its
    time is in seconds under a ``time_ms`` header."""
    pulsed = [(_onset(s, 0), float(t[-1])) for s, (t, _) in zip(proto.sweeps, sweeps,
                                                                 strict=True) if s.pulses]
    if not pulsed or any(end >= onset for onset, end in pulsed):
        return
    onset, end = min(o for o, _ in pulsed), max(e for _, e in pulsed)
    likely = "check its time unit"
    for words, unit, factor in (("seconds", "s", 1e3), ("minutes", "min", 6e4)):
        if end > 0 and end * factor >= onset:
            likely = (f"its time is likely in {words} under a ms header: name the column "
                      f"time_{unit}, or give the times in ms")
            break
    raise KingenError(f"no recorded sample reaches the first pulse (at {onset:g} ms): the "
                      f"recording ends at {end:g} ms; {likely}", file=rec.source,
                      field=where)


def _sweep_order(rec: Recording, proto: Protocol, where: str) -> list[int]:
    """The recorded sweep of each protocol sweep: by label where the recording's sweeps are
    labelled (a label that names no protocol sweep is refused), by position where they are
    only numbered."""
    labels = [s.label for s in proto.sweeps]
    recorded = rec.sweep_labels
    # by label only where labels name one sweep each: with a repeat (a protocol built in
    # Python), .index would give one recorded sweep to both protocol sweeps
    unique = len(set(labels)) == len(labels) and len(set(recorded)) == len(recorded)
    if rec.n_sweeps != proto.n_sweeps:
        raise KingenError(f"{rec.n_sweeps} recorded sweeps for a protocol of "
                          f"{proto.n_sweeps} ({', '.join(labels)})",
                          file=rec.source, field=where, value=proto.name)
    if rec.labelled and unique:
        stray = [lab for lab in recorded if lab not in labels]
        if stray:
            raise KingenError(
                f"this sweep label names no sweep of protocol '{proto.name}' (recorded: "
                f"{', '.join(recorded)}; protocol: {', '.join(labels)}): labelled sweeps "
                "are paired by label, so label each with its protocol sweep's label",
                file=rec.source, field=f"{where}.sweep", value=stray[0])
    if unique and sorted(recorded) == sorted(labels):
        return [recorded.index(lab) for lab in labels]
    return list(range(proto.n_sweeps))


class Objective:
    """Errors per protocol for batches of candidates.

    Parameters
    ----------
    scheme
        The scheme (with the fit's overrides applied).
    items
        One :class:`ProtocolData` per protocol.
    backend, precision, step, courant
        Passed to :class:`~kingen.solve.batch.Simulator`.

    Raises
    ------
    KingenError
        If a recording does not match its protocol's sweeps, holds no usable sample, or a
        target cannot be mapped onto the protocol.
        A recorded sweep that starts after 0 with the gap unmasked is no error here: it
        is listed in ``late_starts``, which a new fit (:func:`kingen.fit`) refuses.

    Examples
    --------
    Score two candidates (the demo model's own rates, twice) against the demo's data:

    >>> import kingen, numpy as np
    >>> cfg = kingen.load_config(kingen.demo_config())
    >>> objective = kingen.Objective(cfg.scheme, cfg.protocols, backend="cpu")
    >>> objective.names
    ['deactivation', 'desensitization', 'recovery', 'dose_response']
    >>> evaluation, _ = objective.evaluate(np.stack([cfg.scheme.values] * 2))
    >>> evaluation.fitness.shape, evaluation.errors.shape, evaluation.fail.tolist()
    ((2,), (2, 4), [0, 0])
    """

    def __init__(self, scheme: Scheme, items: list[ProtocolData], *, backend: str = "auto",
                 precision: str = "float64", step: float | None = None,
                 courant: float = DEFAULT_COURANT) -> None:
        if not items:
            raise KingenError("no protocols to fit", field="protocols")
        self.scheme = scheme
        self.items = list(items)
        self.protocols = [it.protocol for it in items]
        self.names = [p.name for p in self.protocols]
        sweeps, self.spans = protocol_sweeps(self.protocols)
        self.sample_start = np.concatenate(
            [[0], np.cumsum([s.n_samples for s in sweeps])]).astype(np.int64)
        n = int(self.sample_start[-1])
        self.data = np.zeros(n)
        self.weight = np.zeros(n)
        self.plans: list[_ProtocolPlan] = []
        self.warnings: list[str] = []
        # recorded sweeps that start after 0 with the gap unmasked: a new fit refuses them
        # (kingen.fit); a run that has one is still resumed, profiled and read
        self.late_starts: list[KingenError] = []
        windows = []
        for item, (a, _) in zip(self.items, self.spans, strict=True):
            plan = _ProtocolPlan(item, a)
            self.plans.append(plan)
            windows.append(plan.windows if plan.targets else _switched_off(plan.windows))
            if item.recording is not None:
                self._place_recording(item, a)
            elif item.targets is None:
                raise KingenError("nothing to fit: give a recording or targets",
                                  file=item.source,
                                  field=f"protocols.{item.protocol.name}")
        self.windows = np.concatenate(windows).astype(np.int64)
        self.dd = np.array([float((self.weight[self._slice(p)] * self.data[self._slice(p)] ** 2)
                                  .sum()) for p in range(len(self.items))])
        # the data's own sums per sweep, for amplitudes and offsets fitted per sweep
        wd = self.weight * self.data
        self.sweep_sd = np.add.reduceat(wd, self.sample_start[:-1])
        self.sweep_sw = np.add.reduceat(self.weight, self.sample_start[:-1])
        self.sweep_sdd = np.add.reduceat(wd * self.data, self.sample_start[:-1])
        filters = [self._chain_filter(item) for item in self.items]
        for item, dd in zip(self.items, self.dd, strict=True):
            # the errors are relative to the data's own size: data of size 0 has none
            if item.recording is not None and not (np.finfo(float).tiny <= dd < math.inf):
                raise KingenError("the recorded current is zero throughout, or too small or "
                                  "large to square (beyond 1e±154 pA): check its unit",
                                  file=item.recording.source,
                                  field=f"protocols.{item.protocol.name}")
        for p, item in enumerate(self.items):
            if item.recording is not None and self.one_channel_pA(p) > 0:
                peak = float(np.max(np.abs(self.data[self._slice(p)])))
                self.warnings += self._size_warnings(p, peak / self.one_channel_pA(p),
                                                     f"the largest recorded current, {peak:.3g} "
                                                     "pA, is that of fully open")
        self.proto_weight = np.array([it.weight for it in self.items], dtype=float)
        self.derived = np.array([p.derived for p in scheme.parameters], dtype=bool)
        sum_g = any(not self._plain(p) and item.chain.offset != "none"
                    for p, item in enumerate(self.items))
        self.simulator = Simulator(solver_scheme(scheme), self.protocols, backend=backend,
                                   precision=precision, step=step, courant=courant,
                                   objective=ObjectiveInputs(self.data, self.weight,
                                                             self.windows, sum_g),
                                   filters=filters)
        if not np.array_equal(self.simulator.schedule.sample_start, self.sample_start):
            raise RuntimeError("sample grids of the objective and the schedule differ")

    # ------------------------------------------------------------------ the chain
    def _chain_filter(self, item: ProtocolData) -> Any:
        """The protocol's filter, checked against its sweeps; the chain's amplitude and
        offset need a recording to be fitted to."""
        chain, where = item.chain, f"protocols.{item.protocol.name}"
        if item.recording is None and chain.offset != "none":
            raise KingenError("an offset is fitted to a recording: this protocol has none",
                              file=item.source, field=f"{where}.offset", value=chain.offset)
        if item.recording is None and chain.amplitude != "per-protocol":
            raise KingenError("amplitudes per sweep are fitted to a recording: this protocol "
                              "has none", file=item.source, field=f"{where}.amplitude",
                              value=chain.amplitude)
        if item.amplitude is not None and chain.amplitude != "per-protocol":
            raise KingenError("a fixed amplitude is one number for the protocol",
                              file=item.source, field=f"{where}.amplitude",
                              value=chain.amplitude)
        if chain.filter is not None:
            check_filter(chain.filter, [s.dt for s in item.protocol.sweeps], file=item.source,
                         field=f"{where}.filter")
        return chain.filter

    def _plain(self, p: int) -> bool:
        """Protocol ``p``'s trace error takes one amplitude and no offset."""
        chain = self.items[p].chain
        return chain.offset == "none" and chain.amplitude == "per-protocol"

    def _scales(self, p: int, sgg: np.ndarray, sgd: np.ndarray, sg: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sse, amplitudes, offsets) of protocol ``p`` from its sweeps' sums (N, K):
        :func:`solve_scales` with its chain."""
        a, b = self.spans[p]
        item = self.items[p]
        return solve_scales(sgg, sgd, sg, self.sweep_sd[a:b], self.sweep_sw[a:b],
                            self.sweep_sdd[a:b], amplitude=item.chain.amplitude,
                            offset=item.chain.offset, fixed=item.amplitude)

    def _protocol_amplitude(self, p: int, amp: np.ndarray) -> np.ndarray:
        """The one amplitude a protocol reports (and its current-valued targets use) from
        its sweeps' (N, K): their mean when fitted per sweep, else the first sweep's."""
        return amp.mean(axis=1) if self.items[p].chain.amplitude == "per-sweep" else amp[:, 0]

    def _sample_scales(self, p: int, traces: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Amplitude and offset of every sample of protocol ``p`` (N, samples), fitted to
        ``traces`` (all sweeps, finite), and the protocol's amplitude (N,)."""
        a, b = self.spans[p]
        starts = self.sample_start[a:b + 1] - self.sample_start[a]
        g = traces[:, self._slice(p)]
        w, d = self.weight[self._slice(p)], self.data[self._slice(p)]
        sgg = np.add.reduceat(g * g * w, starts[:-1], axis=1)
        sgd = np.add.reduceat(g * (w * d), starts[:-1], axis=1)
        sg = np.add.reduceat(g * w, starts[:-1], axis=1)
        _, amp, off = self._scales(p, sgg, sgd, sg)
        sizes = np.diff(starts)
        return (np.repeat(amp, sizes, axis=1), np.repeat(off, sizes, axis=1),
                self._protocol_amplitude(p, amp))

    # ------------------------------------------------------------------ data placement
    def _slice(self, p: int) -> slice:
        a, b = self.spans[p]
        return slice(int(self.sample_start[a]), int(self.sample_start[b]))

    def _place_recording(self, item: ProtocolData, first: int) -> None:
        rec = item.recording
        proto = item.protocol
        where = f"protocols.{proto.name}.recording"
        order = _sweep_order(rec, proto, where)
        if item.baseline not in BASELINES:
            raise KingenError(f"must be one of {', '.join(BASELINES)}", file=item.source,
                              field=f"protocols.{proto.name}.baseline", value=item.baseline)
        sweeps = []
        for j in order:
            t_rec = np.asarray(rec.sweep_time(j), dtype=float)
            y_rec = np.asarray(rec.sweep_current(j), dtype=float)
            ok = np.isfinite(t_rec) & np.isfinite(y_rec)
            t_rec, y_rec = t_rec[ok], y_rec[ok]
            if t_rec.size < 2:
                raise KingenError("sweep has fewer than 2 samples", file=rec.source,
                                  field=f"{where}.sweep", value=rec.sweep_labels[j])
            sweeps.append((t_rec, y_rec))
        _refuse_all_before_the_pulses(proto, sweeps, rec, where)
        offset = self._offset(item, sweeps, where)
        total = 0
        short: list[tuple[str, float, float]] = []  # recorded sweeps that end early
        for k, (sweep, (t_rec, y_rec)) in enumerate(zip(proto.sweeps, sweeps, strict=True)):
            if item.baseline == "per-sweep" and sweep.pulses:
                y_rec = y_rec - baseline(t_rec, y_rec, _onset(sweep, 0))
            elif offset:
                y_rec = y_rec - offset
            t = sweep.times()
            d = np.interp(t, t_rec, y_rec)
            w = ((t >= t_rec[0] - 1e-9) & (t <= t_rec[-1] + 1e-9)).astype(float)
            masked = np.zeros(t.size, dtype=bool)
            for lo, hi in item.mask:
                masked |= (t >= lo) & (t <= hi)
            w[masked] = 0.0
            # one sampling interval, the recording's or the protocol's, is no gap at either end
            step = max(float(t_rec[1] - t_rec[0]), float(t[1] - t[0]) if t.size > 1 else 0.0)
            late = _late_start(t, t_rec, masked, step, rec, where, rec.sweep_labels[order[k]])
            if late is not None:
                self.late_starts.append(late)
            if ((t > t_rec[-1] + step + 1e-9) & ~masked).any():
                short.append((rec.sweep_labels[order[k]], float(t_rec[-1]), float(t[-1])))
            s = slice(int(self.sample_start[first + k]), int(self.sample_start[first + k + 1]))
            self.data[s] = np.where(w > 0, d, 0.0)
            self.weight[s] = w
            total += int(w.sum())
        if total == 0:
            raise KingenError("no recorded sample falls on the protocol's sweeps (check "
                              "time units and the mask)", file=rec.source, field=where)
        if short:
            label, end, last = short[0]
            first_end = min(e for _, e, _ in short)
            self.warnings.append(
                f"note: {rec.source}: {where}: {len(short)} of {proto.n_sweeps} recorded "
                f"sweeps end before the protocol's sweep (the first, {label!r}, at {end:g} "
                f"of {last:g} ms): the protocol's samples after a recording's end are not "
                "fitted; check the time unit and the protocol's durations, or add mask = "
                f"[[{first_end:g}, {max(t for _, _, t in short):g}]] to the protocol's entry "
                "to say so")
        if not np.any(self.data[self._slice(len(self.plans) - 1)] != 0):
            raise KingenError("the recording is all zero", file=rec.source, field=where)

    def _offset(self, item: ProtocolData, sweeps: list[tuple[np.ndarray, np.ndarray]],
                where: str) -> float:
        """The offset ``"pre-pulse"`` subtracts from every sweep (0 otherwise); with
        ``"none"``, a warning in :attr:`warnings` when the pre-pulse mean is clearly not 0."""
        if item.baseline == "per-sweep":
            return 0.0
        pre = [y[t < _onset(s, 0)] for s, (t, y) in zip(item.protocol.sweeps, sweeps,
                                                        strict=True) if s.pulses]
        pre_all = np.concatenate(pre) if pre else np.zeros(0)
        if pre_all.size == 0:
            return 0.0
        mean = float(pre_all.mean())
        if item.baseline == "pre-pulse":
            return mean
        if pre_all.size >= 3 and item.chain.offset == "none":  # a fitted offset takes it
            se = float(pre_all.std(ddof=1)) / math.sqrt(pre_all.size)
            largest = max(float(np.max(np.abs(y - mean))) for _, y in sweeps)
            if abs(mean) > OFFSET_WARN_SE * se and abs(mean) > OFFSET_WARN_FRACTION * largest:
                self.warnings.append(
                    f"warning: {item.source}: {where}: the current before the first pulse "
                    f"averages {mean:.4g} pA ({abs(mean) / max(se, _TINY):.3g} standard errors "
                    f"from 0, {100 * abs(mean) / largest:.3g} % of the largest current), which "
                    f"the model, starting from rest, cannot fit; set baseline = \"pre-pulse\" "
                    f"if it is a DC offset")
        return 0.0

    # ------------------------------------------------------------------ current size
    def one_channel_pA(self, p: int) -> float:
        """The current of one channel fully open under protocol ``p``, pA (the largest
        conductance of the scheme at the sweeps' largest driving force)."""
        drive = max((abs(s.holding - s.reversal) for s in self.items[p].protocol.sweeps),
                    default=0.0)
        return float(np.max(self.scheme.conductance)) * drive * 1e-3

    def _size_warnings(self, p: int, channels: float, what: str) -> list[str]:
        """A warning naming the likely unit where ``channels`` (fully open channels the
        current of protocol ``p`` takes) is outside :data:`PLAUSIBLE_CHANNELS`."""
        lo, hi = PLAUSIBLE_CHANNELS
        # no channel passes a current at the reversal potential: no size to judge
        if not math.isfinite(channels) or lo <= channels <= hi or not self.one_channel_pA(p):
            return []
        item = self.items[p]
        source = item.recording.source if item.recording is not None else item.source
        likely = ("is the current in nA under a current_pA header?" if channels < lo else
                  "is the current in pA under a current_nA header?")
        return [f"warning: {source}: protocols.{item.protocol.name}: {what} {channels:.3g} "
                f"channels (one open channel passes {self.one_channel_pA(p):.3g} pA; "
                f"plausible: {lo:g} to {hi:g}): {likely}"]

    def amplitude_warnings(self, amplitudes: dict[str, float]) -> list[str]:
        """Warnings for fitted amplitudes (channels, by protocol) below one channel or above
        :data:`PLAUSIBLE_CHANNELS`, naming the likely unit of the current.

        Examples
        --------
        >>> import kingen
        >>> cfg = kingen.load_config(kingen.demo_config())
        >>> objective = kingen.Objective(cfg.scheme, cfg.protocols, backend="cpu")
        >>> objective.amplitude_warnings({"deactivation": 120.0})
        []
        >>> objective.amplitude_warnings({"deactivation": 0.69})[0].split(": ")[-1]
        'is the current in nA under a current_pA header?'
        """
        out = []
        for p, item in enumerate(self.items):
            amp = amplitudes.get(item.protocol.name, math.nan)
            if item.amplitude is None:  # a fixed amplitude is the user's own number
                out += self._size_warnings(p, abs(amp), "the fitted amplitude is")
        return out

    # ------------------------------------------------------------------ evaluation
    def guard(self, params: np.ndarray, *, complete: bool = True) -> np.ndarray:
        """Parameters with derived rates recomputed; rows whose derived rates leave their
        bounds become NaN, which the solver fails (code 4) without simulating them.

        Parameters
        ----------
        params
            (N, n_params) internal units.
        complete
            False: the derived rates of ``params`` are already computed
            (:meth:`~kingen.fitting.params.ParameterMap.to_params` does it), only their bounds are
            checked. Either way ``params`` itself is never written into.
        """
        p = np.atleast_2d(np.asarray(params, dtype=np.float64))
        if complete:
            p = self.scheme.complete(p)
        if self.derived.any():
            inside = np.ones(p.shape[0], dtype=bool)
            # column by column: a boolean column mask of a (65k, P) array costs more
            for j in np.flatnonzero(self.derived):
                d = p[:, j]
                inside &= (d >= self.scheme.lower[j] * (1 - 1e-9)) & (
                    d <= self.scheme.upper[j] * (1 + 1e-9))
            out = ~inside
            if out.any():
                if not complete:
                    p = p.copy()
                p[out] = np.nan
        return p

    @property
    def n_protocols(self) -> int:
        """Number of protocols."""
        return len(self.items)

    def evaluate(self, params: np.ndarray, *, complete: bool = True,
                 while_solving: Callable[[], object] | None = None
                 ) -> tuple[Evaluation, BatchResult]:
        """Score a batch: ONE solver call for all candidates and sweeps.

        Parameters
        ----------
        params
            (N, n_params) internal units.
        complete
            False when the derived rates of ``params`` are already computed (see
            :meth:`guard`).
        while_solving
            Called once while the solver runs (see :meth:`kingen.solve.batch.Simulator.run`).
        """
        # the guard leaves every derived rate computed: the solver need not redo them
        result = self.simulator.run(self.guard(params, complete=complete), "objective",
                                    complete=False, while_solving=while_solving)
        return self.reduce(result.sgg, result.sgd, result.windows, result.fail,
                           result.sg), result

    def reduce(self, sgg: np.ndarray, sgd: np.ndarray, windows: np.ndarray,
               fail: np.ndarray, sg: np.ndarray | None = None) -> Evaluation:
        """Turn per-(candidate, sweep) sums and window values into errors.

        Parameters
        ----------
        sgg, sgd
            (N, n_sweeps) Σw·g², Σw·g·d.
        windows
            (N, n_sweeps, 4, 2) window values and peak sample indices.
        fail
            (N, n_sweeps) failure codes.
        sg
            (N, n_sweeps) Σw·g, which a chain's fitted offsets need.
        """
        n = sgg.shape[0]
        errors = np.zeros((n, self.n_protocols))
        amps = np.full((n, self.n_protocols), np.nan)
        recorded = np.array([item.recording is not None for item in self.items])
        plain = np.array([self._plain(p) for p in range(self.n_protocols)])
        fixed = np.array([np.nan if item.amplitude is None else float(item.amplitude)
                          for item in self.items])
        _recording_errors(np.asarray(sgg, dtype=np.float64), np.asarray(sgd, dtype=np.float64),
                          np.array(self.spans, dtype=np.int64), self.dd, recorded & plain,
                          fixed, errors, amps)
        sweep_amps = offsets = None
        if (recorded & ~plain).any():
            sweep_amps = np.zeros(sgg.shape)
            offsets = np.zeros(sgg.shape)
            for p, (a, b) in enumerate(self.spans):
                if not recorded[p]:
                    sweep_amps[:, a:b] = np.nan
                elif plain[p]:
                    sweep_amps[:, a:b] = amps[:, [p]]
                else:
                    sse, amp, off = self._scales(p, sgg[:, a:b], sgd[:, a:b],
                                                 None if sg is None else sg[:, a:b])
                    errors[:, p] += sse / self.dd[p]
                    amps[:, p] = self._protocol_amplitude(p, amp)
                    sweep_amps[:, a:b], offsets[:, a:b] = amp, off
        with np.errstate(all="ignore"):
            for p, (item, plan) in enumerate(zip(self.items, self.plans, strict=True)):
                if plan.targets:
                    amp = amps[:, p] if item.recording is not None else None
                    err, amp = self._target_error(plan, windows, amp)
                    errors[:, p] += err
                    if amp is not None:
                        amps[:, p] = amp
            # Σ_p weight_p · error_p term by term, not by BLAS (see Scheme.complete)
            fitness = np.zeros(n)
            for p, w in enumerate(self.proto_weight):
                fitness += w * errors[:, p]
        fcode = _first_failure(fail)
        bad = ~np.isfinite(fitness) & (fcode == 0)
        fcode[bad] = FAIL_NONFINITE
        failed = fcode != 0
        fitness[failed] = np.inf
        errors[failed] = np.inf
        return Evaluation(fitness, errors, fcode, amps, sweep_amps, offsets)

    def _amplitude(self, item: ProtocolData, s_gd: np.ndarray, s_gg: np.ndarray) -> np.ndarray:
        if item.amplitude is not None:
            return np.full(s_gd.shape, float(item.amplitude))
        return np.maximum(np.where(s_gg > 0, s_gd / np.where(s_gg > 0, s_gg, 1.0), 0.0), 0.0)

    def target_residuals(self, plan: Any, win: np.ndarray, amp: np.ndarray | None
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(model − value) / scale of a protocol's summary targets, per candidate, and the
        targets' weights; current-valued targets use the amplitude fitted to them."""
        values, current = plan.model_values(win)
        _, amp_t = self._target_error(plan, win, amp)
        tv = np.array([t.value for t in plan.targets])
        sc = np.array([t.scale for t in plan.targets])
        tw = np.array([t.weight for t in plan.targets])
        model = values.copy()
        if amp_t is not None:
            model[:, current] *= amp_t[:, None]
        return (model - tv) / sc, tw

    def _target_error(self, plan: _ProtocolPlan, windows: np.ndarray,
                      amp: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        values, current = plan.model_values(windows)
        tv = np.array([t.value for t in plan.targets])
        sc = np.array([t.scale for t in plan.targets])
        tw = np.array([t.weight for t in plan.targets])
        if amp is None and plan.item.amplitude is not None:
            amp = np.full(values.shape[0], float(plan.item.amplitude))
        if amp is None and current.any():
            m = values[:, current]
            w = tw[current] / sc[current] ** 2
            num = (m * tv[current] * w).sum(axis=1)
            den = (m * m * w).sum(axis=1)
            amp = np.maximum(np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0), 0.0)
        model = values.copy()
        if amp is not None:
            model[:, current] *= amp[:, None]
        r = (model - tv) / sc
        return (tw * r * r).sum(axis=1) / tw.sum(), amp

    # ------------------------------------------------------------------ traces and residuals
    def residuals(self, params: np.ndarray) -> np.ndarray:
        """Residual vectors (N, R) whose sum of squares is each candidate's fitness.

        Computed from simulated traces (one solver call in trace mode), for local
        least-squares refinement. Failed candidates get residuals of 1e6.
        """
        res = self.simulator.run(self.guard(params), "traces")
        traces = res.traces
        n = traces.shape[0]
        parts = []
        failed = np.any(res.fail != 0, axis=1)
        safe = np.where(np.isfinite(traces), traces, 0.0)
        win = host_windows(safe, self.sample_start, self.windows)
        for p, (item, plan) in enumerate(zip(self.items, self.plans, strict=True)):
            sl = self._slice(p)
            sw = np.sqrt(item.weight)
            amp = None
            if item.recording is not None and not self._plain(p):
                w = self.weight[sl]
                keep = w > 0
                a_s, c_s, amp = self._sample_scales(p, safe)
                model = a_s[:, keep] * safe[:, sl][:, keep] + c_s[:, keep]
                parts.append(sw * np.sqrt(w[keep]) * (model - self.data[sl][keep])
                             / math.sqrt(self.dd[p]))
            elif item.recording is not None:
                w = self.weight[sl]
                keep = w > 0
                g, d, wk = safe[:, sl][:, keep], self.data[sl][keep], w[keep]
                amp = self._amplitude(item, (g * wk * d).sum(1), (g * g * wk).sum(1))
                parts.append(sw * np.sqrt(wk) * (amp[:, None] * g - d) / math.sqrt(self.dd[p]))
            if plan.targets:
                res, tw = self.target_residuals(plan, win, amp)
                parts.append(sw * np.sqrt(tw / tw.sum()) * res)
        out = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0))
        out = np.where(np.isfinite(out), out, 1e6)
        out[failed] = 1e6
        return out

    def traces(self, params: np.ndarray) -> tuple[dict[str, dict], dict[str, float]]:
        """Fitted and recorded currents of one candidate, per protocol.

        Returns
        -------
        traces
            ``{protocol: {"time_ms": [...], "fit_pA": [...], "data_pA": [...] or None,
            "model_pA": [...] or None, "labels": [...]}}``, one array per sweep; data
            resampled onto the sweep grid (less its baseline when one is configured), NaN
            where it is not compared. ``fit_pA`` is what is compared with the data: through
            the protocol's filter, with its amplitudes and offsets; ``model_pA`` the same
            without the filter (None when the protocol has none). A chain that fits
            amplitudes or offsets per sweep adds ``amplitude`` and ``offset_pA`` (one value
            per sweep).
        amplitudes
            Amplitude (channels) per protocol; NaN where none applies.
        """
        p = np.atleast_2d(np.asarray(params, dtype=float))
        res = self.simulator.run(self.guard(p), "traces")
        raw = (self.simulator.run(self.guard(p), "traces", filtered=False)
               if self.simulator.n_sections else None)
        ev = self._eval_from_traces(p, res)
        out: dict[str, dict] = {}
        amps: dict[str, float] = {}
        for q, (item, (a, b)) in enumerate(zip(self.items, self.spans, strict=True)):
            amp = float(ev.amplitudes[0, q])
            amps[item.protocol.name] = amp
            scale = amp if math.isfinite(amp) else self.scheme.channels
            times, fits, datas, models = [], [], [], []
            for k in range(a, b):
                s = slice(int(self.sample_start[k]), int(self.sample_start[k + 1]))
                sweep = item.protocol.sweeps[k - a]
                times.append(sweep.times())
                a_k, c_k = scale, 0.0
                if ev.sweep_amplitudes is not None and item.recording is not None:
                    a_k, c_k = float(ev.sweep_amplitudes[0, k]), float(ev.offsets[0, k])
                fits.append(res.traces[0, s] * a_k + c_k)
                if raw is not None:
                    models.append(raw.traces[0, s] * a_k + c_k)
                datas.append(np.where(self.weight[s] > 0, self.data[s], np.nan))
            out[item.protocol.name] = {
                "time_ms": times, "fit_pA": fits,
                "data_pA": datas if item.recording is not None else None,
                "model_pA": models if item.chain.filter is not None else None,
                "labels": [s.label for s in item.protocol.sweeps]}
            if item.recording is not None and not self._plain(q):
                out[item.protocol.name]["amplitude"] = [
                    float(x) for x in ev.sweep_amplitudes[0, a:b]]
                out[item.protocol.name]["offset_pA"] = [float(x) for x in ev.offsets[0, a:b]]
        return out, amps

    def _eval_from_traces(self, params: np.ndarray, res: BatchResult) -> Evaluation:
        traces = np.where(np.isfinite(res.traces), res.traces, 0.0)
        n = traces.shape[0]
        sgg = np.zeros((n, len(self.sample_start) - 1))
        sgd = np.zeros_like(sgg)
        sg = np.zeros_like(sgg)
        for k in range(sgg.shape[1]):
            s = slice(int(self.sample_start[k]), int(self.sample_start[k + 1]))
            g = traces[:, s]
            sgg[:, k] = (self.weight[s] * g * g).sum(1)
            sgd[:, k] = (self.weight[s] * g * self.data[s]).sum(1)
            sg[:, k] = (self.weight[s] * g).sum(1)
        win = host_windows(traces, self.sample_start, self.windows)
        return self.reduce(sgg, sgd, win, res.fail, sg)

    def evaluate_traces(self, params: np.ndarray) -> Evaluation:
        """Score a batch from trace-mode simulation (host reduction; for checks and polish)."""
        p = np.atleast_2d(np.asarray(params, dtype=float))
        return self._eval_from_traces(p, self.simulator.run(self.guard(p), "traces"))
