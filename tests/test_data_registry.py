"""Recording readers are found through a registry keyed by file suffix (myokit's style)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kingen.errors import KingenError
from kingen.experiment import recordings as data
from kingen.experiment.recordings import registry


def test_the_built_in_readers_are_registered_by_suffix() -> None:
    assert data.reader_suffixes() == (".csv", ".nwb", ".abf")
    assert data.FORMATS == ("csv", "nwb", "abf")


def test_an_unknown_suffix_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "rec.xyz"
    path.write_text("x")
    with pytest.raises(KingenError) as exc:
        data.load_recording(path)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "unknown recording format (use .csv, .nwb or .abf)" in msg and "xyz" in msg


def test_a_registered_reader_is_used_and_given_the_channel(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(registry, "_READERS", dict(registry._READERS))
    seen = []

    def read_demo(path: Path, *, channel: int = 0) -> data.Recording:
        seen.append((path.name, channel))
        return data.Recording(None, np.arange(3.0), np.zeros(3), ["1"], source=str(path))

    data.register_reader("demo", read_demo)
    path = tmp_path / "rec.DEMO"
    path.write_text("x")
    rec = data.load_recording(path, protocol="p", channel=2)
    assert seen == [("rec.DEMO", 2)] and rec.protocol == "p"
    assert data.reader_suffixes()[-1] == ".demo"
    with pytest.raises(KingenError, match=r"use \.csv, \.nwb, \.abf or \.demo"):
        data.load_recording(tmp_path / "x.txt")



def test_written_files_get_the_permissions_open_would_give(tmp_path):
    from kingen.base.files import atomic_write

    atomic_write(tmp_path / "a.csv", lambda p: p.write_text("x"))
    (tmp_path / "b.csv").write_text("x")  # what open() gives under this umask
    mode = (tmp_path / "a.csv").stat().st_mode & 0o777
    assert mode == (tmp_path / "b.csv").stat().st_mode & 0o777
