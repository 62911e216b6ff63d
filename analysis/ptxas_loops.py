"""Registers, spills and the loops' instructions of a generated CUDA launch kernel, without a GPU.

Compiles the sample kernel of Robert & Howe's standard set (or a part of it) for sm_90 with
numba-cuda's NVVM, then runs ``ptxas -v`` (registers, spills) and ``cuobjdump -sass`` on
it, and counts each loop's instructions (a backward branch's body) by the unit that issues
them: float64 and float32 arithmetic, loads and stores (of them, spills to local memory),
shared-memory loads. The span loop is the one with 32 (or 48, with a folded filter) shared
loads and no shuffle: it is unrolled by two spans.

Needs the CUDA toolkit's ``ptxas`` on the PATH, ``cuobjdump`` (the PyPI wheels
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` supply it) and libdevice
(``--libdevice``). Run from the repository root::

    NUMBA_FORCE_CUDA_CC=9.0 python analysis/ptxas_loops.py --lanes 8 --span 16 \\
        --exchange 0.2 --sections 4 --protocols deactivation,desensitization,recovery

(``analysis/h200/optimization_log_exchange.md``, steps 10 and 11, and
``optimization_log_ideal.md``, step 4, count with it).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

UNITS = {
    "float64": ("DFMA", "DMUL", "DADD"),
    "float32": ("FFMA", "FMUL", "FADD"),
    "load/store": ("LDS", "STS", "LDL", "STL", "LDG", "STG"),
    "spills": ("LDL", "STL"),
    "shared loads": ("LDS",),
    "shuffles": ("SHFL",),
}


def loops(sass: str) -> list[list[str]]:
    """The opcodes of each loop body (a backward branch's range) of a SASS listing."""
    ins = [(int(m[1], 16), m[2]) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s*(.*?);", sass)]
    found = []
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m[1], 16) < addr:
            lo = int(m[1], 16)
            found.append([re.sub(r"^@!?U?P\w+ ", "", t).split()[0]
                          for a, t in ins if lo <= a <= addr])
    return found


def counts(ops: list[str]) -> dict[str, int]:
    """Instructions of a loop body by unit (see ``UNITS``)."""
    by_op = collections.Counter(ops)
    out = {"instructions": len(ops)}
    for unit, prefixes in UNITS.items():
        out[unit] = sum(v for k, v in by_op.items() if k.startswith(prefixes))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="float64", choices=("float64", "float32"))
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--span", type=int, default=16)
    ap.add_argument("--exchange", type=float, default=0.0, help="10-90 %% time, ms")
    ap.add_argument("--protocols", default="", help="a part of the standard set (default all)")
    ap.add_argument("--sections", type=int, default=0, help="the filter's sections (4: 8-pole)")
    ap.add_argument("--windows", type=int, default=1, help="feature windows the kernel carries")
    ap.add_argument("--min-loop", type=int, default=60, help="shorter loops are not listed")
    ap.add_argument("--libdevice", default="/usr/local/cuda-13.0/nvvm/libdevice/libdevice.10.bc")
    args = ap.parse_args(argv)

    import numba
    import numba.cuda.cudadrv.libs as libs
    import numba.cuda.cudadrv.nvvm as nvvm
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    # compile for an H100/H200 on a machine without one
    dispatcher.get_current_device = lambda: type("Device", (), {"compute_capability": (9, 0)})
    libs.get_libdevice = lambda: args.libdevice
    if hasattr(nvvm, "get_libdevice"):
        nvvm.get_libdevice = libs.get_libdevice

    from kingen.experiment.protocol import standard_protocol, standard_set
    from kingen.model.scheme import Scheme
    from kingen.solve.compiled import solver_module
    from kingen.solve.plan import plan_propagator
    from kingen.solve.schedule import build_schedule, protocol_sweeps

    scheme = Scheme.load(Path(__file__).resolve().parents[1] / "models" / "robert_howe_2003.toml")
    protocols = ([standard_protocol(n, exchange=args.exchange)
                  for n in args.protocols.split(",")] if args.protocols
                 else standard_set(exchange=args.exchange))
    plan = plan_propagator(scheme, build_schedule(scheme, protocol_sweeps(protocols)[0]),
                           every_constant_row=True)
    module = solver_module(scheme, "objective", args.precision, "cuda", form="propagator",
                           lanes=args.lanes, span=args.span, stage_rows=plan.stage_rows,
                           edge_rows=plan.edge_rows, n_windows=args.windows,
                           n_sections=args.sections)

    def array(dtype, ndim: int):
        return numba.types.Array(numba.from_dtype(np.dtype(dtype)), ndim, "C")

    F = args.precision
    span = ((array(F, 4), array(F, 4), array(F, 4), array("f8", 3), array("i8", 1))
            if args.span > 1 and args.sections else
            (array(F, 4), array(F, 4)) if args.span > 1 else ())
    sig = numba.types.void(
        numba.int64, numba.int64, array(F, 2), array(F, 2), array("f8", 2), array("i8", 2),
        array("i8", 1), array("i8", 1), array("f8", 1), array("i8", 1), array("f8", 1),
        array("f8", 3), array("i8", 1), numba.float64, array(F, 4), *span,
        array("f8", 1), array("f8", 1), array("i8", 3), array("f8", 3), array("i4", 2))
    ptx, _ = cuda.compile_ptx(module.launch.py_func, sig, cc=(9, 0))
    with tempfile.TemporaryDirectory() as folder:
        src, cubin = Path(folder) / "launch.ptx", Path(folder) / "launch.cubin"
        src.write_text(ptx)
        info = subprocess.run(["ptxas", "-v", "-arch=sm_90", str(src), "-o", str(cubin)],
                              capture_output=True, text=True, check=True).stderr
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    print(f"source: {module.__file__}")
    for line in info.splitlines():
        if "registers" in line or "spill" in line:
            print(line.strip())
    for body in loops(sass):
        if len(body) >= args.min_loop:
            print(", ".join(f"{k} {v}" for k, v in counts(body).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
