"""Guarded access to numba-cuda: one clear message when no usable GPU is present."""

from __future__ import annotations

import os
from typing import Any

from kingen.errors import KingenError

NO_GPU = "no CUDA GPU found: kingen analyze needs one; run it on a machine with an NVIDIA GPU"


def simulator_enabled() -> bool:
    """True when Numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def cuda_module() -> Any:
    """Import and return ``numba.cuda``; raise :class:`KingenError` when it is missing."""
    try:
        from numba import cuda
    except ImportError as exc:  # numba-cuda is an extra
        raise KingenError(
            f"numba-cuda is not installed ({exc}); install kingen[cuda]", field="analysis"
        ) from exc
    return cuda


def require_gpu() -> Any:
    """Return ``numba.cuda`` when a real GPU is usable, else raise the one-line error.

    Asks the solver's probe (:func:`kingen.solve.backends.cuda_status`, kingen's only one).
    The simulator counts as no GPU: timings and counters from it mean nothing. A missing
    numba-cuda or a numpy too new for it is an installation problem, not "no GPU".
    """
    from kingen.solve.backends import cuda_status

    if simulator_enabled():
        raise KingenError(NO_GPU + " (the CUDA simulator is on: NUMBA_ENABLE_CUDASIM=1)")
    status = cuda_status()
    if status.usable:
        return cuda_module()
    if status.problem == "missing":
        raise KingenError(status.reason, field="analysis")
    if status.problem == "numpy":
        raise KingenError(status.reason, field="numpy")
    raise KingenError(NO_GPU + (f" ({status.reason})" if status.reason and
                                status.reason != "no CUDA GPU found" else ""))


def synchronize() -> None:
    """Wait for the device (no-op under the simulator)."""
    cuda_module().synchronize()
