"""Recordings and targets: CSV, NWB and ABF readers, writers and their errors."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from kingen.errors import KingenError
from kingen.experiment import recordings as D

FIXTURES = Path(__file__).parent / "fixtures" / "data"
ABF_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "abf"


def abf_file(name: str) -> Path:
    path = ABF_DIR / name
    if not path.is_file():
        pytest.skip(f"real ABF recordings not found at {ABF_DIR} (the shared/ folder beside "
                    "the repository is absent)")
    return path


def one_line(exc: pytest.ExceptionInfo[KingenError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def example_recording(synthetic: bool = True) -> D.Recording:
    """Two sweeps of different lengths on one grid, with agonist and holding potential."""
    t = np.arange(0, 12.0, 0.02)
    y1 = np.where(t >= 2, -120.0 * np.exp(-(t - 2) / 2.5), 0.0)
    c1 = np.where((t >= 2) & (t < 3), 10.0, 0.0)
    n2 = 400
    return D.Recording("deactivation", [t, t[:n2]], [y1, 0.5 * y1[:n2]], ["1ms", "b"],
                       concentration_mM=[c1, c1[:n2]], holding_mV=-60.0,
                       meta={"synthetic": synthetic})


def write(tmp_path: Path, text: str, name: str = "x.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- CSV traces

def test_csv_units_labels_stimulus_and_comments() -> None:
    rec = D.load_recording(FIXTURES / "trace_units.csv")
    assert rec.sweep_labels == ["a", "b"]
    assert rec.protocol == "deactivation" and rec.holding_mV == -60.0
    assert rec.meta["synthetic"] == "hand-written fixture for tests/test_data.py"
    np.testing.assert_allclose(rec.sweep_time(0), [0.0, 0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(rec.sweep_current(0), [0, -50, -200, -150, -100])
    assert rec.sweep_current(1).size == 4  # trailing empty cell: a shorter sweep
    np.testing.assert_allclose(rec.sweep_concentration(1), [0, 10, 10, 0])


def test_csv_single_sweep_as_written_by_simulate(tmp_path: Path) -> None:
    path = write(tmp_path, "time_ms,current_pA\n0,0\n0.5,-3\n1.0,-2\n")
    rec = D.load_recording(path, protocol="deactivation")
    assert rec.protocol == "deactivation" and rec.n_sweeps == 1
    assert rec.current_pA.shape == (1, 3) and rec.time_ms.shape == (3,)


def test_csv_round_trip_is_exact(tmp_path: Path) -> None:
    rec = example_recording()
    D.write_csv(rec, tmp_path / "r.csv")
    back = D.load_recording(tmp_path / "r.csv")
    assert back.sweep_labels == rec.sweep_labels and back.protocol == rec.protocol
    assert back.holding_mV == -60.0 and back.meta["synthetic"] is True
    for i in range(2):
        np.testing.assert_array_equal(back.sweep_time(i), rec.sweep_time(i))
        np.testing.assert_array_equal(back.sweep_current(i), rec.sweep_current(i))
        np.testing.assert_array_equal(back.sweep_concentration(i), rec.sweep_concentration(i))
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind


def test_csv_labels_with_commas_and_quotes_are_quoted_and_read_back(tmp_path: Path) -> None:
    t = np.arange(0, 1.0, 0.1)
    labels = ["a,b", 'q"x', "x y", "10mM"]
    currents = np.vstack([-(k + 1.0) * t for k in range(4)])
    rec = D.Recording("p", t, currents, labels, concentration_mM=currents * 0 + 1.0)
    D.write_csv(rec, tmp_path / "r.csv")
    header = (tmp_path / "r.csv").read_text(encoding="utf-8").splitlines()[1]
    assert header.startswith('time_ms,"current_pA_a,b","current_pA_q""x",current_pA_x y,')
    back = D.load_recording(tmp_path / "r.csv")
    assert back.sweep_labels == labels
    np.testing.assert_array_equal(back.current_pA, currents)
    np.testing.assert_array_equal(back.concentration_mM, currents * 0 + 1.0)


@pytest.mark.parametrize("labels, column", [
    (["1", "3", "1"], "current_pA_1"),
    (["", "0"], "current_pA_0"),  # a blank label reads back as sweep '0'
])
def test_csv_write_refuses_labels_that_read_back_as_one_sweep(tmp_path: Path,
                                                              labels: list[str],
                                                              column: str) -> None:
    from kingen.experiment.protocol import Protocol, Sweep

    t = np.arange(5) * 0.1
    rec = D.Recording("p", t, np.ones((len(labels), 5)), labels)
    # a protocol built in Python is not checked as a protocol file is
    protocol = Protocol("p", "custom", tuple(Sweep(x, 0.4, 0.1) for x in labels))
    for write_it in (lambda p: D.write_csv(rec, p),
                     lambda p: D.write_current_csv(p, protocol, [t] * len(labels),
                                                   rec.currents_list())):
        with pytest.raises(KingenError) as exc:
            write_it(tmp_path / "r.csv")
        assert one_line(exc).startswith(f"{tmp_path / 'r.csv'}: sweep label = ")
        assert f"two sweeps would share the CSV column {column!r}" in one_line(exc)
        assert not list(tmp_path.iterdir())


def test_csv_comments_with_line_breaks_stay_comments(tmp_path: Path) -> None:
    rec = example_recording()
    rec.protocol = "deact\nvariant"
    rec.meta["comments"] = ["line one\u2028line two"]
    D.write_csv(rec, tmp_path / "r.csv")
    back = D.load_recording(tmp_path / "r.csv")
    assert back.protocol == "deact variant" and back.sweep_labels == rec.sweep_labels
    assert "line one line two" in back.meta["comments"]


@pytest.mark.parametrize("text, separator", [
    ("time_ms;current_pA\n0;0\n0,02;-1,5\n", "';' (as Excel writes CSV where the decimal "
     "mark is a comma)"),
    ("time_ms;current_pA\n0;0\n0.02;-1.5\n", "';'"),
    ("time_ms\tcurrent_pA\n0\t0\n0.02\t-1.5\n", "tabs"),
])
def test_csv_with_another_separator_says_so(tmp_path: Path, text: str,
                                            separator: str) -> None:
    path = write(tmp_path, "# from a European Excel\n" + text)
    with pytest.raises(KingenError) as exc:
        D.load_recording(path)
    first = text.splitlines()[0]
    assert one_line(exc).startswith(f"{path}: header = {first!r}: the columns seem to be "
                                    f"separated by {separator}")
    assert "kingen reads ',' separated columns with '.' as the decimal mark" in \
        one_line(exc)
    targets = write(tmp_path, "feature;value;unit\npeak;-450;pA\n", "t.csv")
    with pytest.raises(KingenError, match="seem to be separated by ';'"):
        D.load_targets(targets)


def test_csv_write_refuses_different_grids_and_leaves_no_file(tmp_path: Path) -> None:
    rec = D.Recording(None, [np.arange(3.0), np.arange(3.0) * 2], [np.zeros(3), np.ones(3)],
                      ["a", "b"])
    with pytest.raises(KingenError, match="sampling grids"):
        D.write_csv(rec, tmp_path / "r.csv")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("text,where", [
    ("current_pA,time_ms\n0,0\n", "first column must be the time"),
    ("time,current_pA\n0,0\n", "unit missing"),
    ("time_ms,current_furlongs\n0,0\n", "current_furlongs"),
    ("time_ms,current_pA_a,current_pA_b\n0,1,2\n1,2\n", "row 3"),
    ("time_ms,current_pA_a\n0,1\n1,nan\n", "current_pA_a row 3"),
    ("time_ms,current_pA_a\n0,1\n1,abc\n", "not a number"),
    ("time_ms,current_pA\n", "no data rows"),
    ("time_ms,current_pA_a,current_pA_b\n0,1,\n1,2,\n", "current_pA_b"),
    ("time_ms,current_pA\n0,1\n2,1\n1,1\n", "time_ms row 4"),
    ("time_ms,current_pA\n0,1\n0,1\n", "does not increase"),
    ("time_ms,current_pA_a\n0,\n1,2\n", "empty cell"),
    ("time_ms,voltage_mV\n0,1\n", "unknown column"),
    ("# only a comment\n", "no header"),
])
def test_csv_errors_are_one_line_naming_file_field_value(tmp_path: Path, text: str,
                                                           where: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(KingenError) as exc:
        D.load_recording(path)
    message = one_line(exc)
    assert str(path) in message and where in message


def test_csv_empty_sweep_and_nan_name_column_and_row(tmp_path: Path) -> None:
    with pytest.raises(KingenError, match=r"current_pA_b.*empty sweep"):
        D.load_recording(write(tmp_path, "time_ms,current_pA_a,current_pA_b\n0,1,\n1,2,\n"))
    with pytest.raises(KingenError, match=r"current_pA_a row 3 = 'NaN': NaN"):
        D.load_recording(write(tmp_path, "time_ms,current_pA_a\n0,1\n1,NaN\n"))


def test_missing_file_and_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(KingenError, match="not found") as exc:
        D.load_recording(tmp_path / "absent.csv")
    assert "absent.csv" in one_line(exc)
    with pytest.raises(KingenError, match=r"format = 'txt'"):
        D.load_recording(write(tmp_path, "x", "r.txt"))


# --------------------------------------------------------------------------- targets

def test_feature_targets_units_weights_sd() -> None:
    targets = D.load_targets(FIXTURES / "targets.csv")
    f = targets.features
    assert f["peak_pA"].value == pytest.approx(-450.0) and f["peak_pA"].sd == pytest.approx(40)
    assert f["tau_des_ms"].value == pytest.approx(9.0) and f["tau_des_ms"].weight == 2.0
    assert f["tau_des_ms"].sd == pytest.approx(1.0)
    assert f["tau_deact_ms"].value == 2.5 and f["tau_deact_ms"].sd is None
    assert f["ec50_peak_mM"].value == pytest.approx(0.45)
    assert f["ss_to_peak"].value == 0.012 and f["hill_peak"].value == 1.3
    assert f["time_to_peak_ms"].weight == 0.5


def test_tables_and_merge() -> None:
    targets = D.load_targets([FIXTURES / "targets.csv", FIXTURES / "dose_response.csv",
                              FIXTURES / "recovery.csv"])
    np.testing.assert_allclose(targets.dose_response.concentration_mM, [0.01, 0.1, 1, 10])
    np.testing.assert_allclose(targets.dose_response.ss_pA, [-0.9, -3.2, -5.0, -5.5])
    np.testing.assert_allclose(targets.recovery.interval_ms, [5, 20, 100, 1000])
    values = targets.values()
    assert values["recovery"][1] == [20.0, 0.31] and values["tau_des_ms"] == pytest.approx(9)
    assert len(values["dose_response"]) == 4 and len(targets.sources) == 3


@pytest.mark.parametrize("text,where", [
    ("feature,value,unit\ntau_des,5,\n", "unit missing"),
    ("feature,value,unit\ntau_des,5,furlong\n", "furlong"),
    ("feature,value,unit\ntau_des_ms,5,s\n", "name says ms"),
    ("feature,value,unit\nwobble,5,ms\n", "unknown feature"),
    ("feature,value,unit\nss_to_peak,0.1,ms\n", "dimensionless"),
    ("feature,value,unit\npeak,NaN,pA\n", "value row 2"),
    ("feature,value,unit,weight\npeak,-1,pA,-2\n", "weight"),
    ("feature,value,unit\npeak,-1,pA\npeak,-2,pA\n", "twice"),
    ("concentration_mM,peak_pA\n0,-1\n", "> 0"),
    ("concentration,peak_pA\n1,-1\n", "unit missing"),
    ("concentration_mM,ss_pA\n1,-1\n", "missing column peak"),
    ("interval_ms,ratio\n5,0.1\n10,\n", "interval_ms"),
    ("interval_ms,ratio\n5,0.1\n10,\n", "ratio row 3"),
    ("what,value\n1,2\n", "first column must be"),
])
def test_target_errors(tmp_path: Path, text: str, where: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(KingenError) as exc:
        D.load_targets(path)
    message = one_line(exc)
    assert str(path) in message and where in message


# --------------------------------------------------------------------------- NWB

def test_nwb_round_trip_csv_nwb_csv(tmp_path: Path) -> None:
    pytest.importorskip("pynwb")
    rec = example_recording()
    D.write_csv(rec, tmp_path / "a.csv")
    from_csv = D.load_recording(tmp_path / "a.csv")
    D.write_nwb(from_csv, tmp_path / "a.nwb")
    from_nwb = D.load_recording(tmp_path / "a.nwb")
    assert from_nwb.sweep_labels == ["1ms", "b"] and from_nwb.protocol == "deactivation"
    assert from_nwb.holding_mV == pytest.approx(-60.0)
    assert from_nwb.meta["synthetic"] is True
    assert "SYNTHETIC" in from_nwb.meta["session_description"]
    for i in range(2):
        np.testing.assert_allclose(from_nwb.sweep_time(i), rec.sweep_time(i), atol=1e-9)
        np.testing.assert_allclose(from_nwb.sweep_current(i), rec.sweep_current(i),
                                   rtol=1e-12)
        np.testing.assert_allclose(from_nwb.sweep_concentration(i),
                                   rec.sweep_concentration(i), rtol=1e-12)
    D.write_csv(from_nwb, tmp_path / "b.csv")
    again = D.load_recording(tmp_path / "b.csv")
    np.testing.assert_allclose(again.sweep_current(1), rec.sweep_current(1), rtol=1e-12)


def test_nwb_from_another_writer_matched_by_order(tmp_path: Path) -> None:
    """A file not written by kingen: nA data with conversion, no table, uM stimuli."""
    pynwb = pytest.importorskip("pynwb")
    import datetime

    from pynwb.icephys import VoltageClampSeries

    nwb = pynwb.NWBFile(session_description="lab rig", identifier="x",
                        session_start_time=datetime.datetime.now(datetime.timezone.utc))
    dev = nwb.create_device(name="amp")
    el = nwb.create_icephys_electrode(name="e", description="pipette", device=dev)
    for k in range(2):
        nwb.add_acquisition(VoltageClampSeries(
            name=f"sweep{k}", data=np.array([0.0, -0.1, -0.2]) * (k + 1), electrode=el,
            gain=1.0, conversion=1e-9, rate=10000.0, starting_time=5.0 * k,
            sweep_number=np.uint32(k)))
        nwb.add_stimulus(pynwb.TimeSeries(name=f"glu{k}", data=np.array([0.0, 100.0, 100.0]),
                                          unit="uM", rate=10000.0, starting_time=5.0 * k))
    with pynwb.NWBHDF5IO(str(tmp_path / "o.nwb"), "w") as io:
        io.write(nwb)
    rec = D.load_recording(tmp_path / "o.nwb")
    assert rec.sweep_labels == ["sweep0", "sweep1"]
    np.testing.assert_allclose(rec.current_pA, [[0, -100, -200], [0, -200, -400]])
    np.testing.assert_allclose(rec.time_ms, [0, 0.1, 0.2])
    np.testing.assert_allclose(rec.concentration_mM[1], [0, 0.1, 0.1])
    assert rec.holding_mV is None and rec.meta["sweep_start_s"] == [0.0, 5.0]


def test_nwb_without_voltage_clamp_series(tmp_path: Path) -> None:
    pynwb = pytest.importorskip("pynwb")
    import datetime

    nwb = pynwb.NWBFile(session_description="no vc", identifier="x",
                        session_start_time=datetime.datetime.now(datetime.timezone.utc))
    nwb.add_acquisition(pynwb.TimeSeries(name="other", data=np.zeros(3), unit="V", rate=1.0))
    with pynwb.NWBHDF5IO(str(tmp_path / "n.nwb"), "w") as io:
        io.write(nwb)
    with pytest.raises(KingenError, match="no VoltageClampSeries") as exc:
        D.load_recording(tmp_path / "n.nwb")
    assert "n.nwb" in one_line(exc)


def test_nwb_unreadable(tmp_path: Path) -> None:
    pytest.importorskip("pynwb")
    with pytest.raises(KingenError, match="cannot read NWB") as exc:
        D.load_recording(write(tmp_path, "not hdf5", "bad.nwb"))
    one_line(exc)


def test_nwb_write_is_atomic_on_failure(tmp_path: Path, monkeypatch) -> None:
    pynwb = pytest.importorskip("pynwb")

    def fail(self, *args, **kwargs):  # a failure half way through writing the file
        raise OSError("disk full")

    monkeypatch.setattr(pynwb.NWBHDF5IO, "write", fail)
    with pytest.raises(Exception):  # noqa: B017 -- whatever the write raises, no file is left
        D.write_nwb(example_recording(), tmp_path / "x.nwb")
    assert not list(tmp_path.iterdir())


def test_nwb_write_refuses_two_sweeps_with_one_label(tmp_path: Path) -> None:
    pytest.importorskip("pynwb")
    t = np.arange(5) * 0.1
    rec = D.Recording("p", t, np.ones((3, 5)), ["1", "3", "1"])
    with pytest.raises(KingenError) as exc:
        D.write_nwb(rec, tmp_path / "x.nwb")
    assert one_line(exc).startswith(f"{tmp_path / 'x.nwb'}: sweep label = '1': two sweeps "
                                    "share this label")
    assert not list(tmp_path.iterdir())


def test_nwb_keeps_labels_its_series_names_cannot_hold(tmp_path: Path) -> None:
    # '/' and ':' cannot be in an NWB name: such a label was refused, after the fit
    pytest.importorskip("pynwb")
    t = np.arange(5) * 0.1
    labels = ["pre/post", "1:2", "pre_post"]
    current = np.arange(15, dtype=float).reshape(3, 5)
    conc = [np.full(5, c) for c in (0.1, 0.2, 0.3)]
    rec = D.Recording("p", t, current, labels, concentration_mM=conc)
    D.write_nwb(rec, tmp_path / "x.nwb")
    back = D.load_recording(tmp_path / "x.nwb")
    assert back.sweep_labels == labels
    for k in range(3):
        np.testing.assert_array_equal(back.sweep_current(k), current[k])
        np.testing.assert_allclose(back.concentration_mM[k], conc[k])


@pytest.mark.parametrize("module,fmt,extra", [("pynwb", "nwb", "kingen[nwb]"),
                                              ("pyabf", "abf", "kingen[abf]")])
def test_missing_optional_reader_says_what_to_install(tmp_path: Path, monkeypatch,
                                                      module: str, fmt: str,
                                                      extra: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    path = write(tmp_path, "x", f"r.{fmt}")
    with pytest.raises(KingenError, match=re.escape(f"install '{extra}'")) as exc:
        D.load_recording(path)
    assert str(path) in one_line(exc)
    if fmt == "nwb":
        with pytest.raises(KingenError, match="kingen\\[nwb\\]"):
            D.write_nwb(example_recording(), tmp_path / "w.nwb")


# --------------------------------------------------------------------------- ABF (real files)

def test_abf_file_axon_7() -> None:
    pytest.importorskip("pyabf")
    rec = D.load_recording(abf_file("File_axon_7.abf"), protocol="agonist")
    assert rec.n_sweeps == 12 and rec.protocol == "agonist"
    assert rec.meta["sample_rate_hz"] == 403.0
    assert rec.meta["abf_protocol"].startswith("Apl NMDA 2 s -80mV")
    assert rec.holding_mV == pytest.approx(-80.0)
    t = rec.time_ms
    assert t.shape == (1615,) and np.diff(t) == pytest.approx(1e3 / 403.0)
    assert t[-1] == pytest.approx(4000.0, rel=0.01)  # 4 s sweeps
    amplitude = np.median(rec.current_pA[:, :50], axis=1) - rec.current_pA.min(axis=1)
    carrying = np.nonzero(amplitude > 100)[0].tolist()
    assert carrying == [1, 3, 6, 9]
    assert np.all((amplitude[carrying] > 440) & (amplitude[carrying] < 670))
    assert np.all(rec.current_pA.min(axis=1)[carrying] < -440)  # inward


def test_abf_17o05026_vc_stim() -> None:
    pytest.importorskip("pyabf")
    rec = D.load_recording(abf_file("17o05026_vc_stim.abf"))
    assert rec.n_sweeps == 8 and rec.meta["sample_rate_hz"] == 20000.0
    assert rec.current_pA.shape == (8, 200000) and rec.time_ms[1] == pytest.approx(0.05)
    assert rec.holding_mV == pytest.approx(-50.0)
    window = (rec.time_ms > 1100) & (rec.time_ms < 1300)
    base = np.median(rec.current_pA[:, (rec.time_ms > 1000) & (rec.time_ms < 1150)], axis=1)
    events = base - rec.current_pA[:, window].min(axis=1)
    assert np.all((events > 35) & (events < 105))  # 39-101 pA inward events
    t_event = rec.time_ms[window][np.argmin(rec.current_pA[:, window], axis=1)]
    assert np.all((t_event > 1160) & (t_event < 1220))


def test_abf_errors(tmp_path: Path) -> None:
    pytest.importorskip("pyabf")
    with pytest.raises(KingenError, match="cannot read ABF") as exc:
        D.load_recording(write(tmp_path, "garbage" * 100, "bad.abf"))
    assert "bad.abf" in one_line(exc)
    with pytest.raises(KingenError, match=r"channel = 3: no such channel"):
        D.load_recording(abf_file("File_axon_7.abf"), channel=3)


def abf1(path: Path, sweeps: int = 3, samples: int = 1000) -> bytes:
    """An ABF1 file written by pyabf's own writer; returns its bytes."""
    from pyabf.abfWriter import writeABF1

    y = np.sin(np.arange(sweeps * samples) / 50.0).reshape(sweeps, samples) * 100.0
    writeABF1(y, str(path), 20000, "pA")
    return path.read_bytes()


@pytest.mark.parametrize("cut, message", [
    (3, "truncated or damaged ABF file: 3 bytes"),
    (100, "truncated or damaged ABF file: its header cannot be read (100 bytes; pyabf: "
     "struct.error: unpack requires a buffer of"),
    (5000, "truncated or damaged ABF file: its header cannot be read (5000 bytes; pyabf: "
     "struct.error: unpack requires a buffer of"),
    # the header is whole, the samples stop one byte short
    (-1, "truncated or damaged ABF file: its header places the samples up to byte 8048, but "
     "the file has 8047 bytes"),
])
def test_a_truncated_abf_is_one_line_naming_the_file(tmp_path: Path, cut: int,
                                                     message: str) -> None:
    pytest.importorskip("pyabf")
    whole = abf1(tmp_path / "whole.abf")
    assert len(whole) == 8192  # 2048 bytes of header, 3 x 1000 int16 samples, padding
    rec = D.load_recording(tmp_path / "whole.abf")
    assert rec.n_sweeps == 3 and rec.current_pA.shape == (3, 1000)
    cut_at = 8047 if cut == -1 else cut
    path = tmp_path / "cut.abf"
    path.write_bytes(whole[:cut_at])
    with pytest.raises(KingenError) as exc:
        D.load_recording(path)
    assert one_line(exc).startswith(f"{path}: {message}")


def test_an_empty_or_foreign_abf_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("pyabf")
    empty = write(tmp_path, "", "empty.abf")
    with pytest.raises(KingenError) as exc:
        D.load_recording(empty)
    assert one_line(exc) == f"{empty}: cannot read ABF: empty file (0 bytes)"
    csv = write(tmp_path, "time_ms,current_pA\n0,0\n", "csv.abf")
    with pytest.raises(KingenError) as exc:
        D.load_recording(csv)
    assert one_line(exc) == (f"{csv}: cannot read ABF: not an ABF file (it begins with "
                             "b'time', not 'ABF ' or 'ABF2')")


# --------------------------------------------------------------------------- Recording

def test_recording_shape_checks() -> None:
    with pytest.raises(KingenError, match="times for"):
        D.Recording(None, np.arange(3.0), [np.zeros(4)], ["a"])
    with pytest.raises(KingenError, match="labels"):
        D.Recording(None, np.arange(3.0), np.zeros((2, 3)), ["a"])
    rec = D.Recording(None, np.arange(3.0), [np.zeros(3), np.ones(3)], [])
    assert rec.sweep_labels == ["0", "1"] and rec.current_pA.shape == (2, 3)
