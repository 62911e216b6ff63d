"""Profile likelihoods of every chosen parameter, all sub-problems in one batched call a step.

The profile of a gene x_j (log10 of a rate) is χ²_j(v) = min over the other genes of χ²(θ)
with x_j fixed at v (:mod:`kingen.identify.likelihood`); Δχ²_j(v) = χ²_j(v) − min χ² is
compared with the χ²₁ quantile at the confidence level (3.84 at 95 %): the confidence
interval is where Δχ² stays below it (Wilks). A side where the profile never crosses it,
up to the parameter's bound, leaves the interval open there: the data do not bound the
rate on that side, and the parameter is not identifiable. A profile that stays below the
threshold everywhere is flat.

:class:`ProfileEngine` holds every (parameter, grid point) sub-problem, plus the optimum
itself, and advances them together: every :meth:`ProfileEngine.step` makes ONE solver call
(:meth:`~kingen.identify.likelihood.Likelihood.gauss_newton`) holding, for every
sub-problem still at work,

- a batched Levenberg–Marquardt step: the trial point and its forward-difference
  perturbations (the Jacobian's columns), whose JᵀJ and Jᵀr give the next step. They are
  summed where the traces are made (on the GPU by kernels reading the traces the solver
  left there, on the CPU in Numba loops parallel over groups; see
  :mod:`kingen.identify.gauss_newton`): only JᵀJ, Jᵀr and χ² of each sub-problem come
  back, never a residual trace;
- or the candidates of its warm start: the optimum with x_j = v, the quadratic (Fisher)
  prediction of the other genes at x_j = v, the nearest point already solved on the same
  profile, and the run's hall of fame with x_j = v;
- or, once all have converged, its neighbours' solutions on the profile (a profile point
  caught in a worse local minimum restarts from a neighbour's).

The grid is laid in each gene's log space around the optimum, wide enough by the quadratic
approximation to cross the threshold (1.5 × its predicted crossing) with ``points`` points;
a side that does not cross is widened (three times the distance, up to
:data:`MAX_WIDEN` times) until it does or reaches the bound. The whole state is plain
numbers (:meth:`ProfileEngine.to_state`), written to the run file after every step, so a
killed computation continues where it stopped.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kingen.identify.fisher import covariance, embed, fd_step
from kingen.identify.gauss_newton import Groups

MAX_WIDEN = 3          # times a side of a profile is widened
MAX_ITER = 30          # Levenberg–Marquardt iterations of the optimum
MAX_ITER_POINT = 20    # ... and of a grid point (warm-started near its solution)
TOL = 1e-2             # χ² decrease below which a sub-problem has converged
NEIGHBOUR_GAIN = 0.01  # χ² a neighbour's solution must gain to restart a point
NEIGHBOUR_PASSES = 2   # neighbour passes per round of the grid
MAX_STEP = 0.5         # decades a gene may move in one step
MAX_REFINE = 2         # times a steep threshold crossing is refined with points between
MIN_WIDTH = 1e-3       # decades: the narrowest first grid
RECENTRE_GAIN = 0.05   # χ² a profile point must gain over the optimum to move the optimum
MAX_RECENTRE = 2       # times the optimum is moved (and the grids laid again)
HOF_STARTS = 4         # hall-of-fame members tried as warm starts

WAIT, ACTIVE, DONE = 0, 1, 2


def threshold(level: float) -> float:
    """The χ²₁ quantile at ``level`` (3.84 at 0.95)."""
    from scipy.stats import chi2

    return float(chi2.ppf(level, 1))


class ProfileEngine:
    """All profile sub-problems of one run, advanced together (see the module docstring).

    Parameters
    ----------
    lik
        The :class:`~kingen.identify.likelihood.Likelihood`.
    genes
        Indices (into the genes) of the parameters to profile.
    points
        Grid points per parameter (before widening).
    level
        Confidence level of the intervals.
    best
        The fit's best genes (the optimum's start).
    hof
        The run's hall of fame (K, n_genes) genes, best first (warm starts).
    state
        A state from :meth:`to_state` to continue from.
    """

    def __init__(self, lik, genes: list[int], points: int, level: float, best: np.ndarray,
                 hof: np.ndarray, state: dict[str, Any] | None = None) -> None:
        self.lik = lik
        self.pmap = lik.pmap
        self.lower = np.asarray(self.pmap.lower, dtype=float)
        self.upper = np.asarray(self.pmap.upper, dtype=float)
        self.n = self.pmap.n_genes
        self.genes = [int(j) for j in genes]
        self.points = int(points)
        self.level = float(level)
        self.thr = threshold(level)
        self.h = fd_step(getattr(lik.objective.simulator, "precision", "float64"))
        self.hof = np.asarray(hof, dtype=float).reshape(-1, self.n)[:HOF_STARTS]
        n = self.n
        # sub-problems: the optimum (param -1) first, then the grid points
        self.param = np.array([-1], dtype=np.int64)
        self.value = np.array([math.nan])
        self.x = np.clip(np.asarray(best, dtype=float), self.lower, self.upper)[None, :]
        self.chi2 = np.array([math.inf])
        self.lam = np.array([1e-3])
        self.iters = np.zeros(1, dtype=np.int64)
        self.status = np.array([WAIT], dtype=np.int64)
        self.phase = "center"
        self.widened = {j: [0, 0] for j in self.genes}
        self.refined = {j: [0, 0] for j in self.genes}
        self.recentred = 0
        self.passes = 0
        self.fisher = np.zeros((n, n))
        self.steps = 0
        self.calls = 0
        self.candidates = 0
        # the neighbour candidates of a pass, waiting for the next step's call (not stored:
        # an interrupted pass is taken again)
        self._neighbour_jobs: list[tuple[int, list[np.ndarray]]] | None = None
        # χ² decrease below which a sub-problem has converged, the optimum's iterations, and
        # why each finished sub-problem stopped (see :meth:`descend`; not stored)
        self.tol = TOL
        self.max_iter = MAX_ITER
        self.why: dict[int, str] = {}
        self._reset_memory()
        if state is not None:
            self._load(state)

    # ------------------------------------------------------------------ state
    def _reset_memory(self) -> None:
        b, n = self.x.shape[0], self.n
        self.a = np.zeros((b, n, n))
        self.g = np.zeros((b, n))
        self.have = np.zeros(b, dtype=bool)  # a, g hold JᵀJ and Jᵀr at x
        self.y = self.x.copy()               # the pending trial point
        self.pred = np.zeros(b)              # the χ² decrease the linear model predicts
        self.nu = np.full(b, 2.0)            # Nielsen's growth factor of λ

    def _grow_memory(self, k: int) -> None:
        n = self.n
        self.a = np.concatenate([self.a, np.zeros((k, n, n))])
        self.g = np.concatenate([self.g, np.zeros((k, n))])
        self.have = np.concatenate([self.have, np.zeros(k, dtype=bool)])
        self.y = np.concatenate([self.y, self.x[-k:]])
        self.pred = np.concatenate([self.pred, np.zeros(k)])
        self.nu = np.concatenate([self.nu, np.full(k, 2.0)])

    def to_state(self) -> dict[str, Any]:
        """Everything needed to continue, as plain numbers (JSON-able)."""
        def fl(a: np.ndarray) -> list:
            return np.where(np.isfinite(a), a, np.nan).tolist()

        return {"version": 1, "phase": self.phase, "genes": self.genes,
                "points": self.points, "level": self.level,
                "param": self.param.tolist(), "value": fl(self.value),
                "x": self.x.tolist(), "chi2": [c if math.isfinite(c) else None
                                               for c in self.chi2.tolist()],
                "lam": self.lam.tolist(), "iters": self.iters.tolist(),
                "status": self.status.tolist(),
                "widened": {str(j): w for j, w in self.widened.items()},
                "refined": {str(j): w for j, w in self.refined.items()},
                "passes": self.passes, "recentred": self.recentred,
                "fisher": self.fisher.tolist(), "steps": self.steps,
                "calls": self.calls, "candidates": self.candidates,
                # the Levenberg-Marquardt memory: a resumed run takes the same steps
                "jtj": self.a.tolist(), "jtr": self.g.tolist(), "have": self.have.tolist(),
                "trial": self.y.tolist(), "pred": self.pred.tolist(), "nu": self.nu.tolist()}

    def _load(self, s: dict[str, Any]) -> None:
        n = self.n
        x = np.array(s["x"], dtype=float)
        b = x.shape[0]
        if x.ndim != 2 or x.shape[1] != n or b < 1:
            raise ValueError("profile state: x of the wrong shape")
        self.param = np.array(s["param"], dtype=np.int64).reshape(b)
        self.value = np.array([math.nan if v is None else v for v in s["value"]],
                              dtype=float).reshape(b)
        self.x = x
        self.chi2 = np.array([math.inf if v is None else v for v in s["chi2"]],
                             dtype=float).reshape(b)
        self.lam = np.array(s["lam"], dtype=float).reshape(b)
        self.iters = np.array(s["iters"], dtype=np.int64).reshape(b)
        self.status = np.array(s["status"], dtype=np.int64).reshape(b)
        self.phase = str(s["phase"])
        self.widened = {int(j): [int(w[0]), int(w[1])] for j, w in s["widened"].items()}
        self.refined = {int(j): [int(w[0]), int(w[1])] for j, w in s["refined"].items()}
        self.passes = int(s["passes"])
        self.recentred = int(s["recentred"])
        self.fisher = np.array(s["fisher"], dtype=float).reshape(n, n)
        self.steps, self.calls = int(s["steps"]), int(s["calls"])
        self.candidates = int(s["candidates"])
        self.a = np.array(s["jtj"], dtype=float).reshape(b, n, n)
        self.g = np.array(s["jtr"], dtype=float).reshape(b, n)
        self.have = np.array(s["have"], dtype=bool).reshape(b)
        self.y = np.array(s["trial"], dtype=float).reshape(b, n)
        self.pred = np.array(s["pred"], dtype=float).reshape(b)
        self.nu = np.array(s["nu"], dtype=float).reshape(b)
        if self.phase not in ("center", "grid", "done") or (
                self.param[1:] < 0).any() or (self.param >= n).any():
            raise ValueError("profile state: inconsistent")

    @property
    def done(self) -> bool:
        """True when every profile is finished."""
        return self.phase == "done"

    @property
    def chi2_min(self) -> float:
        """The lowest χ² seen (the optimum's, or a lower one a profile found)."""
        finite = self.chi2[np.isfinite(self.chi2)]
        return float(finite.min()) if finite.size else math.inf

    # ------------------------------------------------------------------ one step
    def step(self) -> bool:
        """Advance every sub-problem at work by ONE batched solver call.

        Returns False when there is nothing left to do.
        """
        if self.phase == "done":
            return False
        while not (self.status != DONE).any() and self._neighbour_jobs is None:
            if not self._next_round():
                self.phase = "done"
                return False
        batch = Groups()
        jobs: list[tuple[str, int, int, int]] = []
        for b in np.flatnonzero(self.status == WAIT):
            lo = batch.add_points(self._warm_candidates(int(b)))
            jobs.append(("warm", int(b), lo, batch.groups))
        for b in np.flatnonzero(self.status == ACTIVE):
            free = np.ones(self.n, dtype=bool)
            if self.param[b] >= 0:
                free[self.param[b]] = False
            lo = batch.add_lm(self.y[b] if self.have[b] else self.x[b], self.upper, self.h,
                              free)
            jobs.append(("lm", int(b), lo, lo + 1))
        if self._neighbour_jobs is not None:
            for b, cands in self._neighbour_jobs:
                lo = batch.add_points(cands)
                jobs.append(("neighbour", b, lo, batch.groups))
            self._neighbour_jobs = None
        chi2, jtj, jtr = batch.evaluate(self.lik)
        self.calls += 1
        self.candidates += len(batch.rows)
        restarted = False
        for kind, b, lo, hi in jobs:
            if kind == "warm":
                k = lo + int(np.argmin(chi2[lo:hi]))
                self.x[b] = batch.rows[batch.first[k]]
                self.chi2[b] = chi2[k]
                self.status[b] = ACTIVE
                self.have[b] = False
                self.lam[b], self.nu[b] = 1e-3, 2.0
            elif kind == "neighbour":
                k = lo + int(np.argmin(chi2[lo:hi]))
                if chi2[k] < self.chi2[b] - NEIGHBOUR_GAIN:
                    self.x[b] = batch.rows[batch.first[k]]
                    self.chi2[b] = chi2[k]
                    self.status[b] = ACTIVE
                    self.have[b] = False
                    self.lam[b], self.nu[b] = 1e-3, 2.0
                    self.iters[b] = 0
                    restarted = True
            else:
                self._lm_update(b, chi2[lo], jtj[lo], jtr[lo])
        if any(kind == "neighbour" for kind, *_ in jobs) and not restarted:
            self.passes = NEIGHBOUR_PASSES  # nothing to gain from neighbours: go on
        self.steps += 1
        if self.phase == "center" and self.status[0] == DONE:
            self._start_grid()
        return True

    def _lm_update(self, b: int, c0: float, jtj: np.ndarray, jtr: np.ndarray) -> None:
        """One sub-problem's Levenberg–Marquardt update from χ², JᵀJ and Jᵀr at its trial
        point (over its free genes, in order; padding beyond them unread)."""
        free = np.ones(self.n, dtype=bool)
        if self.param[b] >= 0:
            free[self.param[b]] = False
        y = self.y[b] if self.have[b] else self.x[b]
        a, g = embed(jtj, jtr, free)
        converged, why = False, ""
        if not self.have[b]:
            accept = math.isfinite(c0)
        else:
            accept = c0 < self.chi2[b]
            if accept:
                # Nielsen's update: λ shrinks as far as the step matched the linear model
                actual = self.chi2[b] - c0
                rho = actual / self.pred[b] if self.pred[b] > 0 else 1.0
                converged = actual < self.tol
                why = "χ² tolerance"
                self.lam[b] = max(self.lam[b] * max(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3),
                                  1e-9)
                self.nu[b] = 2.0
            else:
                self.lam[b] *= self.nu[b]
                self.nu[b] *= 2.0
                converged = self.lam[b] > 1e7
                why = "step tolerance (no smaller step lowers χ²)"
        if accept:
            self.x[b] = y
            self.chi2[b] = c0
            self.a[b], self.g[b] = a, g
            self.have[b] = True
            if b == 0:
                self.fisher = a
        self.iters[b] += 1
        if not self.have[b]:
            self._done(b, "no finite start")  # nothing to improve on
            return
        limit = self.max_iter if self.param[b] < 0 else MAX_ITER_POINT
        if converged:
            self._done(b, why)
            return
        if self.iters[b] >= limit:
            self._done(b, f"iteration limit ({limit})")
            return
        a, g = self.a[b], self.g[b]
        cols = np.flatnonzero(free)
        if cols.size == 0:
            self._done(b, "nothing free")
            return
        if accept and self.iters[b] > 1:
            # what a full Gauss-Newton step could still gain, gᵀA⁺g (χ² = Σr², g = Jᵀr)
            gc = g[cols]
            gain = float(gc @ np.linalg.lstsq(a[np.ix_(cols, cols)], gc, rcond=1e-12)[0])
            if gain < self.tol:
                self._done(b, "gradient tolerance")
                return
        delta = self._solve(a, g, cols, self.lam[b])
        # genes at a bound that the step pushes outward are held there (active set)
        x = self.x[b]
        held = ((x[cols] <= self.lower[cols] + 1e-12) & (delta < 0)) | (
            (x[cols] >= self.upper[cols] - 1e-12) & (delta > 0))
        if held.any() and (~held).any():
            cols = cols[~held]
            delta = self._solve(a, g, cols, self.lam[b])
        elif held.all():
            self._done(b, "gradient tolerance (every gene held at a bound)")
            return
        big = np.abs(delta).max() if delta.size else 0.0
        if big > MAX_STEP:
            delta *= MAX_STEP / big
        y_new = self.x[b].copy()
        y_new[cols] = np.clip(y_new[cols] + delta, self.lower[cols], self.upper[cols])
        step = y_new - self.x[b]
        if np.abs(step).max() < 1e-9:
            self._done(b, "step tolerance")
            return
        self.y[b] = y_new
        self.pred[b] = -(2.0 * step @ g + step @ a @ step)

    def _done(self, b: int, why: str) -> None:
        self.status[b] = DONE
        self.why[b] = why

    # ------------------------------------------------------------------ descent alone
    @classmethod
    def from_starts(cls, lik, starts: np.ndarray, *, max_iter: int = MAX_ITER,
                    tol: float = TOL) -> ProfileEngine:
        """An engine whose sub-problems are minimisations of χ² over every gene, one from
        each row of ``starts``, advanced by :meth:`descend` (no profile is laid).

        Examples
        --------
        See :func:`kingen.identify.refine.finish`.
        """
        x = np.atleast_2d(np.asarray(starts, dtype=float))
        eng = cls(lik, [], MAX_ITER_POINT, 0.95, x[0], np.zeros((0, x.shape[1])))
        k = x.shape[0]
        eng.param = np.full(k, -1, dtype=np.int64)
        eng.value = np.full(k, math.nan)
        eng.x = np.clip(x, eng.lower, eng.upper)
        eng.chi2 = np.full(k, math.inf)
        eng.lam = np.full(k, 1e-3)
        eng.iters = np.zeros(k, dtype=np.int64)
        eng.status = np.full(k, ACTIVE, dtype=np.int64)
        eng.max_iter, eng.tol = int(max_iter), float(tol)
        eng._reset_memory()
        return eng

    def descend(self) -> bool:
        """One Levenberg–Marquardt step of every sub-problem at work (as :meth:`step`
        takes them), in ONE batched solver call; False when none is at work."""
        active = np.flatnonzero(self.status == ACTIVE)
        if not active.size:
            return False
        batch = Groups()
        free = np.ones(self.n, dtype=bool)
        for b in active:
            batch.add_lm(self.y[b] if self.have[b] else self.x[b], self.upper, self.h, free)
        chi2, jtj, jtr = batch.evaluate(self.lik)
        self.calls += 1
        self.candidates += len(batch.rows)
        for i, b in enumerate(active):
            self._lm_update(int(b), chi2[i], jtj[i], jtr[i])
        self.steps += 1
        return True

    @staticmethod
    def _solve(a: np.ndarray, g: np.ndarray, cols: np.ndarray, lam: float) -> np.ndarray:
        """The Levenberg-Marquardt step on ``cols``: (A + λ diag A) δ = −g."""
        aa = a[np.ix_(cols, cols)]
        d = np.diag(aa).copy()
        d = np.maximum(d, 1e-12 * max(float(d.max()), 1e-300))
        m = aa + lam * np.diag(d)
        try:
            return -np.linalg.solve(m, g[cols])
        except np.linalg.LinAlgError:
            return -np.linalg.lstsq(m, g[cols], rcond=None)[0]

    # ------------------------------------------------------------------ warm starts
    def _with(self, x: np.ndarray, j: int, v: float) -> np.ndarray:
        out = np.clip(np.array(x, dtype=float), self.lower, self.upper)
        out[j] = v
        return out

    def _warm_candidates(self, b: int) -> list[np.ndarray]:
        j, v = int(self.param[b]), float(self.value[b])
        if j < 0:
            return [self.x[0].copy()] + [np.clip(h, self.lower, self.upper) for h in self.hof]
        centre = self.x[0]
        cands = [self._with(centre, j, v)]
        others = np.array([k for k in range(self.n) if k != j])
        f = self.fisher
        if others.size:
            shift = np.linalg.lstsq(f[np.ix_(others, others)], f[others, j], rcond=1e-10)[0]
            pred = centre.copy()
            pred[others] = centre[others] - shift * (v - centre[j])
            cands.append(self._with(pred, j, v))
        same = np.flatnonzero((self.param == j) & (self.status == DONE))
        if same.size:
            near = same[np.argmin(np.abs(self.value[same] - v))]
            cands.append(self._with(self.x[near], j, v))
        cands.extend(self._with(h, j, v) for h in self.hof)
        return cands

    # ------------------------------------------------------------------ the grid
    def _add_points(self, j: int, values: list[float]) -> None:
        k = len(values)
        if not k:
            return
        self.param = np.concatenate([self.param, np.full(k, j, dtype=np.int64)])
        self.value = np.concatenate([self.value, np.asarray(values, dtype=float)])
        self.x = np.concatenate([self.x, np.repeat(self.x[:1], k, axis=0)])
        self.chi2 = np.concatenate([self.chi2, np.full(k, math.inf)])
        self.lam = np.concatenate([self.lam, np.full(k, 1e-3)])
        self.iters = np.concatenate([self.iters, np.zeros(k, dtype=np.int64)])
        self.status = np.concatenate([self.status, np.full(k, WAIT, dtype=np.int64)])
        self._grow_memory(k)

    def _side_values(self, j: int, start: float, end: float, m: int) -> list[float]:
        """m points from ``start`` (excluded) to ``end`` (included), within the bounds;
        the bound itself when the span passes it."""
        lo, hi = self.lower[j], self.upper[j]
        out = []
        for i in range(1, m + 1):
            v = start + (end - start) * i / m
            if v <= lo or v >= hi:
                out.append(lo if v <= lo else hi)
                break
            out.append(v)
        return [v for v in out if abs(v - start) > 1e-9]

    def _start_grid(self) -> None:
        cov = covariance(self.fisher)
        m = max((self.points - 1) // 2, 2)
        centre = self.x[0]
        for j in self.genes:
            se = math.sqrt(cov[j, j]) if math.isfinite(cov[j, j]) and cov[j, j] > 0 else math.inf
            span = self.upper[j] - self.lower[j]
            w = min(max(1.5 * se * math.sqrt(self.thr), MIN_WIDTH), span) if math.isfinite(
                se) else span / 3.0
            for side in (-1, 1):
                self._add_points(j, self._side_values(j, centre[j], centre[j] + side * w, m))
        self.phase = "grid"
        self.passes = 0

    def _next_round(self) -> bool:
        """All converged: a neighbour pass, or widening, or nothing (False)."""
        if self.phase == "center":
            self._start_grid()
            return True
        best = int(np.argmin(np.where(np.isfinite(self.chi2), self.chi2, np.inf)))
        if self.chi2[best] < self.chi2[0] - RECENTRE_GAIN and self.recentred < MAX_RECENTRE:
            # a profile found a lower χ² than the optimum: the optimum moves there, is
            # re-optimised, and the grids are laid again around it
            self.recentred += 1
            x0, c0 = self.x[best].copy(), float(self.chi2[best])
            for name in ("param", "value", "x", "chi2", "lam", "iters", "status"):
                setattr(self, name, getattr(self, name)[:1].copy())
            self.x[0], self.chi2[0], self.lam[0], self.iters[0] = x0, c0, 1e-3, 0
            self.status[0] = ACTIVE
            self._reset_memory()
            self.widened = {j: [0, 0] for j in self.genes}
            self.refined = {j: [0, 0] for j in self.genes}
            self.phase = "center"
            return True
        if self.passes < NEIGHBOUR_PASSES:
            self.passes += 1
            jobs = []
            for j in self.genes:
                idx = self.profile_index(j)
                for pos, b in enumerate(idx):
                    if b == 0:
                        continue
                    cands = [self._with(self.x[idx[q]], j, float(self.value[b]))
                             for q in (pos - 1, pos + 1) if 0 <= q < len(idx)]
                    jobs.append((int(b), cands))
            if jobs:
                self._neighbour_jobs = jobs
                return True
        widened = False
        m = max((self.points - 1) // 4, 2)
        cmin = self.chi2_min
        centre = self.x[0]
        for j in self.genes:
            idx = self.profile_index(j)
            vals = np.array([centre[j] if b == 0 else self.value[b] for b in idx])
            d = self.chi2[idx] - cmin
            for s, side in ((0, -1), (1, 1)):
                on = (vals - centre[j]) * side > 0
                if not on.any():
                    edge = centre[j]
                else:
                    edge = float(vals[on][np.argmax(np.abs(vals[on] - centre[j]))])
                bound = self.lower[j] if side < 0 else self.upper[j]
                crossed = bool((d[on] >= self.thr).any()) if on.any() else False
                if crossed:
                    widened |= self._refine(j, s, side, vals, d)
                    continue
                if abs(edge - bound) < 1e-9 or self.widened[j][s] >= MAX_WIDEN:
                    continue
                far = centre[j] + side * 3.0 * max(abs(edge - centre[j]), 0.02)
                self._add_points(j, self._side_values(j, edge, far, m))
                self.widened[j][s] += 1
                widened = True
        if widened:
            self.passes = 0
        return widened

    def _refine(self, j: int, s: int, side: int, vals: np.ndarray, d: np.ndarray) -> bool:
        """Points between the last point under the threshold and the first over it, when
        the first is far over it (the interpolated crossing would be coarse)."""
        if self.refined[j][s] >= MAX_REFINE:
            return False
        centre = self.x[0, j]
        order = np.argsort((vals - centre) * side)
        prev = centre
        for i in order:
            if (vals[i] - centre) * side <= 0 or not math.isfinite(d[i]):
                continue
            if d[i] >= self.thr:
                if d[i] <= 2.0 * self.thr:
                    return False
                self.refined[j][s] += 1
                self._add_points(j, [prev + (vals[i] - prev) * k / 4 for k in (1, 2, 3)])
                return True
            prev = float(vals[i])
        return False

    def profile_index(self, j: int) -> list[int]:
        """Sub-problems of gene j's profile, the optimum included, by value."""
        idx = np.flatnonzero(self.param == j)
        order = idx[np.argsort(self.value[idx])]
        centre = self.x[0, j]
        left = [int(b) for b in order if self.value[b] < centre]
        right = [int(b) for b in order if self.value[b] >= centre]
        return left + [0] + right

    # ------------------------------------------------------------------ results
    def results(self, names: list[str]) -> dict[str, Any]:
        """Intervals, identifiability and moving pairs: see
        :func:`kingen.identify.intervals.profile_results`."""
        from kingen.identify.intervals import profile_results

        return profile_results(self, names)
