"""The ``kingen plot``, ``kingen report`` and ``kingen export`` commands.

:func:`add_parsers` adds them to the ``kingen`` command's subparsers; each sets ``handler``,
``(args) -> int``, a few lines over :func:`kingen.plot_run`, :func:`kingen.write_report` and
:mod:`kingen.export`. Handlers raise :class:`~kingen.errors.KingenError` for user
errors (the main command prints it as one line).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parsers(subparsers: Any) -> None:
    """Add ``plot``, ``report`` and ``export`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "plot", help="figures of a run (PNG and PDF)",
        description="Write the figures of a run file, finished or still running: fitted vs "
                    "recorded currents, dose-response, recovery, convergence, parameter "
                    "trajectories.")
    p.add_argument("run", type=Path, help="the run file (.h5) written by kingen fit")
    p.add_argument("-o", "--out", type=Path, default=None,
                   help="output folder (default: <run>_figures beside the run file)")
    p.add_argument("--format", action="append", choices=("png", "pdf", "svg"),
                   help="image format; repeat for several (default: png and pdf)")
    p.set_defaults(handler=run_plot)

    r = subparsers.add_parser(
        "report", help="HTML and markdown summary of a run",
        description="Write report.html (self-contained) and report.md with the run's "
                    "figures, fitted parameters, errors, features, settings and environment.")
    r.add_argument("run", type=Path, help="the run file (.h5) written by kingen fit")
    r.add_argument("-o", "--out", type=Path, default=None,
                   help="output folder (default: <run>_report beside the run file)")
    r.set_defaults(handler=run_report)

    e = subparsers.add_parser(
        "export", help="fitted model as a scheme file; fitted traces as CSV or NWB",
        description="Export the fit of a run file. At least one of --model, --csv, --nwb.")
    e.add_argument("run", type=Path, help="the run file (.h5) written by kingen fit")
    e.add_argument("--model", type=Path, metavar="OUT.toml",
                   help="write the fitted model as a scheme file")
    e.add_argument("--csv", type=Path, metavar="DIR",
                   help="write the fitted traces, one CSV per protocol")
    e.add_argument("--nwb", type=Path, metavar="OUT.nwb",
                   help="write the fitted traces as NWB (one file per protocol, "
                        "OUT_<protocol>.nwb, unless --protocol picks one)")
    e.add_argument("--protocol", metavar="NAME",
                   help="for --model: whose fitted amplitude sets model.channels; "
                        "for --nwb: the one protocol to write")
    e.set_defaults(handler=run_export)


def _say(paths: list[Path]) -> None:
    for path in paths:
        print(path)


def run_plot(args: argparse.Namespace) -> int:
    """``kingen plot RUN.h5 -o DIR``."""
    from kingen.plot import FORMATS, plot_run

    out = args.out or args.run.with_name(f"{args.run.stem}_figures")
    formats = tuple(args.format) if args.format else FORMATS
    paths = plot_run(args.run, out, formats=formats,
                     on_skip=lambda line: print(line, file=sys.stderr))
    _say(paths)
    return 0


def run_report(args: argparse.Namespace) -> int:
    """``kingen report RUN.h5 [-o DIR]``."""
    from kingen.report import write_report

    html_path, md_path = write_report(args.run, args.out)
    _say([html_path, md_path])
    return 0


def run_export(args: argparse.Namespace) -> int:
    """``kingen export RUN.h5 --model OUT.toml | --csv DIR | --nwb OUT.nwb``."""
    from kingen.errors import KingenError
    from kingen.export import export_csv, export_model, export_nwb
    from kingen.store import RunStore

    if not (args.model or args.csv or args.nwb):
        raise KingenError("nothing to export: give --model OUT.toml, --csv DIR or "
                          "--nwb OUT.nwb", field="export")
    with RunStore.open(args.run) as store:
        paths: list[Path] = []
        if args.model:
            paths.append(export_model(store, args.model, protocol=args.protocol))
        if args.csv:
            paths += export_csv(store, args.csv)
        if args.nwb:
            paths += export_nwb(store, args.nwb, protocol=args.protocol)
    _say(paths)
    return 0


__all__ = ["add_parsers", "run_export", "run_plot", "run_report"]
