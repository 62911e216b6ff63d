"""The ``kingen profile`` command: a few lines over :func:`kingen.runs.profile.profile_run`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parsers(subparsers: Any) -> None:
    """Add ``profile`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "profile", help="profile likelihoods: confidence intervals and identifiability",
        description="Profile the likelihood of each free parameter of a finished fit: "
                    "confidence intervals, non-identifiable parameters, parameters that move "
                    "together. Written to the run file (/profiles) as it goes; run again to "
                    "continue an interrupted computation.")
    p.add_argument("run", type=Path, help="the run file (.h5) of a finished kingen fit")
    p.add_argument("--parameters", nargs="+", metavar="NAME",
                   help="free parameters to profile (default: all); commas also separate")
    p.add_argument("--points", type=int, default=25,
                   help="grid points per parameter before widening (default 25)")
    p.add_argument("--level", type=float, default=0.95,
                   help="confidence level of the intervals (default 0.95)")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda"), default=None,
                   help="solver backend (default: auto, a GPU where there is one)")
    p.add_argument("--restart", action="store_true",
                   help="start again instead of continuing stored profiles")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.set_defaults(handler=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    """``kingen profile RUN.h5 [--parameters ...] [--points N] [--level 0.95]``."""
    from kingen.runs.profile import profile_run

    names = None
    if args.parameters:
        names = [n.strip() for item in args.parameters for n in item.split(",") if n.strip()]
    result = profile_run(args.run, parameters=names, points=args.points, level=args.level,
                         backend=args.backend, restart=args.restart,
                         progress=not args.quiet)
    print(result.summary())
    return 0


__all__ = ["add_parsers", "run_profile"]
