"""The ``kingen analyze`` sub-command: wire with ``add_analyze_parser(subparsers)``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kingen.analysis._gpu import NO_GPU
from kingen.errors import KingenError


def add_analyze_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``analyze`` to the ``kingen`` sub-commands; its handler is :func:`cmd_analyze`."""
    p = subparsers.add_parser(
        "analyze", help="measure GPU kernels and classify them as compute-, memory- or "
        "latency-bound",
        description="Check, time and profile kernels (the solver's, or the stencil and SGEMM "
        "references), classify each against the measured device ceilings, print a table and "
        "write JSON and roofline plots.")
    p.add_argument("target", choices=["rk4", "stencil", "sgemm", "all"])
    p.add_argument("--out", type=Path, default=Path("kingen-analyze"),
                   help="output folder (default: ./kingen-analyze)")
    p.add_argument("--no-ncu", action="store_true",
                   help="skip Nsight Compute: CUDA-event timing and declared counts only")
    p.add_argument("--size", choices=["default", "small"], default="default",
                   help="problem size of the reference kernels")
    p.add_argument("--remeasure", action="store_true",
                   help="re-run the device micro-benchmarks instead of using the cache")
    p.add_argument("--repeats", type=int, default=20, help="timed launches per kernel")
    p.add_argument("--compute-threshold", type=float, default=70.0, metavar="PCT")
    p.add_argument("--memory-threshold", type=float, default=70.0, metavar="PCT")
    p.set_defaults(func=cmd_analyze)
    return p


def cmd_analyze(args: argparse.Namespace) -> int:
    """Run ``kingen analyze``; user problems print one line. Returns the exit code.

    No GPU is not an error (exit 0, one line); any other user-fixable problem exits 1.
    """
    from kingen.analysis.classify import Thresholds

    try:
        from kingen.analysis.report import run_analyze

        run_analyze(args.target, args.out, use_ncu=not args.no_ncu, size=args.size,
                    remeasure=args.remeasure, repeats=args.repeats,
                    thresholds=Thresholds(compute_pct=args.compute_threshold,
                                          memory_pct=args.memory_threshold))
    except KingenError as exc:
        print(f"kingen analyze: {exc}")
        return 0 if str(exc).startswith(NO_GPU) else 1
    return 0
