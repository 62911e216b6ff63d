"""The propagator form (p ← p + p·D, D = R(hQ)ⁿ − I) against the stage form with the same
steps and against the exact reference; its lanes on the CUDA kernel under Numba's simulator;
failure detection; the plan of which rows it takes, recurring exchange edges included."""

from functools import cache
from pathlib import Path

import numpy as np
import pytest
from test_solver import _mini_protocols, _objective_case, _reference, by_model

from kingen.codegen import generate_propagator
from kingen.errors import KingenError
from kingen.experiment.protocol import Protocol, Pulse, Sweep, standard_protocol
from kingen.model.scheme import Scheme
from kingen.solve import Simulator, simulate_exact
from kingen.solve.batch import ObjectiveInputs
from kingen.solve.cuda import LaunchConfig, default_config
from kingen.solve.options import SolverOptions
from kingen.solve.plan import plan_propagator
from kingen.solve.schedule import build_schedule, stage_concentrations

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


@pytest.mark.parametrize("path", by_model(MODELS))  # after test_solver.py's, in one process:
def test_propagator_equals_stage_form_with_the_same_steps_and_the_exact_solution(path):
    # the same traces kernel (0.2 ms exchange: spans of 16 between stage rows and propagated
    # edges) and exact references as test_solver.py's, at full size; one product per sample
    # is checked against the spans on a smaller scheme below
    model = path.stem
    scheme = _scheme(model)
    # constant rows propagated, the exchange's edges in products of their own or stage form
    protocols = [standard_protocol(n, exchange=0.2) for n in STANDARD]
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    assert sim.propagator_plan().n_keys > 0 and sim.launch_config().span == 16
    prop = sim.run(scheme.values[None], "traces")
    stage = sim.run(scheme.values[None], "traces", launch_config=STAGE)
    assert not prop.fail.any() and not stage.fail.any()
    if model == "robert_howe_2003":  # its recovery trains' edges recur: products too
        assert sim.propagator_plan().edge_samples > 0
    # an identity, not an approximation: equal up to float64 rounding, which over the 10⁵
    # samples of the longest recovery sweeps lets the total probability drift by a few
    # 1e-12
    for w in range(sim.n_sweeps):
        a, b = prop.sweep_trace(0, w), stage.sweep_trace(0, w)
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err <= 1e-11, (sim.sweeps[w].label, err)
    exact = [c for p in protocols for c in _reference(path, p.name)]
    assert _peak_errors(prop, exact, scheme, protocols) <= 1e-6


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
    _spans_match_the_cpu_stage_form(lanes, span, _mini_protocols())


def test_cuda_spans_of_32_on_8_lanes_match_the_cpu_stage_form():
    # float32's default with ideal steps: four currents per lane and span; sweeps long
    # enough for rows of two spans and more
    kw = dict(dt=0.02)
    protocols = [
        Protocol("deactivation", "deactivation",
                 (Sweep("1", 3.0, pulses=(Pulse(0.2, 0.3, 0.3, 0.05, 0.05),), **kw),)),
        Protocol("dose_response", "dose_response", tuple(
            Sweep(f"{c}", 2.0, pulses=(Pulse(0.2, 0.5, c),), x=c, **kw) for c in (0.03, 0.3)))]
    _spans_match_the_cpu_stage_form(8, 32, protocols)


def test_spans_with_ideal_steps_test_their_windows_once_per_span():
    # With ideal steps the GPU kernel holds no stage code: a span outside every window skips
    # the windows' tests, and its samples' data come in two alternating sets of registers.
    # In each sweep the windows cover just the last sample of one span and the first of
    # the next: both spans must see them, and every other span passes them by. Rows of
    # three spans and of two (the sets' odd and even ends) and remainders occur.
    scheme = _scheme("robert_howe_2003")
    kw = dict(dt=0.05)
    protocols = [
        Protocol("desensitization", "desensitization",
                 (Sweep("1", 2.0, pulses=(Pulse(0.2, 1.3, 0.3),), **kw),)),
        Protocol("dose_response", "dose_response", tuple(
            Sweep(f"{c}", 2.0, pulses=(Pulse(0.2, 0.8, c),), x=c, **kw) for c in (0.03, 0.3)))]
    span = 8
    obj = _objective_case(scheme, protocols, np.random.default_rng(5))
    gpu = Simulator(scheme, protocols, options=SolverOptions(backend="cuda"), objective=obj)
    plan, rows_i = gpu.propagator_plan(), gpu.schedule.rows_i
    assert plan.stage_rows == "none"
    reps = rows_i[plan.row_key >= 0, 1]
    assert {2, 3} <= set((reps // span).tolist()) and (reps % span > 0).any()
    windows = obj.windows.copy()
    windows[:, :, 2] = -1
    for w in range(gpu.n_sweeps):
        smp = 0  # the sample a row starts after
        for r in range(gpu.schedule.row_start[w], gpu.schedule.row_start[w + 1]):
            if rows_i[r, 1] >= 2 * span and rows_i[r, 2] == 1:
                break
            smp += rows_i[r, 1] * rows_i[r, 2]
        edge = smp + span  # the first span's last sample
        windows[w, :3] = [(edge, edge, 0), (edge + 1, edge + 1, 0), (edge, edge + 1, 1)]
    obj = ObjectiveInputs(obj.data, obj.weight, windows)
    params = np.clip(np.vstack([scheme.values, scheme.values * 1.3]), scheme.lower,
                     scheme.upper)
    cpu = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"), objective=obj)
    gpu = Simulator(scheme, protocols, options=SolverOptions(backend="cuda"), objective=obj)
    config = LaunchConfig(block=32, form="propagator", lanes=4, span=span)
    got, ref = _sums_against_the_cpu_stage_form(cpu, gpu, params, config)
    np.testing.assert_allclose(got.windows, ref.windows, rtol=1e-9, atol=1e-12)
    # both one-sample windows hold their sample (a skipped one would keep index -1)
    for q in (0, 1):
        assert (got.windows[:, :, q, 1] == windows[None, :, q, 0]).all()
    # the CPU's spans skip the windows' tests alike
    spans = cpu.run(params, "objective", launch_config=LaunchConfig(form="propagator",
                                                                    span=span))
    np.testing.assert_allclose(spans.windows, ref.windows, rtol=1e-9, atol=1e-12)


def _spans_match_the_cpu_stage_form(lanes: int, span: int, protocols: list) -> None:
    scheme = _scheme("robert_howe_2003")
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
    # a trace takes its samples from the same spans (occupancies alone need every state)
    assert gpu._config_for(config, False, "traces").span == span
    assert gpu._config_for(config, True, "traces").span == 1
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
    with pytest.raises(ValueError, match="one product per sample"):
        generate_propagator(_scheme("jonas_1993"), "traces", span=16, target="cpu",
                            with_occupancy=True)
    scheme = _scheme("jonas_1993")
    protocols = _mini_protocols()[:1]
    obj = _objective_case(scheme, protocols, np.random.default_rng(0))
    gpu = Simulator(scheme, protocols, options=SolverOptions(backend="cuda"), objective=obj)
    with pytest.raises(KingenError, match="at least two lanes"):
        gpu.run(scheme.values[None], "objective",
                launch_config=LaunchConfig(form="propagator", span=16))


def test_cpu_spans_equal_one_product_per_sample_with_stage_rows_and_propagated_edges_between():
    # the fit's path on the CPU with every kind of row between spans: stage rows (edges that
    # occur once) and single products (the train's recurring edges), as the full standard
    # protocols give it
    scheme = _scheme("jonas_1993")
    protocols = [standard_protocol("deactivation"),
                 standard_protocol("desensitization", exchange=0.2), _edge_protocols()[0]]
    probe = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    obj = _objective_case(scheme, protocols, np.random.default_rng(5))
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"), objective=obj)
    assert sim.launch_config().span == 16  # the CPU default
    plan = sim.propagator_plan()
    reps = probe.schedule.rows_i[plan.row_key >= 0, 1]
    assert (reps > 16).any() and (reps % 16 > 0).any() and (plan.row_key < 0).any()
    assert plan.edge_samples > 0
    params = np.clip(np.vstack([scheme.values, scheme.values * 1.3]), scheme.lower,
                     scheme.upper)
    one = sim.run(params, "objective", launch_config=PROP)
    got = sim.run(params, "objective")
    assert not got.fail.any()
    np.testing.assert_allclose(got.sgg, one.sgg, rtol=1e-9)
    np.testing.assert_allclose(got.sgd, one.sgd, rtol=1e-9)
    np.testing.assert_allclose(got.windows, one.windows, rtol=1e-9, atol=1e-12)
    # a trace takes its samples from the spans too (what intervals and plots read)
    traces = sim.run(params, "traces")
    assert sim._config_for(None, False, "traces").span == 16 and not traces.fail.any()
    want = sim.run(params, "traces", launch_config=PROP).traces
    assert np.abs(traces.traces - want).max() <= 1e-11 * np.abs(want).max()


def test_cpu_traces_kept_for_a_reduction_are_rewritten_whole_by_every_call():
    # on_device on the CPU: a buffer the simulator keeps and every call rewrites (no NaN
    # fill first), so every sample of a sweep that succeeds must be written by the kernel:
    # spans, their remainders, stage rows and propagated edges alike
    scheme = _scheme("jonas_1993")
    protocols = [standard_protocol("deactivation"),
                 standard_protocol("desensitization", exchange=0.2), _edge_protocols()[0]]
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    first = np.clip(np.vstack([scheme.values, scheme.values * 1.3]), scheme.lower,
                    scheme.upper)
    kept = sim.run(first, "traces", on_device=True).traces
    kept[:] = np.nan  # a sample the next call leaves unwritten would stay NaN
    again = sim.run(first[::-1] * 0.9, "traces", on_device=True)
    assert again.traces is kept and not again.fail.any()  # the same buffer, rewritten
    fresh = sim.run(first[::-1] * 0.9, "traces")
    assert np.isfinite(fresh.traces).all()
    np.testing.assert_array_equal(again.traces, fresh.traces)


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
    if span > 1:  # the objective's sums too
        obj = _objective_case(scheme, protocols, np.random.default_rng(1))
        sim = Simulator(scheme, protocols, options=SolverOptions(backend=backend), objective=obj)
        res = sim.run(params, "objective", launch_config=config)
        assert (res.fail[[0, 2]] == 0).all() and (res.fail[1] != 0).all()
        assert np.isinf(res.sgg[1]).all() and np.isfinite(res.sgg[[0, 2]]).all()
        alone = sim.run(params[[0, 2]], "objective", launch_config=config)
        np.testing.assert_array_equal(res.sgg[[0, 2]], alone.sgg)
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
    # with ideal steps every key is used thousands of times: the CPU takes them all
    assert ideal.propagator_plan().key_uses == everything.key_uses
    edges = Simulator(scheme, [standard_protocol(n, exchange=0.2) for n in STANDARD],
                      options=SolverOptions(backend="cpu"))
    everything = plan_propagator(scheme, edges.schedule, every_constant_row=True)
    assert everything.stage_rows == "smooth"
    paying = edges.propagator_plan()
    # the rare partial rows around the edges stay in stage form on the CPU
    assert paying.n_span_keys < everything.n_span_keys
    assert everything.stage_steps < paying.stage_steps < edges.schedule.total_steps // 500
    assert all(uses >= scheme.n_states for uses in paying.key_uses)


@pytest.mark.parametrize("exchange", [0.0, 0.2])
def test_rows_whose_steps_differ_in_the_last_bits_share_one_key(exchange):
    # The schedule's steps of one sampling interval differ in their last bits from row to
    # row; a key per bit pattern built the same matrix 2-3 times (ideal steps: 26 keys for
    # 10 matrices). Each row's key is its own step, concentration and step count.
    scheme = _scheme("robert_howe_2003")
    sim = Simulator(scheme, [standard_protocol(n, exchange=exchange) for n in STANDARD],
                    options=SolverOptions(backend="cpu"))
    plan = plan_propagator(scheme, sim.schedule, every_constant_row=True)
    rows_f, rows_i = sim.schedule.rows_f, sim.schedule.rows_i
    const = np.nonzero((plan.row_key >= 0) & (rows_i[:, 3] == 0))[0]
    k = plan.row_key[const]
    np.testing.assert_allclose(plan.keys_f[k, 0], rows_f[const, 1], rtol=1e-9, atol=0)
    np.testing.assert_array_equal(plan.keys_f[k, 1], rows_f[const, 2])
    np.testing.assert_array_equal(plan.keys_i[k], rows_i[const, 0])
    span_keys = plan.keys_f[:plan.n_span_keys]
    keys = [(round(h * 1e3, 9), c, n)
            for (h, c, _, _), n in zip(span_keys, plan.keys_i[:plan.n_span_keys])]
    assert len(set(keys)) == len(keys) == (10 if exchange == 0 else 20)


def test_generated_code_names_its_states_and_rates_and_defaults_per_scheme_size():
    scheme = _scheme("jonas_1993")
    source = generate_propagator(scheme, "objective", lanes=2).source
    assert f"p0 = occupancy of {scheme.states[0]}" in source
    first = scheme.transitions[0]
    assert (f"k0 = rate {scheme.states[first.source]} -> {scheme.states[first.target]}"
            in source)
    assert default_config(scheme).lanes == 4 and default_config(scheme).span == 8
    assert default_config(scheme, stage_rows="smooth").lanes == 1
    rh = _scheme("robert_howe_2003")
    # ideal steps: spans of 16 over 8 lanes, of 32 in float32 (unless filtered)
    assert default_config(rh).name == "prop-l8-s16-b128"
    assert default_config(rh, "float32").name == "prop-l8-s32-b128"
    for precision in ("float64", "float32"):
        config = default_config(rh, precision, filtered=True)
        assert (config.lanes, config.span) == (8, 16)
        config = default_config(rh, precision, stage_rows="smooth", filtered=True)
        assert (config.lanes, config.span) == (8, 16)
    # with exchange and no filter the stage steps are repeated on fewer lanes: 4 in
    # float64 up to 16 states, 2 in float32
    assert default_config(rh, stage_rows="smooth").name == "prop-l4-s8-b128"
    assert default_config(rh, "float32", stage_rows="smooth").name == "prop-l2-s8-b128"
    coombs = _scheme("coombs_2017")
    assert coombs.n_states > 16
    assert default_config(coombs, stage_rows="smooth").name == "prop-l8-s16-b128"
    with pytest.raises(ValueError, match="power of two"):
        generate_propagator(scheme, "objective", lanes=3)


def test_a_gpu_batch_with_exchange_takes_the_default_of_its_precision_and_filter(
        monkeypatch, tmp_path):
    from kingen.experiment.chain import Filter

    monkeypatch.setenv("KINGEN_CACHE", str(tmp_path))  # no tuned choice recorded
    rh = _scheme("robert_howe_2003")
    protocol = [standard_protocol("deactivation", exchange=0.2)]
    chosen = {}
    for precision in ("float64", "float32"):
        for filters in (None, [Filter("bessel", 8, 5.0)]):
            sim = Simulator(rh, protocol, filters=filters,
                            options=SolverOptions(backend="cuda", precision=precision))
            assert sim.propagator_plan().stage_rows == "smooth"
            chosen[precision, filters is not None] = sim.launch_config().name
            # a profile's step of a few hundred candidates keeps 8 lanes (measured there)
            small = sim._config_for(None, False, "traces", 352).name
            assert small == ("prop-l8-s16-b128" if precision == "float64" or filters
                             else "prop-l2-s8-b128")
            assert sim.launch_config(16_384) == sim.launch_config()  # from FULL_BATCH on
    assert chosen == {("float64", False): "prop-l4-s8-b128",
                      ("float64", True): "prop-l8-s16-b128",
                      ("float32", False): "prop-l2-s8-b128",
                      ("float32", True): "prop-l8-s16-b128"}


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


# ------------------------------------------------------------------ recurring exchange edges


def _smooth_rows(schedule, w: int) -> list[int]:
    rows = range(schedule.row_start[w], schedule.row_start[w + 1])
    return [r for r in rows if schedule.rows_i[r, 3]]


def test_an_edge_that_recurs_shares_its_waveform_and_one_that_differs_keeps_its_own():
    scheme = _scheme("robert_howe_2003")

    def sweep(label: str, start: float, duration: float = 20.0) -> Sweep:
        return Sweep(label, duration, 0.02, pulses=(Pulse(start, 5.0, 10.0, 0.2, 0.2),))

    # the same edge at 2 ms, at 2102 ms (its times rounded otherwise), 1e-6 ms later, and
    # half a sample later
    sweeps = [sweep("a", 2.0), sweep("late", 2102.0, 2120.0), sweep("shifted", 2.0 + 1e-6),
              sweep("off grid", 2.01)]
    schedule = build_schedule(scheme, sweeps)
    first = _smooth_rows(schedule, 0)
    # the rise and the decay: each its head, its samples grouped by their step counts, and
    # its tail; the samples on an edge's foot step at their own concentration, the
    # steepest at the pulse's
    steps = schedule.rows_i[first, 0]
    assert len(first) > 6 and steps.min() < steps.max()
    assert schedule.rows_i[first, 1].sum() == 2 * (round(0.92 / 0.02) + 2)
    late = _smooth_rows(schedule, 1)
    assert [schedule.row_conc[r] for r in late] == [schedule.row_conc[r] for r in first]
    assert [schedule.rows_f[r, 1] for r in late] == [schedule.rows_f[r, 1] for r in first]
    for w in (2, 3):
        own = {int(schedule.row_conc[r]) for r in _smooth_rows(schedule, w)}
        # its own waveform where it differs; a piece near 0 or 10 mM, where the shift moves
        # the concentration by less than 1e-8 of the pulse, may be shared (checked below)
        assert len(own & {int(schedule.row_conc[r]) for r in first}) < len(own) / 2
    # what every row reads is its own waveform, to 1e-8 of the pulse at most (a far tail,
    # within 1e-9 of 0 or 10 mM, may serve another), and exactly for the row that wrote it
    written: set[int] = set()
    for w, sweep_ in enumerate(sweeps):
        for r in _smooth_rows(schedule, w):
            n = 3 * schedule.rows_i[r, 0] * schedule.rows_i[r, 1]
            start = int(schedule.row_conc[r])
            read = schedule.conc[start:start + n]
            own = stage_concentrations(sweep_, list(schedule.rows_f[r]), list(schedule.rows_i[r]))
            assert np.abs(read - own).max() <= 1e-8 * 10.0
            if start not in written:
                np.testing.assert_array_equal(read, own)
                written.add(start)


@pytest.mark.parametrize("every_constant_row", [False, True])
def test_recurring_edges_take_products_and_an_edge_that_occurs_once_keeps_its_steps(
        every_constant_row):
    scheme = _scheme("robert_howe_2003")
    protocols = [standard_protocol(n, exchange=0.2) for n in STANDARD]
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    schedule = sim.schedule
    plan = plan_propagator(scheme, schedule, every_constant_row=every_constant_row)
    rows_i = schedule.rows_i
    smooth = rows_i[:, 3] == 1
    steps = rows_i[:, 0] * rows_i[:, 1]
    sweep_of = np.repeat(np.arange(sim.n_sweeps), np.diff(schedule.row_start))
    ten = np.array([sim.sweeps[w].pulses[0].concentration == 10.0 for w in sweep_of])
    # the 10 mM edges recur 21 times over the set; each dose-response edge once, but for
    # a piece whose waveform is a 10 mM edge's (a head within 1e-9 of 0 mM): it shares
    keyed = plan.row_key >= 0
    assert keyed[smooth & ten].all()
    shared = set(schedule.row_conc[smooth & ten].tolist())
    once = np.nonzero(smooth & ~ten & keyed)[0]
    assert len(once) == 2 and all(schedule.row_conc[r] in shared for r in once)
    assert rows_i[smooth & ten, 1].sum() == 2016
    assert plan.edge_rows and plan.edge_samples == rows_i[smooth & keyed, 1].sum() == 2018
    assert plan.stage_steps == steps[~keyed].sum()
    assert plan.stage_steps < steps[smooth].sum() / 6  # 142,856 steps before, 14,990 now
    assert plan.prop_samples == rows_i[keyed, 1].sum()
    edge_keys = plan.keys_conc >= 0
    assert not edge_keys[:plan.n_span_keys].any() and edge_keys[plan.n_span_keys:].all()
    # 21 uses per sample; an edge's far tail (within 1e-9 of 10 mM or of 0) serves both the
    # rise's last and the decay's first interval
    assert sorted({u for u, edge in zip(plan.key_uses, edge_keys) if edge}) == [21, 42, 44]
    assert plan.n_keys - plan.n_span_keys == 94
    # repetition j of an edge row reads conc from its own sample on
    for r in np.nonzero(smooth & keyed)[0]:
        n, k = rows_i[r, 0], plan.row_key[r]
        for j in range(rows_i[r, 1]):
            assert plan.keys_conc[k + j] == schedule.row_conc[r] + 3 * n * j
            assert plan.keys_f[k + j, 0] == schedule.rows_f[r, 1] and plan.keys_i[k + j] == n


def _edge_protocols() -> list[Protocol]:
    """A train whose edges recur often enough to pay for their matrices (Jonas 1993: 9
    times), and pulses whose edges occur once: 1e-6 ms later and half a sample later than
    the train's."""
    kw = dict(dt=0.05)
    train = Sweep("train", 6.3, pulses=tuple(Pulse(0.3 + 0.6 * k, 0.3, 0.3, 0.05, 0.05)
                                             for k in range(10)), **kw)
    once = Sweep("once", 2.5, pulses=(Pulse(0.3 + 1e-6, 0.3, 0.3, 0.05, 0.05),
                                      Pulse(1.325, 0.3, 0.3, 0.05, 0.05)), **kw)
    return [Protocol("train", "train", (train,)), Protocol("once", "custom", (once,))]


@pytest.mark.parametrize("lanes,span", [(1, 1), (4, 1), (8, 1), (2, 4), (4, 8)])
def test_cuda_propagated_edges_under_simulator_match_the_cpu_stage_form(lanes, span):
    scheme = _scheme("jonas_1993")  # few states: the simulator builds its matrices in Python
    protocols = _edge_protocols()
    obj = _objective_case(scheme, protocols, np.random.default_rng(lanes + span))
    params = np.clip(np.vstack([scheme.values, scheme.values * 1.3]), scheme.lower,
                     scheme.upper)
    cpu = Simulator(scheme, protocols, objective=obj, options=SolverOptions(backend="cpu"))
    gpu = Simulator(scheme, protocols, objective=obj, options=SolverOptions(backend="cuda"))
    plan = gpu.propagator_plan()
    smooth = gpu.schedule.rows_i[:, 3] == 1
    train = np.arange(gpu.schedule.row_start[1])
    assert (plan.row_key[train][smooth[train]] >= 0).all()  # the train's edges: products
    once = np.arange(gpu.schedule.row_start[1], gpu.schedule.row_start[-1])
    assert (plan.row_key[once][smooth[once]] < 0).all()  # the others: steps
    config = LaunchConfig(block=32, form="propagator", lanes=lanes, span=span)
    got, ref = _sums_against_the_cpu_stage_form(cpu, gpu, params, config)
    np.testing.assert_allclose(got.sgg, ref.sgg, rtol=1e-12)
    np.testing.assert_allclose(got.sgd, ref.sgd, rtol=1e-12)
    np.testing.assert_allclose(got.windows, ref.windows, rtol=1e-12, atol=1e-15)
    if span > 1:  # a trace takes one product per sample: the cases above cover it
        return
    traces = gpu.run(params, "traces", launch_config=config)
    stage = cpu.run(params, "traces", launch_config=STAGE)
    assert np.abs(traces.traces - stage.traces).max() <= 1e-12 * np.abs(stage.traces).max()
    for cand in range(2):
        exact = [c for p in protocols for c in simulate_exact(scheme, p, params[cand]).currents]
        worst = max(float(np.abs(traces.sweep_trace(cand, w) * scheme.channels - e).max()
                          / np.abs(e).max()) for w, e in enumerate(exact))
        assert worst <= 1e-6


def test_a_launch_finds_its_compiled_module_once(monkeypatch):
    # making a kernel's source to look its module up cost 4 ms a call on the GPU's host, a
    # fifth of a profile's step: each launch (mode, config, filter) looks it up once
    import kingen.solve.batch as batch

    calls = []
    real = batch.solver_module
    monkeypatch.setattr(batch, "solver_module",
                        lambda *a, **k: calls.append((a[1], k["span"])) or real(*a, **k))
    scheme = _scheme("jonas_1993")
    sim = Simulator(scheme, [standard_protocol("deactivation")],
                    options=SolverOptions(backend="cpu"))
    first = sim.run(scheme.values[None], "traces")
    again = sim.run(scheme.values[None] * 1.1, "traces")
    sim.run(scheme.values[None], "traces", launch_config=PROP)
    assert calls == [("traces", 16), ("traces", 1)]
    assert not np.array_equal(first.traces, again.traces)  # the second call solved anew
