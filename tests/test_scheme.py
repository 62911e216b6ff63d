"""Scheme files: parsing, unit conversion, validation errors, cycles and derived rates."""

from pathlib import Path

import numpy as np
import pytest

from kingen.errors import KingenError
from kingen.model.scheme import Scheme

MODELS = Path(__file__).resolve().parents[1] / "models"

TWO_STATE = """
[model]
name = "two-state"
[units]
time = "s"
concentration = "M"
[states]
C = { conductance = 0 }
O = { conductance = 20 }
[parameters]
kon = { value = 1e7, unit = "M^-1 s^-1", bounds = [1e6, 1e8] }
koff = { value = 500, unit = "1/s", bounds = [50, 5000] }
[transitions]
"C -> O" = "kon * glu"
"O -> C" = "koff"
"""

TRIANGLE = """
[model]
name = "triangle"
[states]
A = {}
B = { conductance = 10 }
C = {}
[parameters]
kab = { value = 1.0, bounds = [0.1, 10] }
kba = { value = 2.0, bounds = [0.2, 20] }
kbc = { value = 3.0, bounds = [0.3, 30] }
kcb = { value = 4.0, bounds = [0.4, 40] }
kca = { value = 5.0, bounds = [0.5, 50] }
kac = { value = 0.5, bounds = [0.01, 100] }
[transitions]
"A -> B" = "kab * glu"
"B -> A" = "kba"
"B -> C" = "kbc"
"C -> B" = "kcb"
"C -> A" = "kca"
"A -> C" = { rate = "kac * glu", derived = true }
"""


def test_units_converted_once_at_load():
    s = Scheme.loads(TWO_STATE, "two.toml")
    kon, koff = s.values
    assert kon == pytest.approx(10.0)  # 1e7 /M/s = 10 /mM/ms
    assert koff == pytest.approx(0.5)  # 500 /s = 0.5 /ms
    assert s.parameters[0].order == 2 and s.parameters[1].order == 1
    assert s.lower[0] == pytest.approx(1.0) and s.upper[1] == pytest.approx(5.0)


def test_generator_matrix_rows_sum_to_zero_and_rates_placed():
    s = Scheme.loads(TWO_STATE)
    q = s.Q(0.1)
    np.testing.assert_allclose(q, [[-1.0, 1.0], [0.5, -0.5]])
    q = Scheme.load(MODELS / "jonas_1993.toml").Q(10.0)
    np.testing.assert_allclose(q.sum(axis=1), 0.0, atol=1e-12)


def test_jonas_cycles_found_and_reversible():
    s = Scheme.load(MODELS / "jonas_1993.toml")
    assert len(s.cycles) == 2
    names = {frozenset(s.states[i] for i in c.states) for c in s.cycles}
    assert names == {frozenset({"C1", "C2", "C4", "C3"}), frozenset({"C2", "O", "C5", "C4"})}
    for f, b in s.cycle_products():
        assert abs(f / b - 1) < 0.01


def test_jonas_with_a_rate_changed_tenfold_is_rejected_naming_the_cycle():
    text = (MODELS / "jonas_1993.toml").read_text()
    bad = text.replace("k24 = { value = 0.172,", "k24 = { value = 1.72,  ")
    assert bad != text
    with pytest.raises(KingenError) as err:
        Scheme.loads(bad, "jonas_bad.toml")
    msg = str(err.value)
    assert "violates microscopic reversibility" in msg
    assert "C2" in msg and "C4" in msg and "jonas_bad.toml" in msg
    assert "\n" not in msg


JONAS_WARNINGS = [
    'warning: cycle C3-C4-C2-C1-C3 has no derived rate, so the fit searches rates that break '
    'microscopic reversibility; mark one derived, e.g. "C3 -> C4" = { rate = "k34", '
    'derived = true } (or set model.check_reversibility = false)',
    'warning: cycle C4-C5-O-C2-C4 has no derived rate, so the fit searches rates that break '
    'microscopic reversibility; mark one derived, e.g. "C4 -> C5" = { rate = "k45", '
    'derived = true } (or set model.check_reversibility = false)',
]


def test_cycles_without_a_derived_rate_are_named_with_a_rate_to_derive():
    text = (MODELS / "jonas_1993.toml").read_text()
    s = Scheme.loads(text, "jonas_1993.toml")
    assert s.reversibility_warnings() == JONAS_WARNINGS
    # only cycles whose rates the fit varies: k2o and ko2 lie on the second cycle only
    assert s.reversibility_warnings({"k2o", "ko2"}) == JONAS_WARNINGS[1:]
    assert s.reversibility_warnings(set()) == []
    # following both suggestions at once gives a scheme with nothing left to warn about
    fixed = text.replace('"C3 -> C4" = "k34 * glu"',
                         '"C3 -> C4" = { rate = "k34 * glu", derived = true }').replace(
        '"C4 -> C5" = "k45"', '"C4 -> C5" = { rate = "k45", derived = true }')
    assert fixed.count("derived = true") == 2
    followed = Scheme.loads(fixed, "jonas_derived.toml")
    assert sorted(p.name for p in followed.parameters if p.derived) == ["k34", "k45"]
    assert followed.reversibility_warnings() == []
    # a scheme out of equilibrium on purpose is not warned about
    off = text.replace('channels = 100', 'channels = 100\ncheck_reversibility = false')
    assert Scheme.loads(off, "jonas_off.toml").reversibility_warnings() == []
    assert Scheme.load(MODELS.parent / "data" / "jonas_1993_reversible.toml"
                       ).reversibility_warnings() == []


def test_cycles_whose_shared_rates_cancel_are_not_warned_about():
    # Robert & Howe 2003 uses the same rates on the parallel arms of its cycles: the ratio
    # of the two products does not depend on them, so any parameter set stays reversible.
    s = Scheme.load(MODELS / "robert_howe_2003.toml")
    assert sum(c.derived is None for c in s.cycles) == 5
    assert s.reversibility_warnings() == []


def test_derived_rate_keeps_every_parameter_set_exactly_reversible():
    s = Scheme.loads(TRIANGLE)
    assert len(s.cycles) == 1 and s.cycles[0].derived is not None
    rng = np.random.default_rng(1)
    for _ in range(20):
        p = s.complete(np.exp(rng.uniform(np.log(s.lower), np.log(s.upper))))
        (f, b), = s.cycle_products(p)
        assert f == pytest.approx(b, rel=1e-12)
    # derived value at the file's values: kac = kab*kbc*kca / (kba*kcb) ... oriented A->C
    kab, kba, kbc, kcb, kca = 1.0, 2.0, 3.0, 4.0, 5.0
    assert s.values[5] == pytest.approx(kab * kbc * kca / (kba * kcb))


def test_complete_in_place_and_a_zero_rate_makes_the_derived_rate_nan():
    s = Scheme.loads(TRIANGLE)
    p = np.vstack([s.values, s.values * 2.0, s.values])
    p[2, 0] = 0.0
    copied = s.complete(p)
    assert copied is not p
    same = s.complete(p, copy=False)
    assert same is p
    np.testing.assert_array_equal(same, copied)
    derived = [q.derived for q in s.parameters]
    assert np.isnan(p[2, derived]).all() and np.isfinite(p[:2, derived]).all()


def test_resting_occupancy_is_equilibrium_without_agonist():
    s = Scheme.load(MODELS / "jonas_1993.toml")
    rest = s.rest_occupancy()
    np.testing.assert_allclose(rest @ s.Q(0.0), 0.0, atol=1e-14)
    assert rest.sum() == pytest.approx(1.0)
    assert rest[0] == pytest.approx(1.0)


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


BAD_CASES = {
    "malformed TOML": (lambda t: t + "\n[[[", "malformed TOML"),
    "unknown state": (lambda t: _replace(t, '"O -> C" = "koff"', '"O -> X" = "koff"'),
                      "unknown state"),
    "unknown parameter": (lambda t: _replace(t, '"O -> C" = "koff"', '"O -> C" = "kof"'),
                          "unknown parameter 'kof'"),
    "self transition": (lambda t: _replace(t, '"O -> C" = "koff"', '"O -> O" = "koff"'),
                        "to itself"),
    "unknown table": (lambda t: t + '[[extra]]\n', "extra: unknown field (known: model,"),
    "misspelt model field": (lambda t: _replace(t, 'name = "two-state"',
                                                'name = "two-state"\ncheck_reversiblity = false'),
                             "model.check_reversiblity: unknown field"),
    "string for a boolean": (
        lambda t: _replace(t, 'name = "two-state"',
                           'name = "two-state"\ncheck_reversibility = "false"'),
        "must be true or false"),
    "no conducting state": (lambda t: _replace(t, "conductance = 20", "conductance = 0"),
                            "no conducting state"),
    "non-positive rate": (lambda t: _replace(t, "value = 500,", "value = -5,"), "must be > 0"),
    "non-positive bound": (lambda t: _replace(t, "bounds = [50, 5000]", "bounds = [0, 5000]"),
                           "bounds[0] = 0: must be > 0"),
    "inverted bounds": (lambda t: _replace(t, "bounds = [50, 5000]", "bounds = [5000, 50]"),
                        "lower bound must be below"),
    "value outside bounds": (lambda t: _replace(t, "value = 500,", "value = 9000,"),
                             "outside its bounds"),
    "unused parameter": (lambda t: _replace(t, "[transitions]", "kx = 1.0\n[transitions]"),
                         "unused parameter"),
    "unknown unit": (lambda t: _replace(t, 'time = "s"', 'time = "fortnight"'),
                     "unknown time unit"),
    "rate unit of wrong order": (lambda t: _replace(t, 'unit = "1/s"', 'unit = "1/(M*s)"'),
                                 "does not match its use"),
    "not a rate unit": (lambda t: _replace(t, 'unit = "1/s"', 'unit = "mV"'),
                        "not a rate unit"),
    "zero factor": (lambda t: _replace(t, '"O -> C" = "koff"', '"O -> C" = "0 * koff"'),
                    "factor must be > 0"),
    "two parameters": (lambda t: _replace(t, '"O -> C" = "koff"', '"O -> C" = "koff * kon"'),
                       "two parameters"),
    "wrong agonist name": (lambda t: _replace(t, '"kon * glu"', '"kon * ach"'),
                           "unknown parameter 'ach'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_invalid_scheme_gives_one_line_error_naming_file(case):
    mutate, expected = BAD_CASES[case]
    with pytest.raises(KingenError) as err:
        Scheme.loads(mutate(TWO_STATE), "bad.toml")
    msg = str(err.value)
    assert expected in msg
    assert msg.startswith("bad.toml")
    assert "\n" not in msg


def test_duplicate_transition_rejected():
    # a [transitions] table cannot repeat a key, so duplicates come in the list form
    lst = TWO_STATE.split("[transitions]")[0] + (
        '[[transitions]]\nfrom = "C"\nto = "O"\nrate = "kon * glu"\n'
        '[[transitions]]\nfrom = "O"\nto = "C"\nrate = "koff"\n'
        '[[transitions]]\nfrom = "C"\nto = "O"\nrate = "kon * glu"\n')
    with pytest.raises(KingenError, match=r"transitions\[2\].*duplicate transition C -> O"):
        Scheme.loads(lst, "dup.toml")


def test_unreachable_state_named():
    text = TWO_STATE.replace("O = { conductance = 20 }",
                             "O = { conductance = 20 }\nZ = { conductance = 0 }")
    text = text.replace("[transitions]", "kz = 1.0\n[transitions]\n\"Z -> C\" = \"kz\"")
    with pytest.raises(KingenError, match=r"states\.Z: unreachable state"):
        Scheme.loads(text, "u.toml")


def test_transitions_list_after_parameters_gets_a_helpful_error():
    text = TWO_STATE.split("[transitions]")[0] + (
        'transitions = [ { from = "C", to = "O", rate = "kon * glu" } ]\n')
    with pytest.raises(KingenError, match="written after \\[parameters\\]"):
        Scheme.loads(text, "t.toml")


def test_one_way_cycle_rejected_and_derived_needs_a_cycle():
    text = TRIANGLE.replace('"A -> C" = { rate = "kac * glu", derived = true }', "")
    text = text.replace('kac = { value = 0.5, bounds = [0.01, 100] }\n', "")
    with pytest.raises(KingenError, match="one-way transition"):
        Scheme.loads(text, "oneway.toml")
    no_cycle = TWO_STATE.replace('"O -> C" = "koff"', '"O -> C" = { rate = "koff", derived = '
                                 'true }')
    with pytest.raises(KingenError, match="closes no cycle"):
        Scheme.loads(no_cycle, "d.toml")


def test_missing_file_error():
    with pytest.raises(KingenError, match="nope.toml: scheme file not found"):
        Scheme.load("nope.toml")


def test_rest_sink_shortcut_equals_the_equilibrium_solve():
    """The structural shortcut (all receptors rest in one state) must agree with solving
    p Q(0) = 0 for arbitrary rates; schemes with apo-desensitization have no sink."""
    rng = np.random.default_rng(5)
    for path in sorted(MODELS.glob("*.toml")):
        s = Scheme.load(path)
        p = s.complete(np.exp(rng.uniform(np.log(s.lower), np.log(s.upper),
                                          (20, s.n_params))))
        solved = Scheme.load(path)
        solved._sink = None
        np.testing.assert_allclose(s.rest_occupancy(p), solved.rest_occupancy(p), atol=1e-12)
        rest = solved.rest_occupancy(p)
        np.testing.assert_allclose(np.einsum("ns,nst->nt", rest, s.Q(0.0, p)), 0, atol=1e-12)
    assert Scheme.load(MODELS / "jonas_1993.toml").rest_sink() == 0
    assert Scheme.load(MODELS / "coombs_2017.toml").rest_sink() is None


def test_default_rate_units_can_be_read_back_for_every_concentration_unit():
    from kingen.fitting.params import to_file_units

    text = TWO_STATE.replace('concentration = "M"', 'concentration = "mol/l"').replace(
        ', unit = "M^-1 s^-1"', "")
    s = Scheme.loads(text, "moll.toml")
    assert s.values[0] == pytest.approx(10.0)
    back = to_file_units(s, s.values)  # raised "not a rate unit" for 'mol/l^-1 s^-1'
    assert back["kon"] == pytest.approx(1e7)


def test_negative_reversibility_tolerance_is_a_clear_error():
    text = (MODELS / "jonas_1993.toml").read_text().replace(
        "[units]", "reversibility_tolerance = -1\n[units]", 1)
    with pytest.raises(KingenError, match="model.reversibility_tolerance = -1: must be >= 0"):
        Scheme.loads(text, "tol.toml")


def test_unit_spellings_are_exact_because_case_carries_meaning():
    from kingen.model import units

    assert units.factor("conductance", "mS") == 1e9
    assert units.factor("time", "s") == 1e3 and units.factor("concentration", "uM") == 1e-3
    for kind, unit in (("conductance", "MS"), ("concentration", "MM"), ("time", "MS")):
        with pytest.raises(KingenError, match=f"unknown {kind} unit"):
            units.factor(kind, unit, file="f.toml", field="units.x")
