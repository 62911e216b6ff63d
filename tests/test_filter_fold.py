"""The recording filter folded into the GPU's spans (kingen.codegen.span): its state-space
form against SciPy, and the kernels' filtered sums against scipy.signal.sosfilt under the
CUDA simulator, with span rows, edge rows and stage-form rows alternating in a sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import signal
from test_solver import _objective_case

from kingen.codegen.span import filter_state_space, fold_constants, fold_padded
from kingen.experiment.chain import Filter, design_sos
from kingen.experiment.protocol import Protocol, Pulse, Sweep
from kingen.model.scheme import Scheme
from kingen.solve import Simulator
from kingen.solve.batch import ObjectiveInputs
from kingen.solve.cuda import LaunchConfig
from kingen.solve.options import SolverOptions

MODELS = Path(__file__).resolve().parents[1] / "models"
RT = Scheme.load(MODELS / "raman_trussell_1992.toml")  # 6 states: quick to compile
BESSEL = Filter("bessel", 8, 5.0)
BUTTER = Filter("butterworth", 4, 2.0)


def _sections(sos: np.ndarray) -> np.ndarray:
    """The kernels' layout of a section: b0, b1, b2, a1, a2."""
    return sos[:, [0, 1, 2, 4, 5]]


SOS = {
    "bessel8": design_sos("bessel", 8, 5.0, 0.02),
    "butter3": design_sos("butterworth", 3, 2.0, 0.05),
    "bessel2": design_sos("bessel", 2, 9.0, 0.05),
}


# ------------------------------------------------------------------------------ host side

@pytest.mark.parametrize("name", SOS)
def test_the_state_space_form_gives_scipys_impulse_response_output_and_state(name):
    sos = SOS[name]
    A, B, C, D = filter_state_space(_sections(sos))
    assert A.shape == (2 * sos.shape[0],) * 2
    # sosfilt of an impulse is D, C·B, C·A·B, ...
    h = signal.sosfilt(sos, np.eye(1, 40)[0])
    mine = [D] + [C @ np.linalg.matrix_power(A, k) @ B for k in range(39)]
    np.testing.assert_allclose(mine, h, rtol=0, atol=1e-13)
    # from any state, in sosfilt's own coordinates: output and final state
    rng = np.random.default_rng(0)
    z0 = rng.normal(size=(sos.shape[0], 2))
    x = rng.normal(size=30)
    y, zf = signal.sosfilt(sos, x, zi=z0)
    z, out = z0.ravel(), []
    for u in x:
        out.append(C @ z + D * u)
        z = A @ z + B * u
    np.testing.assert_allclose(out, y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(z, zf.ravel(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("lanes", [2, 8])
def test_the_folded_constants_give_a_whole_span_of_the_filter_at_once(lanes):
    sos, span = SOS["bessel8"], 16
    run, build = fold_constants(_sections(sos), span, lanes)
    order = 2 * sos.shape[0]
    assert run.shape == (span + fold_padded(order, lanes), order)
    assert build.shape == (1 + fold_padded(order, lanes), span)
    rng = np.random.default_rng(1)
    z0 = rng.normal(size=(sos.shape[0], 2))
    u = rng.normal(size=span)
    y, zf = signal.sosfilt(sos, u, zi=z0)
    h = build[0]
    want_y = [run[t] @ z0.ravel() + sum(h[t - s] * u[s] for s in range(t + 1))
              for t in range(span)]
    want_z = run[span:span + order] @ z0.ravel() + build[1:1 + order] @ u
    np.testing.assert_allclose(want_y, y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(want_z, zf.ravel(), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------ kernels

def _protocols() -> list[Protocol]:
    """A train whose seven pulses' exchange edges recur (they take products, one key per
    sample, on the lanes), and a protocol whose edges occur once (stage form); between the
    edges and after them, constant rows of 1 to 34 samples (no span, one span and a
    remainder, several spans and a remainder)."""
    kw = dict(dt=0.05)
    train = Protocol("train", "custom", (Sweep("t", 6.0, pulses=tuple(
        Pulse(0.3 + 0.6 * k, 0.25, 1.0, 0.05, 0.05) for k in range(7)), **kw),))
    once = Protocol("once", "custom", (
        Sweep("o", 2.5, pulses=(Pulse(0.2, 0.4, 0.5, 0.15, 0.15),), **kw),
        Sweep("s", 2.0, pulses=(Pulse(0.3, 0.2, 1.0),), **kw)))
    return [train, once]


def _sosfilt(flt: Filter, x: np.ndarray, dt: float) -> np.ndarray:
    sos = flt.sos(dt)
    return signal.sosfilt(sos, x, zi=signal.sosfilt_zi(sos) * x[0])[0]


@pytest.mark.parametrize("lanes, span, precision", [
    (2, 4, "float64"), (4, 8, "float64"), (8, 16, "float64"), (4, 8, "float32"),
])
def test_folded_spans_equal_scipy_under_the_cuda_simulator(lanes, span, precision):
    protocols = _protocols()
    filters = [BESSEL, BUTTER]
    obj = _objective_case(RT, protocols, np.random.default_rng(lanes + span))
    obj = ObjectiveInputs(obj.data, obj.weight, obj.windows, sum_g=True)
    gpu = Simulator(RT, protocols, objective=obj, filters=filters,
                    options=SolverOptions(backend="cuda", precision=precision))
    config = LaunchConfig(block=32, form="propagator", lanes=lanes, span=span)
    # what the case covers: edges on the lanes and in stage form between span rows, rows
    # of several spans with a remainder, and a key that two filters share
    plan, sched = gpu.propagator_plan(), gpu.schedule
    assert plan.edge_samples > 0 and plan.stage_rows == "smooth"
    spans = sched.rows_i[(plan.row_key >= 0) & (sched.rows_i[:, 3] == 0), 1]
    assert ((spans > 2 * span) & (spans % span != 0)).any()
    row_fold, fold_key, _, _ = gpu._fold_arrays(config)
    assert len(set(fold_key.tolist())) < fold_key.size  # one key, two filters
    assert gpu._module("objective", config, False, gpu.n_sections).FOLD_ORDER == 8

    params = RT.complete(np.clip(np.vstack([RT.values, RT.values * 1.3]), RT.lower, RT.upper))
    one = LaunchConfig(block=32, form="propagator", lanes=1)  # one product per sample
    raw = gpu.run(params, "traces", launch_config=one, filtered=False)
    starts = sched.sample_start
    want = np.empty_like(raw.traces)
    w = 0
    for p, f in zip(protocols, filters, strict=True):
        for sweep in p.sweeps:
            for c in range(want.shape[0]):
                want[c, starts[w]:starts[w + 1]] = _sosfilt(f, raw.sweep_trace(c, w), sweep.dt)
            w += 1
    got = gpu.run(params, "objective", launch_config=config)
    assert not got.fail.any()
    tol = 1e-9 if precision == "float64" else 1e-4
    for w in range(gpu.n_sweeps):
        g = want[:, starts[w]:starts[w + 1]]
        wt, d = obj.weight[starts[w]:starts[w + 1]], obj.data[starts[w]:starts[w + 1]]
        np.testing.assert_allclose(got.sgg[:, w], (wt * g * g).sum(1), rtol=tol)
        np.testing.assert_allclose(got.sgd[:, w], (wt * g * d).sum(1), rtol=tol)
        np.testing.assert_allclose(got.sg[:, w], (wt * g).sum(1), rtol=tol)
        lo, hi, _ = obj.windows[w, 0]
        i = lo + np.argmax(np.abs(g[:, lo:hi + 1]), axis=1)
        np.testing.assert_allclose(got.windows[:, w, 0, 0], g[np.arange(2), i], rtol=tol)
        if precision == "float64":
            np.testing.assert_array_equal(got.windows[:, w, 0, 1], i)
