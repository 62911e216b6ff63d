"""JᵀJ, Jᵀr and χ² of Levenberg–Marquardt groups, from sums reduced where the traces are made.

A group is a base candidate and its m forward-difference perturbations (x + hₖeₖ), rows in
that order. The residual vector r(θ) of :class:`~kingen.identify.likelihood.Likelihood`
(Σ r² = χ²) has, per recorded protocol, √(w/(σ²τ))·(a·g + c − d) with the amplitude a (and
offset c, where the chain fits one) profiled out per candidate, and its summary targets'
residuals. Forward differences give Jₖ = (r(x + hₖeₖ) − r(x)) / hₖ; the step needs JᵀJ,
Jᵀr(x) and χ²(x) only.

:func:`gauss_newton` computes them with the traces left where the solver made them
(:mod:`kingen.solve.gnsums`): a first reduction gives each candidate's sums per sweep, from
which its scales are solved by the fit's own closed form
(:meth:`~kingen.fitting.objective.Objective._scales`); a second forms the residual changes
sample by sample and accumulates their products. Only (m × m), m and one χ² per group come
back, and the window values of the summary targets (a few numbers per candidate), whose
few residuals are differenced on the host. A perturbation that fails counts as today's
residual of 0 (its column is −r(x)/hₖ); a base that fails has χ² = inf.

:meth:`~kingen.identify.likelihood.Likelihood.residuals` gives the full residual vectors
(the same numbers, formed on the host): the reference these sums are tested against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kingen.identify.fisher import perturbations
from kingen.solve.gnsums import gn_sums, scale_sums, unpack, window_values

FAILED = np.inf


@dataclass
class Layout:
    """The compared samples of a likelihood, by block (one block per recorded sweep)."""

    samples: np.ndarray   # (S,) sample indices, by block
    bstart: np.ndarray    # (B + 1,) each block's first entry of ``samples``
    sblock: np.ndarray    # (S,) block of each entry
    weight: np.ndarray    # (S,) the fit's weight w
    data: np.ndarray      # (S,) d
    cw: np.ndarray        # (S,) w / (σ²τ)
    blocks: dict[int, np.ndarray]  # protocol -> its blocks


def layout(lik) -> Layout:
    """The :class:`Layout` of ``lik``'s recorded protocols (built once, kept on ``lik``)."""
    cached = getattr(lik, "_gn_layout", None)
    if cached is not None:
        return cached
    obj = lik.objective
    samples, cw, blocks, sweeps = [], [], {}, []
    for q, idx, _, w, _, c in lik._rec:
        a, b = obj.spans[q]
        blocks[q] = np.arange(len(sweeps), len(sweeps) + b - a)
        sweeps.extend(range(a, b))
        samples.append(idx)
        cw.append(c * w)
    s = np.concatenate(samples).astype(np.int64) if samples else np.zeros(0, np.int64)
    sweep = np.searchsorted(obj.sample_start, s, side="right") - 1
    block_of_sweep = np.full(obj.sample_start.size, -1, dtype=np.int64)
    block_of_sweep[np.array(sweeps, dtype=np.int64)] = np.arange(len(sweeps))
    sblock = block_of_sweep[sweep] if s.size else np.zeros(0, np.int64)
    bstart = np.concatenate([[0], np.cumsum(np.bincount(sblock, minlength=len(sweeps)))])
    out = Layout(s, bstart.astype(np.int64), sblock.astype(np.int64), obj.weight[s].copy(),
                 obj.data[s].copy(), np.concatenate(cw) if cw else np.zeros(0), blocks)
    lik._gn_layout = out
    return out


class Groups:
    """The candidates of one solver call, in groups: a Levenberg–Marquardt trial point and
    its forward-difference perturbations, or a candidate alone (whose χ² is all that is
    read).

    Examples
    --------
    >>> import numpy as np
    >>> batch = Groups()
    >>> batch.add_points([np.zeros(2)]), batch.add_lm(np.zeros(2), np.ones(2), 1e-5,
    ...                                                np.array([True, False]))
    (0, 1)
    >>> len(batch.rows), batch.first
    (3, [0, 1])
    """

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.first: list[int] = []
        self.steps: list[np.ndarray] = []

    @property
    def groups(self) -> int:
        """Groups so far."""
        return len(self.first)

    def add_points(self, cands: list[np.ndarray]) -> int:
        """Each candidate a group of its own; returns the first group's index."""
        lo = self.groups
        for c in cands:
            self.first.append(len(self.rows))
            self.rows.append(c)
            self.steps.append(np.zeros(0))
        return lo

    def add_lm(self, y: np.ndarray, upper: np.ndarray, h: float, free: np.ndarray) -> int:
        """y and its forward-difference perturbations in the ``free`` genes."""
        pert, steps = perturbations(y, upper, h, free)
        self.first.append(len(self.rows))
        self.rows.append(y)
        self.rows.extend(pert)
        self.steps.append(steps)
        return self.groups - 1

    def evaluate(self, lik) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """χ², JᵀJ and Jᵀr of every group: ONE solver call, the sums formed where the
        traces are (:mod:`kingen.identify.gauss_newton`)."""
        count = np.array([s.size for s in self.steps], dtype=np.int64)
        h = np.ones((count.size, int(count.max(initial=0))))
        for i, s in enumerate(self.steps):
            h[i, : s.size] = s
        return gauss_newton(lik, np.array(self.rows), count, h)


def gauss_newton(lik, genes: np.ndarray, count: np.ndarray, steps: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """χ² (G,), JᵀJ (G, M, M) and Jᵀr (G, M) of G groups in ONE solver call.

    Parameters
    ----------
    lik
        The :class:`~kingen.identify.likelihood.Likelihood`.
    genes
        (N, n) the groups' rows, each base followed by its perturbations.
    count
        (G,) perturbations per group (0: the base's χ² alone); Σ (count + 1) = N.
    steps
        (G, M) each perturbation's step hₖ (M = the largest count; padding unread).

    Returns zeros beyond a group's count, and for a group whose base fails.

    Examples
    --------
    >>> import kingen, numpy as np
    >>> from kingen.identify.noise import estimate_noise
    >>> from kingen.identify.likelihood import Likelihood
    >>> cfg = kingen.load_config(kingen.demo_config())
    >>> obj = kingen.Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu"))
    >>> x = cfg.pmap.start_genes()
    >>> lik = Likelihood(obj, cfg.pmap, estimate_noise(obj, cfg.pmap.to_params(x[None])), x)
    >>> rows = np.vstack([x, x + 1e-5 * np.eye(x.size)[0]])
    >>> chi2, jtj, jtr = gauss_newton(lik, rows, np.array([1]), np.array([[1e-5]]))
    >>> r, c = lik.residuals(rows)
    >>> bool(abs(chi2[0] / c[0] - 1) < 1e-9), jtj.shape, jtr.shape
    (True, (1, 1, 1), (1, 1))
    """
    t0 = time.perf_counter()
    lay = layout(lik)
    g = np.atleast_2d(np.asarray(genes, dtype=float))
    count = np.asarray(count, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(count + 1)[:-1]]).astype(np.int64)
    if int((count + 1).sum()) != g.shape[0]:
        raise ValueError("the groups' sizes do not add up to the rows")
    res = lik.solve(g)
    traces, n = res.traces, g.shape[0]
    ok = ~np.any(res.fail != 0, axis=1)
    m = int(count.max(initial=0))
    # rows of each group's perturbations (padding points at the base: read, then masked)
    ks = np.arange(m)
    valid = ks[None, :] < count[:, None]
    rowk = np.where(valid, first[:, None] + 1 + ks[None, :], first[:, None])
    # pass 1: every candidate's sums per block, its scales by the fit's closed form
    s1 = scale_sums(traces, lay.samples, lay.bstart, lay.weight, lay.data, first, count)
    sums = np.repeat(s1[:, :, :, 0], count + 1, axis=0)  # (N, B, 3): the base's
    for k in range(1, m + 1):
        at = np.flatnonzero(count >= k)
        sums[first[at] + k] += s1[at, :, :, k]
    a, c, amps = _scales(lik, lay, sums)
    usable = ok & np.isfinite(sums).all(axis=(1, 2)) & np.isfinite(a).all(axis=1) & \
        np.isfinite(c).all(axis=1)
    rt = _target_residuals(lik, traces, amps, n)
    usable &= np.isfinite(rt).all(axis=1)
    use = np.concatenate([usable[first][:, None], usable[rowk] & valid], axis=1)
    # pass 2: the residual changes sample by sample, their products summed
    a0, c0 = a[first], c[first]
    ak = np.where(valid[:, None, :], a[rowk].transpose(0, 2, 1), 0.0)
    dak = np.where(valid[:, None, :], ak - a0[:, :, None], 0.0)
    dck = np.where(valid[:, None, :], c[rowk].transpose(0, 2, 1) - c0[:, :, None], 0.0)
    pairs = gn_sums(traces, lay.samples, lay.sblock, lay.cw, lay.data, first, count, use,
                    a0, c0, ak, np.where(use[:, None, 1:], dak, 0.0),
                    np.where(use[:, None, 1:], dck, 0.0))
    chi2, jtr, jtj = unpack(pairs, np.full(count.shape, m))
    if rt.shape[1]:
        r0 = np.where(use[:, :1], rt[first], 0.0)
        d = np.where(use[:, 1:, None], rt[rowk] - r0[:, None, :], 0.0)
        jtj += d @ d.transpose(0, 2, 1)
        jtr += (d @ r0[:, :, None])[..., 0]
        chi2 += (r0 * r0).sum(axis=1)
    # a failed perturbation's residuals read 0: its change is −r(x)
    bad = valid & ~use[:, 1:]
    if bad.any():
        v = np.where(bad, -chi2[:, None], jtr)
        jtj = np.where(bad[:, :, None], -v[:, None, :], jtj)
        jtj = np.where(bad[:, None, :], -v[:, :, None], jtj)
        jtr = v
    h = np.where(valid, np.asarray(steps, dtype=float).reshape(count.size, m), 1.0)
    jtj = np.where(valid[:, :, None] & valid[:, None, :], jtj / (h[:, :, None] * h[:, None, :]),
                   0.0)
    jtr = np.where(valid, jtr / h, 0.0)
    base_ok = use[:, 0] & np.isfinite(chi2)
    chi2 = np.where(base_ok, chi2, FAILED)
    jtj[~base_ok] = 0.0
    jtr[~base_ok] = 0.0
    took = time.perf_counter() - t0
    lik.steps_s = getattr(lik, "steps_s", 0.0) + took
    # each call's time and size: a process's first call also sets up Numba and loads its
    # kernels
    lik.step_log = [*getattr(lik, "step_log", []), (took, g.shape[0])]
    return chi2, jtj, jtr


def _scales(lik, lay: Layout, sums: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    """Each candidate's amplitude and offset per block (N, B), and each recorded
    protocol's amplitude (N,), from its sums per block, as the likelihood solves them."""
    obj = lik.objective
    n, nb = sums.shape[:2]
    a, c = np.zeros((n, nb)), np.zeros((n, nb))
    amps: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for q, _, _, _, fixed, _ in lik._rec:
            bq = lay.blocks[q]
            sgg, sgd, sg = (sums[:, bq, i] for i in range(3))
            if obj._plain(q):
                if fixed is not None:
                    amp = np.full(n, fixed)
                else:
                    tg, td = sgg.sum(axis=1), sgd.sum(axis=1)
                    amp = np.maximum(np.where(tg > 0, td / np.where(tg > 0, tg, 1.0), 0.0),
                                     0.0)
                a[:, bq] = amp[:, None]
                amps[q] = amp
            else:
                _, amp_k, off = obj._scales(q, sgg, sgd, sg)
                a[:, bq], c[:, bq] = amp_k, off
                amps[q] = obj._protocol_amplitude(q, amp_k)
    return a, c, amps


def _target_residuals(lik, traces, amps: dict[int, np.ndarray], n: int) -> np.ndarray:
    """(N, R_t) the summary targets' residuals, from window values reduced where the
    traces are."""
    obj = lik.objective
    if not any(p.targets for p in obj.plans):
        return np.zeros((n, 0))
    win = window_values(traces, obj.sample_start, obj.windows)
    cols = []
    with np.errstate(all="ignore"):
        for q, plan in enumerate(obj.plans):
            if not plan.targets:
                continue
            res, tw = obj.target_residuals(plan, win, amps.get(q))
            factor = np.where(lik._sd[q], 1.0, lik._scale[q])
            cols.append(np.sqrt(factor * tw) * res)
    return np.concatenate(cols, axis=1)
