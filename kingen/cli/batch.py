"""``kingen batch``: a thin shell over :func:`kingen.scaleout.batch.run_batch`."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parsers", "cmd_batch", "cluster_option"]

CLUSTER_HELP = ("where to run: local (this host: one worker per GPU, else CPU worker "
                "processes), local:N (N worker processes), tcp://HOST:PORT (an existing Dask "
                "scheduler), or a TOML file with a [cluster] table (Slurm, PBS); see the "
                "documentation's 'Scale out' how-to")


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``batch`` subcommand."""
    p = subparsers.add_parser(
        "batch", help="run many fits (cells x schemes x seeds) on a Dask cluster",
        description="Run every fit a batch manifest lists, one Dask task per fit, each with "
                    "its own run file and log; run it again to skip finished fits and resume "
                    "unfinished ones. Writes batch_summary.csv and batch_summary.html.")
    p.add_argument("manifest", type=Path, help="batch manifest (TOML)")
    p.add_argument("--cluster", default=None, help=CLUSTER_HELP + " (default: the "
                   "manifest's [cluster] table, else local)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.set_defaults(handler=cmd_batch)


def cluster_option(value: str | None):
    """The ``--cluster`` option's settings, or None when not given."""
    if value is None:
        return None
    from kingen.scaleout.cluster import parse_cluster_option

    return parse_cluster_option(value)


def cmd_batch(args: argparse.Namespace) -> int:
    """Run ``kingen batch``; exit status 1 if any fit failed."""
    from kingen.scaleout.batch import run_batch
    from kingen.scaleout.manifest import load_manifest
    from kingen.scaleout.summary import CSV_NAME, HTML_NAME

    cluster = cluster_option(args.cluster)  # the option's mistakes before the manifest's
    manifest = load_manifest(args.manifest)
    rows = run_batch(manifest, cluster=cluster, progress=not args.quiet)
    failed = [r for r in rows if r.get("status") != "ok"]
    print(f"kingen batch: {len(rows) - len(failed)} of {len(rows)} fits ok; "
          f"{manifest.output / CSV_NAME}, {manifest.output / HTML_NAME}")
    for r in failed:
        print(f"  failed: {r['id']}: {r['reason']}")
    return 1 if failed else 0
