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


def window_values(out: np.ndarray, n: int, n_sweeps: int, sums: int) -> np.ndarray:
    """``BatchResult.windows`` (N, n_sweeps, 4, 2) from the objective kernel's results ``out``
    (value, candidate, sweep), whose first ``sums`` values are the pair's sums; windows the
    batch does not use read 0 with index −1. With none used it is a read-only view of one
    pair's values, not an array of the batch's size that nobody reads.

    Examples
    --------
    >>> out = np.zeros((2 + 2, 3, 1))  # two sums, then window 0's value and index
    >>> out[2], out[3] = 5.0, 7.0
    >>> w = window_values(out, 3, 1, 2)
    >>> w.shape, float(w[0, 0, 0, 0]), float(w[0, 0, 0, 1]), float(w[0, 0, 1, 1])
    ((3, 1, 4, 2), 5.0, 7.0, -1.0)
    """
    used = (out.shape[0] - sums) // 2
    empty = np.zeros((N_WINDOWS, 2))
    empty[:, 1] = -1.0
    if used == 0:
        return np.broadcast_to(empty, (n, n_sweeps, N_WINDOWS, 2))
    win = np.empty((n, n_sweeps, N_WINDOWS, 2))
    win[:, :, used:] = empty[used:]
    win[:, :, :used] = out[sums:].reshape(used, 2, n, n_sweeps).transpose(2, 3, 0, 1)
    return win
