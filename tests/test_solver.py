"""The batched RK4 solver against the exact reference, on the CPU and on the CUDA kernel
(under Numba's simulator, with tiny grids); objective mode; failure handling."""

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from kingen.codegen import FAIL_PARAMS, N_WINDOWS
from kingen.errors import KingenError
from kingen.experiment.protocol import Protocol, Pulse, Sweep, standard_protocol
from kingen.model.scheme import Scheme
from kingen.solve import ObjectiveInputs, Simulator, batch, simulate_batch, simulate_exact
from kingen.solve.cuda import LaunchConfig
from kingen.solve.options import SolverOptions

MODELS = sorted((Path(__file__).resolve().parents[1] / "models").glob("*.toml"))
STANDARD = ["deactivation", "desensitization", "recovery", "dose_response"]
TOLERANCE = {"float64": 1e-6, "float32": 1e-3}


@cache
def _scheme(path: Path) -> Scheme:
    return Scheme.load(path)


@cache
def _reference(path: Path, name: str) -> list[np.ndarray]:
    return simulate_exact(_scheme(path), standard_protocol(name, exchange=0.2)).currents


def _max_rel_error(result, reference: list[np.ndarray], channels: float) -> float:
    err = 0.0
    for k, ref in enumerate(reference):
        got = result.sweep_trace(0, k) * channels
        assert np.isfinite(got).all()
        err = max(err, float(np.abs(got - ref).max() / np.abs(ref).max()))
    return err


def by_model(paths: list[Path]) -> list:
    """Parameters, one per scheme, each in its scheme's xdist group: the tests of one scheme
    (here and in test_propagator.py) run in one process, one after the other, where the
    kernels and exact references the first compiles are loaded, while other schemes run in
    the other processes."""
    return [pytest.param(p, id=p.stem, marks=pytest.mark.xdist_group(f"model {p.stem}"))
            for p in paths]


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("model", by_model(MODELS))
def test_cpu_backend_matches_exact_reference_on_every_standard_protocol(model, precision):
    scheme = _scheme(model)
    protocols = [standard_protocol(n, exchange=0.2) for n in STANDARD]
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu", precision=precision))
    result = sim.run(scheme.values[None, :], "traces")
    assert not result.fail.any()
    offset = 0
    for name, protocol in zip(STANDARD, protocols):
        ref = _reference(model, name)
        for k, r in enumerate(ref):
            got = result.sweep_trace(0, offset + k) * scheme.channels
            err = np.abs(got - r).max() / np.abs(r).max()
            assert err <= TOLERANCE[precision], (name, k, err)
        offset += protocol.n_sweeps


def _mini_protocols() -> list[Protocol]:
    """The standard protocols' shapes in miniature, cheap enough for the CUDA simulator."""
    kw = dict(dt=0.05)
    deact = Protocol("deactivation", "deactivation",
                     (Sweep("1", 1.5, pulses=(Pulse(0.2, 0.3, 0.3, 0.05, 0.05),), **kw),))
    desens = Protocol("desensitization", "desensitization",
                      (Sweep("1", 1.5, pulses=(Pulse(0.2, 1.0, 0.3),), **kw),))
    recov = Protocol("recovery", "recovery", tuple(
        Sweep(f"{g}", 1.5 + g, pulses=(Pulse(0.2, 0.4, 0.3), Pulse(0.6 + g, 0.4, 0.3)), x=g,
              **kw) for g in (0.1, 0.3)))
    dose = Protocol("dose_response", "dose_response", tuple(
        Sweep(f"{c}", 1.0, pulses=(Pulse(0.2, 0.5, c),), x=c, **kw) for c in (0.03, 0.3)))
    return [deact, desens, recov, dose]


# Schemes whose CUDA kernel under the simulator is also checked against the CPU kernel, bit
# for bit in float64: every scheme's is checked against the exact reference, and each CPU
# kernel for these protocols is one more compile (a minute for Coombs' 17 states); Robert &
# Howe's lanes are checked against the CPU in test_propagator.py.
CROSS_CHECKED = {"jonas_1993", "destexhe_1994_ampa5"}


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.stem)
def test_cuda_kernel_under_simulator_matches_reference_and_cpu(model, precision):
    scheme = _scheme(model)
    protocols = _mini_protocols()
    params = np.vstack([scheme.values, scheme.values * 1.3])
    params = np.clip(params, scheme.lower, scheme.upper)
    gpu = Simulator(scheme, protocols, options=SolverOptions(backend="cuda", precision=precision))
    assert gpu.backend == "cuda"  # the simulator in CI, a real GPU on the GPU machine
    got = gpu.run(params, "traces")
    assert not got.fail.any()
    if model.stem in CROSS_CHECKED:
        cpu = Simulator(scheme, protocols, options=SolverOptions(backend="cpu",
                                                                 precision=precision))
        np.testing.assert_allclose(got.traces, cpu.run(params, "traces").traces, rtol=0,
                                   atol=1e-12 if precision == "float64" else 1e-5)
    for cand in range(2):
        offset = 0
        for protocol in protocols:
            ref = simulate_exact(scheme, protocol, params[cand]).currents
            for k, r in enumerate(ref):
                g = got.sweep_trace(cand, offset + k) * scheme.channels
                err = np.abs(g - r).max() / np.abs(r).max()
                assert err <= TOLERANCE[precision], (protocol.name, k, err)
            offset += protocol.n_sweeps


def _objective_case(scheme: Scheme, protocols: list[Protocol], rng) -> ObjectiveInputs:
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    n = sim.schedule.n_samples
    data = rng.normal(-20.0, 5.0, n)
    weight = rng.uniform(0.0, 2.0, n)
    windows = np.full((sim.n_sweeps, N_WINDOWS, 3), -1, dtype=np.int64)
    for w in range(sim.n_sweeps):
        m = int(sim.schedule.sample_start[w + 1] - sim.schedule.sample_start[w])
        windows[w, 0] = (0, m - 1, 0)
        windows[w, 1] = (m // 3, m // 2, 1)
        windows[w, 2] = (m // 2, m - 1, 0)
    return ObjectiveInputs(data, weight, windows)


def test_a_gpu_simulator_is_shared_safely_by_threads_and_copied_by_pickle():
    # its device buffers outlive a call: calls from two threads must not share them
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    scheme = _scheme(MODELS[[p.stem for p in MODELS].index("jonas_1993")])
    protocols = _mini_protocols()
    obj = _objective_case(scheme, protocols, np.random.default_rng(11))
    gpu = Simulator(scheme, protocols, options=SolverOptions(backend="cuda"), objective=obj)
    batches = [np.clip(scheme.values * f, scheme.lower, scheme.upper)[None].repeat(2, 0)
               for f in (1.0, 1.4, 0.7, 1.2)]
    alone = [gpu.run(p, "objective").sgg for p in batches]
    assert not np.allclose(alone[0], alone[1])  # the batches differ
    with ThreadPoolExecutor(4) as pool:
        shared = list(pool.map(lambda p: gpu.run(p, "objective").sgg, batches))
    for a, b in zip(alone, shared, strict=True):
        np.testing.assert_array_equal(a, b)
    copy = pickle.loads(pickle.dumps(gpu))  # without the device arrays: it makes its own
    np.testing.assert_array_equal(copy.run(batches[2], "objective").sgg, alone[2])


@pytest.mark.parametrize("backend", [
    # in the process where Robert & Howe's full-size checks have compiled its traces kernel
    pytest.param("cpu", marks=pytest.mark.xdist_group("model robert_howe_2003")), "cuda"])
def test_work_given_to_run_while_solving_starts_once_the_solve_is_under_way(backend,
                                                                           monkeypatch):
    # On the GPU it must start after the launch (the host then only waits), on the CPU
    # before the solve; it runs once, and changes no result.
    scheme = _scheme(MODELS[[p.stem for p in MODELS].index("jonas_1993")])
    protocols = _mini_protocols()
    obj = _objective_case(scheme, protocols, np.random.default_rng(5))
    params = scheme.complete(np.clip(np.vstack([scheme.values, scheme.values * 1.3]),
                                     scheme.lower, scheme.upper))
    sim = Simulator(scheme, protocols, options=SolverOptions(backend=backend), objective=obj)
    ref = sim.run(params, "objective")
    events: list[str] = []
    cpu_call, cuda_call = sim._cpu_call, sim._cuda_call

    def logged(name, step):
        return lambda *a, **k: (events.append(name), step(*a, **k))[1]

    kernels: list[str] = []

    def logged_cuda_call(*args, **kwargs):
        call, out = cuda_call(*args, **kwargs)
        # the launch runs its kernels from this list, in order
        call.stages[:] = [(name, logged(name, stage)) for name, stage in call.stages]
        kernels.extend(name for name, _ in call.stages)
        return call, out

    monkeypatch.setattr(batch, "solver_rates", logged("rates", batch.solver_rates))
    monkeypatch.setattr(batch, "solver_rest", logged("rest", batch.solver_rest))
    sim._cpu_call = logged("solve", cpu_call)
    sim._cuda_call = logged_cuda_call
    got = sim.run(params, "objective", while_solving=lambda: events.append("hook"))
    # on the GPU the resting states are solved once the matrix builds are queued (they do
    # not read them), before the first kernel that does: the sample kernel, or the gather
    # of the candidates into their layout (kingen.solve.warp_order) where there is one
    # (the span build too where the launch has spans)
    if backend == "cpu":
        assert events == ["rates", "rest", "hook", "solve"]
    else:
        reads = kernels.index("order_rest" if "order_rest" in kernels else "launch")
        assert events == ["rates", *kernels[:reads], "rest", *kernels[reads:], "hook"]
        assert "build" in kernels[:reads] and kernels.index("launch") >= reads
    np.testing.assert_array_equal(got.sgg, ref.sgg)
    np.testing.assert_array_equal(got.sgd, ref.sgd)
    np.testing.assert_array_equal(got.fail, ref.fail)
    # derived rates given as computed are taken as they are, and the caller's array is
    # not written into, even where a row is refused
    bad = params.copy()
    bad[1, 0] = -1.0
    given = bad.copy()
    taken = sim.run(bad, "objective", complete=False)
    np.testing.assert_array_equal(bad, given)
    assert taken.fail[1].all() and not taken.fail[0].any()
    np.testing.assert_array_equal(taken.sgg[0], ref.sgg[0])
    # a derived rate given with complete=False is the one solved with; by default it is
    # recomputed (R&H derives km2 from its cycle); on the CPU in the traces kernel that
    # the full-size checks of R&H compile, rather than a kernel of its own
    rh = _scheme(MODELS[[p.stem for p in MODELS].index("robert_howe_2003")])
    rh_protocols = (protocols if backend == "cuda"
                    else [standard_protocol(n, exchange=0.2) for n in STANDARD])
    rh_sim = Simulator(rh, rh_protocols, options=SolverOptions(backend=backend))
    completed = rh.complete(np.clip(rh.values[None], rh.lower, rh.upper))
    wrong = completed.copy()
    wrong[0, rh.param_names.index("km2")] *= 100.0
    right = rh_sim.run(completed, "traces").traces
    np.testing.assert_array_equal(rh_sim.run(wrong, "traces").traces, right)
    taken = rh_sim.run(wrong, "traces", complete=False).traces
    assert np.nanmax(np.abs(taken - right)) > 1e-6 * np.nanmax(np.abs(right))


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_objective_mode_equals_error_computed_from_traces(backend):
    scheme = _scheme(MODELS[[p.stem for p in MODELS].index("jonas_1993")])
    rng = np.random.default_rng(3)
    protocols = _mini_protocols() if backend == "cuda" else [
        standard_protocol("deactivation", exchange=0.2), standard_protocol("dose_response")]
    obj = _objective_case(scheme, protocols, rng)
    params = np.exp(rng.uniform(np.log(scheme.lower), np.log(scheme.upper),
                                (3, scheme.n_params)))
    params = scheme.complete(params)
    sim = Simulator(scheme, protocols, options=SolverOptions(backend=backend), objective=obj)
    res = sim.run(params, "objective")
    tr = Simulator(scheme, protocols, options=SolverOptions(backend=backend)).run(params, "traces")
    assert not res.fail.any()
    starts = sim.schedule.sample_start
    for c in range(3):
        for w in range(sim.n_sweeps):
            g = tr.traces[c, starts[w]:starts[w + 1]]
            d = obj.data[starts[w]:starts[w + 1]]
            wt = obj.weight[starts[w]:starts[w + 1]]
            assert res.sgg[c, w] == pytest.approx(np.sum(wt * g * g), rel=1e-10)
            assert res.sgd[c, w] == pytest.approx(np.sum(wt * g * d), rel=1e-10)
            lo, hi, _ = obj.windows[w, 0]
            peak_i = lo + int(np.argmax(np.abs(g[lo:hi + 1])))
            assert res.windows[c, w, 0, 0] == pytest.approx(g[peak_i], rel=1e-12)
            assert res.windows[c, w, 0, 1] == peak_i
            lo, hi, _ = obj.windows[w, 1]
            assert res.windows[c, w, 1, 0] == pytest.approx(g[lo:hi + 1].sum(), rel=1e-10)
            assert res.windows[c, w, 3, 1] == -1  # unused window untouched


def test_invalid_and_unstable_candidates_flagged_others_unaffected():
    scheme = _scheme(MODELS[[p.stem for p in MODELS].index("jonas_1993")])
    protocol = standard_protocol("deactivation")
    good = scheme.values
    nan = good.copy()
    nan[3] = np.nan
    negative = good.copy()
    negative[0] = -1.0
    unstable = good.copy()
    unstable[2] *= 1e4  # a binding rate far above its bound: RK4 blows up at the 10 mM step
    params = np.vstack([good, nan, good * 1.1, negative, unstable])
    res = simulate_batch(scheme, protocol, params, "traces", options=SolverOptions(backend="cpu"))
    assert res.fail[0, 0] == 0 and res.fail[2, 0] == 0
    assert res.fail[1, 0] == FAIL_PARAMS and res.fail[3, 0] == FAIL_PARAMS
    assert res.fail[4, 0] in (1, 2, 3)
    alone = simulate_batch(scheme, protocol, params[[0, 2]], "traces",
                           options=SolverOptions(backend="cpu"))
    np.testing.assert_array_equal(res.traces[[0, 2]], alone.traces)
    assert np.isnan(res.traces[[1, 3, 4]]).all()  # failed traces are NaN, never garbage
    assert np.isfinite(res.traces[[0, 2]]).all()
    obj = ObjectiveInputs(np.zeros(res.schedule.n_samples), np.ones(res.schedule.n_samples),
                          np.full((1, N_WINDOWS, 3), -1, dtype=np.int64))
    o = Simulator(scheme, [protocol],
                  options=SolverOptions(backend="cpu"), objective=obj).run(params, "objective")
    assert np.isinf(o.sgg[[1, 3, 4], 0]).all() and np.isfinite(o.sgg[[0, 2], 0]).all()


def test_user_step_overrides_and_controls_accuracy():
    scheme = _scheme(MODELS[[p.stem for p in MODELS].index("jonas_1993")])
    protocol = standard_protocol("deactivation")
    ref = simulate_exact(scheme, protocol).currents
    coarse = simulate_batch(scheme, protocol, scheme.values[None],
                            options=SolverOptions(step=0.004, backend="cpu"))
    fine = simulate_batch(scheme, protocol, scheme.values[None],
                          options=SolverOptions(step=0.0004, backend="cpu"))
    assert coarse.schedule.total_steps < fine.schedule.total_steps
    e_coarse = _max_rel_error(coarse, ref, scheme.channels)
    e_fine = _max_rel_error(fine, ref, scheme.channels)
    assert e_fine < e_coarse / 100  # fourth order: 10x smaller step, ~1e4 smaller error


def test_agonist_free_stretches_take_longer_steps():
    scheme = _scheme(MODELS[[p.stem for p in MODELS].index("jonas_1993")])
    sim = Simulator(scheme, [standard_protocol("recovery")], options=SolverOptions(backend="cpu"))
    rows_f, rows_i = sim.schedule.rows_f, sim.schedule.rows_i
    h_on = rows_f[(rows_f[:, 2] > 0) & (rows_i[:, 3] == 0), 1].max()
    h_off = rows_f[(rows_f[:, 2] == 0) & (rows_i[:, 3] == 0), 1].min()
    assert h_off > 10 * h_on


def test_varying_concentration_is_read_from_the_schedule_at_every_stage_time():
    """Exchange edges and a synaptic transient in one sweep: the schedule holds the
    waveform at the three stage times of every step of the smooth rows, and both forms of
    the solver reproduce the exact reference from it."""
    from kingen.experiment.protocol import Transient

    scheme = _scheme(MODELS[[p.stem for p in MODELS].index("jonas_1993")])
    sweep = Sweep("edges and transient", 12.0, 0.02,
                  pulses=(Pulse(1.0, 2.0, 10.0, rise=0.2, decay=0.3),),
                  transients=(Transient(start=6.0, peak=1.1, tau_decay=1.2, tau_rise=0.05),))
    protocol = Protocol("custom", "custom", (sweep,))
    sim = Simulator(scheme, [protocol], options=SolverOptions(backend="cpu"))
    sch = sim.schedule
    smooth = np.flatnonzero(sch.rows_i[:, 3] == 1)
    assert smooth.size > 0
    used = 0
    for r in smooth:
        t0, h, _, mid = sch.rows_f[r, :4]
        steps = int(sch.rows_i[r, 0] * sch.rows_i[r, 1])
        assert sch.row_conc[r] == used
        k = np.arange(steps)
        for stage, dt in enumerate((0.0, 0.5 * h, h)):
            expected = sweep.concentration(t0 + k * h + dt, steps_at=mid)
            got = sch.conc[used + 3 * k + stage]
            np.testing.assert_array_equal(got, expected)
        used += 3 * steps
    assert sch.conc.size == used
    assert np.all(sch.row_conc[sch.rows_i[:, 3] == 0] == 0)
    ref = simulate_exact(scheme, protocol).currents[0]
    for form in ("stage", "propagator"):
        config = LaunchConfig(form=form)
        got = sim.run(scheme.values[None, :], "traces", launch_config=config)
        err = np.abs(got.sweep_trace(0, 0) * scheme.channels - ref).max() / np.abs(ref).max()
        assert err < 1e-6, (form, err)


def test_bad_arguments_give_clear_errors():
    scheme = _scheme(MODELS[0])
    p = standard_protocol("deactivation")
    with pytest.raises(KingenError, match="params must have"):
        simulate_batch(scheme, p, np.ones((2, scheme.n_params + 1)),
                       options=SolverOptions(backend="cpu"))
    with pytest.raises(KingenError, match="unknown precision"):
        simulate_batch(scheme, p, scheme.values[None], options=SolverOptions(precision="float16"))
    with pytest.raises(KingenError, match="unknown backend"):
        simulate_batch(scheme, p, scheme.values[None], options=SolverOptions(backend="tpu"))
    with pytest.raises(KingenError, match="objective mode needs data"):
        simulate_batch(scheme, p, scheme.values[None], "objective",
                       options=SolverOptions(backend="cpu"))


def test_numpy_2_5_incompatibility_is_reported_not_crashed(monkeypatch):
    from kingen.solve import backends

    monkeypatch.delattr(np, "row_stack", raising=False)
    status = backends.cuda_status()
    assert not status.usable and "numpy<2.5" in status.reason
    with pytest.raises(KingenError, match="cuda backend cannot run here.*numpy<2.5"):
        backends.choose_backend("cuda")
    assert backends.choose_backend("auto")[0] == "cpu"


FAST_CLOSING = """
[model]
name = "fast closing"
[states]
C = {}
O = { conductance = 20 }
[parameters]
kon = { value = 5.0, bounds = [0.5, 50] }
koff = { value = 10.0, bounds = [1, 100] }
[transitions]
"C -> O" = "kon * glu"
"O -> C" = "koff"
"""


def test_cpu_backend_keeps_occupancies_out_of_the_subnormal_range(tmp_path):
    # Bound states decay through the subnormal range in the recovery protocol's long
    # agonist-free gaps (a quarter of Robert & Howe's occupancies did, unflushed), and
    # subnormal arithmetic is ~100x slower on Intel cores: the CPU step flushes them to zero.
    # Here O closes at 10/ms, so it passes 1e-308 after 71 ms of each gap.
    path = tmp_path / "fast_closing.toml"
    path.write_text(FAST_CLOSING)
    scheme = Scheme.load(path)
    sim = Simulator(scheme, [standard_protocol("recovery")], options=SolverOptions(backend="cpu"))
    occ = sim.run(scheme.values[None, :], "traces", with_occupancy=True).occupancy[0]
    nonzero = np.abs(occ[occ != 0])
    assert (occ == 0).sum() > 0.1 * occ.size  # the decayed states really reached zero
    assert nonzero.min() >= 0.5e-100


def test_the_low_occupancy_warning_is_hidden_as_numba_cuda_words_it():
    import warnings

    from kingen.solve.gpu_call import LOW_OCCUPANCY

    said = "Grid size 2 will likely result in GPU under-utilization due to low occupancy."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=LOW_OCCUPANCY)
        warnings.warn(said, UserWarning, stacklevel=1)
        warnings.warn(f"\x1b[1m{said}\x1b[0m", UserWarning, stacklevel=1)  # on Dask workers
        warnings.warn("Grid size 2 is fine", UserWarning, stacklevel=1)  # others pass
    assert [str(w.message) for w in caught] == ["Grid size 2 is fine"]
