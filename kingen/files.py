"""Writing a file through a temporary one beside it: a crash never leaves half a file.

The one helper every writer of user-visible files uses (recordings, exports, reports,
figures).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Any) -> None:
    """Write through ``write(tmp_path)`` to a temporary file, then move it into place.

    A crash or a user error part-way leaves the old file (or none), never half a file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keep the suffix: pynwb warns about an HDF5 file not named .nwb.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}",
                               dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
