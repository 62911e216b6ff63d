"""Reading a user's text file, and writing a file through a temporary one beside it.

:func:`read_text` is the one reader of text input files (schemes, protocols,
configurations, CSV recordings): a missing or unreadable file is a one-line
:class:`~kingen.errors.KingenError` naming it. :func:`atomic_write` is the one helper every
writer of user-visible files uses (recordings, exports, reports, figures): a crash never
leaves half a file. :func:`check_replaceable` is the one rule of what an output may
replace: never an input of its command, never a run file, only an earlier output of its
own kind.

Examples
--------
>>> read_text("no/such/scheme.toml", what="scheme file")
Traceback (most recent call last):
...
kingen.errors.KingenError: no/such/scheme.toml: scheme file not found
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kingen.errors import KingenError


def _file_mode() -> int:
    """rw for everyone the umask allows: what ``open()`` would have given."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()


FITTED_MARK = "kingen fitted model current, not a recording"
"""What kingen's exports of fitted currents say they are (a CSV comment, NWB ``notes``)."""

OUTPUT_KINDS: dict[str, str] = {
    "run file": "a kingen run file",
    "fitted scheme": "a fitted scheme kingen exported",
    "imported scheme": "a scheme file kingen imported",
    "neuron": "a NEURON .mod file kingen exported",
    "myokit": "a Myokit .mmt file kingen exported",
    "fitted csv": "a CSV of fitted currents kingen exported",
    "simulated csv": "a CSV of currents kingen simulated",
    "fitted nwb": "an NWB file of fitted currents kingen exported",
    "figure": "a figure kingen drew",
    "report": "a report kingen wrote",
    "batch summary": "a batch summary kingen wrote",
}
"""Every kind of file kingen writes, and how a message names one: an output replaces only a
file of its own kind, and a run file is replaced by no output (see
:func:`check_replaceable`)."""

_HEAD = 64 << 10  # kingen's marks sit in a file's first lines (a PDF's, in its last KiB)
_HDF5 = b"\x89HDF\r\n\x1a\n"
_STREAMS = {stat.S_IFCHR: "a character device", stat.S_IFIFO: "a named pipe (FIFO)"}
_NODES = {stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}
# a descriptor the shell opened (`-o /dev/stdout > out.mod`): written to, never replaced
_DESCRIPTOR = re.compile(r"/dev/(stdout|stderr|fd/\d+)|/proc/(self|\d+)/fd/\d+")
# the first columns of batch_summary.csv (kingen.scaleout.summary.FIRST_COLUMNS)
_SUMMARY_HEAD = b"id,cell,scheme,seed,status,reason,"
_REPORT_HTML = b"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>kingen fit: "


def _text_kind(head: bytes, tail: bytes) -> str | None:
    """The kind of a text or image file kingen wrote, from the marks it writes, or None."""
    lines = [line.rstrip(b"\r") for line in head.split(b"\n", 5)[:5]]
    first = lines[0]
    if first.startswith(b"# Fitted by kingen "):
        return "fitted scheme"
    if first.startswith(b"# Imported by kingen from "):
        return "imported scheme"
    if first.startswith(b"TITLE ") and first.endswith(b"(kingen export)"):
        return "neuron"
    if len(lines) > 3 and first == b"[[model]]" and lines[1].startswith(b"name: kingen_") \
            and lines[2] == b'desc: """' and lines[3].endswith(b"(kingen export)"):
        return "myokit"
    if re.fullmatch(rb"# kingen \S+ simulate", first):
        return "simulated csv"
    for line in head.split(b"\n"):
        if not line.startswith(b"#"):
            break
        if line.rstrip(b"\r") == b"# synthetic: " + FITTED_MARK.encode():
            return "fitted csv"
    if first.startswith(_SUMMARY_HEAD) or (
            first == b"<!DOCTYPE html>" and b"\n<title>kingen batch " in head[:4096]):
        return "batch summary"
    if first.startswith(b"# kingen fit: ") or head.startswith(_REPORT_HTML):
        return "report"
    if (head.startswith(b"\x89PNG") and b"tEXtSoftware\x00kingen " in head) or (
            head.startswith(b"%PDF") and b"/Creator (kingen " in tail) or re.search(
            rb"<dc:creator>\s*<cc:\w+>\s*<dc:title>kingen ", head):
        return "figure"
    return None


def _hdf5_kind(path: Path, head: bytes) -> str | None:
    """``run file`` for an HDF5 file with the run marker, ``fitted nwb`` for kingen's NWB
    export of fitted currents, else None."""
    import h5py

    f = None
    for swmr in (True, False):  # a live run is open for SWMR writing
        try:
            f = h5py.File(path, "r", libver="latest", swmr=swmr, locking=False)
            break
        except (OSError, RuntimeError, ValueError):
            continue
    if f is None:  # damaged: its root's attribute names still tell a run file
        return "run file" if b"kingen_run" in head else None
    with f:
        if "kingen_run" in f.attrs:
            return "run file"
        notes = f.get("general/notes")
        try:
            text = notes[()] if isinstance(notes, h5py.Dataset) else b""
        except (OSError, RuntimeError, ValueError, TypeError):
            return None
        text = text if isinstance(text, bytes) else str(text).encode()
        return "fitted nwb" if FITTED_MARK.encode() in text else None


def written_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind (a key of :data:`OUTPUT_KINDS`) of a regular file kingen wrote, or None for
    any other file (the user's, or none there). Kinds are told by the marks kingen writes
    (header lines, metadata, the run marker), never by the file's name.

    Examples
    --------
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.mod").write_text("TITLE Jonas 1993 (kingen export)\\n")
    >>> written_kind(folder / "a.mod")
    'neuron'
    >>> _ = (folder / "b.mod").write_text("TITLE my kingen model\\n")
    >>> written_kind(folder / "b.mod") is None
    True
    """
    try:  # a device or a pipe is not opened at all (a reader may change what it does)
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never waits on a pipe
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        head = fh.read(_HEAD)
        fh.seek(max(st.st_size - _HEAD, 0))
        tail = fh.read(_HEAD)
    if head.startswith(_HDF5):
        return _hdf5_kind(Path(path), head)
    return _text_kind(head, tail)


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file: the same path once links are resolved, or the same
    inode (a hard link, or a link :meth:`Path.resolve` cannot see through)."""
    try:
        if Path(a).resolve() == Path(b).resolve():
            return True
        return os.path.samefile(a, b)
    except (OSError, RuntimeError):  # one is missing, or a link loop
        return False


def writes_through(path: str | os.PathLike[str]) -> bool:
    """Whether :func:`atomic_write` writes into ``path`` as it is instead of replacing it:
    a character device (``/dev/null``, a terminal), a named pipe, or a descriptor the shell
    opened (``/dev/stdout``)."""
    if _DESCRIPTOR.fullmatch(os.path.abspath(path)):
        return True
    try:
        return stat.S_IFMT(os.stat(path).st_mode) in _STREAMS
    except OSError:
        return False


def check_replaceable(path: str | os.PathLike[str], field: str | None = None, *, kind: str,
                      inputs: Mapping[str | os.PathLike[str], str] | None = None) -> None:
    """Refuse an output path whose file must not be replaced, before any work is done.

    The rule, the same for every command that writes a file:

    - no output replaces one of its command's ``inputs`` (path -> what it is, e.g.
      ``"the run file being exported"``), compared as resolved paths and as inodes;
    - no output replaces a run file (only the fit that writes it does, with
      ``--overwrite``);
    - an output replaces only a file of its own ``kind`` that kingen wrote (a key of
      :data:`OUTPUT_KINDS`): a ``.mod`` export an earlier ``.mod`` export, a figure a
      figure; never a recording, configuration or scheme file of the user's;
    - a character device or named pipe is written through (:func:`atomic_write`), never
      replaced; another file that is not a regular file is refused.

    Raises
    ------
    KingenError
        One line naming the file and what it is.

    Examples
    --------
    >>> import tempfile
    >>> mine = Path(tempfile.mkdtemp()) / "cell.csv"
    >>> _ = mine.write_text("time_ms,current_pA\\n0,-1\\n")
    >>> check_replaceable(mine, "--csv", kind="simulated csv")
    Traceback (most recent call last):
    ...
    kingen.errors.KingenError: ...cell.csv: --csv: exists and kingen did not write it: ...
    >>> check_replaceable(mine, "-o", kind="neuron", inputs={mine: "the file being imported"})
    Traceback (most recent call last):
    ...
    kingen.errors.KingenError: ...cell.csv: -o: is the file being imported: ...
    """
    if kind not in OUTPUT_KINDS or kind == "run file":
        raise ValueError(f"unknown output kind {kind!r}")
    p, name = Path(path), str(path)
    for given, role in (inputs or {}).items():
        if same_file(p, given):
            raise KingenError(f"is {role}: no output replaces its command's input (choose "
                              "another name)", file=name, field=field)
    found = written_kind(p)  # the file behind /dev/stdout too (`>> run.h5`)
    if found == "run file":
        raise KingenError("is a kingen run file: only the fit that writes it replaces it "
                          "(kingen fit --overwrite); choose another name", file=name,
                          field=field)
    if writes_through(p):
        return
    try:
        mode = stat.S_IFMT(os.stat(p).st_mode)
    except OSError:
        return  # nothing there; or the write itself will say what is wrong
    if mode in _NODES:
        raise KingenError(f"is {_NODES[mode]}, not a file: refusing to write to it (choose "
                          "another name)", file=name, field=field)
    if mode != stat.S_IFREG or found == kind:
        return  # a folder (the writer says so), or an earlier output of this kind
    if found is not None:
        raise KingenError(f"is {OUTPUT_KINDS[found]}, not {OUTPUT_KINDS[kind]}: refusing to "
                          "replace it (choose another name, or remove it yourself)", file=name,
                          field=field)
    raise KingenError("exists and kingen did not write it: refusing to replace it (choose "
                      "another name, or remove it yourself)", file=name, field=field)


def atomic_write(path: Path, write: Any) -> None:
    """Write through ``write(tmp_path)`` to a temporary file, then move it into place.

    A crash or a user error part-way leaves the old file (or none), never half a file. The
    file gets the permissions ``open()`` would have given it (``mkstemp`` makes its
    temporary file readable by its owner alone, and the rename would keep that). A
    character device or a named pipe (``-o /dev/null``, ``-o /dev/stdout``) is written
    through, never replaced; a block device or a socket is refused.
    """
    if path.is_dir():
        raise OSError(errno.EISDIR, "it is a folder", str(path))
    if writes_through(path):
        _write_through(path, write)
        return
    _refuse_node(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Keep the suffix: pynwb warns about an HDF5 file not named .nwb.
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}",
                                   dir=path.parent)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, FILE_MODE)
        _refuse_node(path)  # one made while writing is still never renamed over
        os.replace(tmp, path)
    except OSError as exc:  # named as the user gave it, not by the temporary file
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _refuse_node(path: Path) -> None:
    """KingenError if ``path`` is a device, a pipe or a socket: a rename would take its
    place (as root, ``/dev/null``'s)."""
    try:
        mode = stat.S_IFMT(os.stat(path).st_mode)
    except OSError:
        return
    what = _NODES.get(mode) or _STREAMS.get(mode)
    if what is not None:
        raise KingenError(f"is {what}, not a file: refusing to replace it (choose another "
                          "name)", file=str(path))


def _write_through(path: Path, write: Any) -> None:
    """Write into a character device, pipe or open descriptor without replacing it: the
    writer writes a temporary file of its own (h5py and matplotlib may seek in it), whose
    bytes are then copied in."""
    with tempfile.TemporaryDirectory(prefix="kingen-") as folder:
        tmp = Path(folder) / f"output{path.suffix}"
        write(tmp)
        try:
            # no O_CREAT: what is not there is not made; O_APPEND: a file the shell opened
            # (`>>`) is added to, not written over from its start
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        with os.fdopen(fd, "wb") as out, open(tmp, "rb") as src:
            try:
                shutil.copyfileobj(src, out)
                out.flush()
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def read_text(path: str | os.PathLike[str], *, what: str = "file",
              encoding: str = "utf-8") -> str:
    """The text of a user's input file.

    Raises
    ------
    KingenError
        ``<what> not found`` when there is no such file, ``cannot read: <reason>`` when it
        cannot be read or decoded; both name the file as given.
    """
    name, p = str(path), Path(path)
    if p.is_dir():
        raise KingenError(f"is a folder, not a {what}", file=name)
    if not p.is_file():
        raise KingenError(f"{what} not found", file=name)
    try:
        return p.read_text(encoding=encoding)
    except (OSError, UnicodeDecodeError) as exc:
        raise KingenError(f"cannot read: {exc}", file=name) from None
