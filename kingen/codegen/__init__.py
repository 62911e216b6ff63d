"""Generated straight-line solver code, one module per scheme, mode, precision and form.

- :mod:`kingen.codegen.emit`: the emitters both forms share (rates, RK4 stages, samples);
- :mod:`kingen.codegen.stage`: the stage form, classical RK4 at every step;
- :mod:`kingen.codegen.propagator`: the propagator form, one product with
  M = R(hQ)ⁿ per sample on constant-concentration rows.

:mod:`kingen.solve.compiled` compiles the source for Numba's CPU or CUDA target by
supplying the ``DEVICE`` decorator.

Layout of the arguments (see :mod:`kingen.solve.schedule` for the rows):

- ``P`` (n_params, N): parameters, parameter-major so that a warp's loads coalesce.
- ``S0`` (n_states, N): initial occupancies.
- ``conc`` and ``row_conc``: the agonist concentration at each RK4 stage time of the rows
  whose concentration varies, and where each such row's values start
  (:func:`kingen.solve.schedule.stage_concentrations`).
- ``drive`` (n_sweeps,): driving force × 1e-3, so that Σ gᵢ pᵢ · drive is pA per channel.
- objective mode: ``data``, ``weight`` (n_samples_total,), ``win`` (n_sweeps, W, 3) int:
  first sample, last sample, op (0 peak, 1 sum, −1 unused); ``out`` (2 + 2W', N, n_sweeps),
  W' the windows the kernel carries (:func:`out_width`): Σw·g², Σw·g·d, then per window its
  value and sample index; ``fail`` (n_sweeps, N).
- trace mode: ``trace`` (N, n_samples_total) current per channel; ``occ``
  (N, n_samples_total, n_states) when ``with_occupancy``.
"""

from kingen.codegen.emit import (
    FAIL_CONSERVATION,
    FAIL_NONFINITE,
    FAIL_OK,
    FAIL_PARAMS,
    FAIL_RANGE,
    FAILURE_NAMES,
    N_OUT,
    N_WINDOWS,
    out_width,
)
from kingen.codegen.matrix_build import generate_matrix_build
from kingen.codegen.propagator import generate_propagator
from kingen.codegen.stage import GeneratedCode, generate

__all__ = ["FAILURE_NAMES", "FAIL_CONSERVATION", "FAIL_NONFINITE", "FAIL_OK", "FAIL_PARAMS",
           "FAIL_RANGE", "GeneratedCode", "N_OUT", "N_WINDOWS", "generate",
           "generate_matrix_build", "generate_propagator", "out_width"]
