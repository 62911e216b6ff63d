"""No command writes over its own inputs, over a run file, or over any file but an earlier
output of its own kind (issue #34, "Data loss"); a device or a pipe is written through,
never replaced. Every refusal is one line, exit status 2, and every file keeps its bytes."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store import JONAS, make_run, small_protocols

from kingen.base.files import OUTPUT_KINDS, atomic_write, check_replaceable, written_kind
from kingen.cli import main
from kingen.errors import KingenError

DEMO = Path(__file__).resolve().parents[1] / "kingen" / "bundled" / "demo"
KEEP = ("choose another name, or remove it yourself")
NOT_KINGENS = f"exists and kingen did not write it: refusing to replace it ({KEEP})"
RUN_FILE = ("is a kingen run file: only the fit that writes it replaces it (kingen fit "
            "--overwrite); choose another name")


def input_refused(role: str) -> str:
    return f"is {role}: no output replaces its command's input (choose another name)"


def other_kind(found: str, kind: str) -> str:
    return (f"is {OUTPUT_KINDS[found]}, not {OUTPUT_KINDS[kind]}: refusing to replace it "
            f"({KEEP})")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a small run file, a scheme and a protocol file, a .mod and an NWB file
    kingen exported, and a scheme it fitted (copied into each test's folder)."""
    d = tmp_path_factory.mktemp("made")
    make_run(d / "run.h5", protocols=small_protocols(("deactivation",)), generations=2)
    shutil.copy(JONAS, d / "scheme.toml")
    shutil.copy(DEMO / "recovery.toml", d / "protocol.toml")  # its header says "kingen"
    run = str(d / "run.h5")
    for argv in (["export", run, "--to", "neuron", "-o", str(d / "export.mod")],
                 ["export", run, "--nwb", str(d / "fitted.nwb")],
                 ["export", run, "--model", str(d / "fitted.toml")]):
        assert main(argv) == 0
    return d


@pytest.fixture
def here(made: Path, tmp_path: Path) -> Path:
    for f in made.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def digests(folder: Path) -> dict[str, str]:
    """Every entry under ``folder``: a file's sha256, or what else it is."""
    out = {}
    for p in sorted(folder.rglob("*")):
        mode = p.lstat().st_mode
        if stat.S_ISREG(mode):
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p)] = f"mode {stat.S_IFMT(mode):o}"
    return out


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``kingen argv``: exit status 2, one line; returns the line's message."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kingen: error: "), err
    return err[0][len("kingen: error: "):]


def refused_and_unchanged(argv: list[str], folder: Path,
                          capsys: pytest.CaptureFixture[str]) -> str:
    before = digests(folder)
    message = refused(argv, capsys)
    assert digests(folder) == before
    return message


# --------------------------------------------------------------------------- export --to

def test_export_to_never_writes_over_the_run_file_it_exports(here: Path, capsys) -> None:
    run = here / "run.h5"
    for to in ("neuron", "myokit"):
        assert refused_and_unchanged(["export", str(run), "--to", to, "-o", str(run)],
                                     here, capsys) == (
            f"{run}: -o: {input_refused('the run file being exported')}")
    # through a symbolic link, and a hard link (another path, the same inode)
    (here / "link.mod").symlink_to(run)
    os.link(run, here / "hard.mod")
    for name in ("link.mod", "hard.mod"):
        out = here / name
        assert refused_and_unchanged(["export", str(run), "--to", "neuron", "-o", str(out)],
                                     here, capsys) == (
            f"{out}: -o: {input_refused('the run file being exported')}")


def test_export_to_never_writes_over_another_run_file(here: Path, capsys) -> None:
    other = here / "other.mod"  # a run file, whatever its name says
    shutil.copy(here / "run.h5", other)
    for to in ("neuron", "myokit"):
        assert refused_and_unchanged(["export", str(here / "run.h5"), "--to", to, "-o",
                                      str(other)], here, capsys) == f"{other}: -o: {RUN_FILE}"


def test_export_to_never_writes_over_an_nwb_file_kingen_exported(here: Path, capsys) -> None:
    nwb = here / "fitted.nwb"
    assert written_kind(nwb) == "fitted nwb"
    assert refused_and_unchanged(["export", str(here / "run.h5"), "--to", "myokit", "-o",
                                  str(nwb)], here, capsys) == (
        f"{nwb}: -o: {other_kind('fitted nwb', 'myokit')}")


def test_export_to_never_writes_over_a_scheme_or_protocol_file(here: Path, capsys) -> None:
    run = here / "run.h5"
    fitted = here / "fitted.toml"  # kingen wrote it: export --model
    assert refused_and_unchanged(["export", str(run), "--to", "neuron", "-o", str(fitted)],
                                 here, capsys) == (
        f"{fitted}: -o: {other_kind('fitted scheme', 'neuron')}")
    for name in ("protocol.toml", "scheme.toml"):  # the word "kingen" in a header is not ours
        out = here / name
        assert refused_and_unchanged(["export", str(run), "--to", "neuron", "-o", str(out)],
                                     here, capsys) == f"{out}: -o: {NOT_KINGENS}"


def test_export_to_never_writes_over_the_scheme_it_exports(here: Path, capsys) -> None:
    for name in ("scheme.toml", "fitted.toml"):
        scheme = here / name
        assert refused_and_unchanged(["export", str(scheme), "--to", "neuron", "-o",
                                      str(scheme)], here, capsys) == (
            f"{scheme}: -o: {input_refused('the scheme being exported')}")


def test_export_to_replaces_its_own_earlier_export(here: Path, capsys) -> None:
    out = here / "export.mod"
    assert main(["export", str(here / "run.h5"), "--to", "neuron", "-o", str(out)]) == 0
    assert written_kind(out) == "neuron"
    mmt = here / "export.mmt"
    for _ in range(2):
        assert main(["export", str(here / "scheme.toml"), "--to", "myokit", "-o",
                     str(mmt)]) == 0
    assert written_kind(mmt) == "myokit"
    # a .mod export is not a .mmt export
    assert refused_and_unchanged(["export", str(here / "run.h5"), "--to", "myokit", "-o",
                                  str(out)], here, capsys) == (
        f"{out}: -o: {other_kind('neuron', 'myokit')}")


# --------------------------------------------------------------------------- import

def test_import_never_writes_over_the_file_it_imports(here: Path, capsys) -> None:
    mod = here / "export.mod"
    assert written_kind(mod) == "neuron"  # kingen's export header, and still an input
    assert refused_and_unchanged(["import", str(mod), "-o", str(mod)], here, capsys) == (
        f"{mod}: -o: {input_refused('the file being imported')}")
    (here / "sub").mkdir()
    dotted = here / "sub" / ".." / "export.mod"
    assert refused_and_unchanged(["import", str(mod), "-o", str(dotted)], here, capsys) == (
        f"{dotted}: -o: {input_refused('the file being imported')}")


def test_import_never_writes_over_a_scheme_file_with_kingens_header(here: Path,
                                                                   capsys) -> None:
    mod = here / "export.mod"
    fitted = here / "fitted.toml"
    assert refused_and_unchanged(["import", str(mod), "-o", str(fitted)], here, capsys) == (
        f"{fitted}: -o: {other_kind('fitted scheme', 'imported scheme')}")
    shipped = here / "coombs.toml"  # a shipped scheme: its comments name kingen
    shutil.copy(JONAS.with_name("coombs_2017.toml"), shipped)
    assert b"kingen" in shipped.read_bytes()[:4096]
    assert refused_and_unchanged(["import", str(mod), "-o", str(shipped)], here, capsys) == (
        f"{shipped}: -o: {NOT_KINGENS}")
    out = here / "imported.toml"
    for _ in range(2):  # an imported scheme replaces the one it imported before
        assert main(["import", str(mod), "-o", str(out)]) == 0
    assert written_kind(out) == "imported scheme"


# --------------------------------------------------------------------------- batch

def _manifest(folder: Path, config: str, output: str) -> Path:
    demo = folder / config
    demo.write_text((DEMO.parent / "demo.toml").read_text().replace(
        '"demo/', f'"{DEMO}/'))
    manifest = folder / "batch.toml"
    manifest.write_text(f'config = "{config}"\noutput = "{output}"\n')
    return manifest


def test_batch_never_writes_its_summary_over_a_recording_or_a_configuration(
        tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    recording = out / "batch_summary.csv"
    shutil.copy(DEMO / "deactivation.csv", recording)
    manifest = _manifest(tmp_path, "fit.toml", "out")
    assert refused_and_unchanged(["batch", str(manifest), "-q"], tmp_path, capsys) == (
        f"{recording}: output: {NOT_KINGENS}")
    # the base configuration itself, named as the summary, in the batch's folder
    recording.unlink()
    manifest = _manifest(out, "batch_summary.csv", ".")
    role = "the batch's base configuration"
    assert refused_and_unchanged(["batch", str(manifest), "-q"], tmp_path, capsys) == (
        f"{recording}: output: {input_refused(role)}")


# --------------------------------------------------------------------------- devices, pipes

def _reader(fifo: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as fh:
            got.append(fh.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


@pytest.mark.parametrize("command", ["export", "import", "simulate"])
def test_a_fifo_is_written_through_never_replaced(here: Path, command: str, capsys) -> None:
    fifo = here / "pipe"
    os.mkfifo(fifo)
    argv = {"export": ["export", str(here / "run.h5"), "--to", "neuron", "-o", str(fifo)],
            "import": ["import", str(here / "export.mod"), "-o", str(fifo)],
            "simulate": ["simulate", str(here / "scheme.toml"), "--protocol",
                         "deactivation", "--csv", str(fifo)]}[command]
    first = {"export": b"TITLE ", "import": b"# Imported by kingen", "simulate": b"# kingen "}
    thread, got = _reader(fifo)
    assert main(argv) == 0
    thread.join(timeout=30)
    assert got and got[0].startswith(first[command])
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert not [p for p in here.iterdir() if p.name.startswith(".")]  # no temporary left


def _null_device(folder: Path) -> Path:
    """A character device to write to. As root, a null device of the test's own: a writer
    that renamed over a device would otherwise take the place of the system's /dev/null."""
    if os.geteuid() != 0:
        return Path(os.devnull)  # /dev is not writable: a rename over it fails
    node = folder / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("cannot make a character device here")
    return node


def test_a_character_device_and_stdout_are_written_through(here: Path, capfd) -> None:
    null = _null_device(here)
    before = os.stat(null)
    assert main(["export", str(here / "run.h5"), "--to", "neuron", "-o", str(null)]) == 0
    assert main(["simulate", str(here / "scheme.toml"), "--protocol", "deactivation",
                 "--csv", str(null)]) == 0
    after = os.stat(null)
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    capfd.readouterr()
    # /dev/fd/1 is /dev/stdout's target; a rename there fails where /dev/stdout's would not
    assert main(["export", str(here / "run.h5"), "--to", "neuron", "-o", "/dev/fd/1"]) == 0
    out = capfd.readouterr().out
    assert out.startswith("TITLE ") and out.count("NEURON {") == 1
    assert "/dev/fd/1" not in out  # the file's text is the output: no path after it


def test_stdout_opened_on_a_run_file_is_refused(here: Path, capsys) -> None:
    other = here / "other.h5"  # `kingen export ... -o /dev/stdout >> other.h5`
    shutil.copy(here / "run.h5", other)
    fd = os.open(other, os.O_WRONLY | os.O_APPEND)
    try:
        out = f"/dev/fd/{fd}"
        assert refused_and_unchanged(["export", str(here / "run.h5"), "--to", "neuron", "-o",
                                      out], here, capsys) == f"{out}: -o: {RUN_FILE}"
    finally:
        os.close(fd)


def test_a_socket_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    path = Path(tempfile.mkdtemp(dir="/tmp")) / "s"  # a socket's path is short
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    try:
        assert refused(["simulate", str(JONAS), "--protocol", "deactivation", "--csv",
                        str(path)], capsys) == (
            f"{path}: --csv: is a socket, not a file: refusing to write to it (choose "
            "another name)")
        assert stat.S_ISSOCK(path.lstat().st_mode)
    finally:
        sock.close()
        shutil.rmtree(path.parent)


def test_atomic_write_never_renames_over_a_pipe(tmp_path: Path) -> None:
    """Every writer goes through atomic_write: it writes into a pipe, and refuses to take
    the place of one that appears while it writes."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    thread, got = _reader(fifo)
    atomic_write(fifo, lambda tmp: tmp.write_bytes(b"through"))
    thread.join(timeout=30)
    assert got == [b"through"] and stat.S_ISFIFO(fifo.lstat().st_mode)
    late = tmp_path / "late"
    with pytest.raises(KingenError, match="is a named pipe"):
        atomic_write(late, lambda tmp: (tmp.write_bytes(b"x"), os.mkfifo(late)))
    assert stat.S_ISFIFO(late.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late", "pipe"]


# --------------------------------------------------------------------------- the rule

def test_kinds_are_told_by_what_kingen_writes_not_by_the_name(here: Path) -> None:
    assert written_kind(here / "run.h5") == "run file"
    assert written_kind(here / "export.mod") == "neuron"
    assert written_kind(here / "fitted.toml") == "fitted scheme"
    assert written_kind(here / "scheme.toml") is None
    renamed = here / "renamed.png"
    shutil.copy(here / "export.mod", renamed)
    assert written_kind(renamed) == "neuron"
    assert main(["export", str(here / "run.h5"), "--csv", str(here / "csv")]) == 0
    assert written_kind(here / "csv" / "deactivation.csv") == "fitted csv"  # kingen_run: ...
    (here / "mine.mod").write_text("TITLE my kingen model\n")
    assert written_kind(here / "mine.mod") is None
    with pytest.raises(ValueError, match="unknown output kind"):
        check_replaceable(here / "x", kind="run file")


# --------------------------------------------------------------------------- property

def _writers(d: Path) -> dict[str, tuple[list[str], list[str], str]]:
    """Every writing command: (arguments before its output, its input files, and the
    output's name in a folder it writes, '' for a file it is given)."""
    run, scheme, proto, mod = (str(d / n) for n in ("run.h5", "scheme.toml",
                                                      "protocol.toml", "export.mod"))
    return {
        "export --to neuron": (["export", run, "--to", "neuron", "-o"], [run], ""),
        "export scheme --to myokit": (["export", scheme, "--to", "myokit", "-o"], [scheme],
                                      ""),
        "export --model": (["export", run, "--model"], [run], ""),
        "export --nwb": (["export", run, "--nwb"], [run], ""),
        "export --csv": (["export", run, "--csv"], [run], "deactivation.csv"),
        "import": (["import", mod, "-o"], [mod], ""),
        "simulate --csv": (["simulate", scheme, "--protocol", proto, "--csv"],
                           [scheme, proto], ""),
        "simulate --plot": (["simulate", scheme, "--protocol", proto, "--plot"],
                            [scheme, proto], ""),
        "plot": (["plot", run, "--format", "png", "-o"], [run], "convergence.png"),
        "report": (["report", run, "-o"], [run], "report.html"),
    }


@pytest.fixture(scope="module")
def pool(made: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pool")


@pytest.mark.parametrize("how", ["as given", "symbolic link", "hard link", "run file copy"])
@pytest.mark.parametrize("writer", sorted(_writers(Path("."))))
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.integers(0, 9),
       suffix=st.sampled_from(["", ".h5", ".mod", ".mmt", ".toml", ".csv", ".nwb", ".png"]))
def test_no_writer_changes_a_byte_of_its_inputs_or_of_a_run_file(
        made: Path, pool: Path, writer: str, pick: int, how: str, suffix: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each writing command, its output set to one of its inputs or to a run file (as
    given, through a link, or under another name): refused, and no byte changes."""
    d = Path(tempfile.mkdtemp(dir=pool))
    for f in made.iterdir():
        shutil.copy(f, d / f.name)
    before_args, inputs, inside = _writers(d)[writer]
    target = Path(inputs[pick % len(inputs)])
    if how == "run file copy":  # a run file under any name
        target = d / f"copy{suffix}"
        shutil.copy(d / "run.h5", target)
    elif how == "symbolic link":
        (d / f"link{suffix}").symlink_to(target)
        target = d / f"link{suffix}"
    elif how == "hard link":
        os.link(target, d / f"hard{suffix}")
        target = d / f"hard{suffix}"
    out = target
    if inside:  # a folder output: the file it would write there is the target
        out = d / f"folder{suffix}"
        out.mkdir()
        (out / inside).symlink_to(target) if how == "symbolic link" else os.link(
            target, out / inside)
    before = digests(d)
    capsys.readouterr()
    assert main(before_args + [str(out)]) == 2, (writer, how, suffix)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kingen: error: "), err
    assert digests(d) == before, (writer, how, suffix)
