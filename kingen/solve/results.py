"""What a batch compares against and what it returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kingen.codegen import N_WINDOWS
from kingen.solve.schedule import Schedule


@dataclass
class ObjectiveInputs:
    """What the objective mode compares against, on the schedule's sample grid.

    ``data`` and ``weight`` have one entry per sample of every sweep (sweeps concatenated);
    ``windows`` (n_sweeps, 4, 3) int: first sample, last sample, op (0 peak, 1 sum, −1 none).
    ``sum_g``: also reduce Σw·g per (candidate, sweep), which fitted offsets need.
    """

    data: np.ndarray
    weight: np.ndarray
    windows: np.ndarray
    sum_g: bool = False


@dataclass
class BatchResult:
    """What a batch returns.

    Objective mode: ``sgg`` = Σ w·g², ``sgd`` = Σ w·g·d per (candidate, sweep), where g is
    the current of one channel (pA), through the recording's filter when it has one, and d
    the data; ``sg`` = Σ w·g when the inputs ask for it (else None); ``windows``
    (N, n_sweeps, 4, 2) holds each window's value (peak or sum of g) and the sample index
    of the peak.
    Trace mode: ``traces`` (N, n_samples_total) current of one channel, pA, and
    ``occupancy`` (N, n_samples_total, n_states) when asked for.
    ``fail`` (N, n_sweeps): 0 ok, else a failure code (see :mod:`kingen.codegen`).
    """

    backend: str
    device: str
    precision: str
    schedule: Schedule
    fail: np.ndarray
    sgg: np.ndarray | None = None
    sgd: np.ndarray | None = None
    sg: np.ndarray | None = None
    windows: np.ndarray | None = None
    traces: np.ndarray | None = None
    occupancy: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def sweep_trace(self, candidate: int, sweep: int) -> np.ndarray:
        """The per-channel current of one candidate in one sweep, pA."""
        assert self.traces is not None
        a, b = self.schedule.sample_start[sweep], self.schedule.sample_start[sweep + 1]
        return self.traces[candidate, a:b]


def result_store(n: int, n_sweeps: int, sums: int, used: int) -> np.ndarray:
    """A fresh host array for the objective kernel's results and the windows' values:
    (value, candidate, sweep), the ``sums`` planes, then a value plane and a sample index
    plane for each of the N_WINDOWS windows when the batch uses any (none otherwise). The
    kernel fills the first ``sums + 2 * used`` planes; the planes of the windows it does not
    carry read 0 with index −1 here.

    Examples
    --------
    >>> store = result_store(3, 1, 2, 1)
    >>> store.shape, float(store[4, 0, 0]), float(store[5, 0, 0])
    ((10, 3, 1), 0.0, -1.0)
    """
    store = np.empty((sums + (2 * N_WINDOWS if used else 0), n, n_sweeps))
    for q in range(used, N_WINDOWS if used else 0):
        store[sums + 2 * q] = 0.0
        store[sums + 2 * q + 1] = -1.0
    return store


def window_values(store: np.ndarray, n: int, n_sweeps: int, sums: int) -> np.ndarray:
    """``BatchResult.windows`` (N, n_sweeps, 4, 2) as a view of :func:`result_store`'s
    array, whose planes after the first ``sums`` are the windows' values and indices: no
    copy of a batch's size (at 16,384 candidates and 20 sweeps one cost 8 ms of a GPU
    generation). With no window used it is a read-only view of one pair's values.

    Examples
    --------
    >>> store = result_store(3, 1, 2, 1)  # two sums, then window 0's value and index
    >>> store[2], store[3] = 5.0, 7.0
    >>> w = window_values(store, 3, 1, 2)
    >>> w.shape, float(w[0, 0, 0, 0]), float(w[0, 0, 0, 1]), float(w[0, 0, 1, 1])
    ((3, 1, 4, 2), 5.0, 7.0, -1.0)
    """
    if store.shape[0] == sums:
        empty = np.zeros((N_WINDOWS, 2))
        empty[:, 1] = -1.0
        return np.broadcast_to(empty, (n, n_sweeps, N_WINDOWS, 2))
    return store[sums:].reshape(N_WINDOWS, 2, n, n_sweeps).transpose(2, 3, 0, 1)
