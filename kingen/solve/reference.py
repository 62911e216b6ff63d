"""Exact reference simulation: the ground truth for every solver test.

Constant-concentration segments are solved with the matrix exponential,
p(t + τ) = p(t) · expm(Q τ); smooth segments (finite exchange edges, synaptic transients)
with SciPy's LSODA (Adams where the edge is not stiff, BDF where it is) at rtol 1e-11 and
the exact Jacobian: as accurate as BDF alone, in less than half its time
(``python -m benchmarks reference_solver`` measures both against Radau at rtol 1e-13).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.integrate import solve_ivp
from scipy.linalg import expm

from kingen.experiment.protocol import Protocol, Sweep
from kingen.model.scheme import Scheme

RTOL = 1e-11
ATOL = 1e-14
SMOOTH_METHOD = "LSODA"  # SciPy's solve_ivp method for the smooth segments


@dataclass
class SweepTrace:
    """A simulated sweep: sample times (ms), occupancies (n_samples, n_states), current (pA)."""

    label: str
    time: np.ndarray
    occupancy: np.ndarray
    current: np.ndarray


@dataclass
class ProtocolTrace:
    """Every sweep of a protocol, simulated."""

    protocol: Protocol
    sweeps: list[SweepTrace]

    @property
    def currents(self) -> list[np.ndarray]:
        """The current of each sweep, pA."""
        return [s.current for s in self.sweeps]


def simulate_exact(
    scheme: Scheme,
    protocol: Protocol,
    params: np.ndarray | None = None,
    *,
    channels: float | None = None,
) -> ProtocolTrace:
    """Simulate every sweep of ``protocol`` exactly.

    Parameters
    ----------
    scheme
        The kinetic scheme.
    protocol
        The protocol whose sweeps to simulate.
    params
        Parameter vector (n_params,), internal units; ``None`` means the file's values.
        Derived rates are recomputed.
    channels
        Number of channels (default: the scheme's).
    """
    p = scheme.values if params is None else scheme.complete(np.asarray(params, dtype=float))
    sweeps = [simulate_sweep_exact(scheme, sweep, p, channels=channels)
              for sweep in protocol.sweeps]
    return ProtocolTrace(protocol, sweeps)


def simulate_sweep_exact(scheme: Scheme, sweep: Sweep, params: np.ndarray, *,
                         channels: float | None = None) -> SweepTrace:
    """Occupancies and current of one sweep at its sample times (params already complete)."""
    times = sweep.times()
    occ = np.empty((times.size, scheme.n_states))
    state = scheme.rest_occupancy(params)
    t_now = 0.0
    occ[0] = state
    next_sample = 1
    for seg in sweep.segments():
        inside = []
        while next_sample < times.size and times[next_sample] <= seg.end + 1e-9:
            inside.append(next_sample)
            next_sample += 1
        targets = [times[i] for i in inside]
        if seg.smooth:
            values, state = _smooth(scheme, sweep, params, state, t_now, seg.end, targets)
        else:
            values, state = _constant(scheme, params, seg.concentration, state, t_now,
                                      seg.end, targets)
        for i, v in zip(inside, values):
            occ[i] = v
        t_now = seg.end
    current = scheme.current(occ, sweep.driving_force, channels)
    return SweepTrace(sweep.label, times, occ, current)


def _constant(scheme: Scheme, params: np.ndarray, conc: float, state: np.ndarray, t0: float,
              t1: float, targets: list[float]) -> tuple[list[np.ndarray], np.ndarray]:
    q = scheme.Q(conc, params)
    values = []
    cache: dict[float, np.ndarray] = {}
    t = t0
    for target in targets:
        tau = round(target - t, 12)
        if tau not in cache:
            cache[tau] = _transition_matrix(q, tau)
        state = state @ cache[tau]
        values.append(state)
        t = target
    if t1 - t > 0:
        state = state @ _transition_matrix(q, t1 - t)
    return values, state


def _transition_matrix(q: np.ndarray, tau: float) -> np.ndarray:
    """expm(Q τ), made exactly stochastic: entries at least 0 and rows summing to 1.

    With rates many orders of magnitude apart, rounding leaves expm's result slightly off
    stochastic; an eigenvalue just above 1 then grows without bound over the thousands of
    sample steps of a sweep. The stochastic matrix nearest it keeps every power bounded.
    """
    p = np.clip(expm(q * tau), 0.0, None)
    return p / p.sum(axis=1, keepdims=True)


def _smooth(scheme: Scheme, sweep: Sweep, params: np.ndarray, state: np.ndarray, t0: float,
            t1: float, targets: list[float]) -> tuple[list[np.ndarray], np.ndarray]:
    q1 = scheme.Q(1.0, params)
    q0 = scheme.Q(0.0, params)
    dq = q1 - q0  # Q(c) = Q0 + c * dQ: the agonist enters linearly

    mid = 0.5 * (t0 + t1)

    def rhs(t: float, p: np.ndarray) -> np.ndarray:
        c = float(sweep.concentration(t, steps_at=mid))
        return p @ q0 + c * (p @ dq)

    def jac(t: float, p: np.ndarray) -> np.ndarray:
        c = float(sweep.concentration(t, steps_at=mid))
        return (q0 + c * dq).T

    t_eval = [t for t in targets if t0 <= t <= t1]
    span_points = sorted(set([t0, t1] + t_eval))
    sol = solve_ivp(rhs, (t0, t1), state, method=SMOOTH_METHOD, jac=jac, rtol=RTOL, atol=ATOL,
                    t_eval=span_points, first_step=min(1e-4, (t1 - t0) / 10))
    if not sol.success:  # pragma: no cover - a linear system does not fail
        raise RuntimeError(f"reference solver failed: {sol.message}")
    values = {round(t, 12): sol.y[:, k] for k, t in enumerate(sol.t)}
    out = [values[round(t, 12)] for t in targets]
    return out, sol.y[:, -1]
