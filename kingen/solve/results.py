"""What a batch compares against and what it returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
