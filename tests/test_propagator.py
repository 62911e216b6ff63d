"""The propagator form (p ← p + p·D, D = R(hQ)ⁿ − I) against the stage form with the same
steps and against the exact reference; its lanes on the CUDA kernel under Numba's simulator;
failure detection; the plan of which rows it takes."""

from functools import cache
from pathlib import Path

import numpy as np
import pytest
from test_solver import _mini_protocols, _objective_case

from kingen.codegen import generate_propagator
from kingen.errors import KingenError
from kingen.experiment.protocol import standard_protocol
from kingen.model.scheme import Scheme
from kingen.solve import Simulator, simulate_exact
from kingen.solve.batch import ObjectiveInputs
from kingen.solve.cuda import LaunchConfig, default_config
from kingen.solve.options import SolverOptions
from kingen.solve.plan import plan_propagator

MODELS = sorted((Path(__file__).resolve().parents[1] / "models").glob("*.toml"))
STANDARD = ["deactivation", "desensitization", "recovery", "dose_response"]
STAGE = LaunchConfig()
PROP = LaunchConfig(form="propagator")


@cache
def _scheme(stem: str) -> Scheme:
    return Scheme.load(next(p for p in MODELS if p.stem == stem))


def _peak_errors(result, other, scheme, protocols) -> float:
    worst, offset = 0.0, 0
    for prot in protocols:
        for k in range(prot.n_sweeps):
            a = result.sweep_trace(0, offset + k) * scheme.channels
            b = (other[offset + k] if isinstance(other, list)
                 else other.sweep_trace(0, offset + k) * scheme.channels)
            worst = max(worst, float(np.abs(a - b).max() / np.abs(b).max()))
        offset += prot.n_sweeps
    return worst


def _sums_against_the_cpu_stage_form(cpu, gpu, params, config):
    """The GPU launch ``config``'s objective sums, checked against the CPU stage form's."""
    ref = cpu.run(params, "objective", launch_config=STAGE)
    got = gpu.run(params, "objective", launch_config=config)
    assert not got.fail.any()
    np.testing.assert_allclose(got.sgg, ref.sgg, rtol=1e-9)
    np.testing.assert_allclose(got.sgd, ref.sgd, rtol=1e-9)
    return got, ref


@pytest.mark.parametrize("model", [p.stem for p in MODELS])
def test_propagator_equals_stage_form_with_the_same_steps_and_the_exact_solution(model):
    scheme = _scheme(model)
    protocols = [standard_protocol(n) for n in STANDARD]  # ideal steps
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    assert sim.propagator_plan().n_keys > 0
    prop = sim.run(scheme.values[None], "traces", launch_config=PROP)
    stage = sim.run(scheme.values[None], "traces", launch_config=STAGE)
    assert not prop.fail.any() and not stage.fail.any()
    # an identity, not an approximation: equal up to rounding
    assert _peak_errors(prop, stage, scheme, protocols) <= 1e-9
    exact = [c for p in protocols for c in simulate_exact(scheme, p).currents]
    assert _peak_errors(prop, exact, scheme, protocols) <= 1e-6


@pytest.mark.parametrize("model", ["robert_howe_2003", "coombs_2017"])
def test_float32_propagator_meets_its_bound_with_ideal_steps(model):
    scheme = _scheme(model)
    protocols = [standard_protocol("recovery")]  # the longest: drift would show here
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu", precision="float32"))
    got = sim.run(scheme.values[None], "traces", launch_config=PROP)
    exact = simulate_exact(scheme, protocols[0]).currents
    assert _peak_errors(got, exact, scheme, protocols) <= 1e-3


@pytest.mark.parametrize("lanes", [1, 2, 4, 8])
def test_cuda_lanes_under_simulator_match_the_cpu_stage_form(lanes):
    scheme = _scheme("robert_howe_2003")
    protocols = _mini_protocols()
    rng = np.random.default_rng(lanes)
    obj = _objective_case(scheme, protocols, rng)
    params = np.clip(np.vstack([scheme.values, scheme.values * 1.3]), scheme.lower,
                     scheme.upper)
    cpu = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"), objective=obj)
    gpu = Simulator(scheme, protocols, options=SolverOptions(backend="cuda"), objective=obj)
    ref = cpu.run(params, "objective", launch_config=STAGE)
    got = gpu.run(params, "objective",
                  launch_config=LaunchConfig(block=32, form="propagator", lanes=lanes))
    assert not got.fail.any()
    np.testing.assert_allclose(got.sgg, ref.sgg, rtol=1e-9)
    np.testing.assert_allclose(got.sgd, ref.sgd, rtol=1e-9)
    np.testing.assert_allclose(got.windows, ref.windows, rtol=1e-9, atol=1e-12)
    traces = gpu.run(params, "traces",
                     launch_config=LaunchConfig(block=32, form="propagator", lanes=lanes))
    stage = cpu.run(params, "traces", launch_config=STAGE)
    assert np.abs(traces.traces - stage.traces).max() <= 1e-9 * np.abs(stage.traces).max()


@pytest.mark.parametrize("lanes,span", [(2, 4), (4, 8)])
def test_cuda_spans_under_simulator_match_the_cpu_stage_form(lanes, span):
    scheme = _scheme("robert_howe_2003")
    protocols = _mini_protocols()
    obj = _objective_case(scheme, protocols, np.random.default_rng(span))
    params = np.clip(np.vstack([scheme.values, scheme.values * 1.3]), scheme.lower,
                     scheme.upper)
    cpu = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"), objective=obj)
    gpu = Simulator(scheme, protocols, options=SolverOptions(backend="cuda"), objective=obj)
    reps = gpu.schedule.rows_i[gpu.propagator_plan().row_key >= 0, 1]
    # whole spans, a remainder after them, and rows shorter than one span all occur
    assert (reps >= 2 * span).any() and (reps % span > 0).any() and (reps < span).any()
    # and rows in stage form (the finite rise), walked by every lane alike
    assert (gpu.propagator_plan().row_key < 0).any()
    config = LaunchConfig(block=32, form="propagator", lanes=lanes, span=span)
    got, ref = _sums_against_the_cpu_stage_form(cpu, gpu, params, config)
    np.testing.assert_allclose(got.windows, ref.windows, rtol=1e-9, atol=1e-12)
    # a trace needs every sample: the same launch falls back to one product per sample
    traces = gpu.run(params, "traces", launch_config=config)
    stage = cpu.run(params, "traces", launch_config=STAGE)
    assert np.abs(traces.traces - stage.traces).max() <= 1e-9 * np.abs(stage.traces).max()


@pytest.mark.parametrize("lanes,span", [(1, 1), (2, 1), (2, 4)])
def test_cuda_kernels_that_carry_no_window_match_the_cpu(lanes, span):
    # a fit to recordings alone reads no window: its kernels reduce only the two sums
    scheme = _scheme("robert_howe_2003")
    protocols = _mini_protocols()
    obj = _objective_case(scheme, protocols, np.random.default_rng(7))
    windows = obj.windows.copy()
    windows[:, :, 2] = -1
    obj = ObjectiveInputs(obj.data, obj.weight, windows)
    params = np.clip(np.vstack([scheme.values, scheme.values * 1.3]), scheme.lower,
                     scheme.upper)
    cpu = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"), objective=obj)
    gpu = Simulator(scheme, protocols, options=SolverOptions(backend="cuda"), objective=obj)
    assert gpu._n_windows("objective") == 0 and gpu._out_shape(2) == (2, 2, gpu.n_sweeps)
    config = LaunchConfig(block=32, form="propagator", lanes=lanes, span=span)
    got, ref = _sums_against_the_cpu_stage_form(cpu, gpu, params, config)
    assert (got.windows[..., 1] == -1).all() and (ref.windows[..., 1] == -1).all()


def test_a_span_variant_names_itself_and_bad_spans_are_refused():
    config = LaunchConfig.parse("prop-l8-s16-b128")
    assert (config.lanes, config.span, config.block) == (8, 16, 128)
    assert config.name == "prop-l8-s16-b128"
    assert LaunchConfig.parse("prop-l1-s16-b128").span == 16  # the CPU's shape
    for bad in ("prop-l8-s12-b128", "prop-l8-s4-b128", "prop-l2-s6-b128"):
        with pytest.raises(KingenError, match="unknown solver variant"):
            LaunchConfig.parse(bad)
    with pytest.raises(ValueError, match="objective mode only"):
        generate_propagator(_scheme("jonas_1993"), "traces", lanes=2, span=4)
    scheme = _scheme("jonas_1993")
    protocols = _mini_protocols()[:1]
    obj = _objective_case(scheme, protocols, np.random.default_rng(0))
    gpu = Simulator(scheme, protocols, options=SolverOptions(backend="cuda"), objective=obj)
    with pytest.raises(KingenError, match="at least two lanes"):
        gpu.run(scheme.values[None], "objective",
                launch_config=LaunchConfig(form="propagator", span=16))


def test_cpu_spans_equal_one_product_per_sample_with_stage_rows_between():
    scheme = _scheme("robert_howe_2003")
    protocols = [standard_protocol("deactivation"),
                 standard_protocol("desensitization", exchange=0.2)]
    probe = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    obj = _objective_case(scheme, protocols, np.random.default_rng(5))
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"), objective=obj)
    assert sim.launch_config().span == 16  # the CPU default
    plan = sim.propagator_plan()
    reps = probe.schedule.rows_i[plan.row_key >= 0, 1]
    assert (reps > 16).any() and (reps % 16 > 0).any() and (plan.row_key < 0).any()
    params = np.clip(np.vstack([scheme.values, scheme.values * 1.3]), scheme.lower,
                     scheme.upper)
    one = sim.run(params, "objective", launch_config=PROP)
    got = sim.run(params, "objective")
    assert not got.fail.any()
    np.testing.assert_allclose(got.sgg, one.sgg, rtol=1e-9)
    np.testing.assert_allclose(got.sgd, one.sgd, rtol=1e-9)
    np.testing.assert_allclose(got.windows, one.windows, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend,lanes,span", [("cpu", 1, 1), ("cpu", 1, 16), ("cuda", 1, 1),
                                                ("cuda", 4, 1), ("cuda", 4, 8)])
def test_an_unstable_matrix_gives_a_failure_code_not_garbage(backend, lanes, span):
    scheme = _scheme("jonas_1993")
    protocols = [standard_protocol("deactivation")] if backend == "cpu" else \
        _mini_protocols()[1:2]
    good = scheme.values
    unstable = good.copy()
    unstable[2] *= 1e4  # far above its bound: R(hQ) has eigenvalues beyond 1 at 10 mM
    params = np.vstack([good, unstable, good * 1.1])
    config = LaunchConfig(block=32, form="propagator", lanes=lanes, span=span)
    if span > 1:  # spans serve the objective mode
        obj = _objective_case(scheme, protocols, np.random.default_rng(1))
        sim = Simulator(scheme, protocols, options=SolverOptions(backend=backend), objective=obj)
        res = sim.run(params, "objective", launch_config=config)
        assert (res.fail[[0, 2]] == 0).all() and (res.fail[1] != 0).all()
        assert np.isinf(res.sgg[1]).all() and np.isfinite(res.sgg[[0, 2]]).all()
        alone = sim.run(params[[0, 2]], "objective", launch_config=config)
        np.testing.assert_array_equal(res.sgg[[0, 2]], alone.sgg)
        return
    sim = Simulator(scheme, protocols, options=SolverOptions(backend=backend))
    res = sim.run(params, "traces", launch_config=config)
    assert (res.fail[[0, 2]] == 0).all()
    assert (res.fail[1] != 0).all()
    assert np.isnan(res.traces[1]).all() and np.isfinite(res.traces[[0, 2]]).all()
    alone = sim.run(params[[0, 2]], "traces", launch_config=config)
    np.testing.assert_array_equal(res.traces[[0, 2]], alone.traces)


def test_plan_gives_every_constant_row_a_matrix_on_the_gpu_and_pays_its_way_on_the_cpu():
    scheme = _scheme("robert_howe_2003")
    ideal = Simulator(scheme, [standard_protocol(n) for n in STANDARD],
                      options=SolverOptions(backend="cpu"))
    everything = plan_propagator(scheme, ideal.schedule, every_constant_row=True)
    assert everything.stage_rows == "none" and everything.stage_steps == 0
    assert everything.prop_samples == ideal.schedule.n_samples - ideal.n_sweeps
    paying = ideal.propagator_plan()
    assert paying.n_keys < everything.n_keys  # single-use partial rows stay in stage form
    assert 0 < paying.stage_steps < ideal.schedule.total_steps // 1000
    assert all(uses >= scheme.n_states for uses in paying.key_uses)
    smooth = Simulator(scheme, [standard_protocol("deactivation", exchange=0.2)],
                       options=SolverOptions(backend="cpu"))
    assert plan_propagator(scheme, smooth.schedule,
                           every_constant_row=True).stage_rows == "smooth"


def test_generated_code_names_its_states_and_rates_and_defaults_per_scheme_size():
    scheme = _scheme("jonas_1993")
    source = generate_propagator(scheme, "objective", lanes=2).source
    assert f"p0 = occupancy of {scheme.states[0]}" in source
    first = scheme.transitions[0]
    assert (f"k0 = rate {scheme.states[first.source]} -> {scheme.states[first.target]}"
            in source)
    assert default_config(scheme).lanes == 4 and default_config(scheme).span == 8
    assert default_config(scheme, stage_rows="smooth").lanes == 1
    smooth = default_config(_scheme("robert_howe_2003"), stage_rows="smooth")
    assert (smooth.lanes, smooth.span) == (2, 8)
    for precision in ("float64", "float32"):
        config = default_config(_scheme("robert_howe_2003"), precision)
        assert (config.lanes, config.span) == (8, 16)
    with pytest.raises(ValueError, match="power of two"):
        generate_propagator(scheme, "objective", lanes=3)


def test_kingen_info_prints_the_generated_kernel_with_its_legend(capsys):
    from kingen.cli import main

    path = str(next(p for p in MODELS if p.stem == "jonas_1993"))
    assert main(["info", path, "--kernel", "propagator"]) == 0
    out = capsys.readouterr().out
    assert "def build_thread(" in out and "#   p0 = occupancy of C0" in out
    assert main(["info", path, "--kernel", "stage"]) == 0
    assert "def build_thread(" not in capsys.readouterr().out
    assert main(["info", "--kernel", "stage"]) == 2
    assert capsys.readouterr().err.strip() == (
        "kingen: error: --kernel = 'stage': --kernel needs a scheme file")
