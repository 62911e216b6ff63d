"""Recordings that could be misread in silence: each is paired, refused or warned about
in one line, with the exact inputs a new user gave."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_fit_helpers import TRUTH_MODEL

from kingen.cli import main
from kingen.errors import KingenError
from kingen.experiment.protocol import standard_protocol
from kingen.experiment.recordings import Recording, load_recording, write_csv
from kingen.fitting.objective import Objective, ProtocolData
from kingen.model.scheme import Scheme
from kingen.solve.options import SolverOptions

SCHEME = Scheme.load(TRUTH_MODEL)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _refused(folder: Path, argv: list[str], capsys) -> str:
    """``kingen <argv>`` refused in one line with exit 2, every file as it was."""
    before = _snapshot(folder)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert _snapshot(folder) == before
    return err


# --------------------------------------------------------------------------- sweep labels

RECOVERY = standard_protocol("recovery", exchange=0.2, dt=1.0)
SHUFFLED = ["100ms", "20ms", "5ms", "2000ms", "50ms", "1000ms", "10ms", "500ms", "200ms"]


def _recovery_csv(folder: Path, labels: list[str]) -> Path:
    """A recovery recording whose columns are ``current_pA_<label>`` in the given order;
    each sweep's current is its position in the file, so the pairing can be read back."""
    n = max(s.n_samples for s in RECOVERY.sweeps)
    t = np.arange(n) * 1.0
    currents = [np.where(t > 2.0, -(k + 1.0), 0.0) for k in range(len(labels))]
    path = folder / "recovery.csv"
    write_csv(Recording("recovery", t, np.array(currents), labels), path)
    return path


def test_labelled_sweeps_in_another_order_are_paired_by_label(tmp_path):
    rec = load_recording(_recovery_csv(tmp_path, SHUFFLED))
    obj = Objective(SCHEME, [ProtocolData(RECOVERY, rec)], options=SolverOptions(backend="cpu"))
    for k, sweep in enumerate(RECOVERY.sweeps):
        data = obj.data[int(obj.sample_start[k]):int(obj.sample_start[k + 1])]
        assert data.min() == -(SHUFFLED.index(sweep.label) + 1.0), sweep.label


def _fit_config(folder: Path, protocol: str, recording: str) -> Path:
    (folder / "model.toml").write_text(TRUTH_MODEL.read_text(encoding="utf-8"),
                                       encoding="utf-8")
    cfg = folder / "fit.toml"
    cfg.write_text('model = "model.toml"\noutput = "run.h5"\nbackend = "cpu"\npolish = false\n'
                   f'[[protocols]]\nprotocol = "{protocol}"\ndt = 1.0\n'
                   f'recording = "{recording}"\n[ga]\npopulation = 4\ngenerations = 1\n',
                   encoding="utf-8")
    return cfg


def test_a_label_that_names_no_sweep_is_refused_listing_both_sets(tmp_path, capsys):
    labels = [lab if lab != "2000ms" else "2s" for lab in SHUFFLED]
    _recovery_csv(tmp_path, labels)
    cfg = _fit_config(tmp_path, "recovery", "recovery.csv")
    err = _refused(tmp_path, ["fit", str(cfg)], capsys)
    assert "recovery.csv" in err and "'2s'" in err and "names no sweep" in err
    assert ", ".join(labels) in err
    assert ", ".join(s.label for s in RECOVERY.sweeps) in err
    assert not (tmp_path / "run.h5").exists()


def test_one_label_alone_that_names_no_sweep_is_refused(tmp_path, capsys):
    rows = "".join(f"{t:g},{-1.0 if t > 2 else 0.0}\n" for t in np.arange(0.0, 50.0))
    (tmp_path / "deactivation.csv").write_text(f"time_ms,current_pA_5ms\n{rows}")
    cfg = _fit_config(tmp_path, "deactivation", "deactivation.csv")
    err = _refused(tmp_path, ["fit", str(cfg)], capsys)
    assert "'5ms'" in err and "recorded: 5ms; protocol: 1ms" in err


@pytest.mark.parametrize("labels", [[], ["0", "1", "2", "3", "4", "5", "6", "7", "8"]])
def test_numbered_sweeps_are_paired_by_position(labels):
    n = RECOVERY.sweeps[-1].n_samples
    currents = np.array([np.full(n, -(k + 1.0)) for k in range(RECOVERY.n_sweeps)])
    rec = Recording("recovery", np.arange(n) * 1.0, currents, labels)
    assert not rec.labelled
    obj = Objective(SCHEME, [ProtocolData(RECOVERY, rec)], options=SolverOptions(backend="cpu"))
    for k in range(RECOVERY.n_sweeps):
        assert obj.data[int(obj.sample_start[k])] == -(k + 1.0)


def test_a_run_file_keeps_whether_the_sweeps_were_labelled(tmp_path):
    import h5py

    from kingen.store.encode import read_recording, write_recording

    rec = load_recording(_recovery_csv(tmp_path, SHUFFLED))
    numbered = Recording("recovery", rec.time_ms, rec.current_pA, [])
    with h5py.File(tmp_path / "x.h5", "w") as f:
        for name, r in (("a", rec), ("b", numbered)):
            write_recording(f.create_group(name), name, r)
        assert read_recording(f["a"]).labelled and not read_recording(f["b"]).labelled
        del f["a"].attrs["labelled"]  # a file from an earlier kingen
        old = read_recording(f["a"])
    assert not old.labelled
    # as then: paired by label where both sets agree
    obj = Objective(SCHEME, [ProtocolData(RECOVERY, old)], options=SolverOptions(backend="cpu"))
    assert obj.data[int(obj.sample_start[1]) - 1] == -(SHUFFLED.index("5ms") + 1.0)



# --------------------------------------------------------------------------- units

DEMO = Path(__file__).resolve().parents[1] / "kingen" / "bundled" / "demo"


def _demo_csv(name: str, *, time: float = 1.0, current: float = 1.0) -> str:
    """The demo's recording with its time and current columns scaled, headers kept."""
    lines = (DEMO / name).read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines:
        if line.startswith("#") or line.startswith("time"):
            out.append(line)
            continue
        cells = line.split(",")
        out.append(",".join([repr(float(cells[0]) * time)]
                            + [repr(float(c) * current) if c else "" for c in cells[1:]]))
    return "\n".join(out) + "\n"


def test_seconds_under_a_time_ms_header_are_refused_naming_the_unit(tmp_path, capsys):
    (tmp_path / "deactivation.csv").write_text(_demo_csv("deactivation.csv", time=1e-3))
    cfg = _fit_config(tmp_path, "deactivation", "deactivation.csv")
    err = _refused(tmp_path, ["fit", str(cfg)], capsys)
    assert "deactivation.csv" in err and "no recorded sample reaches the first pulse" in err
    assert "time_s" in err and "pre-pulse" not in err
    assert not (tmp_path / "run.h5").exists()


def test_nanoamperes_under_a_current_pa_header_are_warned_of_before_and_after_the_fit(
        tmp_path):
    import io

    from kingen.runs.fit import fit

    (tmp_path / "deactivation.csv").write_text(_demo_csv("deactivation.csv", current=1e-3))
    cfg = _fit_config(tmp_path, "deactivation", "deactivation.csv")
    out = io.StringIO()
    result = fit(cfg, progress=False, stream=out)
    assert result.amplitudes["deactivation"] < 1.0
    lines = [line for line in out.getvalue().splitlines() if "nA under a current_pA" in line]
    assert len(lines) == 2, out.getvalue()
    data, fitted = lines
    assert "deactivation.csv" in data and "largest recorded current" in data
    assert f"fitted amplitude is {result.amplitudes['deactivation']:.3g} channels" in fitted


def test_a_plausible_current_gives_no_warning_and_a_huge_one_names_the_unit():
    from kingen import demo_config, load_config

    cfg = load_config(demo_config())
    obj = Objective(cfg.scheme, cfg.protocols, options=SolverOptions(backend="cpu"))
    assert obj.warnings == []
    assert obj.amplitude_warnings({"deactivation": 120.0, "recovery": 1.5}) == []
    (huge,) = obj.amplitude_warnings({"dose_response": 3e6})
    assert "dose_response" in huge and "pA under a current_nA header" in huge


# --------------------------------------------------------------------------- API overrides

def test_an_unknown_override_is_refused_naming_the_key_and_the_close_match():
    from kingen import demo_config, load_config

    with pytest.raises(KingenError) as info:
        load_config(demo_config(), overrides={"generatons": 1})
    text = str(info.value)
    assert len(text.splitlines()) == 1
    assert "'generatons'" in text and "did you mean 'generations'" in text
    assert load_config(demo_config(), overrides={"generations": 1}).ga.generations == 1


# --------------------------------------------------------------------------- shipped schemes

@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working folder outside the checkout, holding no scheme file."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_scheme_load_takes_the_readme_path_and_a_name_from_outside_the_checkout(elsewhere):
    from kingen.model.shipped import models_dir

    for spec in ("models/jonas_1993.toml", "jonas_1993", "jonas_1993.toml"):
        scheme = Scheme.load(spec)
        assert scheme.param_names[:2] == ["k01", "k10"]
        assert Path(scheme.path) == models_dir() / "jonas_1993.toml"
    with pytest.raises(KingenError, match="scheme file not found"):
        Scheme.load("my_lab/jonas_1993.toml")  # a folder of one's own is no shipped name


@pytest.mark.parametrize("argv", [["info", "jonas_1993"],
                                  ["simulate", "jonas_1993", "--protocol", "deactivation",
                                   "--json"],
                                  ["simulate", "models/jonas_1993.toml", "--protocol",
                                   "deactivation", "--json"]])
def test_commands_take_a_shipped_name_from_outside_the_checkout(elsewhere, argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "C0" in out if argv[0] == "info" else "peak_pA" in out


@pytest.mark.parametrize("model", ["jonas_1993", "models/jonas_1993.toml"])
def test_a_fit_configuration_takes_a_shipped_name(elsewhere, model):
    from kingen import load_config

    t = np.arange(0.0, 20.0, 0.5)
    write_csv(Recording("deactivation", t, np.where(t > 2, -50.0, 0.0)[None, :], []),
              elsewhere / "deactivation.csv")
    (elsewhere / "fit.toml").write_text(
        f'model = "{model}"\n[[protocols]]\nprotocol = "deactivation"\n'
        'recording = "deactivation.csv"\n[parameters]\nfree = ["k2o"]\n', encoding="utf-8")
    cfg = load_config("fit.toml")
    assert cfg.scheme.param_names[:2] == ["k01", "k10"] and cfg.pmap.gene_names == ["k2o"]


# --------------------------------------------------------------------------- schemes

def test_an_absorbing_state_is_named_as_such(tmp_path, capsys):
    from test_fit_helpers import FOUR_STATE

    text = FOUR_STATE.replace('"D -> O" = "r"\n', "").replace(  # D: no way out
        'r = { value = 0.01, unit = "ms^-1", bounds = [0.001, 0.1] }\n', "")
    assert text != FOUR_STATE
    (tmp_path / "absorbing.toml").write_text(text, encoding="utf-8")
    err = _refused(tmp_path, ["info", str(tmp_path / "absorbing.toml")], capsys)
    assert "states.D" in err and "state D is absorbing" in err
    assert "initial occupancies" not in err
    Scheme.loads(FOUR_STATE)  # with its way out, the scheme loads


# --------------------------------------------------------------------------- features

def test_the_ratio_at_the_pulses_end_is_reported_where_no_steady_state_is(capsys):
    import json

    assert main(["simulate", "jonas_1993", "--protocol", "desensitization", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert "ss_to_peak" not in got and "no steady state" in got["failed"]["ss_to_peak"]
    assert got["end_to_peak"] == pytest.approx(0.0314, abs=5e-4)  # Jonas 1993, 100 ms
