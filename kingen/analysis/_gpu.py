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

    The simulator counts as no GPU: timings and counters from it mean nothing.
    """
    if simulator_enabled():
        raise KingenError(NO_GPU + " (the CUDA simulator is on: NUMBA_ENABLE_CUDASIM=1)")
    cuda = cuda_module()
    try:
        ok = cuda.is_available()
    except Exception:  # a broken driver install reads as no GPU, not as a traceback
        ok = False
    if not ok:
        raise KingenError(NO_GPU)
    _check_numpy_compat()
    return cuda


def _check_numpy_compat() -> None:
    # numba-cuda 0.30 calls np.row_stack, which numpy 2.5 removed: every kernel would fail
    # to compile with an AttributeError deep inside numba; say it once, up front.
    import numpy as np

    if not hasattr(np, "row_stack"):
        raise KingenError(
            "this numpy has no np.row_stack, which numba-cuda <0.31 needs to compile kernels; "
            "install numpy<2.5",
            field="numpy",
            value=np.__version__,
        )


def synchronize() -> None:
    """Wait for the device (no-op under the simulator)."""
    cuda_module().synchronize()
