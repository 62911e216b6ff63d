"""Hostile recordings (CSV and NWB): each is refused when ``kingen fit`` loads it, in one
exact line naming the file, the field and the value, with exit status 2, no run file, and
every input byte-identical afterwards."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from kingen.cli import main

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
MODEL = DATA / "jonas_1993_reversible.toml"


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


def fit_error(recording: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``kingen fit`` of a configuration fitting ``recording``: the one line it refuses it
    with (checked: status 2, nothing written, every input as it was)."""
    folder = recording.parent
    config = folder / "fit.toml"
    config.write_text(f'model = "{MODEL}"\noutput = "run.h5"\n[[protocols]]\n'
                      f'protocol = "deactivation"\nrecording = "{recording.name}"\n'
                      "[ga]\npopulation = 8\ngenerations = 1\n")
    before = digests(folder)
    capsys.readouterr()
    assert main(["fit", str(config), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "Warning" not in err, err
    assert digests(folder) == before  # no run file, inputs untouched
    return err.strip().removeprefix("kingen: error: ")


def two_sweeps_csv(path: Path, header: str) -> Path:
    path.write_bytes(("time_ms," + header + "\n0,0,0\n0.1,-1,-2\n0.2,-3,-4\n").encode())
    return path


# ------------------------------------------------------------------ CSV labels

@pytest.mark.parametrize("char", ["\t", "\n", "\x07", "\x1b"])
def test_csv_sweep_label_with_a_control_character(tmp_path: Path, capsys, char: str) -> None:
    # protocol labels were refused so; a recorded column label was taken (and a label with
    # a line break wrote CSV files that did not read back)
    path = two_sweeps_csv(tmp_path / "r.csv", f'current_pA_x,"current_pA_a{char}b"')
    shown = repr(char)[1:-1]
    assert fit_error(path, capsys) == (
        f"{path}: header = 'current_pA_a{shown}b': sweep label holds a control character "
        f"('{shown}'): write labels without tabs or line breaks")


# ------------------------------------------------------------------ NWB labels

def nwb_with(tmp_path: Path, edit) -> Path:
    """An NWB file kingen wrote (sweeps 'a' and 'b'), then edited with h5py."""
    h5py = pytest.importorskip("h5py")
    pytest.importorskip("pynwb")
    from kingen.experiment.recordings import Recording, write_nwb

    path = tmp_path / "r.nwb"
    t = np.arange(400) * 0.05
    current = -100 * np.exp(-t / 3) * (1 - np.exp(-t / 0.2))
    write_nwb(Recording(None, t, np.vstack([current, current]), ["a", "b"]), path)
    with h5py.File(path, "a") as f:
        edit(f["acquisition/current_a"].attrs, h5py)
    return path


def comment(text: str):
    return lambda attrs, h5py: attrs.__setitem__("comments", json.dumps(
        {"kingen_sweep_label": text}))


def comment_bytes(raw: bytes, fixed: bool):
    """A comment whose bytes are not UTF-8, stored as variable-length text (h5py hands it
    over as a lone surrogate) or as fixed-length text (hdmf fails to decode it)."""
    def edit(attrs, h5py):
        del attrs["comments"]
        if not fixed:
            attrs.create("comments", data=np.array(raw, dtype=h5py.string_dtype("utf-8")))
            return
        tid = h5py.h5t.C_S1.copy()
        tid.set_size(len(raw))
        tid.set_cset(h5py.h5t.CSET_UTF8)
        attr = h5py.h5a.create(attrs._id, b"comments", tid, h5py.h5s.create(h5py.h5s.SCALAR))
        attr.write(np.array(raw, dtype=f"S{len(raw)}"), mtype=tid)
    return edit


@pytest.mark.parametrize("edit, expected", [
    (comment("a\tb"), "acquisition/current_a.comments = 'a\\tb': sweep label holds a "
     "control character ('\\t'): write labels without tabs or line breaks"),
    (comment("b"), "acquisition/current_a.comments = 'b': sweep label repeats that of "
     "acquisition/current_b: every sweep needs its own label"),
    (comment_bytes(b'{"kingen_sweep_label": "\xff"}', fixed=False),
     "acquisition/current_a.comments = '\\udcff': sweep label is not valid UTF-8 text"),
    (comment_bytes(b'{"kingen_sweep_label": "\xff"}', fixed=True),
     "acquisition/current_a.comments: not valid UTF-8 text (byte 0xff at position 24)"),
], ids=["control", "repeat", "utf8_variable", "utf8_fixed"])
def test_nwb_sweep_label_comments(tmp_path: Path, capsys, edit, expected: str) -> None:
    path = nwb_with(tmp_path, edit)
    assert fit_error(path, capsys) == f"{path}: {expected}"



# ------------------------------------------------------------------ implausible currents

BEYOND = ("a current beyond any voltage-clamp recording (more than 1e+09 pA, 1 mA, in "
          "magnitude): check its unit")


@pytest.mark.parametrize("column, cell", [
    ("current_pA", "-1e300"),  # squared, it overflowed: NumPy's warning, then a message
    ("current_pA", "2e9"),
    ("current_nA", "-5e6"),  # 5e9 pA
], ids=["1e300", "2e9_pA", "5e6_nA"])
def test_a_current_beyond_any_recording_is_refused_at_load(tmp_path: Path, capsys,
                                                           column: str, cell: str) -> None:
    path = tmp_path / "r.csv"
    rows = [f"{0.05 * k:.2f},{-100.0 if k else 0.0}" for k in range(400)]
    rows[7] = f"0.35,{cell}"
    path.write_text(f"time_ms,{column}\n" + "\n".join(rows) + "\n")
    assert fit_error(path, capsys) == f"{path}: {column} row 9 = '{cell}': {BEYOND}"


def test_an_nwb_current_beyond_any_recording(tmp_path: Path, capsys) -> None:
    path = nwb_with(tmp_path, lambda attrs, h5py: None)
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "a") as f:
        f["acquisition/current_b/data"][5] = -1e300
    assert fit_error(path, capsys) == (f"{path}: acquisition/current_b sample 5 = -1e+300: "
                                       f"{BEYOND}")


def test_a_large_current_of_a_whole_oocyte_still_loads(tmp_path: Path) -> None:
    """Two-electrode clamp of an oocyte reaches tens of microamperes: below the bound."""
    from kingen.experiment.recordings import read_csv

    path = tmp_path / "r.csv"
    path.write_text("time_ms,current_uA\n0,0\n0.05,-40\n0.1,-20\n")
    assert read_csv(path).current_pA.min() == -4e7
