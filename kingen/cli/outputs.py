"""The ``kingen plot``, ``kingen report`` and ``kingen export`` commands.

:func:`add_parsers` adds them to the ``kingen`` command's subparsers; each sets ``handler``,
``(args) -> int``, a few lines over :func:`kingen.plot_run`, :func:`kingen.write_report` and
:mod:`kingen.outputs.export`. Handlers raise :class:`~kingen.errors.KingenError` for user
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
        "export", help="fitted model as a scheme file, .mod or .mmt; fitted traces as CSV "
                       "or NWB",
        description="Export the fit of a run file. At least one of --model, --csv, --nwb, "
                    "--to. With --to neuron|myokit -o FILE, the run's fitted scheme (or a "
                    "scheme file's own) is written as a NEURON .mod or a Myokit .mmt.")
    e.add_argument("run", type=Path, help="the run file (.h5) written by kingen fit; with "
                                          "--to, a scheme file (.toml) too")
    e.add_argument("--to", choices=("neuron", "myokit"),
                   help="write the scheme for NEURON (.mod) or Myokit (.mmt) to -o FILE")
    e.add_argument("-o", "--out", type=Path, metavar="FILE", help="the file --to writes")
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
    add_import_parser(subparsers)


def _say(paths: list[Path]) -> None:
    from kingen.base.files import writes_through

    for path in paths:
        if not writes_through(path):  # -o /dev/stdout: the file's text is the output
            print(path)


def run_plot(args: argparse.Namespace) -> int:
    """``kingen plot RUN.h5 -o DIR``."""
    from kingen.outputs.plot import FORMATS, plot_run

    out = args.out or args.run.with_name(f"{args.run.stem}_figures")
    formats = tuple(args.format) if args.format else FORMATS
    paths = plot_run(args.run, out, formats=formats,
                     on_skip=lambda line: print(line, file=sys.stderr))
    _say(paths)
    return 0


def run_report(args: argparse.Namespace) -> int:
    """``kingen report RUN.h5 [-o DIR]``."""
    from kingen.outputs.report import write_report

    html_path, md_path = write_report(args.run, args.out)
    _say([html_path, md_path])
    return 0


def run_export(args: argparse.Namespace) -> int:
    """``kingen export RUN.h5 --model OUT.toml | --csv DIR | --nwb OUT.nwb``."""
    from kingen.errors import KingenError
    from kingen.outputs.export import export_csv, export_model, export_nwb
    from kingen.store import RunStore

    if args.to or args.out:
        return _export_foreign(args)
    if not (args.model or args.csv or args.nwb):
        raise KingenError("nothing to export: give --model OUT.toml, --csv DIR, "
                          "--nwb OUT.nwb or --to neuron|myokit -o FILE", field="export")
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


def _export_foreign(args: argparse.Namespace) -> int:
    """``kingen export RUN.h5|scheme.toml --to neuron|myokit -o FILE``."""
    from kingen.cli.command import output_path
    from kingen.errors import KingenError
    from kingen.outputs.export import export_foreign

    if not (args.to and args.out):
        raise KingenError("--to and -o go together: --to neuron|myokit -o FILE",
                          field="--to" if not args.to else "-o")
    if args.model or args.csv or args.nwb:
        raise KingenError("--to writes one file: give --model, --csv or --nwb in a separate "
                          "command", field="--to", value=args.to)
    out = output_path(args.out, "-o")
    _say([export_foreign(args.run, args.to, out, protocol=args.protocol)])
    return 0


def run_import(args: argparse.Namespace) -> int:
    """``kingen import FILE.mod|FILE.mmt -o scheme.toml``."""
    from kingen.cli.command import output_path
    from kingen.outputs.interop import import_scheme

    out = output_path(args.out, "-o")
    left_out: list[str] = []
    path = import_scheme(args.file, out, agonist=args.agonist, celsius=args.celsius,
                         left_out=left_out)
    for line in left_out:  # on stderr: -o /dev/stdout keeps the scheme's text alone
        print(f"{args.file}: left out: {line}", file=sys.stderr)
    _say([path])
    return 0


def add_import_parser(subparsers: Any) -> None:
    """Add ``import`` to an ``argparse`` subparsers object."""
    i = subparsers.add_parser(
        "import", help="a scheme from a NEURON .mod or Myokit .mmt file",
        description="Read the kinetic scheme of a NEURON .mod file (KINETIC block) or a "
                    "Myokit .mmt model (myokit.lib.markov form) and write a kingen scheme "
                    "file: units converted, bounds x/÷10 around the values, cycles checked. "
                    "Rates the scheme format cannot hold are listed, line by line.")
    i.add_argument("file", type=Path, help="the .mod or .mmt file")
    i.add_argument("-o", "--out", type=Path, required=True, metavar="scheme.toml",
                   help="the scheme file to write")
    i.add_argument("--agonist", metavar="NAME",
                   help="the agonist concentration variable, when the file's rates multiply "
                        "more than one")
    i.add_argument("--celsius", type=float, metavar="C",
                   help="evaluate a .mod file's dependence on celsius at this temperature, "
                        "°C, where it is not a Q10 or Arrhenius factor (those become the "
                        "scheme's [temperature] table)")
    i.set_defaults(handler=run_import)


__all__ = ["add_import_parser", "add_parsers", "run_export", "run_import", "run_plot",
           "run_report"]
