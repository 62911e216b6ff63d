"""Inputs that used to end in a traceback or a wrong file, each now one line (exit 2).

Found by trying what a rig or a hand produces: a date where a description goes, a control
character in a name, a recording in the wrong unit, a model file of deeply nested
parentheses, a folder given for a file.
"""

from __future__ import annotations

from pathlib import Path

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
