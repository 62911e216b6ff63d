"""NMODL files as labs write them (issue #33): Q10 factors become the scheme's
[temperature] table, unit annotations and unit factors are read, and the pieces that do not
feed the kinetic scheme are left out with one line each. The fixtures in
tests/data/nmodl_published were written for these tests in the style of ModelDB files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kingen.cli import main
from kingen.errors import KingenError
from kingen.model.scheme import Scheme
from kingen.outputs.interop import ImportProblems, export_text, import_text

DATA = Path(__file__).parent / "data" / "nmodl_published"

WARM = (Path(__file__).parent / "data" / "warm_four_state.toml").read_text()


def _imported(name: str, **kwargs) -> tuple[Scheme, list[str]]:
    left: list[str] = []
    text = import_text(DATA / name, left_out=left, **kwargs)
    return Scheme.loads(text), left


def _groups(scheme: Scheme) -> dict[str, tuple[str, float, list[str]]]:
    names = scheme.param_names
    return {g.name: (g.kind, scheme.values[g.param], [names[m] for m in g.members])
            for g in scheme.temperature.groups}


def _values(scheme: Scheme) -> dict[str, float]:
    return {p.name: v for p, v in zip(scheme.parameters, scheme.values) if p.order}


def test_kingen_export_imports_back_with_the_same_q10s_and_activation_energy(tmp_path):
    scheme = Scheme.loads(WARM, path="warm.toml")
    mod = tmp_path / "warm.mod"
    mod.write_text(export_text(scheme, "neuron"))
    back = Scheme.loads(import_text(mod))
    assert back.temperature.reference_c == pytest.approx(22.0, abs=1e-9)
    got = _groups(back)
    assert got["binding"][0] == "q10" and got["binding"][1] == pytest.approx(2.4, rel=1e-12)
    assert got["binding"][2] == ["kon", "koff"]
    assert got["gating"][1] == pytest.approx(3.0, rel=1e-12)
    assert got["d"][0] == "ea" and got["d"][1] == pytest.approx(60.0, rel=1e-9)
    assert got["d"][2] == ["d"]
    assert back.param_names == scheme.param_names
    assert _values(back) == pytest.approx(_values(scheme), rel=1e-12)


def test_q10_computed_in_initial():
    scheme, left = _imported("q10_initial.mod")
    assert scheme.temperature.reference_c == 22
    assert _groups(scheme) == {"binding": ("q10", 2.4, ["kon", "koff"]),
                               "gating": ("q10", 3.0, ["beta", "alpha"])}
    assert _values(scheme) == {"kon": 5, "koff": 2, "beta": 4, "alpha": 1, "d": 0.2,
                               "r": 0.01}
    assert left == []


def test_unit_factors_of_rates_in_per_second():
    scheme, left = _imported("unit_factors.mod")
    assert _values(scheme) == pytest.approx({"Rb": 5.0, "Ru": 2.0, "Ro": 4.0, "Rc": 1.0},
                                            rel=1e-12)
    assert all(t.factor == 1.0 for t in scheme.transitions)
    assert scheme.temperature is None
    assert left == ["POINTER C: the transmitter comes from another mechanism: not imported "
                    "(a protocol gives its concentration)"]


def test_unit_annotations_in_a_mg_block_procedure():
    scheme, left = _imported("mg_procedure.mod")
    assert scheme.states == ["C0", "C1", "C2", "D", "O"]
    assert scheme.conductance.tolist() == [0, 0, 0, 0, 50]
    assert _values(scheme)["Rb"] == 5.0
    assert left == ["Mg block B(v) multiplies the conductance: not imported (PROCEDURE "
                    "mgblock, line 65)"]


def test_mg_block_function_outside_the_kinetic_block():
    scheme, left = _imported("mg_function.mod")
    assert scheme.states == ["R", "RT", "O"] and scheme.agonist == "T"
    assert scheme.conductance.tolist() == [0, 0, 40]
    assert left == ["Mg block B(v) multiplies the conductance: not imported (FUNCTION B, "
                    "line 54)"]


def test_net_receive_release_is_left_out():
    scheme, left = _imported("net_receive.mod")
    assert _values(scheme) == {"Alpha": 1.1, "Beta": 0.19}
    assert scheme.agonist == "C"
    assert left == [
        "NET_RECEIVE (line 61) handles synaptic events: not imported (a protocol gives the "
        "transmitter's concentration)",
        "the transmitter C is computed in NET_RECEIVE at line 62 (its release or diffusion): "
        "not imported (a protocol gives its concentration)"]


def test_pointer_transmitter_and_verbatim_are_left_out():
    scheme, left = _imported("pointer.mod")
    assert scheme.agonist == "glu" and scheme.states == ["R", "O", "D"]
    assert left == [
        "POINTER glu: the transmitter comes from another mechanism: not imported (a protocol "
        "gives its concentration)",
        "PROCEDURE hello (line 57) does not feed the kinetic scheme: not imported",
        "VERBATIM (line 58) is C code: not imported"]


CELSIUS = """NEURON { POINT_PROCESS s RANGE C }
PARAMETER { k = 2 (/ms) kon = 1 (/mM /ms) }
ASSIGNED { C (mM) g (pS) celsius (degC) fac (1) }
STATE { A B }
INITIAL { fac = exp(0.05 * (celsius - 22)) }
BREAKPOINT { SOLVE kin METHOD sparse
 g = 10 * B }
KINETIC kin {
 ~ A <-> B (kon*C, k*fac)
}
"""


def test_a_temperature_dependence_other_than_q10_is_evaluated_at_celsius(tmp_path):
    mod = tmp_path / "x.mod"
    mod.write_text(CELSIUS)
    with pytest.raises(ImportProblems) as info:
        import_text(mod)
    assert str(info.value) == (f"{mod}:9: rate B -> A depends on the temperature celsius "
                               "other than through a Q10 or Arrhenius factor: give --celsius "
                               "T to evaluate it at T")
    scheme = Scheme.loads(import_text(mod, celsius=32))
    back = scheme.transitions[1]
    assert scheme.states[back.source] == "B" and scheme.parameters[back.param].name == "k"
    assert back.factor * scheme.values[back.param] == pytest.approx(2 * math.exp(0.5),
                                                                    rel=1e-12)
    with pytest.raises(KingenError, match=r"--celsius = 320: a temperature in °C must lie"):
        import_text(mod, celsius=320)


def test_kingen_import_prints_one_line_per_left_out_piece(tmp_path, capsys):
    out = tmp_path / "nmda.toml"
    assert main(["import", str(DATA / "mg_procedure.mod"), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == (f"{DATA / 'mg_procedure.mod'}: left out: Mg block B(v) "
                                    "multiplies the conductance: not imported (PROCEDURE "
                                    "mgblock, line 65)")
    assert captured.out.strip() == str(out)
    assert "# Mg block B(v) multiplies the conductance" in out.read_text()


def test_myokit_export_carries_the_temperature_and_imports_back(tmp_path):
    """The .mmt export holds a temperature variable: set to 35, Myokit's own Markov
    simulation equals kingen's at --temperature 35; imported back, the same groups."""
    myokit = pytest.importorskip("myokit")
    import myokit.lib.markov as markov
    import numpy as np

    from kingen.experiment.protocol import standard_protocol
    from kingen.runs.simulate import simulate

    scheme = Scheme.loads(WARM, path="warm.toml")
    text = export_text(scheme, "myokit")
    model = myokit.parse_model(text)
    model.check_units(myokit.UNIT_STRICT)
    model.get("kingen_warm.celsius").set_rhs(35)
    linear = markov.LinearModel.from_component(model.get("kingen_warm"),
                                               vm="kingen_warm.glu", current="kingen_warm.i")
    protocol = standard_protocol("desensitization", dt=0.1)
    ours = simulate(scheme, protocol, temperature=35)
    sweep, ref = protocol.sweeps[0], ours.currents[0]
    pacing = myokit.Protocol()
    for seg in sweep.segments():
        if seg.concentration:
            pacing.schedule(seg.concentration, seg.start, seg.end - seg.start)
    log = markov.AnalyticalSimulation(linear, pacing).run(sweep.duration + sweep.dt,
                                                          log_times=ours.times[0])
    got = np.asarray(log["kingen_warm.i"])  # the export scales by the channel count
    assert np.max(np.abs(got - ref)) <= 1e-6 * np.max(np.abs(ref))
    mmt = tmp_path / "warm.mmt"
    mmt.write_text(text)
    back = Scheme.loads(import_text(mmt))
    got_groups = _groups(back)
    assert got_groups["binding"][1] == pytest.approx(2.4, rel=1e-12)
    assert got_groups["gating"][1] == pytest.approx(3.0, rel=1e-12)
    assert got_groups["d"][0] == "ea" and got_groups["d"][1] == pytest.approx(60, rel=1e-9)
    assert back.temperature.reference_c == pytest.approx(22, abs=1e-9)
