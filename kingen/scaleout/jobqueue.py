"""Slurm and PBS clusters: dask-jobqueue's, built from the settings (memory per GPU worker,
walltimes as each batch system reads them), and their first jobs submitted, a refusal said
in one line.
"""

from __future__ import annotations

import logging
from typing import Any

from kingen.errors import KingenError
from kingen.scaleout.logfilters import REFUSED
from kingen.scaleout.settings import ClusterSettings, walltime_seconds


def _per_gpu(memory: str, gpus: int) -> str:
    """A job's memory divided among its GPU workers (``"60GB"``, 2 -> ``"30GB"``)."""
    from dask.utils import format_bytes, parse_bytes

    return format_bytes(parse_bytes(memory.replace(" ", "")) // max(1, gpus)).replace(" ", "")


def _slurm_memory(memory: str) -> str:
    """A size as ``#SBATCH --mem`` takes it, rounded up as dask-jobqueue rounds its own."""
    from dask.utils import parse_bytes
    from dask_jobqueue.slurm import slurm_format_bytes_ceil

    return str(slurm_format_bytes_ceil(parse_bytes(memory.replace(" ", ""))))


def _hours_minutes_seconds(total: int) -> str:
    """``HH:MM:SS``, hours past 24 included: the walltime PBS reads (it has no days)."""
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


def jobqueue_cluster(s: ClusterSettings, **extra: Any) -> Any:
    """A ``dask_jobqueue`` cluster (not yet scaled) for ``kind = "slurm"`` or ``"pbs"``.

    Its ``job_script()`` is the batch script each job submits; nothing is submitted until
    the cluster is scaled (:func:`open_client` does that).
    """
    try:
        import dask
        from dask_jobqueue import PBSCluster, SLURMCluster
    except ImportError:
        raise KingenError("dask-jobqueue is not installed (pip install 'kingen[dask]')",
                          file=s.source, field="cluster.kind", value=s.kind) from None
    walltime = s.walltime
    if s.kind == "pbs":  # PBS reads hours:minutes:seconds, with no days- prefix
        walltime = _hours_minutes_seconds(walltime_seconds(s.walltime) or 0)
    kwargs: dict[str, Any] = {"cores": s.cores, "memory": s.memory, "walltime": walltime,
                              "name": "kingen-worker"}
    if s.queue:
        kwargs["queue"] = s.queue
    if s.account:
        kwargs["account"] = s.account
    directives = list(s.job_extra)
    if s.gpus_per_job:
        # One `dask cuda worker` per job starts one worker process per GPU it is given,
        # each with CUDA_VISIBLE_DEVICES set to its own GPU.
        kwargs["processes"] = 1
        # Each worker takes one task at a time, as on a local cluster: dask-jobqueue gives
        # a worker cores / processes threads and memory / processes, and `dask cuda worker`
        # gives every one of its workers that much. The job still asks for all its cores
        # (the solver's threads use them) and all its memory.
        kwargs["cores"] = 1
        kwargs["memory"] = _per_gpu(s.memory, s.gpus_per_job)
        if s.kind == "slurm":
            kwargs["job_cpu"] = s.cores
            kwargs["job_mem"] = _slurm_memory(s.memory)
        kwargs["worker_command"] = "dask cuda worker"
        kwargs["worker_extra_args"] = ["--resources", f"GPU={s.gpus_per_job}"]
        directives.insert(0, (f"--gres=gpu:{s.gpus_per_job}" if s.kind == "slurm" else
                              f"-l ngpus={s.gpus_per_job}"))
    else:
        kwargs["processes"] = s.workers_per_job
    if s.kind == "pbs" and s.gpus_per_job:
        # PBS takes GPUs in the resource list of the select statement, not a directive line
        directives.pop(0)
        kwargs["resource_spec"] = (f"select=1:ncpus={s.cores}:ngpus={s.gpus_per_job}:"
                                   f"mem={s.memory.replace(' ', '')}")
    kwargs["job_extra_directives"] = directives
    if s.prologue:
        kwargs["job_script_prologue"] = list(s.prologue)
    if s.python:
        kwargs["python"] = s.python
    if s.local_directory:
        kwargs["local_directory"] = s.local_directory
    if s.log_directory:
        kwargs["log_directory"] = s.log_directory
    if s.interface:
        kwargs["interface"] = s.interface
    # A login node is shared: another user's Dask on the default dashboard port (8787)
    # would cost a warning of five lines. A free port, unless Dask's own configuration
    # names one.
    kwargs["scheduler_options"] = {"dashboard_address": ":0", **dask.config.get(
        f"jobqueue.{s.kind}.scheduler-options", {})}
    kwargs.update(extra)
    cls = SLURMCluster if s.kind == "slurm" else PBSCluster
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise KingenError(f"dask-jobqueue refused the settings: {exc}", file=s.source,
                          field="cluster") from None


def need_submit_command(s: ClusterSettings) -> None:
    """Refuse, before any cluster starts, a batch system whose submit command is not here."""
    import shutil

    command = "sbatch" if s.kind == "slurm" else "qsub"
    if shutil.which(command) is None:
        system = "Slurm" if s.kind == "slurm" else "PBS"
        raise KingenError(f"{command} is not on this machine's PATH: run kingen where "
                          f"{system}'s commands are (the cluster's login node, or after "
                          f"`module load {system.lower()}`)", file=s.source,
                          field="cluster.kind", value=s.kind)


def submit_jobs(cluster: Any, s: ClusterSettings) -> None:
    """Scale a batch-system cluster to ``s`` and wait until its jobs are submitted (not
    started: they may wait in the queue).

    Raises
    ------
    KingenError
        The batch system refused every job (``sbatch``/``qsub`` failed): one line with
        what it said.
    """
    from distributed.core import Status

    for name in ("tornado.application", "asyncio", "distributed.deploy.spec"):
        logging.getLogger(name).addFilter(REFUSED)
    REFUSED.said = ""
    if s.adaptive:
        cluster.adapt(minimum_jobs=s.minimum_jobs, maximum_jobs=s.maximum_jobs)
    else:
        cluster.scale(jobs=s.jobs)
    error = ""
    try:
        # SpecCluster's own step that submits the jobs: scale() only schedules it, and
        # Dask has no public call that awaits the submissions
        cluster.sync(cluster._correct_state)
    except RuntimeError as exc:
        error = str(exc)
    jobs = list(getattr(cluster, "workers", {}).values())
    # a job whose submission failed was never given an id, and is not being submitted
    refused = [j for j in jobs if getattr(j, "job_id", "") is None
               and j.status == Status.created and not j.lock.locked()]
    if not jobs or len(refused) < len(jobs):
        return
    for job in refused:
        job.status = Status.failed  # nothing to cancel when the cluster closes
    said = REFUSED.said or next((line.strip() for line in error.split("stderr:", 1)[-1]
                                 .splitlines() if line.strip()), "")
    command = "sbatch" if s.kind == "slurm" else "qsub"
    reason = (said if said.startswith(command) else
              f"{command} failed ({said or 'kingen -v shows more'})")
    raise KingenError(f"the batch system refused the worker jobs: {reason}", file=s.source,
                      field="cluster")
