"""The CPU backend's propagator form on several threads: bit for bit the same results
whatever the thread count and whichever way a batch runs (candidate by candidate, or by
(candidate, sweep) pairs), with matrices held per thread, not per candidate."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numba
import numpy as np
import pytest

from kingen.codegen import N_WINDOWS
from kingen.experiment.chain import Filter
from kingen.experiment.protocol import Protocol, Pulse, Sweep, standard_protocol
from kingen.model.scheme import Scheme
from kingen.solve import Simulator, cpu
from kingen.solve.batch import ObjectiveInputs
from kingen.solve.options import SolverOptions

RT = Scheme.load(Path(__file__).resolve().parents[1] / "models" / "raman_trussell_1992.toml")
TWO = min(2, numba.config.NUMBA_NUM_THREADS)


def _case() -> tuple[Simulator, np.ndarray]:
    """Spans (the CPU default); a train whose exchange edges recur often enough to be taken
    as products, and exchange edges stepped; a filter on two of the three protocols; peak
    and sum windows and Σw·g; eight candidates, one of them unstable."""
    train = Sweep("train", 6.3, dt=0.05,
                  pulses=tuple(Pulse(0.3 + 0.6 * k, 0.3, 0.3, 0.05, 0.05) for k in range(10)))
    protocols = [Protocol("train", "train", (train,)),
                 standard_protocol("desensitization", exchange=0.2),
                 standard_protocol("dose_response")]
    filters = [Filter("bessel", 8, 5.0), None, Filter("butterworth", 4, 2.0)]
    probe = Simulator(RT, protocols, options=SolverOptions(backend="cpu"))
    starts = probe.schedule.sample_start
    rng = np.random.default_rng(1)
    windows = np.full((probe.n_sweeps, N_WINDOWS, 3), -1, dtype=np.int64)
    for w in range(probe.n_sweeps):
        m = int(starts[w + 1] - starts[w])
        windows[w, 0] = (0, m - 1, 0)
        windows[w, 1] = (m // 3, m // 2, 1)
    n = probe.schedule.n_samples
    obj = ObjectiveInputs(rng.normal(-20.0, 5.0, n), rng.uniform(0.0, 2.0, n), windows,
                          sum_g=True)
    sim = Simulator(RT, protocols, options=SolverOptions(backend="cpu"), objective=obj,
                    filters=filters)
    params = RT.complete(np.clip(RT.values * np.exp(rng.normal(0.0, 0.3, (8, RT.n_params))),
                                 RT.lower, RT.upper))
    params[5, 2] *= 1e4  # far above its bound: an unstable matrix, a failure code
    return sim, params


def _run(sim: Simulator, params: np.ndarray, threads: int):
    previous = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        return sim.run(params, "objective")
    finally:
        numba.set_num_threads(previous)


def _assert_same(a, b) -> None:
    for name in ("sgg", "sgd", "sg", "windows", "fail"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.skipif(TWO < 2, reason="Numba's pool has one thread")
def test_one_thread_and_two_give_the_same_bits_by_candidate_and_by_pairs():
    sim, params = _case()
    plan = sim.propagator_plan()
    assert sim.launch_config().span == 16 and plan.n_span_keys > 0 and plan.edge_rows
    assert cpu.by_candidate(8, 1) and cpu.by_candidate(8, 2) and not cpu.by_candidate(3, 2)
    one, two = _run(sim, params, 1), _run(sim, params, 2)
    assert (one.fail[5] != 0).all() and not one.fail[[0, 1, 2, 3, 4, 6, 7]].any()
    _assert_same(one, two)
    # three candidates on two threads run by (candidate, sweep) pairs
    few = _run(sim, params[:3], 2)
    for name in ("sgg", "sgd", "sg", "windows", "fail"):
        np.testing.assert_array_equal(getattr(few, name), getattr(one, name)[:3],
                                      err_msg=name)


def test_candidate_by_candidate_holds_matrices_per_thread_not_per_candidate():
    sim, params = _case()
    many = np.repeat(params[:1], 64, axis=0)
    _run(sim, many[:8], 1)  # compiled
    tracemalloc.start()
    try:
        res = _run(sim, many, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    plan = sim.propagator_plan()
    S = RT.n_states
    per_candidate = 8 * (plan.n_keys * S * S + plan.n_span_keys * S * (16 + S))
    assert not res.fail.any()
    # the outputs and the host's arrays are small next to 64 candidates' matrices
    assert peak < 64 * per_candidate / 2, (peak, per_candidate)
