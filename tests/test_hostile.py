"""Hostile and careless input (issue #12): every class ends in one exact line, never a
traceback, a hang or a silent acceptance."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from test_scheme import TWO_STATE

from kingen.cli import main
from kingen.errors import KingenError
from kingen.experiment.protocol import load_protocol
from kingen.experiment.protocol_file import protocol_from_dict
from kingen.experiment.recordings import load_targets, read_csv
from kingen.fitting.config import loads_config
from kingen.model import limits
from kingen.model.scheme import Scheme

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
MODEL = DATA / "jonas_1993_reversible.toml"


CYCLE = """
[model]
name = "cycle"
[states]
A = {}
B = { conductance = 10 }
C = {}
[parameters]
kab = { value = 1.0, bounds = [0.1, 10] }
kba = { value = 1.0, bounds = [0.1, 10] }
kbc = { value = 1.0, bounds = [0.1, 10] }
kcb = { value = 1.0, bounds = [0.1, 10] }
kca = { value = 1.0, bounds = [0.1, 10] }
kac = { value = 1.0, bounds = [0.1, 10] }
[transitions]
"A -> B" = "kab"
"B -> A" = "kba"
"B -> C" = "kbc"
"C -> B" = "kcb"
"C -> A" = "kca"
"A -> C" = "kac"
"""

PROTOCOL = """
[protocol]
dt = 0.05
[[sweeps]]
duration = 20
pulses = [{ start = 2, duration = 1, concentration = 10 }]
"""

CONFIG = f"""
model = "{MODEL}"
[[protocols]]
protocol = "deactivation"
recording = "{DATA / 'deactivation.csv'}"
[ga]
population = 8
generations = 1
"""


def scheme_error(text: str) -> str:
    with pytest.raises(KingenError) as err:
        Scheme.loads(text, "s.toml")
    return str(err.value)


def protocol_error(text: str) -> str:
    from kingen.model.fields import loads_toml

    with pytest.raises(KingenError) as err:
        protocol_from_dict(loads_toml(text, "p.toml"), source="p.toml")
    return str(err.value)


def config_error(text: str, **overrides) -> str:
    with pytest.raises(KingenError) as err:
        loads_config(text, path="fit.toml", base=DATA, overrides=overrides or None)
    return str(err.value)


def cli_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err.strip()


# ------------------------------------------------------------------ resource bombs

def test_population_bomb_names_the_memory_and_the_limit(monkeypatch) -> None:
    monkeypatch.setattr(limits, "free_memory", lambda: 12 * 2**30)
    msg = config_error(CONFIG.replace("population = 8", "population = 1000000000"))
    assert msg == ("fit.toml: ga.population = 1000000000: needs 4.6 TiB for a generation of "
                   "2,000,000,000 candidates; 12 GiB free (the limit is 50% of that): lower "
                   "ga.population, or pass --force (force = true in a fit configuration) to "
                   "try anyway")
    # a big machine may: the setting lifts the limit (and nothing is allocated here)
    loads_config("force = true\n" + CONFIG.replace("population = 8", "population = 1000000000"),
                 path="fit.toml", base=DATA)


def test_sampling_bomb_in_a_protocol_file() -> None:
    msg = protocol_error(PROTOCOL.replace("dt = 0.05", "dt = 1e-9"))
    assert msg == ("p.toml: sweeps[0]: needs 20,000,000,001 samples in one sweep; the limit is "
                   "10,000,000: sweep '0' lasts 20 ms sampled every 1e-09 ms: raise dt or "
                   "shorten the sweep (kingen.model.limits.MAX_SAMPLES_PER_SWEEP), or pass --force "
                   "(force = true in a fit configuration) to try anyway")


def test_duration_and_train_bombs() -> None:
    assert "needs 20,000,000,000,001 samples in one sweep" in protocol_error(
        PROTOCOL.replace("duration = 20", "duration = 1e12"))
    msg = protocol_error("[train]\nstart = 2\nduration = 1\nconcentration = 10\n"
                         "n = 100000000\nfrequency = 50\n")
    assert msg == ("p.toml: train.n = 100000000: needs 100,000,000 pulses in one sweep; the "
                   "limit is 2,000: fewer pulses (kingen.model.limits.MAX_PULSES_PER_SWEEP), or "
                   "pass --force (force = true in a fit configuration) to try anyway")


def test_step_and_courant_bombs() -> None:
    msg = config_error("step = 1e-9\n" + CONFIG)
    assert msg.startswith("fit.toml: step = 1e-09: needs ")
    assert msg.endswith("RK4 steps to simulate one candidate; the limit is 1,000,000,000: a "
                        "larger step, a courant nearer 2.5, a larger dt or shorter sweeps "
                        "(kingen.model.limits.MAX_STEPS_PER_CANDIDATE), or pass --force (force = "
                        "true in a fit configuration) to try anyway")
    assert config_error("courant = 1e-9\n" + CONFIG).startswith("fit.toml: courant = 1e-09: "
                                                                 "needs ")


def test_ten_thousand_states_refused_at_once(tmp_path: Path, capsys) -> None:
    n = 10_000
    lines = ["[model]\nname = 'chain'\n[states]"]
    lines += [f"S{i} = {{ conductance = {1 if i == n - 1 else 0} }}" for i in range(n)]
    lines.append("[parameters]\nk = 1.0\n[transitions]")
    lines += [f'"S{i} -> S{i + 1}" = "k"\n"S{i + 1} -> S{i}" = "k"' for i in range(n - 1)]
    path = tmp_path / "chain.toml"
    path.write_text("\n".join(lines))
    assert cli_error(["info", str(path)], capsys) == (
        f"kingen: error: {path}: states: needs 10,000 states; the limit is 500: split the "
        "model or lump states (kingen.model.limits.MAX_STATES), or pass --force (force = true in a "
        "fit configuration) to try anyway")


def test_cli_dt_bomb_and_force(capsys) -> None:
    assert cli_error(["simulate", str(MODEL), "--protocol", "deactivation", "--dt", "1e-9"],
                     capsys).startswith("kingen: error: --dt = 1e-09: needs 30,000,000,001 "
                                        "samples in one sweep; the limit is 10,000,000")


# ------------------------------------------------------------------ wrong types in TOML

@pytest.mark.parametrize("text, expected", [
    (PROTOCOL.replace("pulses = [{ start = 2, duration = 1, concentration = 10 }]",
                      "pulses = 5"), "p.toml: sweeps[0].pulses = 5: must be an array of tables"),
    ("sweeps = 5\n", "p.toml: sweeps = 5: must be an array of tables"),
    ("[train]\nstart = 2\nduration = 1\nconcentration = 10\nn = 0.5\nfrequency = 50\n",
     "p.toml: train.n = 0.5: must be an integer"),
    ("a = " + "[" * 40 + "]" * 40 + "\n",
     "p.toml: a[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
     "[0][0][0][0][0]: nested too deeply (more than 32 levels of arrays or tables)"),
    ("a = " + "[" * 5000 + "]" * 5000 + "\n",
     "p.toml: nested too deeply (more than 32 levels of arrays or tables)"),
])
def test_wrong_types_in_protocols(text: str, expected: str) -> None:
    assert protocol_error(text) == expected


def test_same_mistake_same_message_in_every_file_kind() -> None:
    big = "1" + "0" * 400
    too_large = "integer too large (at most 9223372036854775807 in size)"
    assert scheme_error(TWO_STATE.replace("koff = { value = 500", f"koff = {{ value = {big}")
                        ) == f"s.toml: parameters.koff.value = <integer of 1329 bits>: {too_large}"
    assert protocol_error(PROTOCOL.replace("dt = 0.05", f"dt = {big}")) == (
        f"p.toml: protocol.dt = <integer of 1329 bits>: {too_large}")
    assert config_error(CONFIG.replace("population = 8", f"population = {big}")) == (
        f"fit.toml: ga.population = <integer of 1329 bits>: {too_large}")
    # non-finite and wrong type, spelled alike
    assert scheme_error(TWO_STATE.replace("value = 500", "value = nan")) == (
        "s.toml: parameters.koff.value = nan: must be finite (not inf or nan)")
    assert protocol_error(PROTOCOL.replace("dt = 0.05", "dt = inf")) == (
        "p.toml: protocol.dt = inf: must be finite (not inf or nan)")
    assert config_error("courant = nan\n" + CONFIG) == (
        "fit.toml: courant = nan: must be finite (not inf or nan)")
    assert config_error(CONFIG + "[parameters]\nk01 = { bounds = [1, inf] }\n") == (
        "fit.toml: parameters.k01.bounds[1] = inf: must be finite (not inf or nan)")
    assert config_error(CONFIG + "[parameters]\nk01 = { bounds = [1, 1e300] }\n").startswith(
        "fit.toml: parameters.k01.bounds[1] = 1e+300: out of range: gives ")


# ------------------------------------------------------------------ overflow after conversion

def test_values_that_overflow_on_conversion() -> None:
    assert scheme_error(TWO_STATE.replace('kon = { value = 1e7, unit = "M^-1 s^-1", '
                                          'bounds = [1e6, 1e8] }',
                                          'kon = { value = 1e308, unit = "M^-1 s^-1" }')) == (
        "s.toml: parameters.kon.value = 1e+308: out of range: gives 1e+302 mM^-1 ms^-1; rate "
        "constants must lie in [1e-30, 1e+30] mM^-1 ms^-1")
    assert protocol_error(PROTOCOL.replace("dt = 0.05", "dt = 0.05\nholding = 1e308")) == (
        "p.toml: protocol.holding = 1e+308: must be <= 10000")
    assert protocol_error("[units]\ntime = 'min'\n" + PROTOCOL.replace(
        "duration = 20", "duration = 1e305")) == (
        "p.toml: sweeps[0].duration = 1e+305: overflows once converted to ms (x 60000)")


def test_current_that_overflows_in_pA(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("time_ms,current_A\n0,0\n1,1e300\n")
    with pytest.raises(KingenError) as err:
        read_csv(path)
    assert str(err.value) == (f"{path}: current_A row 3 = '1e300': overflows once converted "
                              "to pA (x 1e+12)")
    feat = tmp_path / "f.csv"
    feat.write_text("feature,value,unit\ntau_des,1e305,min\n")
    with pytest.raises(KingenError) as err:
        load_targets(feat)
    assert str(err.value) == (f"{feat}: value row 2 = '1e305': overflows once converted to ms "
                              "(x 60000)")


def test_failed_feature_is_named_not_null(monkeypatch, capsys) -> None:
    import kingen.experiment.features

    monkeypatch.setattr(kingen.experiment.features, "protocol_features",
                        lambda *a, **k: {"peak_pA": [-1.0, float("nan")],
                                         "tau_des_ms": float("nan")})
    assert main(["simulate", str(MODEL), "--protocol", "deactivation", "--json"]) == 0
    out = capsys.readouterr().out
    why = ("could not be measured from the simulated current (too flat, too short, or its "
           "fit did not converge)")
    assert "null" not in out
    import json

    assert json.loads(out) == {"peak_pA": [-1.0, "failed"],
                               "failed": {"peak_pA[1]": why, "tau_des_ms": why}}


# ------------------------------------------------------------------ recordings

def test_csv_cell_over_128_kib(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text('time_ms,current_pA\n0,0\n1,"' + "1" * 200_000 + '"\n')
    with pytest.raises(KingenError) as err:
        read_csv(path)
    assert str(err.value) == (f"{path}: row 3: malformed CSV: field larger than field limit "
                              f"({csv.field_size_limit()})")


def _nwb_variant(tmp_path: Path, name: str, edit) -> Path:
    h5py = pytest.importorskip("h5py")
    pytest.importorskip("pynwb")
    from kingen.experiment.recordings import write_nwb

    path = tmp_path / name
    write_nwb(read_csv(DATA / "deactivation.csv"), path)
    with h5py.File(path, "a") as f:
        edit(f)
    return path


def _set(key: str, index, value):
    def edit(f):
        f[f"acquisition/current_0/{key}"][index] = value
    return edit


def _attr(key: str, attr: str, value):
    def edit(f):
        f[f"acquisition/current_0/{key}"].attrs[attr] = value
    return edit


def _strings(f):
    n = f["acquisition/current_0/data"].shape[0]
    del f["acquisition/current_0/data"]
    d = f.create_dataset("acquisition/current_0/data", data=np.array([b"x"] * n))
    d.attrs["unit"] = "amperes"
    d.attrs["conversion"] = 1e-12


@pytest.mark.parametrize("name, edit, expected", [
    ("nan.nwb", _set("data", 5, np.nan),
     "acquisition/current_0 sample 5 = nan: NaN or infinite value in the current (in internal "
     "units)"),
    ("furlongs.nwb", _attr("data", "unit", "furlongs"),
     "acquisition/current_0.unit = 'furlongs': unknown current unit (use one of A, mA, uA, µA, "
     "nA, pA, fA)"),
    ("rate.nwb", _attr("starting_time", "rate", -20000.0),
     "acquisition/current_0.rate = -20000.0: sampling rate must be a finite number > 0 Hz"),
    ("strings.nwb", _strings, "acquisition/current_0.data: not numbers (stored as |S1)"),
])
def test_nwb_gets_the_csv_checks(tmp_path: Path, name, edit, expected) -> None:
    from kingen.experiment.recordings import read_nwb

    path = _nwb_variant(tmp_path, name, edit)
    with pytest.raises(KingenError) as err:
        read_nwb(path)
    assert str(err.value) == f"{path}: {expected}"


def test_reversed_nwb_is_blamed_on_the_file_not_the_config(tmp_path: Path) -> None:
    pytest.importorskip("pynwb")
    from kingen.experiment.recordings import Recording, read_nwb, write_nwb

    t = np.array([0.0, 0.05, 0.02, 0.1])
    path = tmp_path / "rev.nwb"
    write_nwb(Recording(None, t, np.zeros(4), ["a"]), path)
    with pytest.raises(KingenError) as err:
        read_nwb(path)
    assert str(err.value) == (f"{path}: acquisition/current_a sample 2 = 0.02: time does not "
                              "increase")


# ------------------------------------------------------------------ CLI outputs

def test_cli_outputs_checked_before_work(tmp_path: Path, capsys) -> None:
    base = ["simulate", str(MODEL), "--protocol", "deactivation"]
    assert cli_error(base + ["--csv", str(tmp_path)], capsys) == (
        f"kingen: error: {tmp_path}: --csv: is a folder: give a file name")
    assert cli_error(base + ["--plot", "."], capsys) == (
        "kingen: error: .: --plot: is a folder: give a file name")
    assert cli_error(base + ["--plot", str(tmp_path / "f.bmp")], capsys) == (
        f"kingen: error: {tmp_path / 'f.bmp'}: --plot = '.bmp': unknown image format (use "
        ".png, .pdf, .svg)")


def test_huge_sigma_and_concentration() -> None:
    assert config_error(CONFIG.replace("population = 8", "population = 8\nalgorithm = 'cmaes'"
                                       "\nsigma = 1e300")) == (
        "fit.toml: ga.sigma = 1e+300: must be <= 1")
    assert protocol_error(PROTOCOL.replace("concentration = 10", "concentration = 1e300")) == (
        "p.toml: sweeps[0].pulses[0].concentration = 1e+300: more than 10000 mM once "
        "converted: not a solution")
    assert protocol_error(PROTOCOL.replace(
        "pulses = [{ start = 2, duration = 1, concentration = 10 }]",
        "transients = [{ start = 2, peak = 1e300, tau_decay = 1 }]")) == (
        "p.toml: sweeps[0].transients[0].peak = 1e+300: more than 10000 mM once converted: "
        "not a solution")


# ------------------------------------------------------------------ misleading errors

def test_rates_are_named_not_blamed_on_the_rest_state() -> None:
    for value in ("1e200", "1e-200", "4e-320"):
        assert scheme_error(CYCLE.replace("kab = { value = 1.0, bounds = [0.1, 10] }",
                                          f"kab = {value}")).startswith(
            f"s.toml: parameters.kab.value = {float(value)}: out of range: gives ")
    assert scheme_error(CYCLE.replace('"A -> B" = "kab"', '"A -> B" = "1e400 * kab"')) == (
        "s.toml: transitions[0].rate = '1e400 * kab': rate factor out of range (the factors "
        "of a rate must multiply to between 1e-30 and 1e+30)")


def test_cycle_broken_by_1e90_is_caught_in_log_space(tmp_path: Path, capsys) -> None:
    text = CYCLE
    for name in ("kab", "kbc", "kca"):
        text = text.replace(f"{name} = {{ value = 1.0, bounds = [0.1, 10] }}",
                            f"{name} = {{ value = 1e25, bounds = [1e24, 1e26] }}")
    text = text.replace("kba = { value = 1.0, bounds = [0.1, 10] }",
                        "kba = { value = 1e-5, bounds = [1e-6, 1e-4] }")
    assert scheme_error(text) == (
        "s.toml: transitions: cycle A-C-B-A violates microscopic reversibility: product of "
        "rates one way 1e-05, the other way 1e+75 (ratio 1e-80, tolerance 0.02); correct a "
        "rate, or mark one rate of the cycle derived = true")
    # products that overflow a float still compare: kingen info shows the ratio, not nan
    path = tmp_path / "c.toml"
    path.write_text(text.replace("[model]", "[model]\ncheck_reversibility = false"))
    assert main(["info", str(path)]) == 0
    assert "A-C-B-A  (ratio 1e-80)" in capsys.readouterr().out


def test_tiny_rates_round_a_cycle_compare_without_dividing_by_zero() -> None:
    text = CYCLE
    for name in ("kab", "kba", "kbc", "kcb", "kca", "kac"):
        text = text.replace(f"{name} = {{ value = 1.0, bounds = [0.1, 10] }}",
                            f"{name} = {{ value = 1e-29, bounds = [1e-30, 1e-28] }}")
    assert Scheme.loads(text, "s.toml").n_states == 3


def test_load_protocol_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("sweeps = 5\n")
    with pytest.raises(KingenError, match=r"p.toml: sweeps = 5: must be an array of tables"):
        load_protocol(path)
