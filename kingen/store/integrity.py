"""A run file's integrity: the writer lock, opening (a truncated or damaged file refused in
one line; a file left open by a killed writer rebuilt from what it committed), the
marker and version checks, and the refusal to overwrite inputs or files that are not run
files. The consistency of counters and data is :mod:`kingen.store.consistency`'s.
"""

from __future__ import annotations

import errno
import os
import platform
import re
import stat
import struct
from collections.abc import Mapping
from pathlib import Path

import h5py

from kingen.errors import KingenError
from kingen.store.datasets import as_text
from kingen.store.layout import LAYOUT_VERSION, MARKER, REQUIRED_GROUPS

try:  # POSIX; elsewhere a run file is not locked against a second writer
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

_ALREADY_OPEN = "already open for write"
_RECORD = 256  # bytes of the lock file's "<pid> <host>" record, padded with spaces


# --------------------------------------------------------------------------- the writer lock

class WriterLock:
    """An OS lock (``flock``) held by the one process that writes a run file.

    The lock is on a hidden sibling, ``.<run file name>.lock``, not on the run file: the
    run file is replaced (``--overwrite``, a killed run's rebuild) while the lock is held.
    The holder writes its PID and host into the lock file, for the refusal message. The
    OS drops the lock when the holder dies, however it dies, so a killed run never leaves
    a stale lock. The lock file is opened without following a link and is never truncated:
    one that is a link, not a regular file, or holds anything but a holder's record is
    refused in one line and left as it is.
    """

    def __init__(self, run_path: Path) -> None:
        self.run_path = run_path
        self.path = run_path.with_name(f".{run_path.name}.lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise KingenError naming the process that holds it."""
        if fcntl is None or self._fd is not None:  # pragma: no cover - not POSIX
            return
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, _RECORD, 0).decode("utf-8", "replace").split()
                os.close(fd)
                who = (f"process {holder[0]} on {holder[1]}" if len(holder) >= 2
                       else "another process")
                raise KingenError(f"the run file is being written by {who} (lock "
                                  f"{self.path.name}); wait for that run to end, or stop it",
                                  file=str(self.run_path)) from None
            # The previous holder removes the lock file before letting go: if the path no
            # longer names the file locked here, lock again.
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            self._check_record(fd)
            # A record of fixed width covers any earlier one: the file is never truncated
            # (a truncation is what a lock that is not kingen's must never get).
            mine = f"{os.getpid()} {platform.node()}".encode()[: _RECORD - 1]
            os.pwrite(fd, mine.ljust(_RECORD - 1) + b"\n", 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _refuse(self, what: str) -> KingenError:
        return KingenError(f"the lock file {self.path.name} beside the run file {what}; kingen "
                           f"makes its own lock file there: remove {self.path.name}",
                           file=str(self.run_path))

    def _open(self) -> int:
        """The lock file, opened (or created) without following a link: a lock that is
        not a regular file of its own is refused in one line, and never written."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISLNK(mode):
            raise self._refuse("is a symbolic link, which kingen does not follow")
        if mode is not None and not stat.S_ISREG(mode):
            raise self._refuse("is not a regular file")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                         0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # made a link since the look above
                raise self._refuse("is a symbolic link, which kingen does not follow"
                                   ) from None
            raise KingenError(f"cannot create the lock file {self.path.name} beside the "
                              f"run file: {exc.strerror}", file=str(self.run_path)) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise self._refuse("is not a regular file" if not stat.S_ISREG(st.st_mode)
                               else "has another name too (a hard link to another file)")
        return fd

    def _check_record(self, fd: int) -> None:
        """KingenError unless the locked file is empty or holds a holder's record (a run
        killed before it could remove its lock file leaves one)."""
        text = os.pread(fd, _RECORD + 1, 0)
        if text and (len(text) > _RECORD or not re.fullmatch(rb"\d+ [^\s]*\s*", text)):
            raise self._refuse("holds something other than kingen's record of the process "
                               "writing the run")

    def release(self) -> None:
        """Let go of the lock (removing the lock file first, while still holding it)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None


def mark_writer(run: h5py.Group) -> None:
    """Record which process writes the file (attributes are fixed once SWMR starts)."""
    run.attrs["writer_pid"] = os.getpid()
    run.attrs["writer_host"] = platform.node()


def _live_writer(f: h5py.File) -> int | None:
    """The id of a process on this host that is still writing the file, if any."""
    run = f["run"]
    pid = int(run.attrs.get("writer_pid", 0))
    if not pid or as_text(run.attrs.get("writer_host", "")) != platform.node():
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def corrupt_error(name: str, exc: BaseException) -> KingenError:
    """The one-line error for a run file HDF5 cannot read (``exc``, from h5py)."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    detail = " ".join(str(text).split()) or type(exc).__name__
    if isinstance(exc, KeyError):
        # h5py's answer for an object that is not in the file: the file itself is readable
        # HDF5 (opening names the items it needs; this is for what a reader looks up later)
        return KingenError(f"incomplete or damaged run file: an item it needs is missing "
                           f"(HDF5 says: {detail}); restore the file from a copy", file=name)
    return KingenError(f"not a readable HDF5 file: corrupt or truncated run file (HDF5 says: "
                       f"{detail})", file=name)


def missing_error(name: str, path: str, kind: str) -> KingenError:
    """The one-line error for a group or dataset the run file should have and has not."""
    return KingenError(f"missing {kind}: the run file is incomplete or damaged (deleted or "
                       "never written); restore it from a copy", file=name, field=path)


def _unreadable(p: Path) -> KingenError:
    # HDF5's own words vary between its versions and say little more: left out
    return KingenError("not a readable HDF5 file: its header (superblock) or metadata is "
                       "damaged, or the file is incomplete", file=str(p))


def _superblock(p: Path) -> tuple[int, int] | None:
    """(consistency flags, end-of-file address) of a version 2 or 3 HDF5 superblock.

    None for other superblocks (or a user block before it): the checks that use it are
    then left to HDF5.
    """
    with open(p, "rb") as fh:
        head = fh.read(48)
    if len(head) < 48 or head[:8] != b"\x89HDF\r\n\x1a\n" or head[8] not in (2, 3):
        return None
    if head[9] != 8:  # size of offsets: kingen files, like h5py's, use 8
        return None
    return head[11], struct.unpack("<Q", head[28:36])[0]


def _check_eof(p: Path) -> tuple[int, int] | None:
    """The superblock's (flags, end of file); KingenError if the file is shorter."""
    info = _superblock(p)
    size = p.stat().st_size
    if info is not None and info[1] > size:
        # Checked here because an SWMR reader skips HDF5's own check, then waits on
        # metadata that is not there.
        raise KingenError(f"truncated run file: {size} bytes where its HDF5 header says "
                          f"{info[1]} (an incomplete copy?)", file=str(p))
    return info


def open_read(p: Path) -> h5py.File:
    """Open for reading: as an SWMR reader when a writer has (or had) the file open."""
    info = _check_eof(p)
    swmr_first = info is None or info[0] != 0
    attempts = (True, False) if swmr_first else (False,)
    error: Exception | None = None
    for swmr in attempts:
        try:
            if swmr:
                return h5py.File(p, "r", libver="latest", swmr=True, locking=False)
            return h5py.File(p, "r", locking=False)
        # h5py raises RuntimeError for some damaged superblocks
        except (OSError, RuntimeError, ValueError) as exc:
            error = error or exc
    assert error is not None
    raise _unreadable(p) from None


def open_append(p: Path) -> h5py.File:
    """Open a run file to append, rebuilding one left by a killed writer first."""
    _check_eof(p)
    if not os.access(p, os.W_OK) or not os.access(p.parent, os.W_OK):
        raise KingenError("cannot open the run file for writing: it or its folder is "
                          "read-only (it is not damaged: kingen plot and report read it)",
                          file=str(p))
    try:
        return h5py.File(p, "a", libver="latest")
    except PermissionError as exc:
        raise KingenError(f"cannot open the run file for writing: {exc.strerror}",
                          file=str(p)) from None
    except (OSError, RuntimeError, ValueError) as exc:
        if _ALREADY_OPEN not in str(exc):
            raise _unreadable(p) from None
    # The superblock still says a writer has the file: either one does, or a run was
    # killed. A live writer would have to be stopped first; a killed run's file is
    # rebuilt from what it committed.
    _rebuild(p)
    try:
        return h5py.File(p, "a", libver="latest")
    except (OSError, RuntimeError, ValueError):
        raise _unreadable(p) from None


def _rebuild(p: Path) -> None:
    """Copy a file left open by a killed writer into a fresh file, then swap it in.

    HDF5 refuses to open such a file for writing (its superblock still marks the writer);
    an SWMR reader can read it, and everything it committed is copied. A kill during the
    copy leaves the original untouched.
    """
    tmp = p.with_name(f".{p.name}.rebuild.tmp")
    src = open_read(p)
    try:
        check_marker(src, str(p))
        pid = _live_writer(src)
        if pid is not None:
            raise KingenError(f"the run is still being written by process {pid}: stop it "
                              "before resuming", file=str(p))
        with h5py.File(tmp, "w", libver="latest") as dst:
            for k, v in src.attrs.items():
                dst.attrs[k] = v
            for member in src:
                src.copy(src[member], dst, name=member)
    except BaseException:
        src.close()
        tmp.unlink(missing_ok=True)
        raise
    src.close()
    os.replace(tmp, p)


def refuse_inputs(p: Path, inputs: Mapping[str, str]) -> None:
    """KingenError if ``p`` is one of the run's input files."""
    for path, role in inputs.items():
        q = Path(path)
        same = q.resolve() == p.resolve()
        if not same and q.exists() and p.exists():
            same = os.path.samefile(q, p)
        if same:
            raise KingenError(f"output is this fit's {role} ({path}); refusing to overwrite "
                              "an input: choose another output file", file=str(p))


def refuse_non_run(p: Path) -> None:
    """KingenError unless ``p`` carries the kingen run-file marker (it is then replaced)."""
    if not is_run_file(p):
        raise KingenError("not a kingen run file; refusing to overwrite it (choose another "
                          "output file, or remove this one yourself)", file=str(p))


def is_run_file(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is an HDF5 file with the kingen run marker (of any layout version,
    damaged or not: only the marker is read)."""
    p = Path(path)
    try:
        if not p.is_file() or p.stat().st_size == 0 or not h5py.is_hdf5(p):
            return False
        with open_read(p) as f:
            marker = f.attrs.get("kingen_run")
            return marker is not None and as_text(marker) == MARKER
    except (KingenError, OSError, RuntimeError, ValueError):
        return False


def check_marker(f: h5py.File, name: str) -> None:
    """KingenError unless ``f`` is a kingen run file of this layout version with its
    top-level groups."""
    marker = f.attrs.get("kingen_run")
    if marker is None or as_text(marker) != MARKER:
        raise KingenError("an HDF5 file, but not a kingen run file (no 'kingen_run' "
                          "attribute on its root group)", file=name)
    version = f.attrs.get("layout_version")
    try:
        version = int(version)
    except (TypeError, ValueError):
        raise KingenError("run file without a valid layout version", file=name,
                          field="/layout_version", value=version) from None
    if version > LAYOUT_VERSION:
        raise KingenError(f"run file of layout version {version}, written by a newer kingen; "
                          f"this kingen reads up to version {LAYOUT_VERSION}: upgrade kingen "
                          "(pip install -U kingen)", file=name, field="/layout_version",
                          value=version)
    if version < LAYOUT_VERSION:
        # Version 1 kept the resume state as a pickle, which runs code when it is read: such
        # a file is not read at all (not even its plots), rather than half-trusted.
        raise KingenError(f"run file of layout version {version}, from an older kingen: its "
                          "resume state is a Python pickle, which could run code when read, "
                          f"so this kingen (layout version {LAYOUT_VERSION}) refuses it; run "
                          "the fit again", file=name, field="/layout_version", value=version)
    for group in REQUIRED_GROUPS:
        need_member(f, name, group, h5py.Group)


def need_member(f: h5py.File, name: str, path: str, kind: type[h5py.Group] | type[h5py.Dataset]
          ) -> None:
    """KingenError naming ``path`` unless it is a ``kind`` (a group or a dataset)."""
    what = "group" if kind is h5py.Group else "dataset"
    obj = f.get(path)
    if obj is None:
        raise missing_error(name, f"/{path}", what)
    if not isinstance(obj, kind):
        found = "group" if isinstance(obj, h5py.Group) else "dataset"
        raise KingenError(f"a {found} where a {what} belongs: the run file is damaged or was "
                          "edited; restore it from a copy", file=name, field=f"/{path}")
