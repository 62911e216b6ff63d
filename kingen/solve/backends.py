"""Which backend runs a batch: the GPU when a working one is present, else all CPU cores."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from kingen.errors import KingenError


@dataclass(frozen=True)
class CudaStatus:
    """Whether numba-cuda can compile and run kernels here, and if not, why."""

    usable: bool
    simulator: bool
    device: str
    reason: str
    # why not, as a word: "" (usable), "missing" (numba-cuda not importable), "numpy"
    # (numpy too new for numba-cuda), "no-gpu", "driver"
    problem: str = ""


def cuda_status() -> CudaStatus:
    """Probe numba-cuda without raising.

    The one GPU probe of kingen: the solver's backend choice, ``kingen info`` and the
    analysis (:func:`kingen.analysis.gpu.require_gpu`) all ask here.
    """
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
    try:
        from numba import cuda
    except Exception as exc:  # numba-cuda missing or broken
        return CudaStatus(False, False, "", f"numba-cuda is not importable ({exc}); "
                          "install kingen[cuda]", "missing")
    if not hasattr(np, "row_stack"):
        try:
            from importlib.metadata import version

            nc = version("numba-cuda")
        except Exception:
            nc = "?"
        if tuple(int(x) for x in nc.split(".")[:2] if x.isdigit()) <= (0, 30):
            return CudaStatus(False, simulator, "", (
                f"numba-cuda {nc} cannot compile kernels with numpy {np.__version__} "
                "(it calls np.row_stack, removed in numpy 2.5); install numpy<2.5"), "numpy")
    if simulator:
        return CudaStatus(True, True, "CUDA simulator", "NUMBA_ENABLE_CUDASIM=1")
    try:
        if not cuda.is_available():
            return CudaStatus(False, False, "", "no CUDA GPU found", "no-gpu")
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        return CudaStatus(True, False, name, "")
    except Exception as exc:
        return CudaStatus(False, False, "", f"CUDA driver error: {exc}", "driver")


def choose_backend(backend: str) -> tuple[str, CudaStatus | None]:
    """Resolve ``auto``, ``cpu`` or ``cuda`` to the backend that will run.

    ``auto`` takes a real GPU when one works (never the CUDA simulator, which is for tests),
    else the CPU. ``cuda`` insists, and fails with the reason when it cannot.
    """
    if backend == "cpu":
        return "cpu", None
    if backend not in ("auto", "cuda"):
        raise KingenError("unknown backend (use auto, cpu or cuda)", field="backend",
                          value=backend)
    status = cuda_status()
    if backend == "cuda":
        if not status.usable:
            raise KingenError(f"the cuda backend cannot run here: {status.reason}",
                              field="backend", value="cuda")
        return "cuda", status
    if status.usable and not status.simulator:
        return "cuda", status
    return "cpu", status
