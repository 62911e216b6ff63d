"""A run file with a group or dataset deleted (with h5py, say) is refused at opening, in one
line naming the HDF5 path, by every command that reads it: not "not a readable HDF5 file"
(it is readable), not a traceback half-way, and never an output drawn without it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import h5py
import pytest
from test_fit_helpers import write_problem

from kingen.cli import main
from kingen.errors import KingenError
from kingen.runs.fit import fit
from kingen.store import RunStore, RunView, layout
from kingen.store.integrity import corrupt_error

MISSING = ("missing {kind}: the run file is incomplete or damaged (deleted or never "
           "written); restore it from a copy")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished run of 3 generations, fitting one recording ("deactivation")."""
    d = tmp_path_factory.mktemp("fitted")
    fit(write_problem(d, ga="generations = 3"), progress=False)
    return d / "run.h5"


def copy_run(src: Path, dst_dir: Path) -> Path:
    """A copy beside the original's configuration files (resume finds them there)."""
    for f in src.parent.iterdir():
        if f.is_file() and not f.name.endswith(".h5"):
            shutil.copy(f, dst_dir / f.name)
    return Path(shutil.copy(src, dst_dir / "run.h5"))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def commands(run: Path, tmp: Path) -> dict[str, tuple[list[str], Path | None]]:
    """Each command's arguments, and the output it would write (None: writes the run file)."""
    return {"plot": (["plot", str(run), "-o", str(tmp / "figs")], tmp / "figs"),
            "report": (["report", str(run), "-o", str(tmp / "report")], tmp / "report"),
            "export": (["export", str(run), "--model", str(tmp / "fitted.toml")],
                       tmp / "fitted.toml"),
            "resume": (["resume", str(run), "-q", "--generations", "5"], None),
            "profile": (["profile", str(run), "-q", "--points", "5"], None)}


def command_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``kingen argv``: it must fail with status 2 and exactly one line on stderr."""
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kingen: error: "), lines
    return lines[0][len("kingen: error: "):]


# What the readers rely on: the recording's time axis, current and sweep labels, the last
# generation's population and fitness, the scheme's text, the settings, why the run stopped,
# the best candidate's marker and traces, a protocol's sweeps, the resume checksums, the
# profiles' state.
DELETED = [
    ("/data/deactivation/time_ms", "dataset"),
    ("/data/deactivation/current_pA", "dataset"),
    ("/data/deactivation/labels", "dataset"),
    ("/generations/population", "dataset"),
    ("/generations/fitness", "dataset"),
    ("/scheme/text", "dataset"),
    ("/config/settings", "dataset"),
    ("/run/finished", "dataset"),
    ("/best/valid", "dataset"),
    ("/best/traces/deactivation/fit_pA", "dataset"),
    ("/best/traces/deactivation", "group"),
    ("/protocols/deactivation/sweeps", "dataset"),
    ("/resume/crc32", "dataset"),
    ("/profiles/slot_0", "dataset"),  # part of it: kingen profile took it for absent
]


@pytest.mark.parametrize("command", ["plot", "report", "export", "resume", "profile"])
@pytest.mark.parametrize(("path", "kind"), DELETED)
def test_a_deleted_item_is_named_in_one_line_by_every_command(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str,
        kind: str, command: str) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        del f[path]
    before = digest(run)
    argv, output = commands(run, tmp_path)[command]
    assert command_error(argv, capsys) == f"{run}: {path}: {MISSING.format(kind=kind)}"
    assert digest(run) == before  # resume and profile wrote nothing
    assert output is None or not output.exists()


@pytest.mark.parametrize("command", ["plot", "export", "resume"])
@pytest.mark.parametrize(("path", "attribute"), [
    ("/protocols", "names"), ("/protocols/deactivation", "kind"),
    ("/protocols/deactivation", "name"), ("/generations", "population_size"),
    ("/resume/slot_1", "fields")])
def test_a_deleted_attribute_is_named_with_its_path(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str,
        attribute: str, command: str) -> None:
    # it used to be "an item it needs is missing (HDF5 says: ... 'kind')", naming no path
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        del f[path].attrs[attribute]
    before = digest(run)
    argv, output = commands(run, tmp_path)[command]
    assert command_error(argv, capsys) == (f"{run}: {path}@{attribute}: "
                                           f"{MISSING.format(kind='attribute')}")
    assert digest(run) == before
    assert output is None or not output.exists()


def test_the_python_readers_refuse_a_deleted_time_axis_too(fitted: Path, tmp_path: Path
                                                          ) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        del f["data/deactivation/time_ms"]
    want = f"{run}: /data/deactivation/time_ms: {MISSING.format(kind='dataset')}"
    for opener in (RunStore.open, RunView.open, lambda p: RunStore.open(p, verify=False)):
        with pytest.raises(KingenError) as exc:
            opener(run)
        assert str(exc.value) == want


def test_a_time_axis_of_another_shape_than_the_current_is_refused(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        shape = f["data/deactivation/current_pA"].shape
        del f["data/deactivation/time_ms"]
        f.create_dataset("data/deactivation/time_ms", data=[[0.0, 0.1, 0.2]], fletcher32=True)
    assert command_error(["plot", str(run), "-o", str(tmp_path / "figs")], capsys) == (
        f"{run}: /data/deactivation/time_ms = (1, 3): inconsistent run file: does not match "
        f"the stored current {shape}")
    assert not (tmp_path / "figs").exists()


def test_targets_without_their_features_table_are_refused(fitted: Path, tmp_path: Path
                                                         ) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        f.create_group("targets/deactivation")
    with pytest.raises(KingenError) as exc:
        RunView.open(run)
    assert str(exc.value) == (f"{run}: /targets/deactivation/features: "
                              f"{MISSING.format(kind='dataset')}")


def test_a_file_from_before_profiles_still_opens(fitted: Path, tmp_path: Path) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        del f["profiles"]
        del f["run/lost_workers"]
    with RunView.open(run) as view:
        assert view.profiles is None and view.store.lost_workers == []
        assert view.fitted_params()[1] == "best candidate"


def test_a_group_where_a_dataset_belongs_is_named(fitted: Path, tmp_path: Path) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        del f["scheme/text"]
        f.create_group("scheme/text")
    with pytest.raises(KingenError) as exc:
        RunStore.open(run)
    assert str(exc.value) == (f"{run}: /scheme/text: a group where a dataset belongs: the "
                              "run file is damaged or was edited; restore it from a copy")


def test_resume_checks_the_slot_it_will_write_before_it_writes(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The next state goes into the slot the commit does not name: one missing a field
    used to be found only after the run file was changed (its "finished" reason lost)."""
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        free = 1 - int(f["run/commit"][1])
        del f[f"resume/slot_{free}/genes"]
    before = digest(run)
    assert command_error(["resume", str(run), "-q", "--generations", "5"], capsys) == (
        f"{run}: /resume/slot_{free} = ['genes']: inconsistent run file: resume state fields "
        "do not match the slot's datasets")
    assert digest(run) == before
    with RunStore.open(run) as store:  # the readers need no resume slot: they still read it
        assert store.finished.startswith("maximum generations (3); not converged: ")


def test_every_dataset_of_a_new_run_file_is_required_or_known_optional(fitted: Path) -> None:
    """Keeps layout.REQUIRED_* in step with what a fit writes."""
    optional = ("run/lost_workers", "resume/slot_")  # slots: checked by resume
    with h5py.File(fitted, "r") as f:
        names: list[str] = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    required = set(layout.REQUIRED_DATASETS + layout.PROFILE_DATASETS) | {
        p.replace("<p>", "deactivation") for p in layout.PROTOCOL_DATASETS
        + layout.RECORDING_DATASETS}
    assert sorted(n for n in names if not n.startswith(optional)) == sorted(required)


def test_a_lookup_that_finds_nothing_is_not_called_unreadable_hdf5(fitted: Path) -> None:
    with RunStore.open(fitted) as store, pytest.raises(KingenError) as exc:
        store._read("best/no_such")
    assert str(exc.value) == f"{fitted}: /best/no_such: {MISSING.format(kind='dataset')}"
    text = str(corrupt_error("run.h5", KeyError("Unable to synchronously open object (object "
                                                "'x' doesn't exist)")))
    assert text == ("run.h5: incomplete or damaged run file: an item it needs is missing "
                    "(HDF5 says: Unable to synchronously open object (object 'x' doesn't "
                    "exist)); restore the file from a copy")
