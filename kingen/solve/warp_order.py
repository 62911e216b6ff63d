"""The order a GPU call lays its candidates out in, so that a warp's threads take alike steps.

On rows whose concentration varies each candidate takes its own number of RK4 steps
(:mod:`kingen.solve.schedule`), and a warp runs its threads' longest count. A warp of the
matrix builds holds 32 consecutive candidates; in the order the caller gives them (a GA's
population) the longest of 32 is the schedule's own count, and the own steps gain nothing
there until the population gathers. Laid out by their own exit rates at the schedule's
highest smooth concentration (the 10 mM edges that the builds step), consecutive candidates
take alike counts: Robert & Howe's edge keys take 0.68 of the schedule's steps in warps of
32 for the propagator suite's candidates, against 1.00 in the given order, and 0.72 for
candidates drawn from the whole bounds. Within each 32, candidates are ordered by their
exit rate without agonist, which sets the steps of the dose series' edges that the sample
kernel's stage rows take, a warp there holding 4 to 16 candidates: those rows then take
0.63 of the schedule's steps in groups of 8 for the suite's candidates, against 0.84 with
the first key alone (``analysis/h200/optimization_log_exchange.md``, step 15).

The GPU call gathers the candidates' rates and resting occupancies into this order on the
device and scatters the results back (the propagator module's ``take`` and ``put``
kernels), so that the solver's kernels, their matrices and every caller are unchanged
(:func:`kingen.solve.gpu_call.cuda_call`).
"""

from __future__ import annotations

import numpy as np

from kingen.model.scheme import Scheme
from kingen.solve.schedule import Schedule

WARP = 32  # threads of a warp: the candidates one warp of the matrix builds holds


def exit_matrices(scheme: Scheme) -> tuple[np.ndarray, np.ndarray]:
    """(n_params, n_states) matrices A and B such that the exit rates of parameter sets p
    (N, n_params) at concentration c are p·A + c·p·B.

    Examples
    --------
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> a, b = exit_matrices(s)
    >>> p = s.complete(s.values)
    >>> bool(np.allclose(p @ a + 10.0 * (p @ b), s.exit_rates(p, 10.0)))
    True
    """
    a = np.zeros((scheme.n_params, scheme.n_states))
    b = np.zeros_like(a)
    for t in scheme.transitions:
        (b if t.agonist else a)[t.param, t.source] += t.factor
    return a, b


def warp_order(scheme: Scheme, schedule: Schedule, P: np.ndarray) -> np.ndarray | None:
    """The candidates' indices in the order the GPU lays them out, or None where every
    candidate takes the schedule's steps (no smooth row takes own steps).

    Parameters
    ----------
    scheme, schedule
        The scheme and the batch's schedule.
    P
        (n_params, N) complete parameter sets, as the solver takes them (columns that
        fail may hold anything). One product and two sorts: about 3 ms of the host's time
        for 16,384 candidates.

    Examples
    --------
    >>> from kingen.experiment.protocol import standard_protocol
    >>> from kingen.solve.schedule import build_schedule, protocol_sweeps
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> sweeps = protocol_sweeps([standard_protocol("deactivation", exchange=0.2)])[0]
    >>> P = s.complete(np.stack([s.upper, s.values, s.lower])).T
    >>> warp_order(s, build_schedule(s, sweeps), P).tolist()  # the slowest first
    [2, 1, 0]
    >>> print(warp_order(s, build_schedule(s, sweeps, step=0.001), P))
    None
    """
    rows_f, rows_i = schedule.rows_f, schedule.rows_i
    own = (rows_i[:, 3] != 0) & (rows_f[:, 4] > 0)
    if not own.any():
        return None
    a, b = exit_matrices(scheme)
    exits = np.concatenate([a + float(rows_f[own, 2].max()) * b, a], axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        rho = (exits.T @ P).reshape(2, scheme.n_states, -1).max(axis=1)  # at the peak, at 0
    order = np.argsort(rho[0], kind="stable")
    # within each warp's worth of builds, by the rate without agonist: a warp of the sample
    # kernel holds fewer candidates, and its stage rows step the dose series' edges
    full = order.size // WARP * WARP
    blocks = order[:full].reshape(-1, WARP)
    order[:full] = np.take_along_axis(
        blocks, np.argsort(rho[1][blocks], axis=1, kind="stable"), axis=1).ravel()
    tail = order[full:]
    order[full:] = tail[np.argsort(rho[1][tail], kind="stable")]
    return order
