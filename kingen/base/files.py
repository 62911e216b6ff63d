"""Reading a user's text file, and writing a file through a temporary one beside it.

:func:`read_text` is the one reader of text input files (schemes, protocols,
configurations, CSV recordings): a missing or unreadable file is a one-line
:class:`~kingen.errors.KingenError` naming it. :func:`atomic_write` is the one helper every
writer of user-visible files uses (recordings, exports, reports, figures): a crash never
leaves half a file.

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
import tempfile
from pathlib import Path
from typing import Any

from kingen.errors import KingenError


def _file_mode() -> int:
    """rw for everyone the umask allows: what ``open()`` would have given."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()


def check_replaceable(path: str | os.PathLike[str], field: str | None = None) -> None:
    """Refuse to replace a file kingen did not write (a recording, a configuration, a
    scheme file the user wrote): an output may only replace an earlier output. kingen's
    outputs name it (a header line, a description); nothing else is looked at.

    Raises
    ------
    KingenError
        Naming the file.

    Examples
    --------
    >>> import tempfile
    >>> mine = Path(tempfile.mkdtemp()) / "cell.csv"
    >>> _ = mine.write_text("time_ms,current_pA\\n0,-1\\n")
    >>> check_replaceable(mine, "--csv")
    Traceback (most recent call last):
    ...
    kingen.errors.KingenError: ...cell.csv: --csv: exists and kingen did not write it: ...
    """
    p = Path(path)
    if not p.is_file():
        return
    try:
        with open(p, "rb") as fh:
            # HDF5 (NWB) keeps its strings anywhere in the file; text outputs say it first
            head = fh.read() if p.suffix.lower() in (".nwb", ".h5") else fh.read(4096)
    except OSError:
        return  # the write itself will say what is wrong
    if b"kingen" not in head:
        raise KingenError("exists and kingen did not write it: refusing to replace it "
                          "(choose another name, or remove it yourself)", file=str(p),
                          field=field)


def atomic_write(path: Path, write: Any) -> None:
    """Write through ``write(tmp_path)`` to a temporary file, then move it into place.

    A crash or a user error part-way leaves the old file (or none), never half a file. The
    file gets the permissions ``open()`` would have given it (``mkstemp`` makes its
    temporary file readable by its owner alone, and the rename would keep that).
    """
    if path.is_dir():
        raise OSError(errno.EISDIR, "it is a folder", str(path))
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
        os.replace(tmp, path)
    except OSError as exc:  # named as the user gave it, not by the temporary file
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
