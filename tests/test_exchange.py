"""Measured solution exchange: a junction current read from a file, applied as a template to
every edge of a protocol or as a whole waveform per sweep, everywhere the concentration is
used; and every way such a file can be wrong, refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_propagator import _peak_errors
from test_solver import _objective_case

from kingen.cli import main
from kingen.errors import KingenError
from kingen.experiment.chain import Filter
from kingen.experiment.exchange import ExchangeSpec, apply_exchange, restore_exchange
from kingen.experiment.protocol import (
    Protocol,
    Pulse,
    Sweep,
    load_protocol,
    standard_protocol,
)
from kingen.model.scheme import Scheme
from kingen.runs.simulate import simulate
from kingen.solve import Simulator, simulate_exact
from kingen.solve.cuda import LaunchConfig
from kingen.solve.options import SolverOptions
from kingen.store.encode import read_protocol, write_protocol

MODELS = Path(__file__).resolve().parents[1] / "models"
JONAS = Scheme.load(MODELS / "jonas_1993.toml")
STAGE = LaunchConfig()
PROP = LaunchConfig(form="propagator")
TAU = 0.06  # ms: the tanh edges' time constant (10-90 % time 0.13 ms)


def _edge(s: np.ndarray, tau: float = TAU) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(s / tau))


def _junction(t: np.ndarray, pulses, *, heights=None, noise=0.0, seed=0, tau=TAU
              ) -> np.ndarray:
    """An open-tip junction current (pA, downward) of pulses (start, end), each of its own
    height."""
    heights = heights or [1.0] * len(pulses)
    y = sum(h * _edge(t - a, tau) * (1.0 - _edge(t - b, tau))
            for (a, b), h in zip(pulses, heights, strict=True))
    rng = np.random.default_rng(seed)
    return 12.0 - 300.0 * y + rng.normal(0.0, noise * 300.0, t.size)


def _write(path: Path, t: np.ndarray, *columns: np.ndarray, header=None) -> Path:
    names = header or ["time_ms"] + [f"junction_{k}" for k in range(len(columns))]
    rows = "".join(",".join(f"{v:.10g}" for v in row) + "\n" for row in zip(t, *columns))
    path.write_text(",".join(names) + "\n" + rows)
    return path


@pytest.fixture()
def tip(tmp_path) -> Path:
    """A template: one 2 ms pulse sampled every 10 µs, 0.5 % noise."""
    t = np.arange(0.0, 4.0, 0.01)
    return _write(tmp_path / "tip.csv", t, _junction(t, [(1.0, 3.0)], noise=0.005))


# ------------------------------------------------------------------------------ template

def test_a_template_replaces_every_edge_scaled_to_each_pulse(tip):
    protocol = standard_protocol("dose_response")
    got = apply_exchange(protocol, ExchangeSpec(tip))
    for s, measured in zip(protocol.sweeps, got.sweeps, strict=True):
        p, q = s.pulses[0], measured.pulses[0]
        assert (q.start, q.duration, q.concentration) == (p.start, p.duration, p.concentration)
        t = p.start + np.linspace(-0.5, 0.5, 101)
        # the edge the file measured: tanh, to its noise (0.5 %, made monotonic)
        want = p.concentration * _edge(t - p.start)
        assert np.abs(measured.concentration(t) - want).max() < 0.03 * p.concentration
        # exactly constant outside the edges: the solver propagates there
        assert measured.concentration(p.start + 0.5 * p.duration) == p.concentration
        assert measured.concentration(p.start - 1.0) == 0.0
        assert measured.concentration(p.end + 1.0) == 0.0
        assert [seg.smooth for seg in measured.segments()] == [False, True, False, True, False]
        assert abs(q.rise_shape.ten_ninety - 2 * TAU * np.arctanh(0.8)) < 0.01


def test_a_protocol_file_and_a_fit_configuration_declare_it(tip, tmp_path):
    (tmp_path / "p.toml").write_text(
        '[protocol]\nname = "p"\nexchange = { file = "tip.csv", mode = "template" }\n'
        '[[sweeps]]\nduration = 20\npulses = [{start = 2, duration = 5, concentration = 10}]\n')
    p = load_protocol(tmp_path / "p.toml")
    assert p.sweeps[0].pulses[0].rise_shape is not None
    assert p.meta["exchange"]["file"] == "tip.csv"
    from kingen.fitting.config import load_config

    (tmp_path / "fit.toml").write_text(
        'model = "' + str(MODELS / "jonas_1993.toml") + '"\n'
        '[[protocols]]\nprotocol = "deactivation"\ntargets = "t.csv"\n'
        'exchange = { file = "tip.csv" }\n')
    (tmp_path / "t.csv").write_text("feature,value\npeak_pA,-40\n")
    config = load_config(tmp_path / "fit.toml")
    pulse = config.protocols[0].protocol.sweeps[0].pulses[0]
    assert pulse.rise_shape == p.sweeps[0].pulses[0].rise_shape


def test_a_run_file_keeps_the_measured_edges(tip, tmp_path):
    protocol = apply_exchange(standard_protocol("recovery"), ExchangeSpec(tip))
    with h5py.File(tmp_path / "p.h5", "w") as f:
        write_protocol(f.create_group("p"), protocol)
    with h5py.File(tmp_path / "p.h5", "r") as f:
        back = read_protocol(f["p"])
    assert back.sweeps == protocol.sweeps  # the shapes compare equal, float for float
    meta = json.loads(json.dumps(protocol.meta))
    assert restore_exchange(replace(protocol, meta=meta)).sweeps == protocol.sweeps


# ------------------------------------------------------------------------------ sweeps

def test_a_whole_waveform_per_sweep_moves_each_pulse_and_normalises_it_alone(tmp_path):
    kw = dict(dt=0.05)
    sweeps = (Sweep("a", 10.0, pulses=(Pulse(1.0, 2.0, 5.0), Pulse(5.0, 2.0, 5.0)), **kw),
              Sweep("b", 10.0, pulses=(Pulse(1.0, 2.0, 1.0), Pulse(6.0, 2.0, 1.0)), **kw))
    protocol = Protocol("pairs", "recovery", sweeps)
    t = np.arange(0.0, 10.0 + 1e-9, 0.01)
    # the rig delivers 0.1 ms late, and the second pulse's junction current is smaller
    a = _junction(t, [(1.1, 3.1), (5.1, 7.1)], heights=[1.0, 0.8])
    b = _junction(t, [(1.1, 3.1), (6.1, 8.1)], heights=[1.0, 0.8])
    got = apply_exchange(protocol, ExchangeSpec(_write(tmp_path / "w.csv", t, a, b), "sweep"))
    for s, ends in zip(got.sweeps, ([(1.1, 3.1), (5.1, 7.1)], [(1.1, 3.1), (6.1, 8.1)]),
                       strict=True):
        for p, (start, end) in zip(s.pulses, ends, strict=True):
            assert abs(p.start - start) < 1e-3 and abs(p.end - end) < 1e-3
            # each pulse at its own plateau: the protocol's concentration
            assert s.concentration(0.5 * (start + end)) == p.concentration
    one = apply_exchange(protocol, ExchangeSpec(_write(tmp_path / "one.csv", t, a), "sweep"))
    assert one.sweeps[0].pulses == got.sweeps[0].pulses


# ------------------------------------------------------------------------------ solvers

def _measured_protocols(tip) -> list[Protocol]:
    kw = dict(dt=0.05)
    train = Sweep("train", 12.0, pulses=tuple(Pulse(0.5 + 1.1 * k, 0.5, 0.3) for k in range(10)),
                  **kw)
    once = Sweep("once", 4.0, pulses=(Pulse(0.52, 1.5, 1.0),), **kw)
    protocols = [Protocol("train", "train", (train,)), Protocol("once", "custom", (once,))]
    t = np.arange(0.0, 1.2, 0.004)
    path = _write(tip.parent / "short.csv", t, _junction(t, [(0.3, 0.7)]))
    return [apply_exchange(p, ExchangeSpec(path)) for p in protocols]


@pytest.mark.parametrize("precision,tol", [("float64", 1e-6), ("float32", 1e-3)])
def test_measured_edges_solve_as_the_exact_reference_in_stage_and_propagator_forms(
        tip, precision, tol):
    protocols = _measured_protocols(tip)
    sim = Simulator(JONAS, protocols, options=SolverOptions(backend="cpu", precision=precision))
    plan = sim.propagator_plan()
    assert plan.edge_samples > 0  # the train's measured edges recur: products
    exact = [c for p in protocols for c in simulate_exact(JONAS, p).currents]
    for config in (STAGE, PROP):
        got = sim.run(JONAS.values[None], "traces", launch_config=config)
        assert not got.fail.any()
        assert _peak_errors(got, exact, JONAS, protocols) <= tol


def test_measured_edges_through_a_filter_equal_scipy_on_the_cpu(tip):
    # the propagated edges' current, through the kernels' filter, against the unfiltered
    # current through scipy.signal
    from scipy import signal

    protocols = _measured_protocols(tip)
    flt = Filter("bessel", 8, 5.0)
    sim = Simulator(JONAS, protocols, filters=[flt, flt], options=SolverOptions(backend="cpu"))
    assert sim.propagator_plan().edge_samples > 0
    raw = sim.run(JONAS.values[None], "traces", launch_config=PROP, filtered=False)
    got = sim.run(JONAS.values[None], "traces", launch_config=PROP)
    sos = flt.sos(0.05)
    for w in range(sim.n_sweeps):
        x = raw.sweep_trace(0, w)
        want = signal.sosfilt(sos, x, zi=signal.sosfilt_zi(sos) * x[0])[0]
        assert np.abs(got.sweep_trace(0, w) - want).max() <= 1e-9 * np.abs(want).max()


@pytest.mark.parametrize("lanes,span", [(1, 1), (2, 1), (2, 4)])
def test_measured_edges_with_a_filter_under_the_cuda_simulator_match_the_cpu(
        tip, lanes, span):
    protocols = _measured_protocols(tip)
    filters = [Filter("bessel", 4, 4.0), Filter("butterworth", 2, 3.0)]
    obj = _objective_case(JONAS, protocols, np.random.default_rng(lanes + span))
    params = np.clip(np.vstack([JONAS.values, JONAS.values * 1.3]), JONAS.lower, JONAS.upper)
    cpu = Simulator(JONAS, protocols, objective=obj, filters=filters,
                    options=SolverOptions(backend="cpu"))
    gpu = Simulator(JONAS, protocols, objective=obj, filters=filters,
                    options=SolverOptions(backend="cuda"))
    assert gpu.propagator_plan().edge_samples > 0
    config = LaunchConfig(block=32, form="propagator", lanes=lanes, span=span)
    got = gpu.run(params, "objective", launch_config=config)
    ref = cpu.run(params, "objective", launch_config=STAGE)
    assert not got.fail.any() and not ref.fail.any()
    np.testing.assert_allclose(got.sgg, ref.sgg, rtol=1e-12)
    np.testing.assert_allclose(got.sgd, ref.sgd, rtol=1e-12)


# ------------------------------------------------------------------------------ the command

def test_simulate_takes_a_measured_waveform(tip, capsys):
    assert main(["simulate", "jonas_1993", "--protocol", "deactivation", "--exchange",
                 str(tip), "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert main(["simulate", "jonas_1993", "--protocol", "deactivation", "--json"]) == 0
    ideal = json.loads(capsys.readouterr().out)
    # the command simulates what the API does with the same file, and the measured edge
    # (10-90 % 0.13 ms) changes the current
    api = simulate(JONAS, apply_exchange(standard_protocol("deactivation"), ExchangeSpec(tip)))
    assert measured["peak_pA"] == pytest.approx(api.features()["peak_pA"], rel=1e-3)
    assert measured["peak_pA"] != pytest.approx(ideal["peak_pA"], rel=1e-3)


# ------------------------------------------------------------------------------ bad files

def _bad_files():
    t = np.arange(0.0, 4.0, 0.01)
    good = _junction(t, [(1.0, 3.0)])
    step = 12.0 - 300.0 * _edge(t - 1.0)  # rises and stays
    tri = 12.0 - 300.0 * np.clip(1.0 - np.abs(t - 2.0), 0.0, None)  # a peak, no plateau
    coarse = np.arange(0.0, 4.0, 0.2)
    backwards = t.copy()
    backwards[50], backwards[51] = backwards[51], backwards[50]
    return {
        "nan": ("time_ms,j\n0,1\n0.01,nan\n" + "".join(f"{k},1\n" for k in range(2, 30)),
                "NaN or infinite", "j row 3"),
        "time backwards": ((t, good), "the time must increase", "time_ms row"),
        "flat": ((t, np.full(t.size, 3.0)), "flat", "junction_0"),
        "no plateau": ((t, tri), "no plateau", "junction_0"),
        "no fall": ((t, step), "does not return to its baseline", "junction_0"),
        "noisy": ((t, _junction(t, [(1.0, 3.0)], noise=0.15)), "too noisy", "junction_0"),
        "coarse": ((coarse, _junction(coarse, [(1.0, 3.0)])), "too coarsely", "junction_0"),
        "two pulses": ((t, _junction(t, [(0.5, 1.5), (2.5, 3.5)])), "one pulse",
                       "junction_0"),
        "two columns": ((t, good, good), "one current column", "header"),
        "short": ("time_ms,j\n0,1\n0.01,2\n", "too short", "time_ms"),
        "no time": ((t, good), "first column must be the time", "header"),
    }, backwards


@pytest.mark.parametrize("case", list(_bad_files()[0]))
def test_a_bad_waveform_file_is_one_line_naming_file_column_and_value(tmp_path, case,
                                                                      capsys):
    cases, backwards = _bad_files()
    content, message, field = cases[case]
    path = tmp_path / "tip.csv"
    if isinstance(content, str):
        path.write_text(content)
    else:
        t, *cols = content
        header = ["t_ms"] + ["j"] * len(cols) if case == "no time" else None
        _write(path, backwards if case == "time backwards" else t, *cols, header=header)
    before = path.read_bytes()
    with pytest.raises(KingenError) as err:
        apply_exchange(standard_protocol("deactivation"), ExchangeSpec(path))
    text = str(err.value)
    assert message in text and field in text and str(path) in text and "\n" not in text
    out = tmp_path / "out.csv"
    assert main(["simulate", "jonas_1993", "--protocol", "deactivation", "--exchange",
                 str(path), "--csv", str(out)]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err
    assert not out.exists() and path.read_bytes() == before


def test_a_waveform_that_does_not_fit_its_sweeps_is_refused(tip, tmp_path):
    t = np.arange(0.0, 4.0, 0.01)
    two = _write(tmp_path / "two.csv", t, _junction(t, [(1.0, 3.0)]),
                 _junction(t, [(1.0, 3.0)]))
    with pytest.raises(KingenError, match=r"one per sweep \(9\); the file has 2"):
        apply_exchange(standard_protocol("dose_response"), ExchangeSpec(two, "sweep"))
    # wrong length: the 4 ms waveform against a 30 ms sweep
    with pytest.raises(KingenError, match="wrong length: the waveform runs from 0 to 3.99 ms"):
        apply_exchange(standard_protocol("deactivation"), ExchangeSpec(tip, "sweep"))
    # edges of 1 ms each way from their 50 % points do not fit in a 1 ms pulse
    slow = np.arange(0, 12, 0.01)
    with pytest.raises(KingenError, match="longer than a pulse of sweep '1ms'"):
        apply_exchange(standard_protocol("deactivation"), ExchangeSpec(
            _write(tmp_path / "slow.csv", slow, _junction(slow, [(3.0, 9.0)], tau=0.5))))
    sweep = Sweep("a", 5.0, 0.05, pulses=(Pulse(1.0, 1.0, 1.0), Pulse(3.0, 1.0, 1.0)))
    with pytest.raises(KingenError, match="the waveform has 1 pulses, sweep 'a' 2"):
        apply_exchange(Protocol("a", "custom", (sweep,)), ExchangeSpec(
            _write(tmp_path / "w.csv", np.arange(0, 5.01, 0.01),
                   _junction(np.arange(0, 5.01, 0.01), [(1.0, 2.0)])), "sweep"))


@pytest.mark.parametrize("spec,message,field", [
    ('{ file = "tip.csv", mode = "edges" }', "must be one of", "protocol.exchange.mode"),
    ('{ file = "none.csv" }', "file not found", "protocol.exchange.file"),
    ('{ mode = "sweep" }', "missing", "protocol.exchange.file"),
    ('{ file = "tip.csv", shape = 1 }', "shape", "protocol.exchange"),
    ('"fast"', "must be a number", "protocol.exchange"),
])
def test_a_bad_declaration_names_its_field(tip, tmp_path, spec, message, field):
    path = tmp_path / "p.toml"
    path.write_text(f'[protocol]\nexchange = {spec}\n[[sweeps]]\nduration = 20\n'
                    'pulses = [{start = 2, duration = 5, concentration = 10}]\n')
    with pytest.raises(KingenError) as err:
        load_protocol(path)
    assert message in str(err.value) and field in str(err.value) and str(path) in str(err.value)


def test_simulate_exchange_that_is_neither_time_nor_file_is_one_line(capsys):
    assert main(["simulate", "jonas_1993", "--protocol", "deactivation", "--exchange",
                 "fast.csv"]) == 2
    err = capsys.readouterr().err
    assert "--exchange" in err and "fast.csv" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------ known truth

@pytest.mark.slow
def test_fitted_with_the_measured_exchange_the_rates_are_recovered_and_without_it_biased(
        tmp_path):
    # the lab's open-tip current: a slow, asymmetric exchange (10-90 % 0.4 ms up, 0.44 ms
    # down), as a file; the data are made by the exact reference from it with 2 % noise
    from test_chain import DETERMINED, FOUR, _polish, _recordings, _z

    from kingen.experiment.chain import Chain
    from kingen.fitting.params import ParameterMap

    t = np.arange(0.0, 8.0, 0.005)
    up, down = _edge(t - 2.0, 0.18), _edge(t - 6.0, 0.2)
    path = _write(tmp_path / "tip.csv", t, 5.0 - 180.0 * up * (1.0 - down)
                  + np.random.default_rng(5).normal(0.0, 0.4, t.size))
    plain = [standard_protocol(n, dt=0.05) for n in ("desensitization", "deactivation")]
    measured = [apply_exchange(p, ExchangeSpec(path)) for p in plain]
    recs = _recordings(measured, 0)
    truth = ParameterMap(FOUR).to_genes(FOUR.values[None, :])[0]
    start = truth + np.log10(1.3) * np.array([1, -1, 1, -1, 1, -1])  # 30 % off each way
    declared, *_ = _polish(measured, recs, Chain(), start)
    # every rate within 3 standard errors of the truth (1.5 at most with this seed)
    assert np.all(np.abs(declared) < 3.0), declared
    # fitted with the default ideal steps, the model must fall as slowly as the solution
    # leaves: unbinding and closing, which the deactivation's decay measures, move by 6-7
    # standard errors (the others stay within 2)
    ignored, *_ = _polish(plain, recs, Chain(), start)
    assert np.all(np.abs(_z(ignored, ["koff", "alpha"])) > 5.0), ignored
    assert np.all(np.abs(_z(ignored, DETERMINED)) < 3.0), ignored
