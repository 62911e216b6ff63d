"""Room on the disk for a run file's next write, checked before HDF5 starts it, and a
disk that filled during one told in one line.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np

from kingen.errors import KingenError
from kingen.experiment.recordings import Recording


def disk_full(exc: OSError) -> str | None:
    """``No space left on device`` or ``Disk quota exceeded`` where ``exc`` (h5py's, which
    carries the C library's words in its text, not in ``errno``) says the disk is full."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return os.strerror(exc.errno)
    text = str(exc)
    for code in (errno.ENOSPC, errno.EDQUOT):
        if os.strerror(code) in text or f"errno = {code}," in text:
            return os.strerror(code)
    return None


def need_space(path: Path, need: int, then: str = "") -> None:
    """Refuse a write of about ``need`` bytes the disk holding ``path`` has no room for:
    HDF5 that runs out of space part-way cannot close the file (tracebacks by the
    hundred, then a crash, and a file it cannot read again)."""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return  # nothing to go on: HDF5 will say
    if free < need:
        then = then or " free some space and run it again"
        raise KingenError(f"the disk holding the run file is full ({free / 1e6:.1f} MB free; "
                          f"the next write needs about {need / 1e6:.1f} MB):{then}",
                          file=str(path))


def recording_bytes(recording: Recording | None) -> int:
    """The size of a recording's samples (0 for none)."""
    if recording is None:
        return 0
    arrays = [recording.time_ms, recording.current_pA, recording.concentration_mM]
    return 8 * sum(sum(np.asarray(a).size for a in (x if isinstance(x, list) else [x]))
                   for x in arrays if x is not None)
