"""``kingen fit`` and ``kingen resume``: thin shells over :func:`kingen.runs.fit.fit` and
:func:`kingen.runs.fit.resume`."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from kingen.cli.batch import CLUSTER_HELP, cluster_option
from kingen.errors import KingenError
from kingen.fitting.config import demo_config

DEMO_OUTPUT = "kingen_demo.h5"

BARE_CLUSTER = "\0"
"""``--cluster`` given alone (no value can hold a NUL, so ``--cluster ""`` stays apart)."""

GPUS_HELP = ("GPUs of this machine to spread each generation over, in this process: a "
             "number or all (default 1); the fit is the same on any number")

__all__ = ["DEMO_OUTPUT", "add_parsers", "cmd_fit", "cmd_resume", "demo_config"]


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``fit`` and ``resume`` subcommands."""
    p = subparsers.add_parser(
        "fit", help="fit a scheme's rate constants to recordings",
        description="Fit the rate constants of a kinetic scheme to recordings and summary "
                    "targets with a genetic algorithm (see the documentation's 'Fit configuration' "
                    "for the configuration file). --demo fits the bundled SYNTHETIC example.")
    p.add_argument("config", nargs="?", type=Path, help="fit configuration (TOML)")
    p.add_argument("--demo", action="store_true",
                   help="fit the bundled example (Jonas 1993 scheme, synthetic recordings)")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda"), default=None,
                   help="where the solver runs (default: the configuration's, else auto)")
    p.add_argument("--precision", choices=("float64", "float32"), default=None)
    p.add_argument("--generations", type=int, default=None, help="maximum generations")
    p.add_argument("--population", type=int, default=None,
                   help="population size μ (offspring λ becomes the same)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("-o", "--output", type=Path, default=None, help="run file (HDF5)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.add_argument("--force", action="store_true",
                   help="lift the size limits (states, samples, RK4 steps, memory)")
    p.add_argument("--cluster", nargs="?", const=BARE_CLUSTER, default=None, metavar="SPEC",
                   help=CLUSTER_HELP + "; --cluster alone: the configuration's [cluster] table. "
                        "Each generation is split into one shard per Dask worker")
    p.add_argument("--gpus", default=None, metavar="N",
                   help=GPUS_HELP)
    p.set_defaults(handler=cmd_fit)

    r = subparsers.add_parser(
        "resume", help="continue a fit from its run file",
        description="Continue a fit from the last completed generation in its run file.")
    r.add_argument("run", type=Path, help="run file (HDF5) of an interrupted fit")
    r.add_argument("--generations", type=int, default=None,
                   help="new maximum number of generations")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    r.add_argument("--cluster", nargs="?", const=BARE_CLUSTER, default=None, metavar="SPEC",
                   help="as kingen fit --cluster (alone: the [cluster] table of the "
                        "configuration stored in the run file)")
    r.add_argument("--gpus", default=None, metavar="N", help=GPUS_HELP)
    r.set_defaults(handler=cmd_resume)


def _positive(value: int | None, flag: str, low: int = 1) -> None:
    if value is not None and value < low:
        raise KingenError(f"must be >= {low}", field=flag, value=value)


def cmd_fit(args: argparse.Namespace) -> int:
    """Run ``kingen fit``."""
    from kingen.runs.fit import fit

    if args.demo == (args.config is not None):
        taken = (args.config is None and args.cluster not in (None, BARE_CLUSTER)
                 and Path(args.cluster).suffix.lower() == ".toml")
        raise KingenError("give a configuration file or --demo (one of them)" + (
            f"; --cluster took {args.cluster} as its value: put the configuration first "
            f"(kingen fit {args.cluster} --cluster)" if taken else ""), field="kingen fit")
    _positive(args.generations, "--generations")
    _positive(args.population, "--population", 2)
    _positive(args.seed, "--seed", 0)
    config = demo_config() if args.demo else args.config
    output = args.output
    overwrite = args.overwrite
    if args.demo and output is None:
        # the demo's own default file: running the quickstart twice must just work
        output = Path(DEMO_OUTPUT)
        overwrite = True
    overrides = {"backend": args.backend, "precision": args.precision,
                 "generations": args.generations, "population": args.population,
                 "seed": args.seed, "output": None if output is None else str(output),
                 "force": args.force}
    _one_way(args)
    if args.cluster is not None:
        from kingen.scaleout.fitting import fit_on_cluster

        result = fit_on_cluster(config, _cluster(args.cluster, config), overwrite=overwrite,
                                progress=not args.quiet, overrides=overrides)
    else:
        from kingen.scaleout.cluster import settings_from_file

        if Path(config).is_file():  # a missing one is the fit's to say
            settings_from_file(config)  # its [cluster], if any: the run file keeps it
        with _evaluators(args) as evaluators:
            result = fit(config, overwrite=overwrite, progress=not args.quiet,
                         overrides=overrides, evaluator=evaluators)
    print(result.summary())
    return 0


def _one_way(args: argparse.Namespace) -> None:
    if args.gpus is not None and args.cluster is not None:
        raise KingenError("give --gpus or --cluster, not both (a cluster's workers take a "
                          "GPU each: start as many as you have)", field="--gpus",
                          value=args.gpus)


def _evaluators(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """The fit's evaluators for ``--gpus`` (none asked: one GPU, the fit's own)."""
    from kingen.fitting.gpus import GpuEvaluators

    if args.gpus is None:
        return contextlib.nullcontext(None)
    return GpuEvaluators(args.gpus)


def _cluster(value: str, config: Path, text: str | None = None):
    """``--cluster SPEC``, or alone the [cluster] table of the configuration (its file, or
    the ``text`` a run file stored)."""
    from kingen.scaleout.cluster import settings_from_text

    if value != BARE_CLUSTER:
        settings = cluster_option(value)
    else:
        value = ""
        if text is None:
            try:
                text = Path(config).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise KingenError(f"cannot read: {exc}", file=str(config)) from None
        settings = settings_from_text(text, str(config), required=True)
    settings.option = value  # how to give them again (kingen resume's hint)
    return settings


def cmd_resume(args: argparse.Namespace) -> int:
    """Run ``kingen resume``."""
    from kingen.runs.fit import resume

    _positive(args.generations, "--generations")
    _one_way(args)
    if args.cluster is not None:
        from kingen.scaleout.fitting import resume_on_cluster
        from kingen.store import RunStore

        text = None
        if args.cluster == BARE_CLUSTER:
            with RunStore.open(args.run, "r", verify=False) as reader:
                text = reader.config_text
        result = resume_on_cluster(args.run, _cluster(args.cluster, args.run, text),
                                   progress=not args.quiet, generations=args.generations)
    else:
        with _evaluators(args) as evaluators:
            result = resume(args.run, progress=not args.quiet, generations=args.generations,
                            evaluator=evaluators)
    print(result.summary())
    sys.stdout.flush()
    return 0
