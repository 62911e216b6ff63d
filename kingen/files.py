"""Writing a file through a temporary one beside it: a crash never leaves half a file.

The one helper every writer of user-visible files uses (recordings, exports, reports,
figures).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def _file_mode() -> int:
    """rw for everyone the umask allows: what ``open()`` would have given."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()


def atomic_write(path: Path, write: Any) -> None:
    """Write through ``write(tmp_path)`` to a temporary file, then move it into place.

    A crash or a user error part-way leaves the old file (or none), never half a file. The
    file gets the permissions ``open()`` would have given it (``mkstemp`` makes its
    temporary file readable by its owner alone, and the rename would keep that).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keep the suffix: pynwb warns about an HDF5 file not named .nwb.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}",
                               dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
