"""A run file whose content was edited (with h5py, say) into something kingen never writes
is refused at opening, in one line naming the HDF5 path and the value, by every command that
reads it: not a traceback, not a misleading "not a readable HDF5 file", and never a resume
that carries on from it. The run file is byte-identical afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_fit_helpers import FOUR_STATE
from test_run_file_missing import command_error, commands, copy_run, digest, fitted

from kingen.errors import KingenError
from kingen.store.datasets import write_json

__all__ = ["fitted"]  # the module's fixture: one finished run of 3 generations


def _json_bytes(f: h5py.File, path: str, raw: bytes) -> None:
    """Write ``raw`` into a JSON blob as kingen stores it (NUL padded bytes)."""
    ds = f[path]
    full = np.zeros(max(ds.shape[0], len(raw)), dtype=np.uint8)
    full[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    ds.resize(full.shape)
    ds[...] = full


def _blob(raw: bytes):
    return lambda f: _json_bytes(f, "best/traces_info", raw)


def _info(obj):
    return lambda f: write_json(f["best/traces_info"], obj)


GOOD = {"labels": {"deactivation": ["1ms"]}, "has_data": {"deactivation": True},
        "n_sweeps": {"deactivation": 1}}
BAD_TRACES_INFO = [
    (_blob(b'{"labels": {"deact'), "/best/traces_info = '{\"labels\": {\"deact'", "not valid "
     "JSON (Unterminated string starting at: line 1 column 13 (char 12))"),
    (_blob(b'\xff{}'), "/best/traces_info", "not UTF-8 text"),
    (_info([1, 2, 3]), "/best/traces_info = '[1, 2, 3]'", "expected an object of labels, "
     "has_data and n_sweeps, each by protocol"),
    (_info({**GOOD, "n_sweeps": {"deactivation": "1"}}),
     "/best/traces_info.n_sweeps.deactivation = '1'", "not a sweep count from 0 to 1 (the "
     "rows stored)"),
    (_info({**GOOD, "n_sweeps": {"deactivation": 7}}),
     "/best/traces_info.n_sweeps.deactivation = 7", "not a sweep count from 0 to 1 (the "
     "rows stored)"),
    (_info({**GOOD, "n_sweeps": {"activation": 1}}),
     "/best/traces_info.n_sweeps.activation = 1", "not a protocol of the run (protocols are "
     "deactivation)"),
    (_info({**GOOD, "labels": {"deactivation": ["1ms", "2ms"]}}),
     "/best/traces_info.labels.deactivation = '[\"1ms\", \"2ms\"]'",
     "expected a list of 1 sweep labels"),
    (_info({**GOOD, "has_data": {"deactivation": "yes"}}),
     "/best/traces_info.has_data.deactivation = '\"yes\"'", "expected true or false"),
]


@pytest.mark.parametrize("command", ["resume", "report", "plot", "export"])
@pytest.mark.parametrize(("edit", "field", "what"), BAD_TRACES_INFO, ids=[
    "json", "utf8", "list", "count_text", "count_rows", "protocol", "labels", "has_data"])
def test_damaged_traces_metadata_is_refused_by_every_command(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, field: str,
        what: str, command: str) -> None:
    # resume carried on from such a file; the readers said "not a readable HDF5 file" or
    # gave a traceback ('list' object has no attribute 'get')
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        edit(f)
    before = digest(run)
    argv, output = commands(run, tmp_path)[command]
    assert command_error(argv, capsys) == f"{run}: {field}: inconsistent run file: {what}"
    assert digest(run) == before
    assert output is None or not output.exists()


def test_other_best_json_blobs_must_parse(fitted: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        _json_bytes(f, "best/features", b"[]")
    before = digest(run)
    assert command_error(["resume", str(run), "-q", "--generations", "5"], capsys) == (
        f"{run}: /best/features: inconsistent run file: not an object of JSON")
    assert digest(run) == before


def test_metadata_of_a_best_candidate_not_yet_valid_is_not_read(fitted: Path, tmp_path: Path
                                                                 ) -> None:
    """A writer killed while rewriting its best candidate leaves valid = 0 and whatever it
    had written: the readers ignore that candidate, so opening does not check it."""
    from kingen.store import RunStore

    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        f["best/valid"][0] = 0
        _json_bytes(f, "best/traces_info", b'{"labels": {"deact')
    with RunStore.open(run) as store:
        assert store.best() is None


# ------------------------------------------------------------------ the scheme, the settings

def _replace_text(f: h5py.File, path: str, text: str) -> None:
    from kingen.store.datasets import make_text_dataset

    group, _, name = path.rpartition("/")
    del f[path]
    make_text_dataset(f[group], name, text)


def _settings(f: h5py.File, edit) -> None:
    settings = json.loads(f["config/settings"][0].decode())
    edit(settings)
    _replace_text(f, "config/settings", json.dumps(settings))


@pytest.mark.parametrize("command", ["resume", "report", "plot", "export"])
def test_a_scheme_text_that_is_not_the_runs_scheme(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    # plot gave IndexError; report and export a NumPy broadcast error (16 parameters in the
    # table, 6 in the text); resume blamed the configuration
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        _replace_text(f, "scheme/text", FOUR_STATE)
    before = digest(run)
    argv, output = commands(run, tmp_path)[command]
    assert command_error(argv, capsys) == (
        f"{run}: /scheme/text: inconsistent run file: not the scheme of the run's tables: "
        "state 3 is 'O' in the text, 'C2' in /scheme/states; restore the run file from a copy")
    assert digest(run) == before
    assert output is None or not output.exists()


@pytest.mark.parametrize(("edit", "what"), [
    (lambda t: t.replace("C5", "D5"), "state 7 is 'D5' in the text, 'C5' in /scheme/states"),
    (lambda t: t.replace("k43", "k43b"),
     "parameter 14 is 'k43b' in the text, 'k43' in /scheme/parameters"),
], ids=["state", "parameter"])
def test_a_scheme_text_edited_against_its_tables(fitted: Path, tmp_path: Path, edit,
                                                 what: str) -> None:
    from kingen.store import RunView

    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        _replace_text(f, "scheme/text", edit(f["scheme/text"][0].decode()))
    with pytest.raises(KingenError) as exc:
        RunView.open(run)
    assert str(exc.value) == (f"{run}: /scheme/text: inconsistent run file: not the scheme of "
                              f"the run's tables: {what}; restore the run file from a copy")


def test_a_scheme_text_that_is_no_scheme(fitted: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        _replace_text(f, "scheme/text", "[model]\nname = 'x'\n")
    before = digest(run)
    assert command_error(["plot", str(run), "-o", str(tmp_path / "figs")], capsys) == (
        f"{run}: /scheme/text: inconsistent run file: not a valid scheme (states: missing "
        "table)")
    assert digest(run) == before


def test_settings_without_their_ga_table(fitted: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # resume gave KeyError: 'ga'
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        _settings(f, lambda s: s.pop("ga"))
    before = digest(run)
    assert command_error(["resume", str(run), "-q", "--generations", "5"], capsys) == (
        f"{run}: /config/settings.ga: missing table: the run file is damaged or was edited; "
        "restore it from a copy")
    assert digest(run) == before


@pytest.mark.parametrize(("edit", "field"), [
    (lambda s: s["ga"].update(population="8"), "/config/settings.ga.population = '8': must be "
     "an integer"),
    (lambda s: s["ga"].update(mutants=3), "/config/settings.ga.mutants: unknown field (known: "
     "algorithm, cxpb, eta_cx, eta_mut, generations, hall_of_fame, indpb, mutpb, offspring, "
     "operators, population, sigma, start_from_model, tournament)"),
    (lambda s: s.pop("seed"), "/config/settings.seed: missing"),
], ids=["type", "key", "seed"])
def test_settings_resume_cannot_use(fitted: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str], edit, field: str
                                    ) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        _settings(f, edit)
    before = digest(run)
    assert command_error(["resume", str(run), "-q", "--generations", "5"], capsys) == (
        f"{run}: {field}: the run file is damaged or was edited; restore it from a copy")
    assert digest(run) == before


@pytest.mark.parametrize("command", ["resume", "report", "plot", "export"])
def test_settings_that_are_not_json(fitted: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str], command: str) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        _replace_text(f, "config/settings", '{"ga": ')
    before = digest(run)
    argv, output = commands(run, tmp_path)[command]
    assert command_error(argv, capsys) == (
        f"{run}: /config/settings = '{{\"ga\": ': inconsistent run file: not valid JSON "
        "(Expecting value: line 1 column 8 (char 7))")
    assert digest(run) == before
    assert output is None or not output.exists()


# ------------------------------------------------------------------ rate constants

@pytest.mark.parametrize("command", ["resume", "report", "plot", "export"])
def test_negative_best_parameters(fitted: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str], command: str) -> None:
    # report gave "math domain error"; export blamed "<exported scheme>"
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        f["best/params"][2] = -28.4
    before = digest(run)
    argv, output = commands(run, tmp_path)[command]
    assert command_error(argv, capsys) == (
        f"{run}: /best/params[2] = -28.4: inconsistent run file: the rate constant k12 must "
        "be > 0; restore the run file from a copy")
    assert digest(run) == before
    assert output is None or not output.exists()


@pytest.mark.parametrize(("path", "field"), [
    ("hall_of_fame/params", "/hall_of_fame/params[1, 3] = -1.0"),
    ("scheme/parameters", "/scheme/parameters[3].lower = -1.0")])
def test_other_rate_constants_a_report_reads(fitted: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str], path: str,
                                             field: str) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        values = f[path][...]
        if values.dtype.names:
            values["lower"][3] = -1.0
        else:
            values[1, 3] = -1.0
        f[path][...] = values
    before = digest(run)
    assert command_error(["report", str(run), "-o", str(tmp_path / "report")], capsys) == (
        f"{run}: {field}: inconsistent run file: the rate constant k21 must be > 0; restore "
        "the run file from a copy")
    assert digest(run) == before
