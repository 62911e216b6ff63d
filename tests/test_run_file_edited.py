"""A run file whose content was edited (with h5py, say) into something kingen never writes
is refused at opening, in one line naming the HDF5 path and the value, by every command that
reads it: not a traceback, not a misleading "not a readable HDF5 file", and never a resume
that carries on from it. The run file is byte-identical afterwards."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from test_run_file_missing import command_error, commands, copy_run, digest, fitted

from kingen.store.datasets import _write_json

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
    return lambda f: _write_json(f["best/traces_info"], obj)


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
