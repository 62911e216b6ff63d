"""The Gaussian log-likelihood of a fit, from the same residuals the fit minimises.

For a recorded protocol p the fit minimises Σ w (A g − d)² (:mod:`kingen.fitting.objective`), with
the amplitude A solved in closed form (least squares, clamped ≥ 0) for every candidate (per
sweep, with rundown and with offsets c when the protocol's recording chain asks for them:
Σ w (A_k g + c_k − d)², solved as the fit solves them; g through the chain's filter). With
independent Gaussian noise of σ_p, and τ_p samples per independent one
(:mod:`kingen.identify.noise`),

    −2 log L(θ) = Σ_p Σ w (A g − d)² / (σ_p² τ_p) + Σ_t s_t w_t ((m_t − y_t) / scale_t)²
                  + const,

A profiled out as in the fit (it is re-solved for every θ). The second sum is over summary
targets (:mod:`kingen.fitting.objective`): s_t = 1 for a target with an sd; a protocol's targets
without one share the scale that makes their χ² at the best equal their number (or
:data:`ASSUMED_RELATIVE_SD` of their value, when the best meets them exactly, and their
scatter says nothing). The protocols' fit weights do not enter:
they are a choice of the search, not a property of the data.

:class:`Likelihood` gives, for a batch of genes, the residual vectors r whose Σ r² is
χ²(θ) = −2 log L(θ) + const, in ONE solver call (trace mode); for the Levenberg–Marquardt
steps, the χ², JᵀJ and Jᵀr of groups of candidates reduced where their traces are made,
without the residual vectors (:mod:`kingen.identify.gauss_newton`).
"""

from __future__ import annotations

import time

import numpy as np

from kingen.fitting.objective import NoiseWeights, host_windows
from kingen.identify.noise import NoiseModel, has_sd

FAILED = np.inf  # χ² of a candidate that cannot be simulated
# Targets without an sd that the best fit meets to within this (squared, relative) per
# target carry no estimate of their scatter; they are then taken to scatter by
# ASSUMED_RELATIVE_SD of their value.
EXACT_TARGETS = 1e-8
ASSUMED_RELATIVE_SD = 0.05


class Likelihood:
    """χ² = −2 log L + const, and its residuals, for batches of genes.

    Parameters
    ----------
    objective
        The fit's :class:`~kingen.fitting.objective.Objective`.
    pmap
        The fit's :class:`~kingen.fitting.params.ParameterMap` (genes: log10 rates).
    noise
        The noise model (:func:`~kingen.identify.noise.estimate_noise`).
    best_genes
        The best fit's genes: sets the scale of targets without an sd.
    """

    def __init__(self, objective, pmap, noise: NoiseModel, best_genes: np.ndarray) -> None:
        self.objective = objective
        self.pmap = pmap
        self.noise = noise
        self.calls = 0
        self.candidates = 0
        self.solver_s = 0.0
        start = objective.sample_start
        self._rec: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, float | None, float]] = []
        for q, item in enumerate(objective.items):
            if item.recording is None:
                continue
            a, b = objective.spans[q]
            idx = np.concatenate([np.arange(int(start[k]), int(start[k + 1]))
                                  for k in range(a, b)])
            idx = idx[objective.weight[idx] > 0]
            c = 1.0 / (float(noise.sigma[q]) ** 2 * float(noise.tau[q]))
            amp = None if item.amplitude is None else float(item.amplitude)
            self._rec.append((q, idx, objective.data[idx], objective.weight[idx], amp, c))
        self._scale = np.where(np.isfinite(noise.target_scale), noise.target_scale, 1.0)
        # per target: 1 where it has its own sd, else its protocol's scale (set below)
        self._sd = {q: np.array([has_sd(item, t) for t in plan.targets], dtype=bool)
                    for q, (item, plan) in enumerate(zip(objective.items, objective.plans,
                                                         strict=True)) if plan.targets}
        unknown = ~np.isfinite(noise.target_scale)
        if unknown.any():
            r = self.residuals(np.atleast_2d(best_genes), _count=False)[0][0]
            for q, (lo, hi) in self._target_blocks().items():
                free = ~self._sd[q]
                if unknown[q] and free.any():
                    rq = r[lo:hi][free]
                    ss, k = float(rq @ rq), int(free.sum())
                    if ss > EXACT_TARGETS * k:
                        self._scale[q] = k / ss
                    else:
                        # the best meets these targets exactly: their scatter says nothing
                        self._scale[q] = 1.0 / ASSUMED_RELATIVE_SD ** 2
                        noise.notes.append(
                            f"{objective.names[q]}: the best fit meets its targets without "
                            f"an sd exactly, so their noise cannot be estimated; taken as "
                            f"{100 * ASSUMED_RELATIVE_SD:g} % of each target (give an sd)")
        self.noise.target_scale = self._scale.copy()

    def _target_blocks(self) -> dict[int, tuple[int, int]]:
        """Columns of each protocol's targets in the residual vector."""
        out, col = {}, sum(x[1].size for x in self._rec)
        for q, plan in enumerate(self.objective.plans):
            if plan.targets:
                out[q] = (col, col + len(plan.targets))
                col += len(plan.targets)
        return out

    @property
    def n_residuals(self) -> int:
        """Length of a residual vector."""
        return sum(x[1].size for x in self._rec) + sum(
            len(p.targets) for p in self.objective.plans)

    def solve(self, genes: np.ndarray, *, count: bool = True, on_device: bool = True):
        """The traces of a batch of genes: ONE solver call in trace mode, left where the
        solver makes them (``on_device``: on the GPU, or in the simulator's buffer on the
        CPU, valid until the next call; see :mod:`kingen.identify.gauss_newton`)."""
        from kingen.solve.batch import Simulator

        obj = self.objective
        g = np.atleast_2d(np.asarray(genes, dtype=float))
        sim = obj.simulator
        kw = {"on_device": True} if on_device and isinstance(sim, Simulator) else {}
        t0 = time.perf_counter()
        # to_params computes the derived rates, the guard checks them: taken as they are
        res = sim.run(obj.guard(self.pmap.to_params(g, clip=True), complete=False),
                      "traces", complete=False, **kw)
        if count:
            self.calls += 1
            self.candidates += g.shape[0]
            self.solver_s += time.perf_counter() - t0
        return res

    def gauss_newton(self, genes: np.ndarray, count: np.ndarray, steps: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """χ², JᵀJ and Jᵀr of groups of candidates in ONE solver call, reduced where the
        traces are made: :func:`kingen.identify.gauss_newton.gauss_newton`."""
        from kingen.identify.gauss_newton import gauss_newton

        return gauss_newton(self, genes, count, steps)

    def chi2(self, genes: np.ndarray) -> np.ndarray:
        """χ² of a batch of genes (``inf`` where one fails), in ONE solver call."""
        n = np.atleast_2d(genes).shape[0]
        return self.gauss_newton(genes, np.zeros(n, np.int64), np.zeros((n, 0)))[0]

    def residuals(self, genes: np.ndarray, *, _count: bool = True
                  ) -> tuple[np.ndarray, np.ndarray]:
        """Residual vectors of a batch of genes: ONE solver call.

        Returns
        -------
        r, chi2
            (N, R) residuals, (N,) Σ r² (``inf`` for a candidate that fails; its residuals
            are 0).
        """
        obj = self.objective
        scaled = [not obj._plain(q) for q in range(obj.n_protocols)]
        g = np.atleast_2d(np.asarray(genes, dtype=float))
        res = self.solve(g, count=_count, on_device=False)
        traces = res.traces
        n = g.shape[0]
        failed = np.any(res.fail != 0, axis=1)
        # One (N, R) array filled block by block, in place: at thousands of candidates and
        # tens of thousands of samples, temporaries cost more than the arithmetic.
        r = np.empty((n, self.n_residuals))
        amps: dict[int, np.ndarray] = {}
        col = 0
        for q, idx, d, w, fixed, c in self._rec:
            span = (idx[0], idx[-1] + 1) if idx.size and idx[-1] - idx[0] + 1 == idx.size \
                else None
            gq = traces[:, span[0]:span[1]] if span else traces[:, idx]
            if scaled[q]:
                # amplitudes and offsets per sweep, as the fit solves them
                sl = obj._slice(q)
                a_s, c_s, amps[q] = obj._sample_scales(
                    q, np.where(np.isfinite(traces), traces, 0.0))
                block = r[:, col: col + idx.size]
                np.multiply(gq, a_s[:, idx - sl.start], out=block)
                block += c_s[:, idx - sl.start]
                block -= d
                block *= np.sqrt(c * w)
                col += idx.size
                continue
            if fixed is not None:
                amp = np.full(n, fixed)
            else:
                wd = w * d
                sgd = gq @ wd
                sgg = np.einsum("ij,ij,j->i", gq, gq, w)
                with np.errstate(all="ignore"):
                    amp = np.maximum(np.where(sgg > 0, sgd / np.where(sgg > 0, sgg, 1.0),
                                              0.0), 0.0)
            amps[q] = amp
            block = r[:, col: col + idx.size]
            np.multiply(gq, amp[:, None], out=block)
            block -= d
            block *= np.sqrt(c * w)
            col += idx.size
        if any(p.targets for p in obj.plans):
            win = host_windows(np.where(np.isfinite(traces), traces, 0.0), obj.sample_start,
                               obj.windows)
            for q, plan in enumerate(obj.plans):
                if not plan.targets:
                    continue
                res, tw = obj.target_residuals(plan, win, amps.get(q))
                factor = np.where(self._sd[q], 1.0, self._scale[q])
                r[:, col: col + tw.size] = np.sqrt(factor * tw) * res
                col += tw.size
        chi2 = np.einsum("ij,ij->i", r, r)
        bad = failed | ~np.isfinite(chi2)  # a non-finite current makes χ² non-finite
        r[bad] = 0.0
        chi2[bad] = FAILED
        return r, chi2


def noise_weights(lik: Likelihood) -> list[NoiseWeights]:
    """Per protocol, what its residuals weigh in ``lik``'s χ², for
    :meth:`~kingen.fitting.objective.Objective.set_noise`: the objective's fitness is then
    this likelihood's χ² (with the protocols' weights of 1).

    Examples
    --------
    >>> import kingen
    >>> from kingen.identify.noise import estimate_noise
    >>> cfg = kingen.load_config(kingen.demo_config())
    >>> objective = kingen.Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu"))
    >>> genes = cfg.pmap.start_genes()
    >>> noise = estimate_noise(objective, cfg.pmap.to_params(genes[None, :]))
    >>> lik = Likelihood(objective, cfg.pmap, noise, genes)
    >>> objective.set_noise(noise_weights(lik))
    >>> chi2 = objective.evaluate(cfg.pmap.to_params(genes[None, :]))[0].fitness[0]
    >>> bool(abs(chi2 / lik.residuals(genes[None, :])[1][0] - 1) < 1e-9)
    True
    """
    trace = {q: c for q, _, _, _, _, c in lik._rec}
    out = []
    for q, plan in enumerate(lik.objective.plans):
        factors = (tuple(float(f) for f in np.where(lik._sd[q], 1.0, lik._scale[q]))
                   if plan.targets else ())
        out.append(NoiseWeights(trace=float(trace.get(q, 0.0)), targets=factors))
    return out
