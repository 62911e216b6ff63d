"""The ``kingen analyze`` sub-command: wire with ``add_analyze_parser(subparsers)``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kingen.analysis.gpu import NO_GPU
from kingen.errors import KingenError


def _model_args(p: argparse.ArgumentParser, positional: bool = False,
                protocols: str = "desensitization") -> None:
    """``--model`` (and an optional positional MODEL): a scheme file or a shipped name."""
    if positional:
        p.add_argument("model_pos", nargs="?", metavar="MODEL",
                       help="scheme file or shipped scheme name (same as --model)")
    p.add_argument("--model", metavar="MODEL",
                   help="scheme file (TOML) or the name of a shipped scheme, e.g. "
                   "jonas_1993 (default: robert_howe_2003, the largest shipped)")
    p.add_argument("--precision", choices=["float64", "float32"],
                   help="solver precision (analyze: both by default; tune: float64)")
    p.add_argument("--candidates", type=int, default=16384, metavar="N",
                   help="candidates in the solver's batch (default 16384)")
    p.add_argument("--protocols", default=protocols,
                   choices=["desensitization", "standard"],
                   help="protocol set of the batch: desensitization (one sweep) or standard "
                   "(deactivation, desensitization, recovery, dose-response: the set the "
                   f"benchmarks and the fits run); default {protocols}")


def _model(args: argparse.Namespace) -> str | None:
    pos = getattr(args, "model_pos", None)
    if pos and args.model and pos != args.model:
        raise KingenError("give the scheme once, as MODEL or as --model", field="model",
                          value=f"{pos} / {args.model}")
    return args.model or pos


def add_analyze_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``analyze`` to the ``kingen`` sub-commands; its handler is :func:`cmd_analyze`."""
    p = subparsers.add_parser(
        "analyze", help="measure GPU kernels and classify them as compute-, memory- or "
        "latency-bound",
        description="Check, time and profile kernels (the solver's, or the stencil and SGEMM "
        "references), classify each against the measured device ceilings, print a table and "
        "write JSON and roofline plots. Prints a line as each step starts; by default ncu "
        "collects only the counters the classifier reads (rk4: about 2 minutes on an H100); "
        "--full collects every section.")
    p.add_argument("target", choices=["rk4", "stencil", "sgemm", "all"])
    p.add_argument("--out", type=Path, default=Path("kingen-analyze"),
                   help="output folder (default: ./kingen-analyze)")
    p.add_argument("--no-ncu", action="store_true",
                   help="skip Nsight Compute: CUDA-event timing and declared counts only")
    p.add_argument("--full", action="store_true",
                   help="collect ncu's full set of sections and SASS counters (slow: "
                   "minutes per solver kernel)")
    p.add_argument("--size", choices=["default", "small"], default="default",
                   help="problem size of the reference kernels")
    _model_args(p)
    p.add_argument("--remeasure", action="store_true",
                   help="re-run the device micro-benchmarks instead of using the cache")
    p.add_argument("--repeats", type=int, default=20,
                   help="most timed samples per kernel (each kernel is timed ~2 s)")
    p.add_argument("--compute-threshold", type=float, default=70.0, metavar="PCT")
    p.add_argument("--memory-threshold", type=float, default=70.0, metavar="PCT")
    p.set_defaults(handler=cmd_analyze)
    return p


def cmd_analyze(args: argparse.Namespace) -> int:
    """Run ``kingen analyze``; user problems print one line. Returns the exit code.

    No GPU is not an error (exit 0, one line); any other user-fixable problem exits 1.
    """
    from kingen.analysis.classify import Thresholds

    try:
        rk4 = {"model": _model(args), "n_candidates": args.candidates,
               "precision": args.precision, "protocols": args.protocols}
        from kingen.analysis.report import run_analyze

        run_analyze(args.target, args.out, use_ncu=not args.no_ncu, size=args.size,
                    remeasure=args.remeasure, repeats=args.repeats,
                    thresholds=Thresholds(compute_pct=args.compute_threshold,
                                          memory_pct=args.memory_threshold),
                    full=args.full, rk4=rk4)
    except KingenError as exc:
        print(f"kingen analyze: {exc}", flush=True)
        return 0 if str(exc).startswith(NO_GPU) else 1
    return 0


def add_tune_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``tune``: the solver kernel's optimization loop (:mod:`kingen.analysis.optimize`)."""
    p = subparsers.add_parser(
        "tune", help="optimize the solver kernel for this GPU and record the choice",
        description="Classify the RK4 solver kernel (compute-, memory- or latency-bound), "
        "build the variants its verdict calls for (propagator form, lanes, register caps at "
        "the occupancy critical points, block size), check each against the exact "
        "reference, time and re-classify it, and keep going while a step gains >= 5 %. "
        "Writes optimization_log.md/.json and roofline.png to --out and records the choice "
        "for this device, scheme and precision; later fits use it. Prints a line per step. "
        "Without a usable GPU it says so in one line and exits 0.")
    # tuning records the launch later fits use: measure it on the set they run
    _model_args(p, positional=True, protocols="standard")
    p.add_argument("--out", type=Path, default=Path("kingen-tune"),
                   help="output folder (default: ./kingen-tune)")
    p.add_argument("--no-ncu", action="store_true",
                   help="skip Nsight Compute: classify from event timing and declared counts "
                   "(by default ncu re-classifies the baseline and each step's best)")
    p.add_argument("--full", action="store_true", help="ncu's full set of counters (slow)")
    p.add_argument("--references", type=Path, metavar="ANALYZE_JSON",
                   help="take the stencil and SGEMM roofline points from a previous "
                   "`kingen analyze all` (its analyze.json) instead of measuring them")
    p.add_argument("--max-steps", type=int, default=6, help="most steps of the loop")
    p.add_argument("--gain", type=float, default=1.05,
                   help="keep a step only at this speedup or more (default 1.05)")
    p.add_argument("--budget", type=float, default=2.0, metavar="SECONDS",
                   help="timing budget per variant (default 2 s)")
    p.add_argument("--time-limit", type=float, default=480.0, metavar="SECONDS",
                   help="start no new variant after this long; the log keeps the steps "
                   "done (default 480 s)")
    p.add_argument("--start", metavar="VARIANT",
                   help="start the loop from this variant instead of the current choice, "
                   "e.g. b128 (the stage form) or prop-l4-b128")
    p.add_argument("--no-record", action="store_true",
                   help="write the log but do not record the choice for later fits")
    p.set_defaults(handler=cmd_tune)
    return p


def cmd_tune(args: argparse.Namespace) -> int:
    """Run ``kingen tune``; no GPU is one line and exit 0, other user problems exit 1."""
    from kingen.model.shipped import resolve_model
    from kingen.solve.backends import cuda_status

    try:
        model = _model(args)
        resolve_model(model)  # a bad name is reported with or without a GPU
        if args.candidates < 1:
            raise KingenError("must be >= 1", field="candidates", value=args.candidates)
    except KingenError as exc:
        print(f"kingen tune: {exc}", flush=True)
        return 1
    status = cuda_status()
    if not status.usable or status.simulator:
        reason = status.reason or "no CUDA GPU found"
        print(f"kingen tune: no usable CUDA GPU ({reason}); tuning measures one", flush=True)
        return 0
    from kingen.analysis.optimize import run_tune

    try:
        run_tune(model, args.out, precision=args.precision or "float64",
                 n_candidates=args.candidates, protocols=args.protocols,
                 use_ncu=not args.no_ncu, full=args.full, references=args.references,
                 max_steps=args.max_steps, gain=args.gain, record=not args.no_record,
                 budget_s=args.budget, time_limit_s=args.time_limit, start=args.start)
    except KingenError as exc:
        print(f"kingen tune: {exc}", flush=True)
        return 0 if str(exc).startswith(NO_GPU) else 1
    return 0
