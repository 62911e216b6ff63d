"""Each candidate's own coarse steps on rows whose concentration varies (exchange edges).

The schedule's steps keep RK4 stable at the bounds' fastest rates; on smooth rows each
candidate takes m of them as one, m from its own rates (:mod:`kingen.solve.schedule`). These
tests check that both forms of the solver take exactly the steps the schedule's host-side
count says (against a NumPy RK4 that steps the schedule itself), that the answer stays as
accurate as the schedule's own against the exact reference, and that a fixed step is kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kingen.experiment.protocol import Protocol, Pulse, Sweep, standard_protocol
from kingen.model.scheme import Scheme
from kingen.solve import Simulator, simulate_exact
from kingen.solve.cuda import LaunchConfig
from kingen.solve.options import SolverOptions
from kingen.solve.schedule import (
    build_schedule,
    candidate_steps,
    coarse_stage_entries,
    coarse_steps,
    protocol_sweeps,
)
from kingen.solve.warp_order import warp_order

MODELS = Path(__file__).resolve().parents[1] / "models"
STANDARD = ["deactivation", "desensitization", "recovery", "dose_response"]
STAGE = LaunchConfig()
PROP = LaunchConfig(form="propagator")


def _train() -> Protocol:
    """Ten 10 mM pulses with 0.05 ms exchange: their edges recur, so the propagator form
    builds their samples' matrices."""
    sweep = Sweep("train", 6.3, 0.05, pulses=tuple(Pulse(0.3 + 0.6 * k, 0.3, 10.0, 0.05, 0.05)
                                                   for k in range(10)))
    return Protocol("train", "train", (sweep,))


def _numpy_rk4(scheme: Scheme, schedule, params: np.ndarray, per: np.ndarray) -> np.ndarray:
    """The occupancy at every sample of sweep 0, stepping the schedule's rows in NumPy with
    ``per`` of a row's steps taken as one (its stage concentrations read from ``conc`` as
    :func:`coarse_stage_entries` says), renormalised at each sample as the solver does."""
    x = np.asarray(scheme.rest_occupancy(params), dtype=np.float64)
    out = [x / x.sum()]
    for r in range(schedule.row_start[0], schedule.row_start[1]):
        h, c = schedule.rows_f[r, 1], schedule.rows_f[r, 2]
        n, reps, record, smooth = (int(v) for v in schedule.rows_i[r])
        for rep in range(reps):
            f = 0
            while f < n:
                m = min(int(per[r]), n - f)
                if smooth:
                    entries = coarse_stage_entries(int(schedule.row_conc[r]) + 3 * rep * n, f, m)
                    q0, q1, q2 = (scheme.Q(float(schedule.conc[i]), params) for i in entries)
                else:
                    q0 = q1 = q2 = scheme.Q(float(c), params)
                hc = m * h
                k1 = x @ q0
                k2 = (x + 0.5 * hc * k1) @ q1
                k3 = (x + 0.5 * hc * k2) @ q1
                k4 = (x + hc * k3) @ q2
                x = x + hc / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
                f += m
            if record:
                x = x / x.sum()
                out.append(x)
    return np.array(out)


@pytest.mark.parametrize("config", [STAGE, PROP], ids=["stage", "propagator"])
def test_both_forms_take_the_coarse_steps_the_schedule_counts(config):
    scheme = Scheme.load(MODELS / "jonas_1993.toml")
    protocol = _train()
    sim = Simulator(scheme, [protocol], options=SolverOptions(backend="cpu"))
    if config is PROP:
        assert sim.propagator_plan().edge_samples > 0  # the edges are products here
    params = scheme.complete(scheme.lower)  # slow rates: many of the schedule's steps as one
    per = coarse_steps(scheme, sim.schedule, params[None])[0]
    smooth = sim.schedule.rows_i[:, 3] == 1
    assert per[smooth].max() >= 4 and (per[~smooth] == 1).all()
    got = sim.run(params[None], "traces", with_occupancy=True, launch_config=config)
    assert not got.fail.any()
    occupancy = got.occupancy[0, :protocol.sweeps[0].n_samples]
    coarse = _numpy_rk4(scheme, sim.schedule, params, per)
    fine = _numpy_rk4(scheme, sim.schedule, params, np.ones_like(per))
    # the coarse steps differ from the schedule's by far more than rounding: the test sees
    # which steps the solver took
    assert np.abs(fine - coarse).max() > 1e-9
    np.testing.assert_allclose(occupancy, coarse, rtol=0, atol=1e-12)


def test_own_steps_are_fewer_for_slow_rates_and_none_at_the_upper_bounds():
    scheme = Scheme.load(MODELS / "robert_howe_2003.toml")
    sweeps = protocol_sweeps([standard_protocol(n, exchange=0.2) for n in STANDARD])[0]
    schedule = build_schedule(scheme, sweeps)
    params = scheme.complete(np.stack([scheme.values, scheme.lower, scheme.upper]))
    per = coarse_steps(scheme, schedule, params)
    smooth = schedule.rows_i[:, 3] == 1
    n, reps = schedule.rows_i[smooth, 0], schedule.rows_i[smooth, 1]
    taken = -(-n // per[:, smooth])  # steps a sample on each smooth row
    fine = int((n * reps).sum())  # 103,208
    edge_steps = (taken * reps).sum(axis=1)
    assert edge_steps[2] == fine  # the bounds' own rates: the schedule's steps
    assert edge_steps[0] < 0.65 * fine and edge_steps[1] < fine / 5  # 61,330 and 10,959
    assert (per[:, ~smooth] == 1).all()
    assert (candidate_steps(schedule, per) == schedule.total_steps - fine + edge_steps).all()
    # never more of the schedule's steps as one than the concentration allows
    assert (per[:, smooth] <= schedule.rows_f[smooth, 5]).all()
    assert schedule.rows_f[smooth, 5].min() < n.max()  # the limit binds on the steep part


def test_a_fixed_step_is_taken_as_given():
    scheme = Scheme.load(MODELS / "robert_howe_2003.toml")
    sweeps = protocol_sweeps([standard_protocol("deactivation", exchange=0.2)])[0]
    schedule = build_schedule(scheme, sweeps, step=0.002)
    assert (schedule.rows_f[:, 4] == 0).all()
    assert (coarse_steps(scheme, schedule, scheme.complete(scheme.lower)[None]) == 1).all()


@pytest.mark.parametrize("which", ["lower", "draw"])
def test_own_steps_keep_the_answer_as_accurate_as_the_schedules(which):
    """Robert & Howe's standard set with 0.2 ms exchange against the exact reference, for a
    candidate whose rates take the most coarse steps (every rate at its lower bound) and one
    drawn log-uniformly inside the bounds: within 1e-6 of each sweep's peak in both forms
    (measured 1.4e-9 and 7e-8; the schedule's own error at the upper bounds is 1.7e-7)."""
    scheme = Scheme.load(MODELS / "robert_howe_2003.toml")
    if which == "lower":
        params = scheme.complete(scheme.lower)
    else:
        rng = np.random.default_rng(3)
        params = scheme.complete(10 ** rng.uniform(np.log10(scheme.lower),
                                                   np.log10(scheme.upper)))
    protocols = [standard_protocol(n, exchange=0.2) for n in STANDARD]
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    per = coarse_steps(scheme, sim.schedule, params[None])[0]
    assert per.max() > 1
    exact = [c for p in protocols for c in simulate_exact(scheme, p, params).currents]
    for config in (STAGE, PROP):
        got = sim.run(params[None], "traces", launch_config=config)
        assert not got.fail.any()
        for w, want in enumerate(exact):
            trace = got.sweep_trace(0, w) * scheme.channels
            assert np.abs(trace - want).max() <= 1e-6 * np.abs(want).max()


def test_the_gpu_lays_candidates_out_by_their_steps_and_answers_in_the_given_order(monkeypatch):
    """Under the CUDA simulator (a real GPU on the GPU machine): candidates given fastest
    first, with one whose rates are refused, are laid out slowest first on the device, and
    every result comes back to the candidate it belongs to, as the CPU gives it."""
    from test_solver import _objective_case

    import kingen.solve.gpu_call as gpu_call

    scheme = Scheme.load(MODELS / "jonas_1993.toml")
    protocols = [_train()]
    obj = _objective_case(scheme, protocols, np.random.default_rng(5))
    params = np.vstack([scheme.upper, scheme.values * 2.0, -scheme.values, scheme.values,
                        scheme.lower])
    cpu = Simulator(scheme, protocols, objective=obj, options=SolverOptions(backend="cpu"))
    gpu = Simulator(scheme, protocols, objective=obj, options=SolverOptions(backend="cuda"))
    assert gpu.backend == "cuda"
    orders = []
    monkeypatch.setattr(gpu_call, "warp_order",
                        lambda *a: orders.append(warp_order(*a)) or orders[-1])
    config = LaunchConfig(block=32, form="propagator", lanes=4)
    got = gpu.run(params, "objective", launch_config=config)
    ref = cpu.run(params, "objective", launch_config=STAGE)
    # the slowest first; the refused row is solved at the scheme's own rates, and fails
    assert orders[0].tolist() == [4, 2, 3, 1, 0]
    np.testing.assert_array_equal(got.fail, ref.fail)
    assert got.fail[2].all() and not got.fail[[0, 1, 3, 4]].any()
    ok = [0, 1, 3, 4]
    np.testing.assert_allclose(got.sgg[ok], ref.sgg[ok], rtol=1e-9)
    np.testing.assert_allclose(got.sgd[ok], ref.sgd[ok], rtol=1e-9)
    np.testing.assert_allclose(got.windows[ok], ref.windows[ok], rtol=1e-9, atol=1e-12)


def test_the_layout_groups_warps_by_the_peak_rate_and_orders_each_by_the_rate_at_rest():
    """A warp of 32 builds holds the 32 candidates nearest in their exit rate at the highest
    concentration (the steps of the 10 mM edges it builds); inside it, and in the last
    partial warp, they follow their exit rate without agonist (the steps of the dose
    series' edges, which the sample kernel's smaller warps step)."""
    from kingen.solve.warp_order import exit_matrices

    scheme = Scheme.load(MODELS / "robert_howe_2003.toml")
    sweeps = protocol_sweeps([standard_protocol("dose_response", exchange=0.2)])[0]
    schedule = build_schedule(scheme, sweeps)
    rng = np.random.default_rng(7)
    params = scheme.complete(10 ** rng.uniform(np.log10(scheme.lower), np.log10(scheme.upper),
                                               (75, scheme.n_params)))
    order = warp_order(scheme, schedule, params.T)
    assert sorted(order.tolist()) == list(range(75))
    a, b = exit_matrices(scheme)
    peak = schedule.rows_f[schedule.rows_i[:, 3] != 0, 2].max()
    at_peak = (params @ (a + peak * b)).max(axis=1)
    at_rest = (params @ a).max(axis=1)
    ranks = np.argsort(np.argsort(at_peak))
    for start in (0, 32, 64):
        warp = order[start:start + 32]
        assert sorted(ranks[warp].tolist()) == list(range(start, min(start + 32, 75)))
        assert (np.diff(at_rest[warp]) >= 0).all()
    assert not (np.diff(at_peak[order]) >= 0).all()  # the second key reorders inside warps
