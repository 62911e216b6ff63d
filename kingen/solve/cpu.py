"""The batch on all CPU cores: the stage form in one parallel call; the propagator form in
one parallel loop over candidates, each thread building a candidate's matrices and then
running its sweeps on them (or, for a batch too small to give every thread several
candidates, the matrices of all candidates first and then one loop over (candidate, sweep)
pairs)."""

from __future__ import annotations

import numba
import numpy as np

from kingen.solve.plan import PropagatorPlan
from kingen.solve.schedule import Schedule

# The pairs' form builds every candidate's matrices at once, in chunks of candidates of at
# most this many bytes.
_CPU_D_BYTES = 64 * 2**20
# Candidates per thread from which a batch runs candidate by candidate (``evaluate``): a
# candidate is one thread's work, and with fewer of them per thread the last round leaves
# cores idle, where the pairs' form still shares a candidate's sweeps out.
PER_THREAD = 4


def run_on_cpu(module, config, P: np.ndarray, S0: np.ndarray, extra: tuple, fail: np.ndarray,
               *, plan: PropagatorPlan, schedule: Schedule, drive: np.ndarray,
               flt: np.ndarray, tol: float, solve: bool = True) -> None:
    """Run a compiled CPU module (:func:`kingen.solve.compiled.solver_module`) on every
    (candidate, sweep) pair: ``extra`` are the mode's outputs and inputs, written in place
    with ``fail``.

    With ``solve`` False the propagator form only builds its matrices (the benchmarks'
    split of the time between the matrices and the samples); the outputs stay as given.
    """
    # Sweeps differ in cost by orders of magnitude (a recovery sweep runs seconds of
    # protocol, a deactivation sweep milliseconds), and Numba's default static split
    # hands whole blocks of the expensive ones to a few threads. Handing out one
    # candidate or (candidate, sweep) pair at a time costs nothing next to its work.
    previous = numba.set_parallel_chunksize(1)
    s = schedule
    try:
        if config.form == "stage":
            module.launch(P.shape[1], s.n_sweeps, P, S0, s.rows_f, s.rows_i, s.row_start,
                          s.conc, s.row_conc, drive, flt, s.sample_start, tol, *extra, fail)
        elif by_candidate(P.shape[1], numba.get_num_threads()):
            _evaluate(module, config, P, S0, extra, fail, plan, s, drive, flt, tol, solve)
        else:
            _propagate(module, config, P, S0, extra, fail, plan, s, drive, flt, tol, solve)
    finally:
        numba.set_parallel_chunksize(previous)


def by_candidate(n: int, threads: int) -> bool:
    """Whether a batch of ``n`` candidates on ``threads`` threads runs candidate by
    candidate (each thread builds a candidate's matrices and runs all of its sweeps).

    Examples
    --------
    >>> by_candidate(1024, 16), by_candidate(20, 16)
    (True, False)
    """
    return n >= PER_THREAD * threads


def _matrices(n_slots: int, config, plan: PropagatorPlan, S: int, dtype) -> tuple:
    """D (slot, key, row, column) and, with spans, GV (slot, key, row, sample) and DV (D's
    layout): one slot per candidate, or per thread (see
    :func:`kingen.codegen.generate_propagator`)."""
    D = np.empty((n_slots, plan.n_keys, S, S), dtype=dtype)
    if config.span == 1:
        return D, ()
    return D, (np.empty((n_slots, plan.n_span_keys, S, config.span), dtype=dtype),
               np.empty((n_slots, plan.n_span_keys, S, S), dtype=dtype))


def _evaluate(module, config, P: np.ndarray, S0: np.ndarray, extra: tuple,
              fail: np.ndarray, plan: PropagatorPlan, s: Schedule, drive: np.ndarray,
              flt: np.ndarray, tol: float, solve: bool) -> None:
    """The propagator form candidate by candidate: one slot of matrices per thread, which
    stay in that core's cache from their build to the candidate's last sweep."""
    D, spans = _matrices(numba.get_num_threads(), config, plan, S0.shape[0], P.dtype)
    _launch(module, True, solve, P, S0, D, spans, extra, fail, plan, s, drive, flt, tol)


def _launch(module, by_candidate: bool, solve: bool, P: np.ndarray, S0: np.ndarray,
            D: np.ndarray, spans: tuple, extra: tuple, fail: np.ndarray,
            plan: PropagatorPlan, s: Schedule, drive: np.ndarray, flt: np.ndarray,
            tol: float) -> None:
    module.launch(P.shape[1], s.n_sweeps, plan.n_keys, plan.n_span_keys if spans else 0,
                  by_candidate, solve, P, S0, s.rows_f, s.rows_i, s.row_start, plan.row_key,
                  plan.keys_f, plan.keys_i, plan.keys_conc, s.conc, s.row_conc, drive, flt,
                  s.sample_start, tol, D, *spans, *extra, fail)


def _propagate(module, config, P: np.ndarray, S0: np.ndarray, extra: tuple,
               fail: np.ndarray, plan: PropagatorPlan, s: Schedule, drive: np.ndarray,
               flt: np.ndarray, tol: float, solve: bool) -> None:
    """The propagator form by (candidate, sweep) pairs, in chunks of candidates whose
    matrices stay within a few tens of MB (they are rebuilt every call; memory, not time,
    bounds them)."""
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
        D, spans = _matrices(b - a, config, plan, S, P.dtype)
        if plan.n_keys:
            module.build(b - a, plan.n_keys, Pc, plan.keys_f, plan.keys_i, plan.keys_conc,
                         s.conc, D)
            if spans and plan.n_span_keys:
                module.build_span(b - a, plan.n_span_keys, D, *spans)
        if not solve:
            continue
        if b - a == n:
            out_extra, out_fail = extra, fail
        else:
            out_extra, out_fail = _chunk_outputs(extra, fail, a, b)
        _launch(module, False, True, Pc, Sc, D, spans, out_extra, out_fail, plan, s, drive,
                flt, tol)
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
