"""What an evaluation of candidates gives back, and what a protocol's residuals weigh.

:class:`Evaluation` is what :meth:`kingen.fitting.objective.Objective.evaluate` returns;
:class:`NoiseWeights` is what one protocol's residuals weigh in χ², set from the noise model
(:mod:`kingen.identify.likelihood`). Both are re-exported by :mod:`kingen.fitting.objective`.

>>> NoiseWeights(trace=0.25).trace
0.25
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NoiseWeights:
    """What one protocol's residuals weigh in χ² = −2 log L + const
    (:mod:`kingen.identify.likelihood` sets them from the noise model).

    Attributes
    ----------
    trace
        1 / (σ² τ) of the recording, 1/pA² (σ its noise, τ samples per independent one);
        0 without a recording.
    targets
        Per compiled summary target: the factor on its weighted squared residual
        w ((model − value) / scale)²: 1 for a target with an sd, else the scale its
        protocol's targets without one share.
    """

    trace: float = 0.0
    targets: tuple[float, ...] = ()


@dataclass
class Evaluation:
    """Scores of a batch of candidates.

    Attributes
    ----------
    fitness
        (N,) Σ_p weight_p · error_p; +inf for a failed candidate.
    errors
        (N, n_protocols) error per protocol (see the module docstring).
    fail
        (N,) 0 ok, else the failure code of the first failing sweep.
    amplitudes
        (N, n_protocols) amplitude (channels) per protocol; NaN where none applies. With
        an amplitude per sweep, their mean; with rundown, the first sweep's.
    sweep_amplitudes, offsets
        (N, n_sweeps) amplitude and offset (pA) of every sweep, when a protocol's chain
        fits them (None otherwise: one amplitude per protocol, no offset).
    chi2
        (N,) χ² = −2 log L + const, when the objective has a noise model
        (:meth:`Objective.set_noise`); None otherwise.
    """

    fitness: np.ndarray
    errors: np.ndarray
    fail: np.ndarray
    amplitudes: np.ndarray
    sweep_amplitudes: np.ndarray | None = None
    offsets: np.ndarray | None = None
    chi2: np.ndarray | None = None
