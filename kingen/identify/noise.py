"""The noise model of each protocol: σ, and how many of its samples are independent.

σ of a recorded protocol comes from the recording's baseline before the first pulse where
there is one (at least :data:`MIN_BASELINE` samples over its sweeps, each sweep's own mean
removed), else from the residuals of the best fit (Σ r² / n). A filtered recording has
correlated noise: neighbouring samples carry nearly the same information, and a likelihood
that counts every sample as independent is too sharp by the factor τ, the *integrated
autocorrelation time* (in samples) of the noise. τ = 1 + 2 Σ_k ρ_k, summed over the lags k
where the autocorrelation ρ_k of the baseline (else of the residuals) is still significant
(above 2/√n); the effective number of independent samples is n / τ.

Summary targets carry their own scale: a target with an ``sd`` is a Gaussian observation with
that sd; a protocol's other targets (relative errors, tables) share a scale from the best
fit's residuals, so that their χ² at the best is their number
(:mod:`kingen.identify.likelihood`).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> round(integrated_time([rng.normal(size=4000)]), 1)
1.0
>>> smooth = np.convolve(rng.normal(size=4000), np.ones(5) / 5, mode="valid")
>>> 3.5 < integrated_time([smooth]) < 6.5
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kingen.experiment.features import edge_half_width

MIN_BASELINE = 20      # baseline samples (all sweeps) needed to take σ from the baseline
MIN_TAU_BASELINE = 200  # baseline samples needed to take τ from baselines
MAX_LAG = 200          # longest lag of the autocorrelation sum, in samples
CORRELATED_FROM = 1.5  # τ above which the noise is reported as correlated
MISFIT_RATIO = 2.0     # residual rms / baseline σ above which the fit is reported as a misfit


def integrated_time(segments: list[np.ndarray], max_lag: int = MAX_LAG) -> float:
    """τ = 1 + 2 Σ ρ_k of the pooled segments (each with its own mean removed), summed
    while ρ_k > 2/√n; 1 for white noise.

    Parameters
    ----------
    segments
        Stretches of noise (baseline or residuals), each contiguous in time.
    """
    segs = [np.asarray(s, dtype=float) - np.mean(s) for s in segments if len(s) >= 4]
    n = sum(s.size for s in segs)
    if n < 8:
        return 1.0
    c0 = sum(float(s @ s) for s in segs)
    if not c0 > 0:
        return 1.0
    cut = 2.0 / math.sqrt(n)
    tau = 1.0
    longest = max(s.size for s in segs)
    for k in range(1, min(max_lag, longest // 2) + 1):
        ck = sum(float(s[:-k] @ s[k:]) for s in segs if s.size > k)
        rho = ck / c0
        if rho <= cut:
            break
        tau += 2.0 * rho
    return max(tau, 1.0)


@dataclass
class NoiseModel:
    """Per protocol (the objective's order): the noise of its recording and targets.

    Attributes
    ----------
    names
        Protocol names.
    sigma
        σ of the recording's noise, pA (NaN without a recording).
    source
        Where σ came from: ``"baseline"``, ``"residuals"`` or ``""`` (no recording).
    tau
        Integrated autocorrelation time of the noise, samples (≥ 1).
    n
        Recorded samples compared.
    residual_rms
        rms of the best fit's residuals, pA.
    target_scale
        Factor on the Σ w·r² of the protocol's targets without an sd (NaN until the
        likelihood sets it from the best fit).
    notes
        Lines worth telling the user (correlated noise, misfit).
    tau_source
        Where τ came from: ``"baseline"`` (the protocol's own, at least
        :data:`MIN_TAU_BASELINE` samples), ``"baselines"`` (the baselines of all the
        recorded protocols sampled at its interval), ``"residuals"`` (the best fit's,
        where it fits within the noise: it then depends on the scheme fitted),
        ``"assumed"`` (1: white noise, where the fit misses the data and no baseline is
        long enough) or ``""`` (no recording, or an older run).
    """

    names: list[str]
    sigma: np.ndarray
    source: list[str]
    tau: np.ndarray
    n: np.ndarray
    residual_rms: np.ndarray
    target_scale: np.ndarray
    notes: list[str] = field(default_factory=list)
    tau_source: list[str] = field(default_factory=list)

    @property
    def n_eff(self) -> np.ndarray:
        """Effective number of independent samples per protocol, n / τ."""
        return self.n / self.tau

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the run file's ``/profiles``)."""
        return {"names": list(self.names), "sigma_pA": _list(self.sigma),
                "source": list(self.source), "tau_samples": _list(self.tau),
                "n_samples": _list(self.n), "n_eff": _list(self.n_eff),
                "residual_rms_pA": _list(self.residual_rms),
                "target_scale": _list(self.target_scale), "notes": list(self.notes),
                "tau_source": list(self.tau_source)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NoiseModel:
        """Inverse of :meth:`to_dict` (numbers checked by the caller's use)."""
        def arr(key: str) -> np.ndarray:
            return np.array([math.nan if v is None else float(v) for v in d[key]])

        return cls(names=[str(v) for v in d["names"]], sigma=arr("sigma_pA"),
                   source=[str(v) for v in d["source"]], tau=arr("tau_samples"),
                   n=arr("n_samples"), residual_rms=arr("residual_rms_pA"),
                   target_scale=arr("target_scale"), notes=[str(v) for v in d["notes"]],
                   tau_source=[str(v) for v in d.get("tau_source", [])])


def _list(a: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in np.asarray(a, dtype=float)]


def _onset(sweep) -> float:
    p = sweep.pulses[0]
    return p.start - edge_half_width(p.rise)


def estimate_noise(objective, params: np.ndarray) -> NoiseModel:
    """The noise model of every protocol of ``objective``, from its data and the fit at
    ``params`` (internal units, one candidate): one solver call in trace mode."""
    p = np.atleast_2d(np.asarray(params, dtype=float))
    res = objective.simulator.run(objective.guard(p), "traces")
    g_all = np.where(np.isfinite(res.traces[0]), res.traces[0], 0.0)
    r = objective.n_protocols
    sigma, tau, n = np.full(r, math.nan), np.ones(r), np.zeros(r)
    rms, tscale = np.full(r, math.nan), np.ones(r)
    source, tau_source = [""] * r, [""] * r
    notes: list[str] = []
    start = objective.sample_start
    # τ is a property of the recording chain, not of a scheme: where a protocol's own
    # baseline is too short for it, the baselines of the protocols sampled alike serve
    pooled: dict[float, list[np.ndarray]] = {}
    for q in range(r):
        segments = _baselines(objective, q)
        if segments:
            pooled.setdefault(_interval(objective, q), []).extend(segments)
    for q, (item, plan) in enumerate(zip(objective.items, objective.plans, strict=True)):
        a, b = objective.spans[q]
        amp = math.nan
        if item.recording is not None:
            sgg = sgd = 0.0
            for k in range(a, b):
                s = slice(int(start[k]), int(start[k + 1]))
                w, g, d = objective.weight[s], g_all[s], objective.data[s]
                sgg += float((w * g * g).sum())
                sgd += float((w * g * d).sum())
            amp = (float(item.amplitude) if item.amplitude is not None
                   else max(sgd / sgg, 0.0) if sgg > 0 else 0.0)
            # the model as the fit scales it: per sweep, with offsets, where the chain asks
            scaled = None if objective._plain(q) else objective._sample_scales(
                q, g_all[None, :])
            first = int(start[a])
            base, resid = [], []
            for k in range(a, b):
                s = slice(int(start[k]), int(start[k + 1]))
                w, g, d = objective.weight[s], g_all[s], objective.data[s]
                keep = w > 0
                if scaled is None:
                    resid.append((amp * g - d)[keep])
                else:
                    at = slice(s.start - first, s.stop - first)
                    resid.append((scaled[0][0, at] * g + scaled[1][0, at] - d)[keep])
            base = _baselines(objective, q)
            n_base = sum(x.size for x in base)
            alike = pooled.get(_interval(objective, q), [])
            n[q] = float(sum(x.size for x in resid))
            sse = float(sum(float(x @ x) for x in resid))
            rms[q] = math.sqrt(sse / max(n[q], 1.0))
            if n_base >= MIN_BASELINE:
                dev = sum(float(((x - x.mean()) ** 2).sum()) for x in base)
                sigma[q] = math.sqrt(dev / max(n_base - len(base), 1))
                source[q] = "baseline"
            else:
                sigma[q] = rms[q]
                source[q] = "residuals"
            if n_base >= MIN_TAU_BASELINE:
                tau[q], tau_source[q] = integrated_time(base), "baseline"
            elif sum(x.size for x in alike) >= MIN_TAU_BASELINE:
                tau[q], tau_source[q] = integrated_time(alike), "baselines"
            elif source[q] == "residuals" or rms[q] <= MISFIT_RATIO * sigma[q]:
                tau[q], tau_source[q] = integrated_time(resid), "residuals"
            else:
                # residuals of a misfit are correlated by the misfit, not by the noise: a τ
                # from them would discount exactly the data a wrong scheme fails
                tau[q], tau_source[q] = 1.0, "assumed"
                notes.append(f"{item.protocol.name}: τ not measured (baselines of "
                             f"{sum(x.size for x in alike)} samples, under "
                             f"{MIN_TAU_BASELINE}, and a fit that misses the data): "
                             "the noise is taken as white")
            name = item.protocol.name
            if not sigma[q] > 0:
                sigma[q] = max(rms[q], 1e-12)
                source[q] = "residuals"
            if tau[q] > CORRELATED_FROM:
                notes.append(f"{name}: correlated noise (filtered recording?): τ = "
                             f"{tau[q]:.3g} samples, {n[q] / tau[q]:.0f} effective "
                             f"independent samples of {n[q]:.0f}; the likelihood counts "
                             "each sample as 1/τ")
            if source[q] == "baseline" and rms[q] > MISFIT_RATIO * sigma[q]:
                notes.append(f"{name}: the best fit misses the data by more than the noise "
                             f"(residual rms {rms[q]:.3g} pA, baseline noise σ "
                             f"{sigma[q]:.3g} pA): the model is not exact, and intervals "
                             "from this likelihood are too narrow")
        if plan.targets:
            with_sd = [has_sd(item, t) for t in plan.targets]
            if not all(with_sd):
                tscale[q] = math.nan  # set from the best fit's residuals by the likelihood
    return NoiseModel(names=list(objective.names), sigma=sigma, source=source, tau=tau,
                      n=n, residual_rms=rms, target_scale=tscale, notes=notes,
                      tau_source=tau_source)


def _baselines(objective, q: int) -> list[np.ndarray]:
    """The recorded samples of protocol ``q`` before each sweep's first pulse."""
    item = objective.items[q]
    if item.recording is None:
        return []
    a, b = objective.spans[q]
    start, out = objective.sample_start, []
    for k in range(a, b):
        s = slice(int(start[k]), int(start[k + 1]))
        sweep = item.protocol.sweeps[k - a]
        if sweep.pulses:
            pre = (objective.weight[s] > 0) & (sweep.times() < _onset(sweep))
            if pre.sum() >= 2:
                out.append(objective.data[s][pre])
    return out


def _interval(objective, q: int) -> float:
    """Protocol ``q``'s sampling interval, ms (rounded: a key for protocols sampled alike)."""
    return round(float(objective.items[q].protocol.sweeps[0].dt), 9)


def has_sd(item, target) -> bool:
    """True when a compiled target of ``item`` came with its own sd."""
    return _has_sd(item, target)


def _has_sd(item, target) -> bool:
    if item.targets is None or target.sweep >= 0:
        return False
    feat = item.targets.features.get(target.key)
    return bool(feat is not None and feat.sd)
