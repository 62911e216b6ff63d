"""Temperature: Q10s and activation energies in the scheme, protocols at several
temperatures, and a fit that recovers rates at the reference and the Q10s (issue #33)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kingen.cli import main
from kingen.errors import KingenError
from kingen.experiment.protocol import load_protocol
from kingen.experiment.recordings import Recording, load_recording, write_csv
from kingen.fitting.config import load_config
from kingen.fitting.objective import Objective
from kingen.fitting.temperature import TemperatureSimulator
from kingen.model.scheme import Scheme
from kingen.model.temperature import arrhenius_factor, at_temperature, rate_factors
from kingen.runs.fit import fit
from kingen.runs.profile import profile_run
from kingen.solve import simulate_exact

THREE_STATE = """
[model]
name = "three-state"
channels = 1
[states]
C0 = { conductance = 0 }
C1 = { conductance = 0 }
O = { conductance = 10 }
[parameters]
kon = { value = 4.0, bounds = [0.4, 40] }
koff = { value = 0.5, bounds = [0.05, 5] }
beta = { value = 3.0, bounds = [0.3, 30] }
alpha = { value = 1.0, bounds = [0.1, 10] }
[transitions]
"C0 -> C1" = "kon * glu"
"C1 -> C0" = "koff"
"C1 -> O" = "beta"
"O -> C1" = "alpha"
"""
TEMPERATURE = """
[temperature]
reference_c = 22
[temperature.binding]
rates = ["kon", "koff"]
q10 = {q_bind}
bounds = [1, 6]
[temperature.gating]
rates = ["beta", "alpha"]
q10 = {q_gate}
bounds = [1, 6]
"""
PROTOCOL = """
[protocol]
name = "steps"
kind = "custom"
dt = 0.05
holding = -70
reversal = 0
[[sweeps]]
label = "low"
duration = 12
pulses = [{ start = 1, duration = 4, concentration = 0.1 }]
[[sweeps]]
label = "high"
duration = 12
pulses = [{ start = 1, duration = 4, concentration = 1.0 }]
[[sweeps]]
label = "saturating"
duration = 12
pulses = [{ start = 1, duration = 4, concentration = 10.0 }]
"""
TRUTH = {"kon": 4.0, "koff": 0.5, "beta": 3.0, "alpha": 1.0}
Q10 = {"binding": 2.4, "gating": 3.0}


def _scheme(q_bind: float = 2.4, q_gate: float = 3.0) -> Scheme:
    return Scheme.loads(THREE_STATE + TEMPERATURE.format(q_bind=q_bind, q_gate=q_gate),
                        path="three.toml")


def _by_hand(celsius: float) -> np.ndarray:
    """The true rates at ``celsius``, scaled by hand (not by kingen's temperature code)."""
    f_bind = Q10["binding"] ** ((celsius - 22.0) / 10.0)
    f_gate = Q10["gating"] ** ((celsius - 22.0) / 10.0)
    return np.array([TRUTH["kon"] * f_bind, TRUTH["koff"] * f_bind,
                     TRUTH["beta"] * f_gate, TRUTH["alpha"] * f_gate])


def test_rates_scale_by_q10_and_arrhenius():
    s = _scheme()
    at34 = at_temperature(s, s.values, 34.0)
    assert at34[:4] == pytest.approx(_by_hand(34.0), rel=1e-12)
    assert at34[4:].tolist() == [2.4, 3.0]  # the Q10s themselves do not scale
    assert at_temperature(s, s.values, 22.0) == pytest.approx(s.values, rel=1e-15)
    ea = Scheme.loads(THREE_STATE + '[temperature]\nreference_c = 20\n'
                      '[temperature.kon]\nea_kj_mol = 55\n')
    assert ea.param_names[-1] == "ea_kon" and ea.parameters[-1].unit == "kJ/mol"
    f = rate_factors(ea, ea.values, 35.0)
    expected = math.exp(-55.0 / 8.314462618e-3 * (1 / 308.15 - 1 / 293.15))
    assert f[0] == pytest.approx(expected, rel=1e-12)
    assert arrhenius_factor(55.0, 35.0, 20.0) == pytest.approx(expected, rel=1e-12)
    assert f[1:4].tolist() == [1.0, 1.0, 1.0]


def test_a_derived_rate_keeps_its_cycle_reversible_at_every_temperature():
    text = """
[model]
name = "cycle"
[states]
A = { conductance = 0 }
B = { conductance = 5 }
C = { conductance = 0 }
[parameters]
ab = 1.0
ba = 2.0
bc = 3.0
cb = 1.5
ca = 0.5
ac = { value = 0.5, bounds = [0.01, 100] }
[transitions]
"A -> B" = "ab"
"B -> A" = "ba"
"B -> C" = "bc"
"C -> B" = "cb"
"C -> A" = "ca"
"A -> C" = { rate = "ac", derived = true }
[temperature]
reference_c = 22
[temperature.fast]
rates = ["ab", "bc"]
q10 = 3
"""
    s = Scheme.loads(text)
    hot = at_temperature(s, s.values, 37.0)
    log_f, log_b = s.cycle_log_products(hot)[0]
    assert log_f == pytest.approx(log_b, abs=1e-12)


def _write_problem(tmp: Path) -> Path:
    """Recordings of the three-state scheme at 22 and 34 °C with 2 % noise, made by the
    exact reference solver from rates scaled by hand."""
    plain = Scheme.loads(THREE_STATE, path="plain.toml")
    (tmp / "steps.toml").write_text(PROTOCOL)
    protocol = load_protocol(tmp / "steps.toml")
    rng = np.random.default_rng(33)
    channels = 200.0
    entries = []
    for celsius in (22.0, 34.0):
        trace = simulate_exact(plain, protocol, _by_hand(celsius), channels=channels)
        clean = [s.current for s in trace.sweeps]
        peak = max(float(np.max(np.abs(c))) for c in clean)
        noisy = [c + rng.normal(0.0, 0.02 * peak, c.size) for c in clean]
        name = f"steps_{celsius:g}"
        write_csv(Recording(name, [s.times() for s in protocol.sweeps], noisy,
                            [s.label for s in protocol.sweeps], holding_mV=-70.0),
                  tmp / f"{name}.csv")
        entries.append(f'[[protocols]]\nprotocol = "steps.toml"\nname = "{name}"\n'
                       f'recording = "{name}.csv"\ntemperature = {celsius:g}\n')
    # the fit starts away from the truth: rates x 1.6 or / 1.6, Q10s 1.8 and 2.2
    start = THREE_STATE.replace("value = 4.0", "value = 6.4").replace(
        "value = 0.5", "value = 0.31").replace("value = 3.0", "value = 1.9").replace(
        "value = 1.0,", "value = 1.6,")
    (tmp / "model.toml").write_text(start + TEMPERATURE.format(q_bind=1.8, q_gate=2.2))
    (tmp / "fit.toml").write_text(
        'model = "model.toml"\noutput = "run.h5"\nseed = 3\nbackend = "cpu"\n'
        'polish = true\npolish_evaluations = 60\n' + "".join(entries)
        + '[ga]\npopulation = 16\ngenerations = 6\nstart_from_model = true\n')
    return tmp / "fit.toml"


@pytest.fixture(scope="module")
def two_temperature_run(tmp_path_factory) -> Path:
    config = _write_problem(tmp_path_factory.mktemp("temperature"))
    fit(config, progress=False)
    return config.parent / "run.h5"


def test_objective_simulates_each_temperature_with_its_own_rates(tmp_path):
    cfg = load_config(_write_problem(tmp_path))
    objective = Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu"))
    assert isinstance(objective.simulator, TemperatureSimulator)
    truth = np.array([*TRUTH.values(), *Q10.values()])
    traces, _ = objective.traces(truth[None])
    plain = Scheme.loads(THREE_STATE)
    protocol = cfg.protocols[1].protocol
    hand = simulate_exact(plain, protocol, _by_hand(34.0), channels=1.0)
    got = traces["steps_34"]["fit_pA"]
    for k, sweep in enumerate(hand.sweeps):
        scale = float(np.max(np.abs(got[k])) / np.max(np.abs(sweep.current)))
        assert got[k] / scale == pytest.approx(sweep.current, abs=2e-4 * np.abs(
            sweep.current).max())


def test_fit_across_temperatures_recovers_rates_and_q10s_inside_their_intervals(
        two_temperature_run):
    result = profile_run(two_temperature_run, points=7, progress=False)
    rows = {r["name"]: r for r in result.rows}
    truth = {**TRUTH, "q10_binding": Q10["binding"], "q10_gating": Q10["gating"]}
    assert set(rows) == set(truth)
    for name, value in truth.items():
        # an interval open on one side (None) reaches that side's bound
        lower, upper = rows[name]["lower"] or 0.0, rows[name]["upper"] or math.inf
        assert lower < value < upper, (name, rows[name])
        assert rows[name]["best"] == pytest.approx(value, rel=0.5)
    for name in ("q10_binding", "q10_gating", "kon"):
        assert rows[name]["identifiable"]
        assert rows[name]["upper"] / rows[name]["lower"] < 1.2


@pytest.mark.parametrize("text, message", [
    ('[temperature]\nreference_c = 22\n[temperature.kon]\nq10 = 0\n',
     "temperature.kon.q10 = 0: must be > 0"),
    ('[temperature]\nreference_c = 22\n[temperature.kon]\nq10 = -2\n',
     "temperature.kon.q10 = -2: must be > 0"),
    ('[temperature]\nreference_c = 295\n',
     "temperature.reference_c = 295: a temperature in °C must lie in 0–50"),
    ('[temperature]\nreference_c = 22\n[temperature.k_nope]\nq10 = 2\n',
     "temperature.k_nope = 'k_nope': no such rate"),
    ('[temperature]\nreference_c = 22\n[temperature.fast]\nrates = ["kon", "kx"]\nq10 = 2\n',
     "temperature.fast.rates = 'kx': unknown rate"),
    ('[temperature]\nreference_c = 22\n[temperature.kon]\nq10 = 2\nea_kj_mol = 50\n',
     "temperature.kon.ea_kj_mol = 50: give q10 or ea_kj_mol, not both"),
    ('[temperature]\nreference_c = 22\n[temperature.a]\nrates = ["kon"]\nq10 = 2\n'
     '[temperature.b]\nrates = ["kon"]\nea_kj_mol = 50\n',
     "temperature.b.rates = 'kon': rate kon is already in group a"),
])
def test_bad_temperature_tables_are_one_line(text, message):
    with pytest.raises(KingenError) as err:
        Scheme.loads(THREE_STATE + text, path="s.toml")
    assert str(err.value).startswith("s.toml: ")
    assert message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_a_protocol_temperature_outside_0_to_50_is_one_line(tmp_path, capsys):
    config = _write_problem(tmp_path)
    text = config.read_text().replace("temperature = 34", "temperature = 307")
    config.write_text(text)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["fit", str(config), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("protocols[1].temperature = 307: a temperature in °C must lie in "
                        "0–50 (a kelvin or Fahrenheit figure?)"), err
    assert "\n" not in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_fit_override_of_an_unknown_q10_is_one_line(tmp_path, capsys):
    config = _write_problem(tmp_path)
    config.write_text(config.read_text() + '[parameters]\nq10_nope = { fixed = true }\n')
    with pytest.raises(KingenError, match=r"parameters\.q10_nope.*unknown parameter"):
        load_config(config)


def test_kingen_simulate_at_a_temperature_equals_rates_scaled_by_hand(tmp_path, capsys):
    model = tmp_path / "three.toml"
    model.write_text(THREE_STATE + TEMPERATURE.format(q_bind=2.4, q_gate=3.0))
    (tmp_path / "steps.toml").write_text(PROTOCOL)
    out = tmp_path / "warm.csv"
    assert main(["simulate", str(model), "--protocol", str(tmp_path / "steps.toml"),
                 "--temperature", "34", "--csv", str(out)]) == 0
    lines = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    header = lines[0].split(",")
    table = np.array([[float(x) for x in line.split(",")] for line in lines[1:]])
    protocol = load_protocol(tmp_path / "steps.toml")
    hand = simulate_exact(Scheme.loads(THREE_STATE), protocol, _by_hand(34.0))
    for sweep, want in zip(protocol.sweeps, hand.currents, strict=True):
        got = table[:, header.index(f"current_pA_{sweep.label}")]
        assert np.max(np.abs(got - want)) <= 1e-6 * np.max(np.abs(want))  # CSV digits


@pytest.mark.parametrize("args, message", [
    (["--temperature", "95"], "--temperature = 95.0: a temperature in °C must lie in 0–50"),
    (["--temperature", "-3"], "--temperature = -3.0: a temperature in °C must lie in 0–50"),
])
def test_kingen_simulate_refuses_a_temperature_outside_0_to_50(tmp_path, capsys, args,
                                                               message):
    model = tmp_path / "three.toml"
    model.write_text(THREE_STATE + TEMPERATURE.format(q_bind=2.4, q_gate=3.0))
    out = tmp_path / "x.csv"
    assert main(["simulate", str(model), "--protocol", "deactivation", "--csv", str(out),
                 *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
    assert not out.exists()


def test_kingen_simulate_at_a_temperature_needs_a_temperature_table(tmp_path, capsys):
    model = tmp_path / "plain.toml"
    model.write_text(THREE_STATE)
    assert main(["simulate", str(model), "--protocol", "deactivation",
                 "--temperature", "30"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--temperature = 30.0: the scheme has no [temperature] table: its "
                        "rates do not depend on temperature"), err


@pytest.mark.parametrize("override, message", [
    ("q10_binding = { value = 0 }", "parameters.q10_binding.value = 0"),
    ("q10_binding = { bounds = [-1, 4] }", "parameters.q10_binding.bounds[0] = -1"),
])
def test_a_q10_at_or_below_0_in_the_fit_configuration_is_one_line(tmp_path, override,
                                                                  message):
    config = _write_problem(tmp_path)
    config.write_text(config.read_text() + f"[parameters]\n{override}\n")
    with pytest.raises(KingenError) as err:
        load_config(config)
    assert message in str(err.value) and "must be > 0" in str(err.value), str(err.value)


def test_an_nwb_recording_carries_its_temperature_into_the_fit(tmp_path):
    """A recording whose file holds its temperature (kingen's NWB notes: temperature_c)
    sets its protocol's temperature without a configuration entry; an entry overrides it."""
    pytest.importorskip("pynwb")
    from kingen.experiment.recordings import read_nwb, write_nwb
    from kingen.fitting.temperature import protocol_temperature

    config = _write_problem(tmp_path)
    rec = load_recording(tmp_path / "steps_34.csv")
    rec.meta["temperature_c"] = 34.0
    write_nwb(rec, tmp_path / "steps_34.nwb")
    assert read_nwb(tmp_path / "steps_34.nwb").meta["temperature_c"] == 34.0
    text = config.read_text().replace('recording = "steps_34.csv"\ntemperature = 34\n',
                                      'recording = "steps_34.nwb"\n')
    config.write_text(text)
    cfg = load_config(config)
    assert [protocol_temperature(p.protocol) for p in cfg.protocols] == [22.0, 34.0]
    config.write_text(text.replace('recording = "steps_34.nwb"\n',
                                   'recording = "steps_34.nwb"\ntemperature = 30\n'))
    assert protocol_temperature(load_config(config).protocols[1].protocol) == 30.0
