"""A run file is data, never code, and a damaged, inconsistent or busy one is refused in one
line by every command (issue #12): pickle payloads, Fletcher-32 checksums, counters that
disagree with the data, unreadable HDF5, ``--overwrite`` on inputs and on live runs, and
``kingen resume`` with an edited model file."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import platform
import shutil
import stat
import subprocess
import sys
import time
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_fit_helpers import whole_and_half_run, write_problem

from kingen.cli import main
from kingen.runs.fit import fit, resume
from kingen.store import LAYOUT_VERSION, RunStore, WriterLock


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of 3 generations (the resume tests continue it to 5)."""
    d = tmp_path_factory.mktemp("fitted")
    fit(write_problem(d, ga="generations = 3"), progress=False)
    return d / "run.h5"


def copy_run(src: Path, dst_dir: Path, name: str = "run.h5") -> Path:
    """A copy beside the original's configuration files (resume finds them there)."""
    for f in src.parent.iterdir():
        if f.is_file() and not f.name.endswith(".h5"):
            shutil.copy(f, dst_dir / f.name)
    dst = dst_dir / name
    shutil.copy(src, dst)
    return dst


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def command_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``kingen argv``; it must fail with status 2 and one line on stderr."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("kingen: error: ")
    return lines[-1][len("kingen: error: "):]


def every_command(path: Path, tmp: Path) -> dict[str, list[str]]:
    return {"resume": ["resume", str(path), "-q", "--generations", "5"],
            "plot": ["plot", str(path), "-o", str(tmp / "figs")],
            "report": ["report", str(path), "-o", str(tmp / "report")],
            "export": ["export", str(path), "--model", str(tmp / "fitted.toml")]}


# --------------------------------------------------------------------------- pickles

class _Payload:
    """Unpickling this creates the file ``marker``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_layout_1_run_file_with_a_pickle_is_refused_and_nothing_runs(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = copy_run(fitted, tmp_path)
    marker = tmp_path / "pwned"
    blob = np.frombuffer(pickle.dumps(_Payload(marker)), dtype=np.uint8)
    with h5py.File(run, "a") as f:  # what kingen 0.1 wrote: a pickle in /resume/state_0
        f.attrs["layout_version"] = 1
        f["resume"].create_dataset("state_0", data=blob)
    pickle.loads(pickle.dumps(_Payload(tmp_path / "works")))  # the payload is live
    assert (tmp_path / "works").exists()

    def refuse(*_a, **_k):
        raise AssertionError("a pickle was read from a run file")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    before = digest(run)
    for name, argv in every_command(run, tmp_path).items():
        assert command_error(argv, capsys) == (
            f"{run}: /layout_version = 1: run file of layout version 1, from an older kingen: "
            "its resume state is a Python pickle, which could run code when read, so this "
            f"kingen (layout version {LAYOUT_VERSION}) refuses it; run the fit again"), name
    assert not marker.exists() and digest(run) == before


def test_a_pickle_in_place_of_a_resume_array_is_refused(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(marker))
    # as raw bytes in a field of numbers: wrong type and shape for the field
    raw = copy_run(fitted, tmp_path, "raw.h5")
    with RunStore.open(raw) as st:
        slot = int(st._commit()[1])
    with h5py.File(raw, "a") as f:
        g = f[f"resume/slot_{slot}"]
        del g["genes"]
        g.create_dataset("genes", data=np.frombuffer(payload, dtype=np.uint8), chunks=True,
                         fletcher32=True, maxshape=(None,))
        g["genes"].attrs["ndim"] = 1
        names = json.loads(g.attrs["fields"])
        g["shapes"][names.index("genes")] = [len(payload), 0, 0]
        shapes = g["shapes"][()]
        crc = 0  # a crafted file carries a matching CRC: the type check must stop it
        for i, n in enumerate(names):
            ndim = int(g[n].attrs["ndim"])
            arr = g[n][tuple(slice(0, k) for k in shapes[i, :ndim])] if ndim else g[n][0]
            crc = zlib.crc32(np.asarray(arr).tobytes(), crc)
        f["resume/crc32"][slot] = zlib.crc32(shapes.tobytes(), crc)
    assert command_error(["resume", str(raw), "-q", "--generations", "5"], capsys) == (
        f"{raw}: /resume/genes: malformed resume state: uint8 of shape ({len(payload)},) "
        "where this run needs float64 of shape (8, 2)")
    # as an object (a string) dataset: never read at all
    obj = copy_run(fitted, tmp_path, "obj.h5")
    with h5py.File(obj, "a") as f:
        g = f[f"resume/slot_{slot}"]
        del g["genes"]
        g.create_dataset("genes", data=payload.hex(), dtype=h5py.string_dtype())
        g["genes"].attrs["ndim"] = 2
    assert command_error(["resume", str(obj), "-q", "--generations", "5"], capsys) == (
        f"{obj}: /resume/slot_{slot}/genes = 'object': malformed resume state: only arrays of "
        "numbers are read")
    assert not marker.exists()


# --------------------------------------------------------------------------- checksums

def _flip(path: Path, dataset: str, offset: int, count: int) -> None:
    """Invert ``count`` bytes of ``dataset``'s first chunk, from ``offset`` (negative: from
    the chunk's end, where its checksum is)."""
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info(0)
    start = info.byte_offset + (offset if offset >= 0 else info.size + offset)
    with open(path, "r+b") as fh:
        fh.seek(start)
        data = fh.read(count)
        fh.seek(start)
        fh.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize(("dataset", "offset", "count"), [
    ("/generations/population", 0, 1),
    ("/generations/population", 100, 64),
    ("/generations/fitness", -2, 1),  # inside the stored checksum itself
    ("/scheme/parameters", 40, 1),
    ("/data/deactivation/current_pA", 10, 64),  # compressed
    ("/best/traces/deactivation/fit_pA", 500, 1),
])
def test_a_flipped_byte_is_reported_by_every_command(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str,
        offset: int, count: int) -> None:
    run = copy_run(fitted, tmp_path)
    _flip(run, dataset, offset, count)
    before = digest(run)
    for name, argv in every_command(run, tmp_path).items():
        assert command_error(argv, capsys) == (
            f"{run}: {dataset}: damaged run file: its data fail their Fletcher-32 checksum; "
            "restore the file from a copy"), name
    assert digest(run) == before  # resume wrote nothing
    assert not (tmp_path / "fitted.toml").exists()


def test_a_wrong_resume_checksum_is_reported(fitted: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        slot = int(f["run/commit"][1])
        f["resume/crc32"][slot] += 1
    before = digest(run)
    assert command_error(["resume", str(run), "-q", "--generations", "5"], capsys) == (
        f"{run}: /resume/slot_{slot}: damaged run file: the resume state of generation 3 "
        "fails its checksum")
    assert digest(run) == before


def test_every_dataset_carries_a_checksum(fitted: Path) -> None:
    with h5py.File(fitted, "r") as f:
        missing = []
        f.visititems(lambda name, obj: missing.append(name) if isinstance(
            obj, h5py.Dataset) and not obj.fletcher32 else None)
        assert missing == []
        assert f.attrs["layout_version"] == LAYOUT_VERSION == 2


# --------------------------------------------------------------------------- consistency

@pytest.mark.parametrize(("edit", "message"), [
    (lambda f: f["run/commit"].__setitem__(0, 9), "/run/commit[0] = 9: inconsistent run file: "
     "generations committed, but 4 rows stored"),
    (lambda f: f["run/commit"].__setitem__(1, 7), "/run/commit[1] = 7: inconsistent run file: "
     "resume slot out of range (0 or 1)"),
    (lambda f: f["generations/population"].resize((4, 8, 17)),
     "/generations/population = (4, 8, 17): inconsistent run file: rows of the wrong width "
     "(expected (8, 16))"),
    (lambda f: f["generations/size"].__setitem__(1, 99), "/generations/size[1] = 99: "
     "inconsistent run file: more candidates than the 8 rows stored"),
    (lambda f: f["hall_of_fame/size"].__setitem__(0, 50), "/hall_of_fame/size = 50: "
     "inconsistent run file: does not match the stored hall of fame (10, 16)"),
])
def test_counters_that_disagree_with_the_data_are_refused_by_every_command(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit,
        message: str) -> None:
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        edit(f)
    for name, argv in every_command(run, tmp_path).items():
        assert command_error(argv, capsys) == f"{run}: {message}", name


# --------------------------------------------------------------------------- unreadable HDF5

@pytest.mark.parametrize("damage", ["signature only", "superblock"])
def test_damage_only_hdf5_sees_is_one_line(fitted: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           damage: str) -> None:
    run = copy_run(fitted, tmp_path)
    if damage == "signature only":
        run.write_bytes(b"\x89HDF\r\n\x1a\n")
    else:
        with open(run, "r+b") as fh:
            fh.seek(12)
            fh.write(b"\x00" * 36)
    for name, argv in every_command(run, tmp_path).items():
        assert command_error(argv, capsys) == (
            f"{run}: not a readable HDF5 file: its header (superblock) or metadata is "
            "damaged, or the file is incomplete"), name


# --------------------------------------------------------------------------- --overwrite

@pytest.mark.parametrize(("target", "role"), [("model.toml", "model file"),
                                              ("fit.toml", "configuration"),
                                              ("deactivation.csv", "recording")])
def test_overwrite_never_replaces_an_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           target: str, role: str) -> None:
    cfg = write_problem(tmp_path, ga="generations = 1")
    files = {f.name: f for f in tmp_path.iterdir()}
    assert target in files, sorted(files)
    before = {n: digest(f) for n, f in files.items()}
    out = tmp_path / target
    assert command_error(["fit", str(cfg), "-q", "--overwrite", "-o", str(out)], capsys) == (
        f"{out}: output is this fit's {role} ({files[target] if role != 'configuration' else cfg}"
        "); refusing to overwrite an input: choose another output file")
    assert {n: digest(f) for n, f in files.items()} == before


def test_overwrite_only_replaces_a_run_file(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_problem(tmp_path, ga="generations = 1")
    other = tmp_path / "notes.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(3)
    before = digest(other)
    assert command_error(["fit", str(cfg), "-q", "--overwrite", "-o", str(other)], capsys) == (
        f"{other}: not a kingen run file; refusing to overwrite it (choose another output "
        "file, or remove this one yourself)")
    assert digest(other) == before
    run = tmp_path / "run.h5"
    assert main(["fit", str(cfg), "-q", "-o", str(run)]) == 0
    assert main(["fit", str(cfg), "-q", "--overwrite", "-o", str(run)]) == 0  # a run: replaced
    assert not (tmp_path / ".run.h5.lock").exists()  # the lock goes with its run


def test_resume_asks_for_the_lock_before_it_reads(fitted: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # A file another process is writing can look damaged between its writes: the refusal
    # must name the writer, not a damage the writer is about to mend.
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        f["resume/crc32"][int(f["run/commit"][1])] += 1
    before = digest(run)
    holder = WriterLock(run)
    holder.acquire()  # flock: a second open of the lock file conflicts, also in-process
    try:
        assert command_error(["resume", str(run), "-q", "--generations", "5"], capsys) == (
            f"{run}: the run file is being written by process {os.getpid()} on "
            f"{platform.node()} (lock .{run.name}.lock); wait for that run to end, or stop it")
    finally:
        holder.release()
    assert digest(run) == before
    assert "fails its checksum" in command_error(
        ["resume", str(run), "-q", "--generations", "5"], capsys)  # once the writer is gone
    assert not (tmp_path / f".{run.name}.lock").exists()


def _lock_refused(what: str, name: str = "run.h5") -> str:
    return (f"the lock file .{name}.lock beside the run file {what}; kingen makes its own "
            f"lock file there: remove .{name}.lock")


@pytest.mark.parametrize("points_to", ["deactivation.csv", "fit.toml", "run.h5"])
def test_a_lock_that_is_a_symbolic_link_is_refused_and_its_target_kept(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        points_to: str) -> None:
    run = copy_run(fitted, tmp_path)
    lock = tmp_path / ".run.h5.lock"
    lock.symlink_to(points_to)
    before = {f.name: digest(f) for f in tmp_path.iterdir() if f.is_file()}
    assert command_error(["resume", str(run), "-q", "--generations", "5"], capsys) == (
        f"{run}: " + _lock_refused("is a symbolic link, which kingen does not follow"))
    assert {f.name: digest(f) for f in tmp_path.iterdir() if f.is_file()} == before
    assert lock.is_symlink() and os.readlink(lock) == points_to


@pytest.mark.parametrize(("make", "what"), [
    (lambda lock, d: os.link(d / "deactivation.csv", lock),
     "has another name too (a hard link to another file)"),
    (lambda lock, d: os.mkfifo(lock), "is not a regular file"),
    (lambda lock, d: lock.mkdir(), "is not a regular file"),
    (lambda lock, d: lock.write_text("time_ms,current_pA\n0,-1\n"),
     "holds something other than kingen's record of the process writing the run"),
], ids=["hard link", "fifo", "folder", "other data"])
def test_a_lock_that_is_not_kingens_is_refused_and_never_truncated(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], make,
        what: str) -> None:
    run = copy_run(fitted, tmp_path)
    lock = tmp_path / ".run.h5.lock"
    make(lock, tmp_path)
    before = {f.name: digest(f) for f in tmp_path.iterdir() if f.is_file()}
    kind = stat.S_IFMT(lock.lstat().st_mode)
    assert command_error(["resume", str(run), "-q", "--generations", "5"], capsys) == (
        f"{run}: " + _lock_refused(what))
    assert {f.name: digest(f) for f in tmp_path.iterdir() if f.is_file()} == before
    assert stat.S_IFMT(lock.lstat().st_mode) == kind


def test_a_lock_left_by_a_killed_run_is_taken_without_truncating_it(tmp_path: Path) -> None:
    run = tmp_path / "run.h5"
    lock = WriterLock(run)
    lock.path.write_text("12345 a-host-of-a-long-name.example.org\n")  # an older record
    truncated = []
    real = os.ftruncate
    try:
        os.ftruncate = lambda *a: truncated.append(a) or real(*a)  # type: ignore[assignment]
        lock.acquire()
        text = lock.path.read_text()
    finally:
        os.ftruncate = real  # type: ignore[assignment]
        lock.release()
    assert not truncated
    assert text.split() == [str(os.getpid()), platform.node()] and text.endswith("\n")
    assert not lock.path.exists()


def test_a_refused_resume_leaves_the_run_file_byte_identical(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Resume adds the statistics' names beside the stored ones: stored names that are not
    # UTF-8 were found only once the file was open for writing, which changed its bytes.
    run = copy_run(fitted, tmp_path)
    with h5py.File(run, "a") as f:
        f["generations/stats_names"][1] = b"\xff\xfemedian"
    before = digest(run)
    assert command_error(["resume", str(run), "-q", "--generations", "5"], capsys) == (
        f"{run}: /generations/stats_names[1] = b'\\xff\\xfemedian': inconsistent run file: "
        "a column name that is not UTF-8 text")
    assert digest(run) == before
    assert not (tmp_path / ".run.h5.lock").exists()


def _committed(path: Path) -> int:
    try:
        with RunStore.open(path, verify=False) as store:
            return store.n_generations
    except Exception:  # not created yet, or caught between its first writes
        return 0


# ``kingen fit`` with one more stopping rule, which holds once the file ``stop`` exists in
# its working folder: a run that the test ends when it chooses, yet whole (its best and its
# reason written). Ctrl-C would end it too, but as an interrupted run: no best, no reason.
_FIT_UNTIL_STOP_FILE = """
import sys
from pathlib import Path

from kingen.fitting.engine import Engine

rules = Engine.stop_reason
Engine.stop_reason = lambda self, state: (
    "stopped by the test" if Path("stop").exists() else rules(self, state))

from kingen.cli import main

sys.exit(main(sys.argv[1:]))
"""


def test_a_second_writer_is_refused_and_nothing_is_lost(
        fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The first run has no wall-time limit: it outlives the two refused commands on any
    # machine, and only the test stops it. (``fitted`` compiled its solver: the first run
    # loads it from the cache, well within the deadline for its start.)
    cfg = write_problem(tmp_path, ga="generations = 1_000_000", extra="[stop]\npatience = 0")
    run = tmp_path / "run.h5"
    first = subprocess.Popen([sys.executable, "-c", _FIT_UNTIL_STOP_FILE, "fit", str(cfg), "-q"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _committed(run) < 2:
            assert first.poll() is None, first.stderr.read().decode()
            assert time.monotonic() < deadline, "the first fit did not start"
            time.sleep(0.02)
        refusal = (f"the run file is being written by process {first.pid} on "
                   f"{platform.node()} (lock .run.h5.lock); wait for that run to end, or stop it")
        # The second writer is this process: another process than the first's, as a second
        # kingen started from a shell would be (the lock is the file system's, between
        # processes), without an interpreter's start that the first run must outlive.
        # (The configuration's output is beside it, wherever kingen runs from.) Were the
        # refusal gone, the second fit would end after 3 generations and fail the test, not
        # run as long as the first.
        for argv in (["fit", str(cfg), "-q", "--overwrite", "--generations", "3"],
                     ["resume", str(run), "-q", "--generations", "5"]):
            capsys.readouterr()
            assert main(argv) == 2
            assert capsys.readouterr().err.strip() == f"kingen: error: {run}: {refusal}"
            assert first.poll() is None  # the first run goes on
    finally:
        (tmp_path / "stop").touch()
        try:
            first.wait(timeout=300)
        except subprocess.TimeoutExpired:
            first.kill()
            raise
    assert first.returncode == 0, first.stderr.read().decode()
    with RunStore.open(run) as st:  # the first run, whole
        n = st.n_generations
        assert n > 2 and st.finished.startswith("stopped by the test")
        np.testing.assert_array_equal(st.history()["generation"], np.arange(n))
        assert st.best() is not None and not st._f["run"].attrs["resumed"] != "[]"
    assert not (tmp_path / ".run.h5.lock").exists()


# --------------------------------------------------------------------------- resume

def test_resume_uses_the_stored_scheme_and_says_the_file_differs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full, part = whole_and_half_run(tmp_path, "generations = 4", 2)
    model = part / "model.toml"
    text = model.read_text(encoding="utf-8")
    model.write_text(text.replace("bounds = [0.459, 45.9]", "bounds = [0.1, 100]"),
                     encoding="utf-8")
    assert model.read_text(encoding="utf-8") != text
    capsys.readouterr()
    resumed = resume(part / "run.h5", progress=False, generations=4)
    assert capsys.readouterr().err == (
        f"kingen: note: the model file {model} differs from the scheme stored in the run "
        "file; resuming with the stored scheme\n")
    np.testing.assert_array_equal(resumed.params, full.params)
    np.testing.assert_array_equal(resumed.history["best"], full.history["best"])


@pytest.mark.parametrize("ga", ['algorithm = "cmaes"\noffspring = 10\ngenerations = 5',
                                # the next generation's numbers are drawn during the solve:
                                # the resume state records the generator before them
                                'operators = "numpy"\noffspring = 12\ngenerations = 5'])
def test_cmaes_and_numpy_operators_resume_as_an_uninterrupted_run(tmp_path: Path,
                                                                  ga: str) -> None:
    full, part = whole_and_half_run(tmp_path, ga, 2)
    with RunStore.open(part / "run.h5") as st:
        _, state = st.last_state()
        if "cmaes" in ga:
            assert state["cma_C"].shape == (state["genes"].shape[1],) * 2
        assert all(a.dtype.kind in "iuf" for a in state.values())
    resumed = resume(part / "run.h5", progress=False, generations=5)
    np.testing.assert_array_equal(resumed.params, full.params)
    np.testing.assert_array_equal(resumed.history["best"], full.history["best"])


def test_a_resumed_killed_run_opens_with_plain_h5py(tmp_path: Path) -> None:
    """A run killed while writing leaves HDF5's 'open for writing' flag; resume clears it."""
    cfg = write_problem(tmp_path, ga="generations = 30")
    run = tmp_path / "run.h5"
    proc = subprocess.Popen([sys.executable, "-m", "kingen.cli", "fit", str(cfg), "-q"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _committed(run) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, 9)
    proc.wait()
    with pytest.raises(OSError):
        h5py.File(run, "r")  # the flag: h5clear -s clears it, or kingen resume
    assert main(["resume", str(run), "-q"]) == 0
    with h5py.File(run, "r") as f:
        assert int(f["run/commit"][0]) == 31


def _kept_two_and_resumes(run: Path, monkeypatch: pytest.MonkeyPatch, generations: int
                          ) -> None:
    """The run file verifies whole with its two committed generations, and, the disk
    given back, resumes to the end (``generations`` in all)."""
    with RunStore.open(run) as store:  # whole: every checksum verified
        assert store.n_generations == 2
    monkeypatch.undo()
    assert main(["resume", str(run), "-q"]) == 0
    with RunStore.open(run) as store:
        assert store.n_generations == generations and store.finished


def test_a_disk_that_fills_up_stops_the_fit_in_one_line_with_its_generations_kept(
        tmp_path, monkeypatch, capsys):
    import kingen.store.space as space
    from kingen.fitting.config import load_config

    cfg = write_problem(tmp_path, ga="generations = 6")
    run = load_config(cfg).output  # as the configuration gives it
    writes = []
    real = shutil.disk_usage

    def filling(path):  # room for the file and two generations, then none
        writes.append(path)
        usage = real(path)
        return usage._replace(free=usage.free if len(writes) <= 3 else 1000)

    monkeypatch.setattr(space.shutil, "disk_usage", filling)
    assert main(["fit", str(cfg), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kingen: error: {run}: the disk holding the run file is full (0.0 MB "
                   "free; the next write needs about 1.1 MB): the run file keeps every "
                   f"committed generation; free some space and go on with kingen resume {run}"]
    _kept_two_and_resumes(run, monkeypatch, generations=7)


@pytest.mark.parametrize(("code", "words"), [(28, "No space left on device"),
                                            (122, "Disk quota exceeded")])
def test_a_disk_that_fills_up_during_hdf5s_write_is_said_in_one_line(
        tmp_path, monkeypatch, capsys, code, words):
    # the disk filled after the free-space check (another process), or a quota statvfs
    # cannot see: h5py's text, a paragraph of buffer addresses, was the message
    import kingen.store.runstore as runstore
    from kingen.fitting.config import load_config

    cfg = write_problem(tmp_path, ga="generations = 4")
    run = load_config(cfg).output
    real = runstore.RunStore._append

    def full(store, generation, *args):
        if generation >= 2:  # two generations written, then none
            raise OSError(f"[Errno {code}] Can't write data (file write failed: time = Tue "
                          f"Nov 24 22:19:57 2026, filename = '{run}', file descriptor = 5, "
                          f"errno = {code}, error message = '{words}', buf = 0x55d0c0a0b000, "
                          "total write size = 4096, bytes this sub-write = 4096, bytes "
                          "actually written = 18446744073709551615, offset = 0)")
        return real(store, generation, *args)

    monkeypatch.setattr(runstore.RunStore, "_append", full)
    assert main(["fit", str(cfg), "-q"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"kingen: error: {run}: the disk holding the run file filled up while generation 2 "
        f"was written (HDF5: {words}): free some space and go on with kingen resume {run}, "
        "which checks the file first"]
    _kept_two_and_resumes(run, monkeypatch, generations=5)


def test_a_read_only_run_file_is_said_to_be_read_only_not_damaged(fitted: Path, tmp_path,
                                                                  capsys) -> None:
    run = tmp_path / "ro.h5"
    shutil.copy(fitted, run)
    if os.geteuid() == 0:  # root writes through permission bits: make it immutable
        if subprocess.run(["chattr", "+i", str(run)], capture_output=True).returncode:
            pytest.skip("chattr +i is not available here")
    else:
        run.chmod(0o444)
    try:
        assert main(["resume", str(run), "-q", "--generations", "9"]) == 2
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(run)], check=True)
    assert capsys.readouterr().err.strip() == (
        f"kingen: error: {run}: cannot open the run file for writing: it or its folder is "
        "read-only (it is not damaged: kingen plot and report read it)")


def test_names_end_where_they_end_and_toml_may_start_with_a_bom(tmp_path) -> None:
    from kingen.errors import KingenError
    from kingen.model.scheme import Scheme

    text = (Path(__file__).resolve().parents[1] / "models" / "jonas_1993.toml").read_text()
    bom = tmp_path / "bom.toml"
    bom.write_text("\ufeff" + text, encoding="utf-8")
    assert Scheme.load(bom).n_states == 7
    bad = tmp_path / "newline.toml"  # a state named "C1\n" reached the generated code
    bad.write_text(text.replace('\nC1 = {', '\n"C1\\n" = {', 1))
    assert '"C1\\n"' in bad.read_text()
    with pytest.raises(KingenError):
        Scheme.load(bad)


def test_overwrite_keeps_the_earlier_run_until_the_new_one_commits(fitted: Path, tmp_path,
                                                                  monkeypatch) -> None:
    from kingen.fitting.engine import Engine

    cfg = write_problem(tmp_path, ga="generations = 2")
    run = tmp_path / "run.h5"
    shutil.copy(fitted, run)
    before = hashlib.sha256(run.read_bytes()).hexdigest()
    real = Engine.evaluate

    def interrupted(self, genes):
        raise KeyboardInterrupt  # stopped in generation 0, before its first commit

    monkeypatch.setattr(Engine, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fit(cfg, overwrite=True, progress=False)
    assert hashlib.sha256(run.read_bytes()).hexdigest() == before  # the earlier run, whole
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    monkeypatch.setattr(Engine, "evaluate", real)
    fit(cfg, overwrite=True, progress=False)  # one that commits takes its place
    with RunStore.open(run) as store:
        assert store.n_generations == 3 and store.finished
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_resume_refuses_a_recording_edited_since_the_run_started(tmp_path, capsys) -> None:
    cfg = write_problem(tmp_path, ga="generations = 2")
    fit(cfg, progress=False)
    run, recording = tmp_path / "run.h5", tmp_path / "deactivation.csv"
    rows = recording.read_text().splitlines()
    # the same file, every current three times larger (a gain set wrong, then corrected)
    edited = [r if r.startswith(("#", "time")) else ",".join(
        [r.split(",")[0]] + [repr(3 * float(v)) if v else v for v in r.split(",")[1:]])
        for r in rows]
    recording.write_text("\n".join(edited) + "\n")
    assert main(["resume", str(run), "-q", "--generations", "4"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"kingen: error: {run}: the recording of protocol deactivation ({recording}) differs "
        "from the copy the run started with: a resumed fit needs the same data (restore the "
        "file, or start a new fit)")
    recording.write_text("\n".join(rows) + "\n")  # restored: it goes on
    assert main(["resume", str(run), "-q", "--generations", "4"]) == 0
