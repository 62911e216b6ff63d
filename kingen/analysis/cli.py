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


def add_tune_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``tune``: time every launch variant of the solver kernel, keep the fastest."""
    p = subparsers.add_parser(
        "tune", help="pick the fastest launch of the solver kernel for this GPU",
        description="Time every launch variant of the RK4 solver kernel (threads per block, "
        "register cap) on this GPU, check each against the CPU backend, and record the "
        "fastest; later fits with the same scheme and precision use it.")
    p.add_argument("model", nargs="?", help="scheme file (default: Robert & Howe 2003)")
    p.add_argument("--precision", choices=["float64", "float32"], default="float64")
    p.add_argument("--candidates", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=5, help="timed launches per variant")
    p.add_argument("--out", type=Path, help="also write the timings as JSON here")
    p.set_defaults(func=cmd_tune)
    return p


def cmd_tune(args: argparse.Namespace) -> int:
    """Run ``kingen tune``; no GPU is one line and exit 0."""
    import json

    from kingen.solve.backends import cuda_status

    status = cuda_status()
    if not status.usable or status.simulator:
        print(f"kingen tune: no usable CUDA GPU ({status.reason}); tuning measures one")
        return 0
    from kingen.analysis.tune import tune
    from kingen.scheme import Scheme
    from kingen.solve import cuda as solver_cuda

    cases = solver_cuda.analysis_cases(args.model, n_candidates=args.candidates,
                                       precision=args.precision,
                                       variants=solver_cuda.VARIANTS)
    model = cases[0].extra["model"]
    result = tune(cases, key=f"rk4-{model}-{args.precision}", repeats=args.repeats,
                  use_cache=False)
    best = next(c for c in cases if c.name == result.best)
    config = solver_cuda.LaunchConfig(**best.extra["variant"])
    scheme_path = args.model or Path(solver_cuda.__file__).resolve().parents[2] / "models" / (
        model + ".toml")
    path = solver_cuda.record_tuning(status.device, Scheme.load(scheme_path), args.precision,
                                     config, result.to_json())
    print(f"{'variant':40s} {'median ms':>10s} {'rel. error':>11s}")
    for c in cases:
        t = result.times_ms.get(c.name, float("nan"))
        print(f"{c.name:40s} {t:10.3f} {result.errors.get(c.name, float('nan')):11.2e}")
    print(f"fastest: {config.name} on {status.device}; recorded in {path}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result.to_json(), indent=1))
    return 0
