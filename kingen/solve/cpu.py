"""The batch on all CPU cores: the stage form in one parallel call, the propagator form in
chunks of candidates whose matrices it builds first."""

from __future__ import annotations

import numba
import numpy as np

from kingen.solve.plan import PropagatorPlan
from kingen.solve.schedule import Schedule

# The CPU propagator builds its matrices in chunks of candidates of at most this many bytes.
_CPU_D_BYTES = 64 * 2**20


def run_on_cpu(module, config, P: np.ndarray, S0: np.ndarray, extra: tuple, fail: np.ndarray,
               *, plan: PropagatorPlan, schedule: Schedule, drive: np.ndarray,
               flt: np.ndarray, tol: float) -> None:
    """Run a compiled CPU module (:func:`kingen.solve.compiled.solver_module`) on every
    (candidate, sweep) pair: ``extra`` are the mode's outputs and inputs, written in place
    with ``fail``."""
    # Sweeps differ in cost by orders of magnitude (a recovery sweep runs seconds of
    # protocol, a deactivation sweep milliseconds), and Numba's default static split
    # hands whole blocks of the expensive ones to a few threads. Handing out one
    # (candidate, sweep) pair at a time costs nothing next to a pair's work.
    previous = numba.set_parallel_chunksize(1)
    s = schedule
    try:
        if config.form == "stage":
            module.launch(P.shape[1], s.n_sweeps, P, S0, s.rows_f, s.rows_i, s.row_start,
                          s.conc, s.row_conc, drive, flt, s.sample_start, tol, *extra, fail)
        else:
            _propagate(module, config, P, S0, extra, fail, plan, s, drive, flt, tol)
    finally:
        numba.set_parallel_chunksize(previous)


def _propagate(module, config, P: np.ndarray, S0: np.ndarray, extra: tuple,
               fail: np.ndarray, plan: PropagatorPlan, s: Schedule, drive: np.ndarray,
               flt: np.ndarray, tol: float) -> None:
    """The propagator form, in chunks of candidates whose matrices stay within a few tens
    of MB (they are rebuilt every call; memory, not time, bounds them)."""
    n = P.shape[1]
    S = S0.shape[0]
    span = config.span
    per_candidate = plan.n_keys * S * S
    if span > 1:
        per_candidate += plan.n_span_keys * S * (span + S)
    per_candidate = max(1, per_candidate * P.itemsize)
    chunk = max(1, min(n, _CPU_D_BYTES // per_candidate))
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        Pc, Sc = np.ascontiguousarray(P[:, a:b]), np.ascontiguousarray(S0[:, a:b])
        # D laid out (candidate, key, row, column): see kingen.codegen.generate_propagator
        D = np.empty((b - a, plan.n_keys, S, S), dtype=P.dtype)
        spans: tuple = ()
        if span > 1:
            spans = (np.empty((b - a, plan.n_span_keys, span, S), dtype=P.dtype),
                     np.empty((b - a, plan.n_span_keys, S, S), dtype=P.dtype))
        if plan.n_keys:
            module.build(b - a, plan.n_keys, Pc, plan.keys_f, plan.keys_i, plan.keys_conc,
                         s.conc, D)
            if spans and plan.n_span_keys:
                module.build_span(b - a, plan.n_span_keys, D, *spans)
        if b - a == n:
            out_extra, out_fail = extra, fail
        else:
            out_extra, out_fail = _chunk_outputs(extra, fail, a, b)
        module.launch(b - a, s.n_sweeps, Pc, Sc, s.rows_f, s.rows_i, s.row_start,
                      plan.row_key, s.conc, s.row_conc, drive, flt, s.sample_start, tol, D,
                      *spans, *out_extra, out_fail)
        if b - a != n:
            _chunk_write_back(extra, fail, out_extra, out_fail, a, b)


def _chunk_outputs(extra: tuple, fail: np.ndarray, a: int, b: int):
    if extra[0].ndim == 1:  # objective: data, weight, win, out (value, N, n_sweeps)
        return (extra[0], extra[1], extra[2], np.zeros_like(extra[3][:, a:b])), \
            np.zeros_like(fail[:, a:b])
    occ = extra[1] if extra[1].shape[0] == 1 else np.empty_like(extra[1][a:b])
    return (np.empty_like(extra[0][a:b]), occ, extra[2], extra[3]), \
        np.zeros_like(fail[:, a:b])


def _chunk_write_back(extra: tuple, fail: np.ndarray, out_extra: tuple,
                      out_fail: np.ndarray, a: int, b: int) -> None:
    fail[:, a:b] = out_fail
    if extra[0].ndim == 1:
        extra[3][:, a:b] = out_extra[3]
    else:
        extra[0][a:b] = out_extra[0]
        if extra[1].shape[0] != 1:
            extra[1][a:b] = out_extra[1]
