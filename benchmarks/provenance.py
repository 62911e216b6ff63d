"""Where a benchmark result came from, and where it goes in the results tree.

Every suite writes one JSON file whose ``provenance`` block records the exact command (as
``python -m benchmarks SUITE ...``), the git commit (and whether the tree had changes), the
device and host, and the versions of Python and the libraries that matter. By default the
file goes to ``benchmarks/results/<device>/<suite>.json``, or
``benchmarks/results/<device>/<suite>/<name>.json`` with ``--name``.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import platform
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# Folder names of the devices results were measured on so far
_KNOWN = (("H100", "h100"), ("H200", "h200"), ("A100", "a100"))
_LIBRARIES = ("numpy", "scipy", "numba", "numba_cuda", "deap", "h5py", "jax", "cupy")


def gpu_name() -> str | None:
    """The first CUDA device's name, or None (no GPU, or numba-cuda cannot see one)."""
    try:
        from numba import cuda

        if not cuda.is_available():
            return None
        name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - any failure to find a GPU means: no GPU
        return None


def gpu_count() -> int:
    """How many CUDA devices numba-cuda sees (0 without one)."""
    try:
        from numba import cuda

        return len(cuda.gpus) if cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - any failure to find a GPU means: no GPU
        return 0


def device_folder(gpu: str | None = None, count: int | None = None) -> str:
    """``h100``, ``h200``, ... for a GPU (``h200x2`` for a host of two); ``cpu-<n>core``
    without one. With ``gpu`` given and no ``count``, one GPU."""
    if gpu is None:
        gpu, count = gpu_name(), gpu_count()
    if not gpu:
        return f"cpu-{os.cpu_count()}core"
    suffix = f"x{count}" if count and count > 1 else ""
    for key, folder in _KNOWN:
        if key in gpu:
            return folder + suffix
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") + suffix


def results_path(suite: str, name: str | None = None, device: str | None = None) -> Path:
    """``benchmarks/results/<device>/<suite>.json`` or ``.../<suite>/<name>.json``."""
    base = RESULTS / (device or device_folder())
    return base / suite / f"{name}.json" if name else base / f"{suite}.json"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def versions() -> dict[str, str]:
    """Python's and the libraries' versions (those installed), and kingen's."""
    out = {"python": platform.python_version()}
    for lib in ("kingen", *_LIBRARIES):
        try:
            out[lib] = str(importlib.import_module(lib).__version__)
        except (ImportError, AttributeError):
            continue
    return out


def provenance(suite: str, argv: list[str]) -> dict[str, Any]:
    """The ``provenance`` block of a result: command, commit, device, host, versions."""
    gpu = gpu_name()
    return {
        "suite": suite,
        "command": shlex.join(["python", "-m", "benchmarks", suite, *argv]),
        "git_commit": _git("rev-parse", "HEAD") or "unknown (no git)",
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "device": gpu or "cpu",
        "device_folder": device_folder(gpu, gpu_count() if gpu else None),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "versions": versions(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
    }


def write(result: dict[str, Any], out: Path) -> Path:
    """Write ``result`` as JSON (folders created); returns the path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return out


def add_output_options(ap: Any, suite: str) -> None:
    """``--out`` and ``--name``: where the result goes (by default in the results tree)."""
    ap.add_argument("--out", type=Path, default=None,
                    help=f"JSON file to write (default benchmarks/results/<device>/{suite}.json, "
                         f"or .../{suite}/NAME.json with --name)")
    ap.add_argument("--name", default=None, help="name of this run within the suite's folder")


def output_path(args: Any, suite: str) -> Path:
    """The file a suite writes, from ``--out`` and ``--name``."""
    return args.out if args.out is not None else results_path(suite, args.name)
