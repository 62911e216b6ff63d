"""Traces of candidates: the fitted currents of one candidate, its scores from traces, and
residual vectors for least squares (:class:`TraceScoring`, a part of
:class:`~kingen.fitting.objective.Objective`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kingen.fitting.targets import host_windows
from kingen.solve.batch import BatchResult


class TraceScoring:
    """The trace-mode methods of :class:`~kingen.fitting.objective.Objective` (they use its
    simulator, grid, data and scoring)."""

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

    def _eval_from_traces(self, params: np.ndarray, res: BatchResult) -> Any:
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

    def evaluate_traces(self, params: np.ndarray) -> Any:
        """Score a batch from trace-mode simulation (host reduction; for checks and polish)."""
        p = np.atleast_2d(np.asarray(params, dtype=float))
        return self._eval_from_traces(p, self.simulator.run(self.guard(p), "traces"))
