"""The ``kingen`` command: a thin shell over the same functions a notebook user calls.

Every subcommand sets ``handler``, a function ``(args) -> int`` (the exit status) that calls
the public API (:mod:`kingen`) and prints; modules add their subcommands with
``add_parsers(subparsers)``. Every error a user can cause ends in one line,
``kingen: error: <file>: <field> = <value>: <what is wrong>``, and exit status 2; never a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from kingen._version import __version__
from kingen.errors import KingenError

# Modules that add their own subcommands with ``add_parsers(subparsers)``.
_COMMAND_MODULES = ("kingen.cli.fit", "kingen.cli.outputs", "kingen.cli.batch",
                    "kingen.cli.profile")
FORCE_HELP = ("lift the size limits (states, samples, RK4 steps, memory) that refuse work "
              "too large for this machine; see the documentation's 'Fit configuration', "
              "'Limits and bad input'")
IMAGE_SUFFIXES = (".png", ".pdf", ".svg")
# What a failed feature means (kingen.experiment.features gives NaN and never raises on data).
FEATURE_FAILED = ("could not be measured from the simulated current (too flat, too short, "
                  "or its fit did not converge)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="kingen",
        description="Fit kinetic (Markov) models of ion channels to recordings.",
    )
    parser.add_argument("--version", action="version", version=f"kingen {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what kingen does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    sim = sub.add_parser("simulate", help="simulate a scheme under a protocol",
                         description="Simulate a scheme under a protocol and print or save "
                                     "the current and its features.")
    sim.add_argument("model", help="scheme file (TOML) or a shipped scheme's name (jonas_1993)")
    sim.add_argument("--protocol", required=True,
                     help="standard protocol (deactivation, desensitization, recovery, "
                          "dose_response) or a protocol TOML file")
    sim.add_argument("--exchange", default=None, metavar="MS|FILE[:MODE]",
                     help="10-90%% solution exchange time of standard protocols, ms "
                          "(default 0: ideal steps); or a measured open-tip junction "
                          "current CSV (time_ms, current) for any protocol, as a template "
                          "of every edge (FILE or FILE:template) or one waveform per sweep "
                          "(FILE:sweep)")
    sim.add_argument("--dt", type=float, default=None,
                     help="sampling interval of standard protocols, ms (default 0.02)")
    sim.add_argument("--solver", choices=("exact", "rk4"), default="exact",
                     help="exact (matrix exponential / SciPy) or rk4 (the fitting solver)")
    sim.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto",
                     help="where rk4 runs (default: the GPU when there is one)")
    sim.add_argument("--precision", choices=("float64", "float32"), default="float64")
    sim.add_argument("--step", type=float, default=None, help="fixed rk4 step, ms")
    sim.add_argument("--filter", default=None, metavar="KIND:POLES:KHZ",
                     help="pass the current through a recording filter, as a rig's "
                          "amplifier does: bessel:8:5 (kind bessel or butterworth, 2-8 "
                          "poles, cutoff in kHz), or a measured response CSV file")
    sim.add_argument("--temperature", type=float, default=None, metavar="C",
                     help="simulate at this temperature, °C, by the scheme's Q10s "
                          "(default: its reference temperature)")
    sim.add_argument("--csv", type=Path, help="write time_ms and current_pA columns here")
    sim.add_argument("--plot", type=Path, help="write a figure (PNG or PDF) here")
    sim.add_argument("--json", action="store_true", help="print the features as JSON")
    sim.add_argument("--force", action="store_true", help=FORCE_HELP)
    sim.set_defaults(handler=cmd_simulate)

    info = sub.add_parser("info", help="describe a scheme file, or this installation",
                          description="Describe a scheme (states, parameters, cycles) or, "
                                      "without a file, the installation and its GPU.")
    info.add_argument("model", nargs="?",
                      help="scheme file (TOML) or a shipped scheme's name (jonas_1993)")
    info.add_argument("--force", action="store_true", help=FORCE_HELP)
    info.add_argument("--kernel", choices=["stage", "propagator"],
                      help="print the scheme's generated solver code in this form instead "
                      "(objective mode; the legend at its top names every variable)")
    info.add_argument("--cluster", default=None, metavar="SPEC",
                      help="also show the Dask workers and GPUs this --cluster value would "
                           "use (local, local:N, tcp://HOST:PORT, or a TOML file with a "
                           "[cluster] table); nothing is started")
    info.add_argument("--connect", action="store_true",
                      help="with --cluster tcp://HOST:PORT: ask that scheduler for its workers")
    info.set_defaults(handler=cmd_info)

    for name in _COMMAND_MODULES:  # they ship with kingen: a failing import is a bug
        importlib.import_module(name).add_parsers(sub)
    from kingen.cli.analysis import add_analyze_parser, add_tune_parser

    add_analyze_parser(sub)
    add_tune_parser(sub)
    return parser


def _unraisable(info: Any) -> None:
    """Python's hook for errors it cannot raise, less Ctrl-C: a press that lands in a
    finalizer (a weakref callback while Dask closes) is otherwise printed as "Exception
    ignored in ..." with a traceback, after kingen has said it was interrupted."""
    if info.exc_type is KeyboardInterrupt:
        return
    sys.__unraisablehook__(info)


def main(argv: list[str] | None = None) -> int:
    """Run the ``kingen`` command; returns the exit status."""
    sys.unraisablehook = _unraisable
    try:
        # The parser imports every command's module (SciPy among them: a second or so, in
        # which a Ctrl-C is as likely as in the command itself). This module imports
        # nothing heavy, so that the interpreter's start is all that precedes this line.
        parser = build_parser()
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(message)s")
        return int(args.handler(args) or 0)
    except KingenError as exc:
        print(f"kingen: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`kingen info ... | head`): not an error of ours; point
        # stdout at nothing so that the interpreter's final flush does not complain either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("kingen: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # an output that cannot be written (read-only, full, a folder)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kingen: error: {where}cannot write: {exc.strerror or exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- simulate

def _load_protocol(args: argparse.Namespace):
    from kingen.experiment.protocol import (
        STANDARD_PROTOCOLS,
        check_size,
        load_protocol,
        standard_protocol,
    )

    force = getattr(args, "force", False)
    exchange, measured = _exchange_option(getattr(args, "exchange", None))
    if args.protocol in STANDARD_PROTOCOLS:
        kwargs = {}
        if exchange is not None:
            kwargs["exchange"] = exchange
        if args.dt is not None:
            kwargs["dt"] = args.dt
        protocol = standard_protocol(args.protocol, **kwargs, force=True)
        check_size(protocol, file=None, field="--dt", value=protocol.sweeps[0].dt,
                   force=force)
    elif exchange is not None or args.dt is not None:
        raise KingenError("--exchange (a time) and --dt apply to standard protocols; set "
                          "them in the protocol file", field="--protocol", value=args.protocol)
    else:
        protocol = load_protocol(args.protocol, force=force)
    if measured is not None:
        from kingen.experiment.exchange import apply_exchange

        protocol = apply_exchange(protocol, measured)
    return protocol


def _exchange_option(text: str | None):
    """``--exchange``: a 10-90 % time (ms), or a measured waveform ``FILE[:MODE]``."""
    from kingen.experiment.exchange import EXCHANGE_MODES, ExchangeSpec

    if text is None:
        return None, None
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not (math.isfinite(value) and value >= 0):
            raise KingenError("exchange time must be >= 0 ms", field="--exchange", value=text)
        return value, None
    name, _, mode = text.rpartition(":")
    if mode not in EXCHANGE_MODES:
        name, mode = text, "template"
    if not Path(name).is_file():
        raise KingenError("neither a time (ms) nor a waveform file that exists",
                          field="--exchange", value=text)
    return None, ExchangeSpec(Path(name), mode, text, None, "--exchange")


def output_path(path: Path | None, flag: str, suffixes: tuple[str, ...] = ()) -> Path | None:
    """Check an output file named on the command line before any work is done: not a
    folder, its folder exists, and (for figures) a format kingen writes."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir() or path.name in ("", ".", ".."):
        raise KingenError("is a folder: give a file name", file=str(path), field=flag)
    if not path.parent.is_dir():
        raise KingenError("folder does not exist", file=str(path.parent), field=flag)
    if suffixes and path.suffix and path.suffix.lower() not in suffixes:
        raise KingenError(f"unknown image format (use {', '.join(suffixes)})", file=str(path),
                          field=flag, value=path.suffix)
    return path


# kingen.simulate's options as the command line spells them: the library's errors name the
# option (``step``), the command's user reads the flag (``--step``).
SIMULATE_FLAGS = {"solver": "--solver", "backend": "--backend", "precision": "--precision",
                  "step": "--step", "filter": "--filter", "temperature": "--temperature"}


def with_flags(exc: KingenError, flags: dict[str, str]) -> KingenError:
    """``exc`` with the options it names spelled as the command line's flags.

    Examples
    --------
    >>> from kingen.errors import KingenError
    >>> err = KingenError("try a smaller step or solver = 'exact'", field="step", value=0.1)
    >>> print(with_flags(err, SIMULATE_FLAGS))
    --step = 0.1: try a smaller --step or --solver exact
    """
    def option(m: re.Match[str]) -> str:
        return f"{flags[m[1]]} {m[2]}" if m[1] in flags else m[0]

    message = re.sub(r"\b(\w+) = '([^']*)'", option, exc.message)
    message = message.replace("set force = True", "pass --force")
    if "step" in flags:
        message = re.sub(r"\b(smaller|larger) step\b", rf"\1 {flags['step']}", message)
    return KingenError(message, file=exc.file, field=flags.get(exc.field or "", exc.field),
                       value=exc.value)


def cmd_simulate(args: argparse.Namespace) -> int:
    """``kingen simulate``: currents and features of a scheme under a protocol."""
    from kingen.model.scheme import Scheme
    from kingen.runs.simulate import simulate

    scheme = Scheme.load(args.model, force=args.force)
    if args.temperature is not None:  # before any file is written
        from kingen.model.temperature import scheme_at_temperature

        scheme_at_temperature(scheme, args.temperature, field="--temperature")
    protocol = _load_protocol(args)
    if args.step is not None and args.solver != "rk4":
        raise KingenError("--step applies to --solver rk4", field="--step", value=args.step)
    flt = None
    if args.filter is not None:
        from kingen.experiment.chain import check_filter, parse_filter

        flt = parse_filter(args.filter, field="--filter")
        check_filter(flt, [s.dt for s in protocol.sweeps], file=None, field="--filter",
                     value=args.filter)
    csv_path = output_path(args.csv, "--csv")
    plot_path = output_path(args.plot, "--plot", IMAGE_SUFFIXES)
    _check_simulate_outputs(args, csv_path, plot_path)
    try:
        sim = simulate(scheme, protocol, solver=args.solver, backend=args.backend,
                       precision=args.precision, step=args.step, force=args.force,
                       filter=flt, temperature=args.temperature)
    except KingenError as exc:
        raise with_flags(exc, SIMULATE_FLAGS) from None
    try:
        if csv_path:
            sim.to_csv(csv_path)
        if plot_path:
            sim.plot(plot_path)
    except OSError as exc:
        raise KingenError(f"cannot write: {exc.strerror or exc}",
                          file=str(exc.filename or csv_path or plot_path)) from None
    features = sim.features()
    values, failed = _split_failed(features)
    if args.json:
        print(json.dumps({**values, **({"failed": failed} if failed else {})}, indent=2))
    else:
        print(f"{scheme.name} | protocol {protocol.name} ({protocol.n_sweeps} sweep"
              f"{'s' if protocol.n_sweeps != 1 else ''}) | {sim.engine}"
              + (f" | filter {flt.label}" if flt is not None else ""))
        for key, value in features.items():
            if key != "not_determined":
                print(f"  {key:16s} {_show(value)}")
        for key, why in failed.items():
            print(f"  failed: {key}: {why}")
        for path in (args.csv, args.plot):
            if path:
                print(f"  wrote {path}")
    return 0


def _check_simulate_outputs(args: argparse.Namespace, csv_path: Path | None,
                            plot_path: Path | None) -> None:
    """``--csv`` and ``--plot`` replace neither the scheme nor the protocol file simulated,
    nor each other, nor any file but an earlier output of their kind."""
    from kingen.base.files import check_replaceable, same_file
    from kingen.experiment.protocol import STANDARD_PROTOCOLS

    inputs = {args.model: "the scheme being simulated"}
    if args.protocol not in STANDARD_PROTOCOLS:
        inputs[args.protocol] = "the protocol file being simulated"
    measured = _exchange_option(args.exchange)[1]
    if measured is not None:
        inputs[str(measured.path)] = "the exchange waveform being simulated"
    if csv_path and plot_path and same_file(csv_path, plot_path):
        raise KingenError("--csv and --plot name the same file: give each its own",
                          file=str(csv_path), field="--plot")
    if csv_path:
        check_replaceable(csv_path, "--csv", kind="simulated csv", inputs=inputs)
    if plot_path:
        check_replaceable(plot_path, "--plot", kind="figure", inputs=inputs)


def _split_failed(features: dict) -> tuple[dict, dict[str, str]]:
    """(JSON-able features, {feature: why it failed}); a failed (NaN) scalar is moved out, a
    failed entry of a list reads "failed"; never ``null``."""
    failed: dict[str, str] = {}
    features = dict(features)
    # kingen.experiment.features says why a value is not determined (no steady state, an unbounded
    # bootstrap interval): that reason replaces the generic one.
    reasons = features.pop("not_determined", None) or {}
    import numpy as np

    def clean(value, key: str):
        if isinstance(value, dict):
            return {k: clean(v, f"{key}.{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple, np.ndarray)):
            return [clean(v, f"{key}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, (np.floating, float)):
            v = float(value)
            if math.isfinite(v):
                return v
            failed[key] = FEATURE_FAILED
            return "failed"
        if isinstance(value, np.integer):
            return int(value)
        return value

    out = {}
    for key, value in features.items():
        v = clean(value, key)
        if v != "failed":
            out[key] = v
    failed.update({k: why for k, why in reasons.items() if k not in out})
    return out, failed


def _show(value) -> str:
    import numpy as np

    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.4g}" if math.isfinite(float(value)) else "failed"
    return str(value)


# --------------------------------------------------------------------------- info

def cmd_info(args: argparse.Namespace) -> int:
    """``kingen info``: a scheme's summary, or the installation's."""
    if args.cluster is not None or args.connect:
        return _info_cluster(args)
    if args.kernel and not args.model:
        raise KingenError("--kernel needs a scheme file", field="--kernel", value=args.kernel)
    if args.model:
        from kingen.model.scheme import Scheme, exp_text

        s = Scheme.load(args.model, force=args.force)
        if args.kernel:
            from kingen.codegen import generate, generate_propagator

            make = generate if args.kernel == "stage" else generate_propagator
            print(make(s, "objective").source, end="")
            return 0
        print(f"{s.name}  ({s.path})")
        if s.source:
            print(f"source: {s.source}")
        print(f"states ({s.n_states}): " + ", ".join(
            f"{n}" + (f" [{g:g} pS]" if g else "") for n, g in zip(s.states, s.conductance)))
        print(f"transitions: {len(s.transitions)}; independent cycles: {len(s.cycles)}")
        for cycle, (log_f, log_b) in zip(s.cycles, s.cycle_log_products()):
            ratio = exp_text(log_f - log_b)
            how = ("derived: " + s.parameters[s.transitions[cycle.derived].param].name
                   if cycle.derived is not None else f"ratio {ratio}")
            print(f"  {s.describe_cycle(cycle)}  ({how})")
        print("parameters (internal units):")
        for p in s.parameters:
            flag = "derived" if p.derived else ("fixed" if p.fixed else p.scale)
            print(f"  {p.name:10s} {s.values[s.param_names.index(p.name)]:<12.6g} "
                  f"{p.internal_unit:12s} [{p.lower:.4g}, {p.upper:.4g}] {flag}")
        from kingen.model.temperature import describe

        for line in describe(s):
            print(f"temperature: {line}")
        return 0
    import numba
    import numpy as np

    from kingen.solve.backends import cuda_status

    status = cuda_status()
    print(f"kingen {__version__}; numpy {np.__version__}; numba {numba.__version__}")
    if status.usable and not status.simulator:
        from numba import cuda

        count = len(cuda.gpus)
        spread = (f"; {count} GPUs: kingen fit --gpus {count} spreads a fit over them"
                  if count > 1 else "")
        print(f"GPU: {status.device} (the cuda backend is used by default{spread})")
    else:
        print(f"GPU: none usable ({status.reason}); the cpu backend uses "
              f"{numba.config.NUMBA_NUM_THREADS} cores")
    import importlib.util

    if importlib.util.find_spec("distributed") is None:
        print("Dask: not installed (pip install 'kingen[dask]' for --cluster and kingen batch)")
    else:
        from kingen.scaleout.cluster import ClusterSettings, describe

        print("Dask, --cluster local: " + describe(ClusterSettings())[0].removeprefix(
            "cluster: ") + " (kingen info --cluster SPEC for others)")
    return 0


def _info_cluster(args: argparse.Namespace) -> int:
    """``kingen info --cluster SPEC``: the workers and GPUs a fit or batch would use; a
    scheduler is asked for its workers only with ``--connect``."""
    from kingen.scaleout.cluster import connected_lines, describe, parse_cluster_option

    if args.cluster is None:
        raise KingenError("--connect needs --cluster tcp://HOST:PORT", field="--connect")
    if args.model or args.kernel:
        raise KingenError("describes a cluster: give it without a scheme file (kingen info "
                          "SCHEME describes the scheme)", field="--cluster", value=args.cluster)
    settings = parse_cluster_option(args.cluster)
    if args.connect and settings.kind != "address":
        raise KingenError("--connect asks an existing scheduler: give --cluster "
                          "tcp://HOST:PORT", field="--cluster", value=args.cluster)
    for line in describe(settings):
        print(line)
    if args.connect:
        from kingen.scaleout.cluster import open_client

        with open_client(settings, wait=False) as client:
            for line in connected_lines(client):
                print(line)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
