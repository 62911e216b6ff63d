"""Hostile .mod and .mmt files given to ``kingen import``: each ends in one exact line with
exit status 2, no output written and the input byte-identical, or (where nothing the scheme
reads is wrong) in an import that says what it skipped. Never a traceback, never a hang."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kingen.cli import main

DATA = Path(__file__).parent / "data"
JONAS = (DATA / "jonas_1993.mod").read_text()


def line_of(text: str, needle: str) -> int:
    return next(k for k, line in enumerate(text.splitlines(), 1) if needle in line)


def import_error(tmp_path: Path, name: str, text: str, capsys: pytest.CaptureFixture[str]
                 ) -> str:
    """``kingen import`` of ``text``: the one line it refuses it with (checked: status 2,
    no output, the input unchanged); the folder is left out of the line."""
    path = tmp_path / name
    path.write_text(text)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    out = tmp_path / "out.toml"
    capsys.readouterr()
    assert main(["import", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    return err.strip().removeprefix("kingen: error: ").replace(f"{tmp_path}/", "")


# ------------------------------------------------------------------ a state declared twice

@pytest.mark.parametrize("states, line, also", [
    ("STATE { C0 C1 C2 O C3 C4 C5 C1 }", 0, ""),
    ("STATE { C0 C1 C2 O C3 C4 C5 }\nSTATE { O }", 1, " (also line {first})"),
], ids=["one_block", "two_blocks"])
def test_a_state_declared_twice(tmp_path: Path, capsys, states: str, line: int,
                                also: str) -> None:
    # the second declaration replaced the first: 'C1' was one state where the file said two
    text = JONAS.replace("STATE { C0 C1 C2 O C3 C4 C5 }", states)
    first = line_of(text, "STATE {")
    name = "C1" if line == 0 else "O"
    assert import_error(tmp_path, "x.mod", text, capsys) == (
        f"x.mod: line {first + line}: state '{name}' is declared twice"
        f"{also.format(first=first)}")
