"""Bad fit configurations fail before any compute with a one-line error naming the field."""

from __future__ import annotations

import pytest
from test_fit_helpers import write_problem

import kingen.solve.batch as batch
from kingen.cli import main
from kingen.errors import KingenError
from kingen.fitting.config import load_config
from kingen.runs.fit import fit


@pytest.fixture
def no_solver(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the solver ran before the configuration was validated")

    monkeypatch.setattr(batch.Simulator, "run", refuse)


def test_a_good_configuration_loads_with_defaults(tmp_path):
    cfg = load_config(write_problem(tmp_path))
    assert cfg.pmap.gene_names == ["k2o", "ko2"]
    assert cfg.ga.lambda_ == 8 and cfg.ga.tournament == 3 and cfg.stop.patience == 20
    assert cfg.output == str(tmp_path / "run.h5")
    assert cfg.protocols[0].protocol.sweeps[0].dt == pytest.approx(0.05)  # from the recording
    assert cfg.settings["ga"]["generations"] == 3
    assert cfg.protocols[0].baseline == "none" and cfg.settings["protocols"][0][
        "baseline"] == "none"


def test_the_output_is_beside_the_configuration_and_minus_o_is_from_here(tmp_path,
                                                                         monkeypatch):
    cfg = write_problem(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    overrides = {"output": None, "backend": None}  # what `kingen fit CONFIG` passes
    assert load_config(cfg, overrides=overrides).output == str(tmp_path / "run.h5")
    assert load_config(cfg, overrides={**overrides, "output": "mine.h5"}).output == "mine.h5"


@pytest.mark.parametrize("line, baseline", [('baseline = "pre-pulse"', "pre-pulse"),
                                            ("subtract_baseline = true", "per-sweep"),
                                            ("subtract_baseline = false", "none")])
def test_baseline_setting_and_its_older_form(tmp_path, line, baseline):
    path = write_problem(tmp_path)
    text = path.read_text().replace('recording = "deactivation.csv"',
                                    f'recording = "deactivation.csv"\n{line}')
    path.write_text(text)
    assert load_config(path).protocols[0].baseline == baseline


BAD = [
    # (text to replace, replacement, expected field, expected message)
    ('free = ["k2o", "ko2"]', 'free = ["k2o", "kx"]', "parameters.free = 'kx'",
     "unknown parameter"),
    ("k2o = { bounds = [1, 20] }", "k2o = { bounds = [20, 1] }", "parameters.k2o.bounds",
     "lower bound must be below"),
    ("k2o = { bounds = [1, 20] }", "k2o = { bounds = [1, 20], colour = 1 }",
     "parameters.k2o.colour", "unknown field"),
    ("population = 8", "population = 8\nmutation = 0.1", "ga.mutation", "unknown field"),
    ("seed = 3", "seed = 3\nspeed = 3", "speed", "unknown field"),
    ("population = 8", 'population = "many"', "ga.population", "must be an integer"),
    ("population = 8", "population = 8\ncxpb = 0.9\nmutpb = 0.3", "ga.mutpb",
     "cxpb + mutpb"),
    ('recording = "deactivation.csv"', 'recording = "recovery.csv"',
     "protocols[0].recording", "not the protocol it is given for"),
    ('recording = "deactivation.csv"', 'recording = "missing.csv"',
     "protocols[0].recording = 'missing.csv'", "file not found"),
    ('recording = "deactivation.csv"', 'recording = []', "protocols[0].recording",
     "non-empty list"),
    ('protocol = "deactivation"', 'protocol = "deactivatoin"', "protocols[0].protocol",
     "not a standard protocol"),
    ('recording = "deactivation.csv"', 'weight = 1', "protocols[0].recording", "no data"),
    ('backend = "cpu"', 'backend = "gpu"', "backend = 'gpu'", "must be one of"),
    ('model = "model.toml"', 'model = "nope.toml"', "model = 'nope.toml'", "not found"),
    ('recording = "deactivation.csv"', 'recording = "deactivation.csv"\nbaseline = "mean"',
     "protocols[0].baseline = 'mean'", "must be one of none, pre-pulse, per-sweep"),
    ('recording = "deactivation.csv"',
     'recording = "deactivation.csv"\nbaseline = "none"\nsubtract_baseline = true',
     "protocols[0].subtract_baseline = True",
     "give baseline or subtract_baseline (its older form), not both"),
]


@pytest.mark.parametrize("old, new, where, message", BAD)
def test_bad_configuration_is_one_line_before_any_compute(tmp_path, no_solver, old, new,
                                                          where, message):
    path = write_problem(tmp_path)
    (tmp_path / "recovery.csv").write_text(
        (tmp_path / "deactivation.csv").read_text().replace("protocol: deactivation",
                                                            "protocol: recovery"))
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(KingenError) as info:
        fit(path, progress=False)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(path)), msg
    assert where in msg and message in msg, msg
    assert not (tmp_path / "run.h5").exists()


def test_empty_recording_is_an_error(tmp_path, no_solver):
    path = write_problem(tmp_path)
    (tmp_path / "deactivation.csv").write_text("# protocol: deactivation\ntime_ms,current_pA\n")
    with pytest.raises(KingenError) as info:
        fit(path, progress=False)
    assert "deactivation.csv" in str(info.value) and "\n" not in str(info.value)


def test_cli_prints_one_line_and_exits_2(tmp_path, capsys, no_solver):
    path = write_problem(tmp_path)
    path.write_text(path.read_text().replace('free = ["k2o", "ko2"]', 'free = ["k99"]'))
    assert main(["fit", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kingen: error: ") and "k99" in err and "\n" not in err
    assert main(["fit"]) == 2
