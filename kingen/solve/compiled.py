"""Turn generated solver source into importable modules for Numba's CPU and CUDA targets.

The source is written to a file in kingen's cache folder and imported from there, so that
Numba's on-disk cache (``cache=True``) keeps the compiled code between runs: a scheme
compiles once per machine, not once per process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from kingen.codegen import generate
from kingen.protocol import EDGE_HALF_WIDTH_SIGMAS
from kingen.scheme import Scheme

_LOADED: dict[str, ModuleType] = {}

# Occupancies below these are set to zero after each CPU step (subnormals are ~100x slower on
# Intel cores; see ``generate``). Above them every product, compensation term and square in
# the step and the objective stays a normal number.
CPU_FLUSH_BELOW = {"float64": 1e-100, "float32": 1e-25}

_CPU_HEADER = """\
import math
import numpy as np
from numba import njit, prange

F = np.{precision}
EDGE = {edge!r}
RSQRT2 = 0.7071067811865476
DEVICE = njit(cache=True, nogil=True)
"""

_CPU_LAUNCH = """

@njit(parallel=True, cache=True)
def launch(N, n_sweeps, P, S0, rows_f, rows_i, row_start, pulses, pulse_start, transients,
           transient_start, drive, sample_start, tol, a0, a1, a2, a3, fail):
    for i in prange(N * n_sweeps):
        run_thread(i % N, i // N, P, S0, rows_f, rows_i, row_start, pulses, pulse_start,
                   transients, transient_start, drive, sample_start, tol, a0, a1, a2, a3,
                   fail)
"""

_CUDA_HEADER = """\
import math
import numpy as np
from numba import cuda

F = np.{precision}
EDGE = {edge!r}
RSQRT2 = 0.7071067811865476
DEVICE = cuda.jit(device=True)
"""

_CUDA_LAUNCH = """

@cuda.jit({options})
def launch(N, n_sweeps, P, S0, rows_f, rows_i, row_start, pulses, pulse_start, transients,
           transient_start, drive, sample_start, tol, a0, a1, a2, a3, fail):
    i = cuda.grid(1)
    if i < N * n_sweeps:
        run_thread(i % N, i // N, P, S0, rows_f, rows_i, row_start, pulses, pulse_start,
                   transients, transient_start, drive, sample_start, tol, a0, a1, a2, a3,
                   fail)
"""


def cache_dir() -> Path:
    """kingen's cache folder: ``$KINGEN_CACHE``, else ``~/.cache/kingen``."""
    root = os.environ.get("KINGEN_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "kingen"
    try:
        path.mkdir(parents=True, exist_ok=True)
        # a probe of its own: a shared name races with other processes probing at once
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test."):
            pass
    except OSError:
        path = Path(tempfile.gettempdir()) / "kingen-cache"
        path.mkdir(parents=True, exist_ok=True)
    return path


def solver_module(scheme: Scheme, mode: str, precision: str, target: str, *,
                  with_occupancy: bool = False, simulator: bool = False,
                  max_registers: int | None = None) -> ModuleType:
    """The compiled solver module for a scheme, mode, precision and target (cpu or cuda).

    The module has ``launch``: for the CPU a parallel function over all (candidate, sweep)
    pairs, for CUDA a kernel with one thread per pair.
    """
    code = generate(scheme, mode, with_occupancy=with_occupancy,
                    compensated=precision == "float32",
                    flush_below=CPU_FLUSH_BELOW[precision] if target == "cpu" else 0.0)
    if target == "cpu":
        text = _CPU_HEADER.format(precision=precision, edge=EDGE_HALF_WIDTH_SIGMAS)
        text += "\n" + code.source + _CPU_LAUNCH
    elif target == "cuda":
        text = _CUDA_HEADER.format(precision=precision, edge=EDGE_HALF_WIDTH_SIGMAS)
        options = [] if simulator else ["cache=True"]
        if max_registers and not simulator:
            options.append(f"max_registers={int(max_registers)}")
        text += "\n" + code.source + _CUDA_LAUNCH.format(options=", ".join(options))
    else:
        raise ValueError(target)
    regs = f"_r{max_registers}" if max_registers and target == "cuda" else ""
    name = f"kingen_rk4_{target}_{precision}_{code.key}{regs}{'_sim' if simulator else ''}"
    if name in _LOADED:
        return _LOADED[name]
    folder = cache_dir() / "solvers"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _LOADED[name] = module
    return module
