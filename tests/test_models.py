"""The shipped scheme files in models/: they load, have the published structure and rate
constants, are microscopically reversible, and behave like their published currents.

Reference values are those of ``shared/reference/ampa_models.md``, in each source's own
units; they are converted here (s -> ms, M -> mM) and compared with the loaded values,
which kingen holds in ms^-1 and mM^-1 ms^-1.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kingen.errors import KingenError
from kingen.experiment.protocol import standard_protocol
from kingen.model.scheme import Scheme
from kingen.solve import simulate_exact

MODELS = Path(__file__).resolve().parent.parent / "models"

# file stem: (states, transitions, independent cycles, derived parameters)
STRUCTURE = {
    "jonas_1993": (7, 16, 2, set()),
    "destexhe_1994_ampa5": (6, 10, 0, set()),
    "raman_trussell_1992": (6, 10, 0, set()),
    "robert_howe_2003": (16, 42, 6, {"km2"}),
    "coombs_2017": (17, 44, 6, {"koff2", "koff3"}),
    "geiger_1999": (7, 16, 2, {"k_d2d1", "k_d2d3"}),
}
NEW = [m for m in STRUCTURE if m != "jonas_1993"]

# Published (non-derived) constants, in the source's units: (value, order) with order 1 for
# a first-order rate and 2 for a binding rate; and the factor to internal units.
MS_MM = 1.0            # NEURON files: already ms^-1 and mM^-1 ms^-1
S_M = {1: 1e-3, 2: 1e-6}  # s^-1 -> ms^-1; M^-1 s^-1 -> mM^-1 ms^-1
PUBLISHED = {
    "destexhe_1994_ampa5": ("ms", {
        "Rb": (13, 2), "Ru1": (0.0059, 1), "Ru2": (86, 1), "Rd": (0.9, 1), "Rr": (0.064, 1),
        "Ro": (2.7, 1), "Rc": (0.2, 1)}),
    "raman_trussell_1992": ("ms", {
        "Rb": (13, 2), "Ru1": (0.3, 1), "Ru2": (200, 1), "Rd": (30, 1), "Rr": (0.02, 1),
        "Ro1": (100, 1), "Rc1": (2, 1), "Ro2": (2, 1), "Rc2": (0.25, 1)}),
    "robert_howe_2003": ("s", {
        "k1": (1e7, 2), "km1": (1e4, 1), "beta": (2e4, 1), "alpha": (8e3, 1),
        "delta0": (3.5e-3, 1), "gamma0": (6, 1), "delta1": (800, 1), "gamma1": (45, 1),
        "delta2": (4e3, 1), "gamma2": (220, 1)}),
    "coombs_2017": ("s", {
        "kon": (1.3e7, 2), "koff": (3000, 1), "beta": (6000, 1), "alpha": (1000, 1),
        "delta0": (0.48, 1), "gamma0": (4.4, 1), "delta3": (250, 1), "delta1": (1200, 1),
        "gamma": (16, 1), "delta2": (1300, 1), "gamma2": (3900, 1)}),
    "geiger_1999": ("s", {
        "k_c0c1": (1.71e7, 2), "k_c1c0": (157, 1), "k_c1c2": (3.24e6, 2), "k_c2c1": (3760, 1),
        "k_c2o": (14900, 1), "k_oc2": (4000, 1), "k_c1d1": (1530, 1), "k_d1c1": (408, 1),
        "k_c2d2": (502, 1), "k_d2c2": (0.377, 1), "k_od3": (121, 1), "k_d3o": (191, 1),
        "k_d1d2": (6.11e5, 2), "k_d3d2": (899, 1)}),
}

# Derived rates recomputed at the published values, internal units (ms^-1), from the
# closed-form microscopic-reversibility conditions worked out in each file's header.
DERIVED = {
    "robert_howe_2003": {"km2": 3 * 3.5e-3 * 45 * 1e4 / (6 * 800) * 1e-3},        # 0.984 s^-1
    "coombs_2017": {"koff2": 3 * 0.48 * 3000 * 16 / (4.4 * 250) * 1e-3,            # 62.8 s^-1
                    "koff3": 250 * 3000 / 1200 * 1e-3},                             # 625 s^-1
    "geiger_1999": {
        "k_d2d1": 1530 * 6.11e5 * 0.377 * 3760 / (3.24e6 * 502 * 408) * 1e-3,       # 2.00 s^-1
        "k_d2d3": 14900 * 121 * 899 * 0.377 / (502 * 191 * 4000) * 1e-3},          # 1.59 s^-1
}

CONDUCTANCES = {
    "destexhe_1994_ampa5": {"O": 10.0},
    "raman_trussell_1992": {"O1": 10.0, "O2": 10.0},
    "robert_howe_2003": {"O2": 8.0, "O3": 16.0, "O4": 24.0},
    "coombs_2017": {"O1": 3.7, "O2": 16.1, "O3": 30.6, "O4": 38.6},
    "geiger_1999": {"O": 8.5},
    "jonas_1993": {"O": 10.0},
}


@pytest.fixture(scope="module")
def schemes() -> dict[str, Scheme]:
    return {stem: Scheme.load(MODELS / f"{stem}.toml") for stem in STRUCTURE}


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# --------------------------------------------------------------------------- loading

def test_every_shipped_file_is_covered_and_loads():
    shipped = {p.stem for p in MODELS.glob("*.toml")}
    assert shipped == set(STRUCTURE), "a model file was added or removed: update STRUCTURE"
    for path in sorted(MODELS.glob("*.toml")):
        s = Scheme.load(path)
        assert s.source and s.name
        assert s.agonist == "glu"


@pytest.mark.parametrize("stem", list(STRUCTURE))
def test_structure_as_published(schemes, stem):
    n_states, n_trans, n_cycles, derived = STRUCTURE[stem]
    s = schemes[stem]
    assert s.n_states == n_states
    assert len(s.transitions) == n_trans
    assert len(s.cycles) == n_cycles
    assert {p.name for p in s.parameters if p.derived} == derived
    # every transition has its reverse (no one-way steps in these schemes)
    pairs = {(t.source, t.target) for t in s.transitions}
    assert all((j, i) in pairs for i, j in pairs)


@pytest.mark.parametrize("stem", list(STRUCTURE))
def test_conductances_and_channels(schemes, stem):
    s = schemes[stem]
    open_states = {name: s.conductance[i] for i, name in enumerate(s.states)
                   if s.conductance[i] > 0}
    assert open_states == pytest.approx(CONDUCTANCES[stem])
    assert s.channels > 0


def test_original_units_declared(schemes):
    for stem in ("destexhe_1994_ampa5", "raman_trussell_1992", "jonas_1993"):
        assert schemes[stem].file_units["time"] == "ms"
        assert schemes[stem].file_units["concentration"] == "mM"
    for stem in ("robert_howe_2003", "coombs_2017", "geiger_1999"):
        assert schemes[stem].file_units["time"] == "s"
        assert schemes[stem].file_units["concentration"] == "M"


# --------------------------------------------------------------------------- rate constants

@pytest.mark.parametrize("stem", NEW)
def test_published_values_converted(schemes, stem):
    s = schemes[stem]
    unit, table = PUBLISHED[stem]
    values = dict(zip(s.param_names, s.values, strict=True))
    derived = {p.name for p in s.parameters if p.derived}
    # one parameter per published constant: published + derived cover all parameters
    assert set(table) | derived == set(values)
    for name, (value, order) in table.items():
        factor = MS_MM if unit == "ms" else S_M[order]
        assert s.parameters[s.param_names.index(name)].order == order, name
        assert values[name] == pytest.approx(value * factor, rel=1e-12), name


def test_spot_checks_internal_units(schemes):
    v = {stem: dict(zip(s.param_names, s.values, strict=True)) for stem, s in schemes.items()}
    assert v["robert_howe_2003"]["k1"] == pytest.approx(10.0)      # 1e7 /M/s
    assert v["robert_howe_2003"]["km1"] == pytest.approx(10.0)     # 1e4 /s
    assert v["robert_howe_2003"]["delta0"] == pytest.approx(3.5e-6)
    assert v["coombs_2017"]["kon"] == pytest.approx(13.0)          # 1.3e7 /M/s
    assert v["coombs_2017"]["alpha"] == pytest.approx(1.0)         # 1000 /s
    assert v["geiger_1999"]["k_d1d2"] == pytest.approx(0.611)      # 6.11e5 /M/s
    assert v["geiger_1999"]["k_c2o"] == pytest.approx(14.9)        # 14900 /s
    assert v["destexhe_1994_ampa5"]["Ru1"] == pytest.approx(0.0059)
    assert v["raman_trussell_1992"]["Ru2"] == pytest.approx(200.0)


@pytest.mark.parametrize("stem", sorted(DERIVED))
def test_derived_rates_recomputed(schemes, stem):
    s = schemes[stem]
    values = dict(zip(s.param_names, s.values, strict=True))
    for name, expected in DERIVED[stem].items():
        assert values[name] == pytest.approx(expected, rel=1e-12), name
        p = s.parameters[s.param_names.index(name)]
        assert p.lower <= values[name] <= p.upper


def test_derived_file_values_are_ignored():
    text = (MODELS / "coombs_2017.toml").read_text(encoding="utf-8")
    text = text.replace("koff2  = { value = 63,", "koff2  = { value = 6.3,")
    text = text.replace("koff3  = { value = 630,", "koff3  = { value = 6300,")
    assert "value = 6.3," in text and "value = 6300," in text
    s = Scheme.loads(text)
    values = dict(zip(s.param_names, s.values, strict=True))
    for name, expected in DERIVED["coombs_2017"].items():
        assert values[name] == pytest.approx(expected, rel=1e-12), name


@pytest.mark.parametrize("stem", NEW)
def test_bounds_are_tenfold_around_file_values(schemes, stem):
    for p in schemes[stem].parameters:
        assert p.upper / p.value == pytest.approx(10.0, rel=1e-9), p.name
        assert p.value / p.lower == pytest.approx(10.0, rel=1e-9), p.name


def test_statistical_factors_in_rates(schemes):
    """Spot-check the generator at 1 mM: factors and the corrected slips."""
    rh = schemes["robert_howe_2003"]
    q = rh.Q(1.0)
    ix = rh.state_index
    assert q[ix("C0"), ix("C1")] == pytest.approx(40.0)   # 4 k1 [glu]
    assert q[ix("C2"), ix("C3")] == pytest.approx(20.0)   # 2 k1 (not 2 k2 = 2e-3)
    assert q[ix("C4"), ix("C3")] == pytest.approx(40.0)   # 4 km1
    assert q[ix("D0"), ix("D1")] == pytest.approx(30.0)   # 3 k1
    assert q[ix("C4"), ix("O4")] == pytest.approx(80.0)   # 4 beta
    assert q[ix("D4"), ix("DD4")] == pytest.approx(12.0)  # 3 delta2
    co = schemes["coombs_2017"]
    q = co.Q(1.0)
    ix = co.state_index
    assert q[ix("R3"), ix("O3")] == pytest.approx(12.0)   # 2 beta, as published
    assert q[ix("R0"), ix("D0")] == pytest.approx(4 * 0.48e-3)
    assert q[ix("D0"), ix("D1")] == pytest.approx(39.0)   # 3 kon
    assert q[ix("DD4"), ix("DD3")] == pytest.approx(6.0)  # 2 koff


# --------------------------------------------------------------------------- reversibility

@pytest.mark.parametrize("stem", NEW)
def test_every_cycle_exactly_reversible(schemes, stem):
    s = schemes[stem]
    for cycle, (f, b) in zip(s.cycles, s.cycle_products(), strict=True):
        assert abs(math.log(f / b)) < 1e-9, s.describe_cycle(cycle)


@pytest.mark.parametrize("stem", sorted(DERIVED))
def test_reversible_for_any_parameter_set(schemes, stem):
    """Derived rates keep every cycle exact wherever a fit goes inside the bounds."""
    s = schemes[stem]
    rng = np.random.default_rng(7)
    lo, hi = np.log(s.lower), np.log(s.upper)
    for _ in range(20):
        p = s.complete(np.exp(rng.uniform(lo, hi)))
        for cycle, (f, b) in zip(s.cycles, s.cycle_products(p), strict=True):
            assert abs(math.log(f / b)) < 1e-9, s.describe_cycle(cycle)


def test_jonas_cycles_reversible_within_tolerance(schemes):
    s = schemes["jonas_1993"]
    cycle_states = {frozenset(s.states[i] for i in c.states) for c in s.cycles}
    assert cycle_states == {frozenset({"C1", "C2", "C4", "C3"}),
                            frozenset({"C2", "O", "C5", "C4"})}
    for f, b in s.cycle_products():
        assert abs(math.log(f / b)) < math.log1p(0.01)


def _jonas_text() -> str:
    return (MODELS / "jonas_1993.toml").read_text(encoding="utf-8")


def test_jonas_with_a_rate_changed_tenfold_is_rejected():
    text = _jonas_text()
    old = "k31 = { value = 0.0392,"
    assert old in text
    bad = text.replace(old, "k31 = { value = 0.392,")
    with pytest.raises(KingenError) as info:
        Scheme.loads(bad, path="jonas_bad.toml")
    message = str(info.value)
    assert "violates microscopic reversibility" in message
    assert "jonas_bad.toml" in message
    for state in ("C1", "C2", "C4", "C3"):
        assert state in message
    assert "C5" not in message  # the other cycle is not blamed


def test_jonas_with_the_changed_rate_derived_loads():
    text = _jonas_text().replace("k31 = { value = 0.0392,", "k31 = { value = 0.392,")
    text = text.replace('"C3 -> C1" = "k31"', '"C3 -> C1" = { rate = "k31", derived = true }')
    s = Scheme.loads(text)
    k31 = s.values[s.param_names.index("k31")]
    assert rel(k31, 0.0392) < 0.02  # back to the published value, up to the 1 % mismatch


def test_robert_howe_transcription_slip_would_be_rejected():
    """C2 -> C3 = 2 k2 with k2 = 1e3 /M/s (as in QSTIMB) breaks cycle C2-C3-D3-D2 by 1e4."""
    text = (MODELS / "robert_howe_2003.toml").read_text(encoding="utf-8")
    text = text.replace('"C2 -> C3" = "2 * k1 * glu"', '"C2 -> C3" = "2 * k2 * glu"')
    text = text.replace("[parameters]\n", "[parameters]\n"
                        'k2 = { value = 1e3, unit = "M^-1 s^-1", bounds = [1e2, 1e4] }\n')
    with pytest.raises(KingenError, match="violates microscopic reversibility") as info:
        Scheme.loads(text)
    assert all(x in str(info.value) for x in ("C2", "C3", "D3", "D2"))


def test_robert_howe_published_km2_is_within_tolerance():
    """The published D1 -> D0 = 1 /s is the reversible value rounded (ratio 1.016)."""
    text = (MODELS / "robert_howe_2003.toml").read_text(encoding="utf-8")
    text = text.replace('{ rate = "km2", derived = true }', '"km2"')
    s = Scheme.loads(text)
    ratios = [f / b for f, b in s.cycle_products()]
    worst = max(abs(math.log(r)) for r in ratios)
    assert 0.01 < worst < math.log1p(0.02)


def test_geiger_as_transcribed_is_rejected():
    """Cycle C2-O-D3-D2 is off by a factor ~1000 with D2 -> D3 = 1590 /s."""
    text = (MODELS / "geiger_1999.toml").read_text(encoding="utf-8")
    text = text.replace('{ rate = "k_d2d3", derived = true }', '"k_d2d3"')
    text = text.replace("k_d2d3 = { value = 1.59322, unit = \"s^-1\", "
                        "bounds = [0.159322, 15.9322]",
                        "k_d2d3 = { value = 1590, unit = \"s^-1\", bounds = [159, 15900]")
    assert "value = 1590," in text
    with pytest.raises(KingenError, match="violates microscopic reversibility") as info:
        Scheme.loads(text)
    assert all(x in str(info.value) for x in ("C2", "O", "D3", "D2"))


# --------------------------------------------------------------------------- behaviour

# 100 ms of 10 mM glutamate at -60 mV (ideal steps), exact solution. Expected, from the
# published schemes (values the files give, checked when the files were written):
#   peak time after onset, ms; steady state / peak at the end of the pulse; |peak|, pA
BEHAVIOUR = {
    # Destexhe AMPA5 at saturating glutamate: slow activation (Ro = 2.7/ms) and weak
    # desensitization (C2 <-> D2 0.9/0.064 against C2 <-> O 2.7/0.2): peak ~1.6 ms,
    # steady state ~62 % of the peak. gmax 500 pS x 60 mV bounds |peak| by 30 pA.
    "destexhe_1994_ampa5": dict(t_peak=(0.5, 3.0), ss=(0.5, 0.75), peak=(10, 30)),
    # Raman & Trussell: very fast (Ro1 = 100/ms) peak ~0.1 ms; ~5 % steady state (O2).
    "raman_trussell_1992": dict(t_peak=(0.0, 0.5), ss=(0.02, 0.1), peak=(50, 300)),
    # Robert & Howe: peak ~0.3 ms, near-complete desensitization (~0.4 %).
    "robert_howe_2003": dict(t_peak=(0.1, 1.0), ss=(0.0, 0.02), peak=(20, 300)),
    # Coombs GluA1 + gamma-2: peak ~0.2 ms, TARP-enhanced steady state ~7 %.
    "coombs_2017": dict(t_peak=(0.05, 1.0), ss=(0.03, 0.15), peak=(20, 300)),
    # Geiger interneuron receptors: peak ~0.3 ms, near-complete desensitization (~0.4 %).
    "geiger_1999": dict(t_peak=(0.1, 1.0), ss=(0.0, 0.02), peak=(20, 300)),
    # Jonas 1993: peak ~0.9 ms, ~3 % steady state.
    "jonas_1993": dict(t_peak=(0.3, 2.0), ss=(0.01, 0.1), peak=(20, 300)),
}


@pytest.fixture(scope="module")
def desensitization_traces(schemes):
    protocol = standard_protocol("desensitization")
    return protocol, {stem: simulate_exact(s, protocol).sweeps[0]
                      for stem, s in schemes.items()}


@pytest.mark.parametrize("stem", list(STRUCTURE))
def test_pulse_response_peaks_and_desensitizes(desensitization_traces, stem):
    protocol, traces = desensitization_traces
    pulse = protocol.sweeps[0].pulses[0]
    trace = traces[stem]
    t, i = trace.time, trace.current
    assert np.all(np.isfinite(i))
    assert np.all(i <= 1e-9), "inward current at -60 mV with reversal 0 mV"
    k = int(np.argmin(i))
    peak = i[k]
    t_peak = t[k] - pulse.start
    during = (t > pulse.end - 2.0) & (t < pulse.end)
    ratio = i[during].mean() / peak
    want = BEHAVIOUR[stem]
    assert want["t_peak"][0] <= t_peak <= want["t_peak"][1], t_peak
    assert want["ss"][0] <= ratio <= want["ss"][1], ratio
    assert want["peak"][0] <= -peak <= want["peak"][1], peak
    # before the pulse there is no current; the current decays after the peak
    assert np.all(np.abs(i[t < pulse.start]) < 1e-9 * abs(peak))
    assert i[during].mean() > peak
