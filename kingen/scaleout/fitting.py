"""``kingen fit --cluster``: one fit whose generations are scored on a Dask cluster.

:func:`fit_on_cluster` and :func:`resume_on_cluster` are :func:`kingen.fit` and
:func:`kingen.resume` with a :class:`~kingen.scaleout.shard.ShardedEvaluator` as the
engine's evaluator: the GA, its random numbers, the run file and the polish stay in this
process; each generation's candidates are scored by the workers, one shard each.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import kingen.scaleout.cluster as cluster_module
from kingen.errors import KingenError
from kingen.scaleout.cluster import ClusterSettings, open_client, wait_for_a_worker
from kingen.scaleout.shard import ClusterLost, ShardedEvaluator


class _Evaluators:
    """Makes the engine's evaluator from the run's objective (the workers build the same
    objective), and closes what it made."""

    def __init__(self, client: Any, options: dict[str, Any]) -> None:
        self.client = client
        self.options = options
        self.made: list[ShardedEvaluator] = []

    def __call__(self, objective: Any) -> ShardedEvaluator:
        # the workers' solver runs with the driver's options
        ev = ShardedEvaluator(self.client, objective.scheme, objective.items,
                              objective.simulator.options,
                              warm=objective.scheme.values[None, :], **self.options)
        self.made.append(ev)
        return ev

    def close(self) -> None:
        # each is closed (it stops listening to the scheduler first) even when closing
        # another is cut short by Ctrl-C
        with contextlib.ExitStack() as stack:
            for ev in self.made:
                stack.callback(ev.close)


def fit_on_cluster(config: Any, settings: ClusterSettings, *, client: Any = None,
                   overrides: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Run :func:`kingen.fit` with every generation sharded over the cluster's workers.

    Parameters
    ----------
    config
        A configuration file or a loaded :class:`~kingen.fitting.config.FitConfig`.
    settings
        Where to run (ignored when ``client`` is given).
    client
        An existing ``distributed.Client``.
    overrides, **kwargs
        As :func:`kingen.fit` takes them (``overwrite``, ``progress``, ``stream``).

    Examples
    --------
    >>> from kingen.scaleout import ClusterSettings
    >>> result = fit_on_cluster("fit.toml", ClusterSettings(workers=2))  # doctest: +SKIP
    """
    from kingen.fitting.config import FitConfig, load_config
    from kingen.runs.fit import check_output, fit

    cfg = config if isinstance(config, FitConfig) else load_config(config, overrides=overrides)
    check_output(cfg, bool(kwargs.get("overwrite")))  # before waiting on a cluster
    return _run(settings, client,
                lambda evaluators: fit(cfg, evaluator=evaluators, **kwargs), cfg.output)


def resume_on_cluster(path: str | os.PathLike[str], settings: ClusterSettings, *,
                      client: Any = None, **kwargs: Any) -> Any:
    """Run :func:`kingen.resume` with every generation sharded over the cluster's workers,
    with the backend, precision and step the run started with."""
    from kingen.runs.fit import check_resumable, resume
    from kingen.store import RunStore

    with RunStore.open(path, "r", verify=False) as reader:
        check_resumable(reader, kwargs.get("generations"))  # before waiting on a cluster
    return _run(settings, client,
                lambda evaluators: resume(path, evaluator=evaluators, **kwargs), path)


def _run(settings: ClusterSettings, client: Any, go: Any,
         run_file: str | os.PathLike[str]) -> Any:
    # Workers of a batch system may end (walltime) and new jobs queue: wait for them,
    # saying so. Elsewhere a cluster without a worker for two minutes stops the fit.
    queued = settings.kind in ("slurm", "pbs")
    options = {"say": _say, "no_worker_s": None if queued else cluster_module.WORKER_WAIT_S}

    def run(c: Any) -> Any:
        evaluators = _Evaluators(c, options)
        try:
            return go(evaluators)
        except ClusterLost as exc:
            if not Path(run_file).exists():
                raise
            raise KingenError(f"{exc.message}; the run file keeps every committed "
                              f"generation: go on with kingen resume {run_file} "
                              f"{' '.join(['--cluster', _spec(settings)]).strip()}",
                              file=exc.file, field=exc.field, value=exc.value) from None
        finally:
            evaluators.close()

    if client is not None:
        return run(client)
    with open_client(settings) as own:
        if settings.kind in ("slurm", "pbs"):  # a shard needs a worker; jobs may queue
            wait_for_a_worker(own, say=_say)
        return run(own)


def _spec(settings: ClusterSettings) -> str:
    """A ``--cluster`` value for these settings, as the user gave them (nothing: the
    configuration's own table, which the run file keeps)."""
    if settings.option is not None:
        return settings.option
    if not settings.source.startswith(("--", "<")):
        return settings.source  # the file with the [cluster] table
    if settings.kind == "address":
        return settings.address
    return f"local:{settings.workers}" if settings.workers else "local"


def _say(line: str) -> None:
    print(f"kingen: {line}", file=sys.stderr, flush=True)
