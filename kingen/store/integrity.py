"""A run file's integrity: the writer lock, opening (a truncated or damaged file refused in
one line; a file left open by a killed writer rebuilt from what it committed), the
marker and version checks, the consistency of counters and data, the resume state's
schema, and the refusal to overwrite inputs or files that are not run files.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import stat
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kingen.errors import KingenError
from kingen.store.datasets import (
    _READ_TRIES,
    MAX_COLUMNS,
    MAX_STATE_DIMS,
    STATE_KINDS,
    _col,
    _key,
    _load,
    _one,
    _text,
)
from kingen.store.layout import (
    LAYOUT_VERSION,
    MARKER,
    PROFILE_DATASETS,
    PROTOCOL_ATTRIBUTES,
    PROTOCOL_DATASETS,
    RECORDING_DATASETS,
    REQUIRED_ATTRIBUTES,
    REQUIRED_DATASETS,
    REQUIRED_GROUPS,
    REQUIRED_SUBGROUPS,
    TARGET_DATASETS,
)

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


def _mark_writer(run: h5py.Group) -> None:
    """Record which process writes the file (attributes are fixed once SWMR starts)."""
    run.attrs["writer_pid"] = os.getpid()
    run.attrs["writer_host"] = platform.node()


def _live_writer(f: h5py.File) -> int | None:
    """The id of a process on this host that is still writing the file, if any."""
    run = f["run"]
    pid = int(run.attrs.get("writer_pid", 0))
    if not pid or _text(run.attrs.get("writer_host", "")) != platform.node():
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


def _corrupt(name: str, exc: BaseException) -> KingenError:
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    detail = " ".join(str(text).split()) or type(exc).__name__
    if isinstance(exc, KeyError):
        # h5py's answer for an object that is not in the file: the file itself is readable
        # HDF5 (opening names the items it needs; this is for what a reader looks up later)
        return KingenError(f"incomplete or damaged run file: an item it needs is missing "
                           f"(HDF5 says: {detail}); restore the file from a copy", file=name)
    return KingenError(f"not a readable HDF5 file: corrupt or truncated run file (HDF5 says: "
                       f"{detail})", file=name)


def _missing(name: str, path: str, kind: str) -> KingenError:
    """The one-line error for a group or dataset the run file should have and has not."""
    return KingenError(f"missing {kind}: the run file is incomplete or damaged (deleted or "
                       "never written); restore it from a copy", file=name, field=path)


def _need(f: h5py.File, name: str, path: str, kind: type[h5py.Group] | type[h5py.Dataset]
          ) -> None:
    """KingenError naming ``path`` unless it is a ``kind`` (a group or a dataset)."""
    what = "group" if kind is h5py.Group else "dataset"
    obj = f.get(path)
    if obj is None:
        raise _missing(name, f"/{path}", what)
    if not isinstance(obj, kind):
        found = "group" if isinstance(obj, h5py.Group) else "dataset"
        raise KingenError(f"a {found} where a {what} belongs: the run file is damaged or was "
                          "edited; restore it from a copy", file=name, field=f"/{path}")


def _need_attribute(f: h5py.File, name: str, path: str, attribute: str) -> None:
    """KingenError naming ``/path@attribute`` unless the object at ``path`` has it."""
    if attribute not in f[path].attrs:
        raise _missing(name, f"/{path}@{attribute}", "attribute")


def _check_required(f: h5py.File, name: str, protocols: list[str]) -> None:
    """Every group and dataset a run file has from its creation is there, checked once at
    opening, so that every reader (and resume, before it writes) refuses a file with a gap
    in one line naming it, rather than failing later or drawing without it."""
    for path in REQUIRED_SUBGROUPS:
        _need(f, name, path, h5py.Group)
    # A file from before /profiles lacks the whole group; one with part of it is damaged
    # (kingen profile would take it for absent and fail to add it).
    for path in REQUIRED_DATASETS + (PROFILE_DATASETS if "profiles" in f else ()):
        _need(f, name, path, h5py.Dataset)
    for p in protocols:
        key = _key(p)
        _need(f, name, f"best/traces/{key}", h5py.Group)
        paths = list(PROTOCOL_DATASETS)
        for group, parts in (("data", RECORDING_DATASETS), ("targets", TARGET_DATASETS)):
            if key in f[group]:  # optional: a protocol fits a recording, targets or both
                _need(f, name, f"{group}/{key}", h5py.Group)
                paths += parts
        for path in paths:
            _need(f, name, path.replace("<p>", key), h5py.Dataset)
        for path, attribute in PROTOCOL_ATTRIBUTES:
            _need_attribute(f, name, path.replace("<p>", key), attribute)
    for path, attribute in REQUIRED_ATTRIBUTES:
        _need_attribute(f, name, path, attribute)


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


def _open_read(p: Path) -> h5py.File:
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


def _open_append(p: Path) -> h5py.File:
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
    src = _open_read(p)
    try:
        _validate(src, str(p))
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


def _validate(f: h5py.File, name: str) -> None:
    marker = f.attrs.get("kingen_run")
    if marker is None or _text(marker) != MARKER:
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
        _need(f, name, group, h5py.Group)


def _inconsistent(name: str, field: str, value: Any, what: str) -> KingenError:
    return KingenError(f"inconsistent run file: {what}", file=name, field=field, value=value)


def _check_consistency(f: h5py.File, name: str) -> list[str]:
    """Check once, at opening, that the counters agree with the data; returns the protocol
    names. Attributes carry no checksum, so they are checked against the datasets too."""
    _validate(f, name)
    _need_attribute(f, name, "protocols", "names")
    try:
        names = json.loads(_text(f["protocols"].attrs["names"]))
    except (KeyError, ValueError) as exc:
        raise _inconsistent(name, "/protocols.names", None, f"unreadable ({exc})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _inconsistent(name, "/protocols.names", names, "not a list of protocol names")
    for n in names:
        if _key(n) not in f["protocols"] or not isinstance(f["protocols"][_key(n)], h5py.Group):
            raise _inconsistent(name, "/protocols.names", n, "no group for this protocol")

    _check_required(f, name, names)

    def ds(path: str, ndim: int, kind: str) -> h5py.Dataset:
        obj = f[path]  # there: checked by _check_required
        if obj.ndim != ndim or obj.dtype.kind not in kind:
            raise _inconsistent(name, f"/{path}", f"{obj.dtype} {obj.shape}",
                                f"expected {ndim} dimensions of kind {kind!r}")
        if f.swmr_mode and f.mode == "r":
            obj.refresh()
        return obj

    n_par = ds("scheme/parameters", 1, "V").shape[0]
    n_prot = len(names)
    commit = np.asarray(_load(ds("run/commit", 1, "iu")), dtype=np.int64)
    if commit.shape != (3,):
        raise _inconsistent(name, "/run/commit", commit.shape, "expected 3 counters")
    rows, slot = int(commit[0]), int(commit[1])
    gen = {k: ds(f"generations/{k}", nd, kind) for k, nd, kind in (
        ("population", 3, "f"), ("errors", 3, "f"), ("fitness", 2, "f"), ("fail", 2, "i"),
        ("generation", 1, "i"), ("size", 1, "i"), ("stats", 2, "f"), ("timings", 2, "f"))}
    if rows < 0 or any(d.shape[0] < rows for d in gen.values()):
        short = min(d.shape[0] for d in gen.values())
        raise _inconsistent(name, "/run/commit[0]", rows, f"generations committed, but "
                            f"{short} rows stored")
    if slot not in (0, 1):
        raise _inconsistent(name, "/run/commit[1]", slot, "resume slot out of range (0 or 1)")
    width = gen["population"].shape[1]
    widths = {"population": (width, n_par), "errors": (width, n_prot), "fitness": (width,),
              "fail": (width,), "stats": (MAX_COLUMNS,), "timings": (MAX_COLUMNS,)}
    for k, want in widths.items():
        if gen[k].shape[1:] != want:
            raise _inconsistent(name, f"/generations/{k}", gen[k].shape,
                                f"rows of the wrong width (expected {want})")
    if rows:
        sizes = np.asarray(_load(gen["size"], np.s_[:rows]))
        bad = np.flatnonzero((sizes < 0) | (sizes > width))
        if bad.size:
            raise _inconsistent(name, f"/generations/size[{bad[0]}]", int(sizes[bad[0]]),
                                f"more candidates than the {width} rows stored")
        last = int(_load(gen["generation"], rows - 1))
        if last != int(commit[2]):
            raise _inconsistent(name, "/run/commit[2]", int(commit[2]), "is not the last "
                                f"committed generation number ({last})")
        res = f["resume"]
        if f"slot_{slot}" not in res:
            raise _inconsistent(name, f"/resume/slot_{slot}", None, "missing resume slot")
    for path, length in (("generations/free_mask", n_par), ("best/params", n_par),
                         ("best/errors", n_prot), ("best/amplitudes", n_prot),
                         ("generations/stats_names", MAX_COLUMNS),
                         ("generations/timings_names", MAX_COLUMNS)):
        d = ds(path, 1, "biufS")
        if d.shape[0] != length:
            raise _inconsistent(name, f"/{path}", d.shape[0], f"length, expected {length}")
        if path.endswith("_names"):  # resume writes new names beside these: checked first
            for i, raw in enumerate(np.asarray(_load(d)).tolist()):
                try:
                    _text(raw)
                except UnicodeDecodeError:
                    raise _inconsistent(name, f"/{path}[{i}]", raw, "a column name that is "
                                        "not UTF-8 text") from None
    hof_size = int(_one(ds("hall_of_fame/size", 1, "iu")))
    hof = ds("hall_of_fame/params", 2, "f")
    hof_fit = ds("hall_of_fame/fitness", 1, "f")
    if hof.shape[1:] != (n_par,) or not 0 <= hof_size <= min(hof.shape[0], hof_fit.shape[0]):
        raise _inconsistent(name, "/hall_of_fame/size", hof_size, "does not match the stored "
                            f"hall of fame {hof.shape}")
    for p in names:
        g = f["data"].get(_key(p))
        if isinstance(g, h5py.Group):
            n_samples = np.asarray(_load(ds(f"{g.name[1:]}/n_samples", 1, "iu")))
            cur = ds(f"{g.name[1:]}/current_pA", 2, "f")
            if n_samples.shape[0] != cur.shape[0] or (n_samples > cur.shape[1]).any() or (
                    n_samples < 0).any():
                raise _inconsistent(name, f"{g.name}/n_samples", n_samples.tolist(),
                                    f"does not match the stored sweeps {cur.shape}")
            # Read beside the current sample for sample: another shape misaligns them.
            for other in ["time_ms"] + (["concentration_mM"] if "concentration_mM" in g
                                        else []):
                arr = ds(f"{g.name[1:]}/{other}", 2, "f")
                if arr.shape != cur.shape:
                    raise _inconsistent(name, f"{g.name}/{other}", arr.shape, "does not "
                                        f"match the stored current {cur.shape}")
    _check_scheme(f, name, ds)
    _check_settings(f, name)
    _check_positive(name, "hall_of_fame/params", _load(hof, np.s_[:hof_size]), f)
    table = _load(f["scheme/parameters"])
    for column in ("value", "lower", "upper"):  # the bounds the reports scale by
        _check_positive(name, f"scheme/parameters.{column}", table[column], f)
    # A live writer rewrites the best candidate (valid = 0 meanwhile) between two reads of
    # a reader: what failed is read again before it is called damaged.
    tries = _READ_TRIES if f.swmr_mode and f.mode == "r" else 1
    for attempt in range(tries):
        try:
            if int(_one(ds("best/valid", 1, "biu"))) == 1:  # else ignored by the readers
                _check_positive(name, "best/params", _load(ds("best/params", 1, "f")), f)
                _check_best_json(name, names, ds)
            break
        except KingenError:
            if attempt + 1 == tries:
                raise
            time.sleep(0.05)
    return names


def _check_scheme(f: h5py.File, name: str, ds: Any) -> None:
    """The stored scheme text parses, and is the scheme the tables beside it describe (the
    readers take the parameters' order from the table and their units from the text)."""
    from kingen.model.scheme import Scheme

    try:  # force: the size limits were passed, or lifted, when the run started
        scheme = Scheme.loads(_text(_one(ds("scheme/text", 1, "SO"))), "/scheme/text",
                              force=True)
    except KingenError as exc:
        raise _inconsistent(name, "/scheme/text", None, f"not a valid scheme "
                            f"({exc.format().removeprefix('/scheme/text: ')})") from None
    t = _load(ds("scheme/transitions", 1, "V"))
    stored = {"states": _col(_load(ds("scheme/states", 1, "V")), "name"),
              "parameters": _col(_load(ds("scheme/parameters", 1, "V")), "name"),
              "transitions": [f"{a} -> {b} ({k})" for a, b, k in zip(
                  _col(t, "source"), _col(t, "target"), _col(t, "param"), strict=True)]}
    text = {"states": list(scheme.states), "parameters": list(scheme.param_names),
            "transitions": [f"{scheme.states[x.source]} -> {scheme.states[x.target]} "
                            f"({scheme.parameters[x.param].name})" for x in scheme.transitions]}
    for table, names in stored.items():
        if names != text[table]:
            k = next((i for i, (a, b) in enumerate(zip(names, text[table])) if a != b),
                     min(len(names), len(text[table])))
            raise _inconsistent(name, "/scheme/text", None, f"not the scheme of the run's "
                                f"tables: {table[:-1]} {k + 1} is {_nth(text[table], k)} in "
                                f"the text, {_nth(names, k)} in /scheme/{table}; restore the "
                                "run file from a copy")


def _nth(items: list[str], k: int) -> str:
    return repr(items[k]) if k < len(items) else "none"


def _check_positive(name: str, path: str, values: np.ndarray, f: h5py.File) -> None:
    """Rate constants a reader takes for fitted values are > 0 (NaN is left: the readers
    pass over a candidate that is not finite)."""
    rows = np.atleast_2d(values)
    bad = np.argwhere(rows <= 0)
    if bad.size:
        i, k = (int(x) for x in bad[0])
        names = _col(_load(f["scheme/parameters"]), "name")
        at = f"[{k}]" if np.ndim(values) == 1 else f"[{i}, {k}]"
        path, dot, column = path.partition(".")
        raise _inconsistent(name, f"/{path}{at}{dot}{column}", float(rows[i, k]),
                            f"the rate constant {names[k]} must be > 0; restore the run file "
                            "from a copy")


def _check_settings(f: h5py.File, name: str) -> None:
    """The stored settings are a JSON object (what each command needs of them is checked
    where it is used: resume, for one, by :func:`kingen.fitting.config.stored_settings`)."""
    text = _text(_one(f["config/settings"]))
    try:
        settings = json.loads(text)
    except ValueError as exc:
        raise _inconsistent(name, "/config/settings", text, f"not valid JSON ({exc})"
                            ) from None
    if not isinstance(settings, dict):
        raise _inconsistent(name, "/config/settings", text, "not an object of JSON")


def _json_dataset(name: str, path: str, ds: Any) -> Any:
    """The JSON held (as NUL-padded UTF-8 bytes) in the dataset at ``path``; KingenError
    naming it when the bytes are not UTF-8 JSON."""
    raw = bytes(np.asarray(_load(ds(path, 1, "u")), dtype=np.uint8)).rstrip(b"\0")
    try:
        return json.loads(raw.decode("utf-8")) if raw else None
    except UnicodeDecodeError:
        raise _inconsistent(name, f"/{path}", None, "not UTF-8 text") from None
    except ValueError as exc:
        raise _inconsistent(name, f"/{path}", raw.decode("utf-8"),
                            f"not valid JSON ({exc})") from None


def _check_best_json(name: str, names: list[str], ds: Any) -> None:
    """The best candidate's JSON blobs parse, and its traces' metadata (labels, has_data
    and n_sweeps per protocol) agrees with the stored traces: every reader and resume
    refuse a file whose metadata was damaged or edited, rather than trusting it."""
    for path, kinds, want in (("best/features", (dict,), "an object"),
                              ("best/polish", (dict, type(None)), "an object or null")):
        if not isinstance(_json_dataset(name, path, ds), kinds):
            raise _inconsistent(name, f"/{path}", None, f"not {want} of JSON")
    info = _json_dataset(name, "best/traces_info", ds)
    keys = ("labels", "has_data", "n_sweeps")
    if not isinstance(info, dict) or not all(isinstance(info.get(k), dict) for k in keys):
        raise _inconsistent(name, "/best/traces_info", _dumps_short(info), "expected an "
                            "object of labels, has_data and n_sweeps, each by protocol")
    for p, n in info["n_sweeps"].items():
        field = f"/best/traces_info.n_sweeps.{p}"
        if p not in names:
            raise _inconsistent(name, field, n, f"not a protocol of the run (protocols are "
                                f"{', '.join(names)})")
        rows = ds(f"best/traces/{_key(p)}/n_samples", 1, "iu").shape[0]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= rows:
            raise _inconsistent(name, field, n, f"not a sweep count from 0 to {rows} (the "
                                "rows stored)")
        labels = info["labels"].get(p)
        if not isinstance(labels, list) or len(labels) != n or not all(
                isinstance(x, str) for x in labels):
            raise _inconsistent(name, f"/best/traces_info.labels.{p}", _dumps_short(labels),
                                f"expected a list of {n} sweep labels")
        if not isinstance(info["has_data"].get(p), bool):
            raise _inconsistent(name, f"/best/traces_info.has_data.{p}",
                                _dumps_short(info["has_data"].get(p)), "expected true or "
                                "false")


def _dumps_short(obj: Any) -> str:
    """JSON text of ``obj`` for a message (the message cuts it)."""
    return json.dumps(obj)[:200]


def _state_schema(fields: Mapping[str, tuple[Any, tuple[int, ...]]]
                  ) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    out = {}
    for name, (dtype, shape) in fields.items():
        dt = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        if (not name or "/" in name or name in ("shapes", ".") or dt.kind not in STATE_KINDS
                or len(shape) > MAX_STATE_DIMS):
            raise ValueError(f"resume state field {name!r}: numbers of up to "
                             f"{MAX_STATE_DIMS} dimensions only ({dt}, {shape})")
        out[name] = (dt, shape)
    return out


def _state_names(g: h5py.Group) -> list[str]:
    """A resume slot's field names, checked: each a dataset of numbers, nothing else."""
    where = g.name
    try:
        names = json.loads(_text(g.attrs["fields"]))
    except (KeyError, ValueError):
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise KingenError("inconsistent run file: no list of resume state fields",
                          file=g.file.filename, field=f"{where}.fields")
    if set(g) != set(names) | {"shapes"}:
        raise KingenError("inconsistent run file: resume state fields do not match the slot's "
                          "datasets", file=g.file.filename, field=where,
                          value=sorted(set(g) ^ (set(names) | {"shapes"})))
    shapes = g["shapes"]
    if not isinstance(shapes, h5py.Dataset) or shapes.shape != (
            max(len(names), 1), MAX_STATE_DIMS) or shapes.dtype.kind != "i":
        raise KingenError("inconsistent run file: malformed table of resume state shapes",
                          file=g.file.filename, field=f"{where}/shapes")
    for n in names:
        ds = g[n]
        ndim = ds.attrs.get("ndim") if isinstance(ds, h5py.Dataset) else None
        if (ndim is None or ds.dtype.kind not in STATE_KINDS or ds.dtype.fields is not None
                or int(ndim) != ds.ndim - (ds.ndim == 1 and int(ndim) == 0)):
            raise KingenError("malformed resume state: only arrays of numbers are read",
                              file=g.file.filename, field=f"{where}/{n}",
                              value=str(getattr(ds, "dtype", type(ds).__name__)))
    return names


def _refuse_inputs(p: Path, inputs: Mapping[str, str]) -> None:
    """KingenError if ``p`` is one of the run's input files."""
    for path, role in inputs.items():
        q = Path(path)
        same = q.resolve() == p.resolve()
        if not same and q.exists() and p.exists():
            same = os.path.samefile(q, p)
        if same:
            raise KingenError(f"output is this fit's {role} ({path}); refusing to overwrite "
                              "an input: choose another output file", file=str(p))


def _refuse_non_run(p: Path) -> None:
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
        with _open_read(p) as f:
            marker = f.attrs.get("kingen_run")
            return marker is not None and _text(marker) == MARKER
    except (KingenError, OSError, RuntimeError, ValueError):
        return False
