"""The recording chain: the filter's design and its run inside the solver's kernels, offsets
and amplitudes solved with the fit, and known-truth fits that show why the chain matters."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import signal
from test_solver import _mini_protocols, _objective_case

from kingen.experiment.chain import Filter, design_sos
from kingen.protocol import standard_protocol
from kingen.scheme import Scheme
from kingen.solve import Simulator
from kingen.solve.batch import ObjectiveInputs
from kingen.solve.cuda import LaunchConfig

RT = Scheme.load("models/raman_trussell_1992.toml")  # 6 states: quick to compile
STAGE = LaunchConfig()
PROP = LaunchConfig(form="propagator")
SPAN = LaunchConfig(form="propagator", span=16)
BESSEL = Filter("bessel", 8, 5.0)
BUTTER = Filter("butterworth", 4, 2.0)


def _sosfilt(flt: Filter | None, x: np.ndarray, dt: float) -> np.ndarray:
    """``x`` through ``flt`` by SciPy, from the steady state for its first value."""
    if flt is None:
        return x
    sos = flt.sos(dt)
    return signal.sosfilt(sos, x, zi=signal.sosfilt_zi(sos) * x[0])[0]


def _filtered_by_scipy(raw, protocols, filters) -> np.ndarray:
    """Every candidate's and sweep's unfiltered trace through its protocol's filter."""
    out = np.empty_like(raw.traces)
    k = 0
    for p, f in zip(protocols, filters, strict=True):
        for sweep in p.sweeps:
            a, b = raw.schedule.sample_start[k], raw.schedule.sample_start[k + 1]
            for c in range(raw.traces.shape[0]):
                out[c, a:b] = _sosfilt(f, raw.traces[c, a:b], sweep.dt)
            k += 1
    return out


def _host_sums(traces: np.ndarray, starts: np.ndarray, obj: ObjectiveInputs):
    """Σw·g², Σw·g·d, Σw·g per (candidate, sweep) and the first window's peak, on the host."""
    n, m = traces.shape[0], starts.size - 1
    sgg, sgd, sg = (np.zeros((n, m)) for _ in range(3))
    peak = np.zeros((n, m, 2))
    for w in range(m):
        g = traces[:, starts[w]:starts[w + 1]]
        wt, d = obj.weight[starts[w]:starts[w + 1]], obj.data[starts[w]:starts[w + 1]]
        sgg[:, w], sgd[:, w], sg[:, w] = (wt * g * g).sum(1), (wt * g * d).sum(1), \
            (wt * g).sum(1)
        lo, hi, _ = obj.windows[w, 0]
        i = lo + np.argmax(np.abs(g[:, lo:hi + 1]), axis=1)
        peak[:, w] = np.column_stack([g[np.arange(n), i], i])
    return sgg, sgd, sg, peak


def _check_objective(got, traces, starts, obj, tol):
    sgg, sgd, sg, peak = _host_sums(traces, starts, obj)
    np.testing.assert_allclose(got.sgg, sgg, rtol=tol)
    np.testing.assert_allclose(got.sgd, sgd, rtol=tol)
    np.testing.assert_allclose(got.sg, sg, rtol=tol, atol=tol * np.abs(sg).max())
    np.testing.assert_allclose(got.windows[:, :, 0, 0], peak[..., 0], rtol=tol)
    np.testing.assert_array_equal(got.windows[:, :, 0, 1], peak[..., 1])


# ------------------------------------------------------------------------------ design

@pytest.mark.parametrize("kind", ["bessel", "butterworth"])
@pytest.mark.parametrize("poles", [2, 5, 8])
def test_first_order_hold_is_the_analog_filter_sampled_for_a_current_linear_between_samples(
        kind, poles):
    # lsim integrates the analog filter exactly for an input linear between samples, from
    # its own state-space form; the sections must give its output at the samples
    dt, fc = 0.02, 5.0
    wc = 2 * np.pi * fc
    analog = (signal.bessel(poles, wc, analog=True, norm="mag") if kind == "bessel"
              else signal.butter(poles, wc, analog=True))
    a, b, c, d = signal.tf2ss(*analog)
    t = np.arange(600) * dt
    x = np.sin(3.0 * t) + (t > 1.0) - 0.5 * np.exp(-t / 0.2) * (t > 4.0)
    x0 = -np.linalg.solve(a, b[:, 0]) * x[0]  # at rest on the first value
    _, y, _ = signal.lsim((a, b, c, d), x, t, X0=x0)
    got = _sosfilt(Filter(kind, poles, fc), x, dt)
    assert np.abs(got - y).max() <= 1e-9 * np.abs(y).max()
    sos = design_sos(kind, poles, fc, dt)
    assert sos.shape == ((poles + 1) // 2, 6)
    assert abs(signal.sosfreqz(sos, worN=[0.0])[1][0] - 1.0) < 1e-12  # unit DC gain


# ------------------------------------------------------------------------------ kernels

@pytest.mark.parametrize("precision,tol", [("float64", 1e-9), ("float32", 1e-4)])
def test_kernel_filter_equals_scipy_on_the_cpu_in_stage_propagator_and_span_forms(
        precision, tol):
    protocols = [standard_protocol("deactivation", exchange=0.2),
                 standard_protocol("desensitization", exchange=0.2),
                 standard_protocol("dose_response")]
    filters = [BESSEL, None, BUTTER]
    obj = _objective_case(RT, protocols, np.random.default_rng(1))
    obj = ObjectiveInputs(obj.data, obj.weight, obj.windows, sum_g=True)
    sim = Simulator(RT, protocols, backend="cpu", precision=precision, objective=obj,
                    filters=filters)
    params = RT.complete(np.clip(np.vstack([RT.values, RT.values * 1.3]), RT.lower, RT.upper))
    starts = sim.schedule.sample_start
    want = {}
    for config in (STAGE, PROP):
        raw = sim.run(params, "traces", launch_config=config, filtered=False)
        got = sim.run(params, "traces", launch_config=config)
        want[config] = _filtered_by_scipy(raw, protocols, filters)
        assert not got.fail.any()
        assert np.abs(got.traces - want[config]).max() <= tol * np.abs(want[config]).max()
        # the pass-through sections leave an unfiltered protocol's current exactly as it is
        a, b = starts[protocols[0].n_sweeps], starts[protocols[0].n_sweeps + 1]
        np.testing.assert_array_equal(got.traces[:, a:b], raw.traces[:, a:b])
    # objective mode, the span form included: the sums of the filtered current (a span
    # regroups the propagator form's products: its traces are the propagator form's)
    for config, traces in ((STAGE, STAGE), (PROP, PROP), (SPAN, PROP)):
        res = sim.run(params, "objective", launch_config=config)
        _check_objective(res, want[traces], starts, obj, tol)


@pytest.mark.parametrize("config", [
    LaunchConfig(block=32),
    LaunchConfig(block=32, form="propagator", lanes=1),
    LaunchConfig(block=32, form="propagator", lanes=2),
    LaunchConfig(block=32, form="propagator", lanes=2, span=4),
], ids=lambda c: c.name)
def test_kernel_filter_equals_scipy_under_the_cuda_simulator(config):
    protocols = _mini_protocols()
    filters = [BESSEL, BUTTER, None, Filter("bessel", 3, 4.0)]
    obj = _objective_case(RT, protocols, np.random.default_rng(2))
    obj = ObjectiveInputs(obj.data, obj.weight, obj.windows, sum_g=True)
    gpu = Simulator(RT, protocols, backend="cuda", objective=obj, filters=filters)
    params = RT.complete(np.clip(np.vstack([RT.values, RT.values * 1.3]), RT.lower, RT.upper))
    raw = gpu.run(params, "traces", launch_config=config, filtered=False)
    want = _filtered_by_scipy(raw, protocols, filters)
    got = gpu.run(params, "traces", launch_config=config)
    assert not got.fail.any()
    assert np.abs(got.traces - want).max() <= 1e-9 * np.abs(want).max()
    res = gpu.run(params, "objective", launch_config=config)
    _check_objective(res, want, gpu.schedule.sample_start, obj, 1e-9)
