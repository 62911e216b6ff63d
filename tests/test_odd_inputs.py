"""Inputs that used to end in a traceback or a wrong file, each now one line (exit 2).

Found by trying what a rig or a hand produces: a date where a description goes, a control
character in a name, a recording in the wrong unit, a model file of deeply nested
parentheses, a folder given for a file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_fit_helpers import write_problem

from kingen.cli import main

ROOT = Path(__file__).resolve().parents[1]
JONAS = (ROOT / "models" / "jonas_1993.toml").read_text()


@pytest.mark.parametrize("old, new, message", [
    ("C0 = { conductance = 0 }", "C0 = { conductance = 0, description = 1993-05-01 }",
     "states.C0.description = 1993-05-01: must be a non-empty string"),
    ('name = "', 'name = "A\\u0000', "model.name = 'A\\x00"),
])
def test_a_scheme_with_odd_strings_is_one_line(tmp_path, capsys, old, new, message):
    path = tmp_path / "m.toml"
    path.write_text(JONAS.replace(old, new, 1))
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kingen: error: {path}: {message}") and "\n" not in err


def test_a_folder_given_for_a_file_says_so(tmp_path, capsys):
    assert main(["info", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"kingen: error: {tmp_path}: is a folder, not a scheme file")


def test_a_recording_too_small_to_square_is_one_line(tmp_path, capsys):
    cfg = write_problem(tmp_path)
    recording = tmp_path / "deactivation.csv"
    lines = recording.read_text().splitlines()
    head = [line for line in lines if line.startswith("#") or line.startswith("time")]
    rows = [line.split(",") for line in lines if line not in head]
    recording.write_text("\n".join(head + [f"{r[0]},{-1e-160}" for r in rows]) + "\n")
    assert main(["fit", str(cfg), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kingen: error: {recording}: protocols.deactivation = ") or \
        err.startswith(f"kingen: error: {recording}: protocols.deactivation: ")
    assert err.endswith("the recorded current is zero throughout, or too small or large "
                        "to square (beyond 1e±154 pA): check its unit")


def test_a_model_file_of_deeply_nested_parentheses_is_one_line(tmp_path, capsys):
    mod = tmp_path / "j.mod"
    assert main(["export", str(ROOT / "models" / "jonas_1993.toml"), "--to", "neuron",
                 "-o", str(mod)]) == 0
    text = mod.read_text()
    assert "(k01 * glu, k10)" in text
    mod.write_text(text.replace("(k01 * glu, k10)",
                                "(" + "(" * 400 + "k01" + ")" * 400 + " * glu, k10)"))
    capsys.readouterr()
    assert main(["import", str(mod), "-o", str(tmp_path / "j.toml")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"kingen: error: {mod}: expressions nest too deeply to read (hundreds of "
        "parentheses)")


DOSE_TWICE = ("[protocol]\nname = 'doses'\n[dose]\nstart = 2\nduration = 5\n"
              "concentrations = [1, 3, 1]\n")
ODD_LABELS = """[protocol]
name = "odd labels"
[[sweeps]]
label = "10 mM, 1 ms"
duration = 10
pulses = [{ start = 2, duration = 1, concentration = 10 }]
[[sweeps]]
label = 'the "long" one'
duration = 20
pulses = [{ start = 2, duration = 5, concentration = 10 }]
"""


def _simulated_csv_read_back(tmp_path: Path, protocol_text: str) -> tuple[list, list]:
    """``kingen simulate --csv`` of the Jonas scheme under a protocol, read back as a
    recording: (its sweep labels, its currents), checked against the simulation itself."""
    from kingen import simulate
    from kingen.experiment.recordings import load_recording

    protocol = tmp_path / "protocol.toml"
    protocol.write_text(protocol_text)
    out = tmp_path / "simulated.csv"
    model = ROOT / "models" / "jonas_1993.toml"
    assert main(["simulate", str(model), "--protocol", str(protocol), "--csv", str(out)]) == 0
    rec = load_recording(out)
    sim = simulate(model, protocol)
    for got, want in zip(rec.currents_list(), sim.currents, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12)
    return rec.sweep_labels, sim.currents


def test_simulate_csv_of_a_protocol_that_repeats_a_dose_reads_back_in_order(tmp_path):
    # the repeat used to give the CSV two current_pA_1 columns, which the reader refuses
    labels, currents = _simulated_csv_read_back(tmp_path, DOSE_TWICE)
    assert labels == ["1", "3", "1_2"]
    np.testing.assert_allclose(currents[2], currents[0], rtol=1e-12, atol=1e-12)


def test_simulate_csv_quotes_labels_with_commas_and_reads_back(tmp_path):
    labels, _ = _simulated_csv_read_back(tmp_path, ODD_LABELS)
    assert labels == ["10 mM, 1 ms", 'the "long" one']


def _late_problem(tmp_path: Path) -> tuple[Path, Path]:
    """A configuration whose recording's clock starts at 3 ms, and that recording."""
    cfg = write_problem(tmp_path)
    recording = tmp_path / "deactivation.csv"
    lines = recording.read_text().splitlines()
    head = [line for line in lines if line.startswith("#") or line.startswith("time")]
    rows = [line.split(",") for line in lines if line not in head]
    recording.write_text("\n".join(head + [",".join([repr(float(r[0]) + 3.0)] + r[1:])
                                           for r in rows]) + "\n")
    return cfg, recording


def test_a_fit_to_a_recording_that_starts_late_is_refused_before_any_output(tmp_path,
                                                                           capsys):
    cfg, recording = _late_problem(tmp_path)
    assert main(["fit", str(cfg), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kingen: error: {recording}: protocols.deactivation.recording.sweep"
                          " = '0': the recorded time starts at 3 ms, not at 0 ms")
    assert "\n" not in err and not (tmp_path / "run.h5").exists()


def test_a_run_made_before_late_starts_were_refused_still_resumes_and_profiles(
        tmp_path, monkeypatch, capsys):
    import kingen.fitting.placement

    cfg, _ = _late_problem(tmp_path)
    run = tmp_path / "run.h5"
    with monkeypatch.context() as m:  # the kingen that made it did not look
        m.setattr(kingen.fitting.placement, "late_start", lambda *args: None)
        assert main(["fit", str(cfg), "-q", "--generations", "1"]) == 0
    assert main(["resume", str(run), "-q", "--generations", "2"]) == 0
    assert "2 generations" in capsys.readouterr().out
    assert main(["profile", str(run), "-q", "--points", "5"]) == 0


def test_a_recording_that_ends_before_its_protocol_is_noted_once_per_protocol(tmp_path,
                                                                               capsys):
    # its samples after the recording's end had weight 0, without a word
    cfg = write_problem(tmp_path)
    recording = tmp_path / "deactivation.csv"
    lines = recording.read_text().splitlines()
    head = [line for line in lines if line.startswith("#") or line.startswith("time")]
    rows = [line for line in lines if line not in head]
    recording.write_text("\n".join(head + rows[:300]) + "\n")  # 0 to 14.95 ms of 30
    assert main(["fit", str(cfg), "-q", "--generations", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"kingen: note: {recording}: protocols.deactivation.recording: 1 of 1 "
                   "recorded sweeps end before the protocol's sweep (the first, '0', at "
                   "14.95 of 30 ms): the protocol's samples after a recording's end are not "
                   "fitted; check the time unit and the protocol's durations, or add mask = "
                   "[[14.95, 30]] to the protocol's entry to say so"]
    # masked, the user has said so
    cfg.write_text(cfg.read_text().replace('recording = "deactivation.csv"\n',
                                           'recording = "deactivation.csv"\n'
                                           'mask = [[14.95, 30]]\n'))
    assert main(["fit", str(cfg), "-q", "--generations", "1", "--overwrite"]) == 0
    assert capsys.readouterr().err == ""
