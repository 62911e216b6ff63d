"""Where the work runs: a ``[cluster]`` table or a ``--cluster`` value, and the Dask cluster
it builds.

Four kinds, all Dask's own (no scheduler, queue or RPC of kingen's):

- ``local`` (the default): on this host, ``dask_cuda.LocalCUDACluster`` (one worker per GPU)
  when a CUDA GPU is usable and dask-cuda is installed, else a ``distributed.LocalCluster``
  of worker processes on the CPU cores;
- ``address``: an existing scheduler, ``tcp://host:8786``;
- ``slurm`` and ``pbs``: ``dask_jobqueue.SLURMCluster`` / ``PBSCluster``, one batch job per
  ``jobs``, each with ``gpus_per_job`` GPUs (a ``dask cuda worker`` per job, one worker per
  GPU) or, without GPUs, ``workers_per_job`` CPU worker processes.

The ``--cluster`` option takes ``local``, ``local:N`` (N worker processes), a scheduler
address, or a TOML file with a ``[cluster]`` table (a fit configuration or a batch manifest
will do).

>>> s = cluster_settings({"kind": "slurm", "queue": "gpu", "jobs": 2, "gpus_per_job": 1,
...                       "walltime": "01:00:00"}, "batch.toml")
>>> s.kind, s.jobs, s.gpus_per_job
('slurm', 2, 1)
>>> parse_cluster_option("local:2").workers
2
>>> parse_cluster_option("tcp://10.0.0.5:8786").address
'tcp://10.0.0.5:8786'
>>> cluster_settings({"kind": "slurm", "jobs": 0}, "batch.toml")
Traceback (most recent call last):
...
kingen.errors.KingenError: batch.toml: cluster.jobs = 0: must be >= 1
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kingen.errors import KingenError
from kingen.model.fields import Fields, join, loads_toml
from kingen.scaleout.local_worker import PRELOAD

KINDS = ("local", "address", "slurm", "pbs")
_KEYS = {"kind", "address", "workers", "threads", "gpus", "queue", "account", "jobs",
         "gpus_per_job", "workers_per_job", "cores", "memory", "walltime", "adaptive",
         "minimum_jobs", "maximum_jobs", "job_extra", "prologue", "python", "local_directory",
         "log_directory", "interface", "retries"}
# tcp://, a host name, an IPv4 address or a bracketed IPv6 one, and the port in digits
_ADDRESS = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://([^\s/:\[\]]+|"
                      r"\[[0-9A-Fa-f:.]+\])(:(?P<port>[^/]*))?/?$")
_WALLTIME = re.compile(r"^((?P<days>\d+)-)?(?P<hours>\d{1,3}):(?P<minutes>\d{2})"
                       r"(:(?P<seconds>\d{2}))?$")
_MEMORY = re.compile(r"^(?P<size>\d+(\.\d+)?)\s*([kKMGTP]i?B|[kKMGTP])$")


@dataclass
class ClusterSettings:
    """Where a fit or a batch runs (see the module docstring and the README's
    "Scale-out (Dask)").

    Examples
    --------
    >>> s = ClusterSettings(workers=2)        # a local cluster of 2 worker processes
    >>> s.kind, s.workers, s.retries
    ('local', 2, 3)
    >>> ClusterSettings(kind="address", address="tcp://10.0.0.5:8786").address
    'tcp://10.0.0.5:8786'
    """

    kind: str = "local"
    address: str = ""
    workers: int = 0               # local: worker processes (0: one per GPU, else 2)
    threads: int = 0               # local CPU: solver threads per worker (0: cores / workers)
    gpus: bool = True              # local: use this host's GPUs (false: CPU workers only)
    queue: str = ""
    account: str = ""
    jobs: int = 1
    gpus_per_job: int = 0
    workers_per_job: int = 1
    cores: int = 4
    memory: str = "16GB"
    walltime: str = "01:00:00"
    adaptive: bool = False
    minimum_jobs: int = 0
    maximum_jobs: int = 0
    job_extra: list[str] = field(default_factory=list)
    prologue: list[str] = field(default_factory=list)
    python: str = ""
    local_directory: str = ""
    log_directory: str = ""
    interface: str = ""
    retries: int = 3               # times a task may lose its worker before it fails
    source: str = "<default>"      # where the settings were read
    option: str | None = None      # the --cluster value that gives them ("": --cluster alone)


def cluster_settings(table: dict[str, Any], file: str, where: str = "cluster"
                     ) -> ClusterSettings:
    """Read and check a ``[cluster]`` table.

    Raises
    ------
    KingenError
        One line naming ``file``, the field and its value.
    """
    c = Fields(file)
    if not isinstance(table, dict):
        raise c.error("must be a table", where, table)
    c.keys(table, _KEYS, where)
    address = c.string(table, "address", where, "")
    kind = c.choice(table, "kind", KINDS, where, "address" if address else "local")
    s = ClusterSettings(kind=kind, address=address, source=file)
    s.workers = c.integer(table, "workers", where, 0, ge=0, le=4096)
    s.threads = c.integer(table, "threads", where, 0, ge=0, le=4096)
    s.retries = c.integer(table, "retries", where, 3, ge=0, le=100)
    s.gpus = c.boolean(table, "gpus", where, True)
    if kind == "address":
        if not address:
            raise c.error("missing: the scheduler's address (tcp://host:8786)",
                          join(where, "address"))
        problem = address_problem(address)
        if problem:
            raise c.error(problem, join(where, "address"), address)
        s.address = scheduler_address(address)
    elif address:
        raise c.error(f"only for kind = \"address\" (this is kind = \"{kind}\")",
                      join(where, "address"), address)
    jobqueue_keys = _KEYS - {"kind", "address", "workers", "threads", "gpus", "retries"}
    if kind != "local" and "gpus" in table:
        raise c.error(f"only for kind = \"local\" (this is kind = \"{kind}\"; jobs take "
                      "gpus_per_job)", join(where, "gpus"), table["gpus"])
    if kind in ("local", "address"):
        for key in sorted(jobqueue_keys & set(table)):
            raise c.error(f"only for kind = \"slurm\" or \"pbs\" (this is kind = \"{kind}\")",
                          join(where, key), table[key])
        return s
    s.queue = c.string(table, "queue", where, "")
    s.account = c.string(table, "account", where, "")
    s.jobs = c.integer(table, "jobs", where, 1, ge=1, le=100_000)
    s.gpus_per_job = c.integer(table, "gpus_per_job", where, 0, ge=0, le=64)
    s.workers_per_job = c.integer(table, "workers_per_job", where, 1, ge=1, le=1024)
    s.cores = c.integer(table, "cores", where, 4, ge=1, le=4096)
    s.memory = c.string(table, "memory", where, "16GB")
    size = _MEMORY.match(s.memory.strip())
    if not size or float(size.group("size")) <= 0:
        raise c.error("must be a size above zero such as \"32GB\"", join(where, "memory"),
                      s.memory)
    s.walltime = c.string(table, "walltime", where, "01:00:00")
    if walltime_seconds(s.walltime) is None:
        raise c.error("must be a time above zero such as \"02:00:00\" (hours:minutes:seconds, "
                      "minutes and seconds below 60; a days- prefix as in \"1-12:00:00\")",
                      join(where, "walltime"), s.walltime)
    s.adaptive = c.boolean(table, "adaptive", where, False)
    s.minimum_jobs = c.integer(table, "minimum_jobs", where, 0, ge=0, le=100_000)
    s.maximum_jobs = c.integer(table, "maximum_jobs", where, s.jobs, ge=1, le=100_000)
    if s.minimum_jobs > s.maximum_jobs:
        raise c.error(f"must be <= maximum_jobs ({s.maximum_jobs})",
                      join(where, "minimum_jobs"), s.minimum_jobs)
    if s.gpus_per_job and "workers_per_job" in table:
        raise c.error("with gpus_per_job, each job runs one worker per GPU; leave "
                      "workers_per_job out", join(where, "workers_per_job"), s.workers_per_job)
    if s.workers_per_job > s.cores:
        raise c.error(f"must be <= cores ({s.cores}): each worker needs a core of the job",
                      join(where, "workers_per_job"), s.workers_per_job)
    for key in ("job_extra", "prologue"):
        items = c.array(table, key, where)
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item.strip() or "\n" in item:
                raise c.error("must be a one-line, non-empty string", join(join(where, key), i),
                              item)
        setattr(s, key, list(items))
    for key in ("python", "local_directory", "log_directory", "interface"):
        setattr(s, key, c.string(table, key, where, ""))
    return s


def address_problem(address: str) -> str:
    """Why ``address`` is not a scheduler address (empty if it is one).

    Examples
    --------
    >>> address_problem("tcp://10.0.0.5:8786")
    ''
    >>> address_problem("tcp://10.0.0.5")
    "needs the scheduler's port: tcp://host:8786"
    >>> address_problem("tls://10.0.0.5:8786")
    'kingen reaches a scheduler over TCP: tcp://host:8786'
    >>> address_problem("tcp://10.0.0.5:99999")
    'the port must be a number from 1 to 65535'
    >>> address_problem("tcp://10.0.0.5:" + "9" * 5000)
    'the port must be a number from 1 to 65535'
    """
    m = _ADDRESS.match(address.strip())
    if not m:
        return "must be a scheduler address such as tcp://host:8786"
    if m.group("scheme").lower() != "tcp":
        return "kingen reaches a scheduler over TCP: tcp://host:8786"
    port = m.group("port")
    if port is None:
        return "needs the scheduler's port: tcp://host:8786"
    # checked as text first: int() of thousands of digits is refused by Python itself
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        return "the port must be a number from 1 to 65535"
    return ""


def scheduler_address(address: str) -> str:
    """An address as Dask takes it: no spaces around, no closing slash, a lower-case scheme.

    >>> scheduler_address(" TCP://10.0.0.5:8786/ ")
    'tcp://10.0.0.5:8786'
    """
    scheme, rest = address.strip().rstrip("/").split("://", 1)
    return f"{scheme.lower()}://{rest}"


def walltime_seconds(text: str) -> int | None:
    """A ``[cluster] walltime`` in seconds; None if it is not a time above zero with minutes
    and seconds below 60.

    Examples
    --------
    >>> walltime_seconds("1-12:00:00"), walltime_seconds("02:30"), walltime_seconds("1:99:99")
    (129600, 9000, None)
    >>> walltime_seconds("00:00:00") is None
    True
    """
    m = _WALLTIME.match(str(text).strip())
    if not m:
        return None
    minutes, seconds = int(m.group("minutes")), int(m.group("seconds") or 0)
    if minutes > 59 or seconds > 59 or len(m.group("days") or "") > 5:
        return None  # (a walltime of 100,000 days is no walltime; int() refuses 4,300 digits)
    total = (int(m.group("days") or 0) * 24 + int(m.group("hours"))) * 3600 + \
        minutes * 60 + seconds
    return total or None


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


def parse_cluster_option(value: str, flag: str = "--cluster") -> ClusterSettings:
    """The ``--cluster`` option: ``local``, ``local:N``, ``tcp://host:port``, or a TOML file
    with a ``[cluster]`` table."""
    text = str(value).strip()
    if not text:
        raise KingenError("is empty: give local, local:N, a scheduler address "
                          "(tcp://host:8786) or a TOML file with a [cluster] table", field=flag,
                          value=value)
    if text == "local":
        return ClusterSettings(source=flag)
    m = re.fullmatch(r"local:(\d+)", text)
    if m:
        n = int(m.group(1)) if len(m.group(1)) <= 5 else 0  # (int() refuses 4,300 digits)
        if not 1 <= n <= 4096:
            raise KingenError("local:N needs 1 <= N <= 4096 worker processes", field=flag,
                              value=text)
        return ClusterSettings(workers=n, source=flag)
    if "://" in text:
        problem = address_problem(text)
        if problem:
            raise KingenError(problem, field=flag, value=text)
        return ClusterSettings(kind="address", address=scheduler_address(text), source=flag)
    path = Path(text)
    if not path.is_file():
        if path.suffix.lower() == ".toml":
            raise KingenError("file not found", field=flag, value=text)
        raise KingenError("must be local, local:N, a scheduler address (tcp://host:8786) or "
                          "a TOML file with a [cluster] table", field=flag, value=text)
    return settings_from_file(path, required=True)


def settings_from_file(path: str | os.PathLike[str], *, required: bool = False
                       ) -> ClusterSettings | None:
    """The ``[cluster]`` table of a TOML file (a fit configuration or a manifest); None if
    it has none (unless ``required``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KingenError(f"cannot read: {exc}", file=str(p)) from None
    return settings_from_text(text, str(p), required=required)


def settings_from_text(text: str, file: str, *, required: bool = False
                       ) -> ClusterSettings | None:
    """The ``[cluster]`` table of TOML text read from ``file`` (None if it has none)."""
    doc = loads_toml(text, file)
    if "cluster" not in doc:
        if required:
            raise KingenError("no [cluster] table", file=file, field="cluster")
        return None
    return cluster_settings(doc["cluster"], file)


# ---------------------------------------------------------------------- what is here

def local_gpus() -> list[str]:
    """Names of the CUDA GPUs this host's workers would use (empty without one; the CUDA
    simulator does not count)."""
    from kingen.solve.backends import cuda_status

    status = cuda_status()
    if not status.usable or status.simulator:
        return []
    from numba import cuda

    names = []
    for gpu in cuda.gpus:
        name = gpu.name
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return names


def has_dask_cuda() -> bool:
    """Whether dask-cuda can be imported (it is imported only when used)."""
    import importlib.util

    return importlib.util.find_spec("dask_cuda") is not None


def local_plan(s: ClusterSettings) -> dict[str, Any]:
    """What ``kind = "local"`` would start here, without starting it: ``{"cluster",
    "workers", "threads", "gpus"}``.

    With GPUs (and ``s.gpus``), one worker per GPU, at most as many as there are GPUs.
    Otherwise worker processes on the CPU cores, each with its share of them.
    """
    gpus = local_gpus() if s.gpus else []
    cores = os.cpu_count() or 1
    if gpus and has_dask_cuda():
        n = s.workers or len(gpus)
        return {"cluster": "dask_cuda.LocalCUDACluster", "workers": min(n, len(gpus)),
                "threads": 1, "gpus": gpus[: min(n, len(gpus))]}
    n = s.workers or min(2, cores)
    threads = s.threads or max(1, cores // n)
    return {"cluster": "distributed.LocalCluster (processes)", "workers": n,
            "threads": threads, "gpus": [], "cores": cores,
            "note": ("dask-cuda is not installed: GPUs are not used by the local cluster "
                     "(pip install dask-cuda)") if gpus else
                    ("" if s.gpus else "gpus = false: the workers do not see this host's GPUs")}


def describe(s: ClusterSettings) -> list[str]:
    """Lines for ``kingen info``: where work would run, without starting anything."""
    if s.kind == "local":
        plan = local_plan(s)
        lines = [f"cluster: {plan['cluster']} on this host, {plan['workers']} worker"
                 f"{'s' if plan['workers'] != 1 else ''}"]
        if plan["gpus"]:
            lines += [f"  worker {i}: GPU {i} ({name})" for i, name in enumerate(plan["gpus"])]
        else:
            lines.append(f"  each worker: {plan['threads']} solver thread(s) on the CPU "
                         f"({plan['cores']} cores here)")
        if plan.get("note"):
            lines.append(f"  note: {plan['note']}")
        return lines
    if s.kind == "address":
        return [f"cluster: the scheduler at {s.address} (its workers: kingen info --cluster "
                f"{s.address} --connect)"]
    per_job = (f"{s.gpus_per_job} GPU{'s' if s.gpus_per_job != 1 else ''} (one worker per GPU)"
               if s.gpus_per_job else f"{s.workers_per_job} CPU worker(s)")
    scale = (f"adaptive, {s.minimum_jobs} to {s.maximum_jobs} jobs" if s.adaptive
             else f"{s.jobs} job{'s' if s.jobs != 1 else ''}")
    per = s.gpus_per_job or s.workers_per_job
    jobs = s.maximum_jobs if s.adaptive else s.jobs
    total = (f"{'up to ' if s.adaptive else ''}{jobs * per} worker{'s' if jobs * per != 1 else ''}"
             + (f" on {jobs * per} GPU{'s' if jobs * per != 1 else ''}" if s.gpus_per_job
                else "") + " in all")
    lines = [f"cluster: {s.kind} ({scale}), each job {per_job}, {s.cores} cores, {s.memory}, "
             f"walltime {s.walltime}" + (f", queue {s.queue}" if s.queue else ""),
             f"  {total}"]
    if s.gpus_per_job:
        lines.append("  the nodes need kingen and dask-cuda installed ('kingen[dask]')")
    return lines


def connected_lines(client: Any) -> list[str]:
    """Lines for ``kingen info --connect``: the workers a scheduler has now."""
    info = client.scheduler_info()
    workers = info.get("workers", {})
    lines = [f"scheduler {info.get('address', '?')}: {len(workers)} worker"
             f"{'s' if len(workers) != 1 else ''}"]
    for addr, w in sorted(workers.items()):
        res = w.get("resources") or {}
        gpu = f", {res['GPU']:g} GPU" if "GPU" in res else ""
        lines.append(f"  {addr}  {w.get('nthreads', '?')} thread(s){gpu}  "
                     f"{w.get('name', '')}")
    return lines


# ---------------------------------------------------------------------- building clusters

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


def _local_cluster(s: ClusterSettings, env: dict[str, str] | None,
                   plan: dict[str, Any]) -> Any:
    if env is not None and plan["gpus"]:
        # plain worker processes sharing what ``env`` gives them (all on GPU 0, say):
        # as many as asked, not one per GPU
        plan = {**plan, "workers": s.workers or len(plan["gpus"]), "threads":
                s.threads or max(1, (os.cpu_count() or 1) // (s.workers or len(plan["gpus"])))}
    elif plan["gpus"]:
        from dask_cuda import LocalCUDACluster  # imported only here: an optional extra

        # n_workers takes the first GPUs of CUDA_VISIBLE_DEVICES, if the user has set it
        return LocalCUDACluster(n_workers=plan["workers"], threads_per_worker=1,
                                dashboard_address=":0", preload=[PRELOAD])
    from distributed import LocalCluster

    # One task at a time per worker process; the solver's own threads (Numba) use the
    # worker's share of the cores, set by the worker plugin.
    hidden = {} if s.gpus else {"CUDA_VISIBLE_DEVICES": ""}
    return LocalCluster(n_workers=plan["workers"], threads_per_worker=1, processes=True,
                        dashboard_address=":0", preload=[PRELOAD],
                        env={"NUMBA_NUM_THREADS": str(plan["threads"]), **hidden,
                             **(env or {})})


class _RefusedSubmissions(logging.Filter):
    """Drops the event loop's tracebacks of a refused job submission, keeping what the
    batch system said (``said``): :func:`submit_jobs` reports it in one line instead."""

    def __init__(self) -> None:
        super().__init__()
        self.said = ""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        text = f"{record.getMessage()} {exc or ''}"
        if "Command exited with non-zero exit code" not in text:
            return True
        lines = [line.strip() for line in str(exc or text).split("stderr:", 1)[-1]
                 .splitlines() if line.strip()]
        self.said = lines[0] if lines else ""
        # kingen -v keeps the whole traceback (the command, its exit code and output)
        return logging.getLogger().getEffectiveLevel() <= logging.INFO


_REFUSED = _RefusedSubmissions()


class _ShutdownNoise(logging.Filter):
    """Drops what Dask logs when a client stops waiting, each record with its traceback:

    - asyncio's "Task exception was never retrieved" for ``AllExit``, the exception Dask's
      ``gather`` uses to stop waiting (one per shard when Ctrl-C stops a gather);
    - a ``CancelledError`` of the client's own tasks as it closes (its reconnection to a
      lost scheduler, say);
    - "Failed to reconnect to scheduler": the fit or batch then stops with its own line,
      which says so.

    ``kingen -v`` keeps the last two."""

    def filter(self, record: logging.LogRecord) -> bool:
        import asyncio

        exc = record.exc_info[1] if record.exc_info else None
        if type(exc).__name__ == "AllExit":
            return False
        noise = (isinstance(exc, asyncio.CancelledError)
                 or "Failed to reconnect to scheduler" in record.getMessage())
        return not noise or logging.getLogger().getEffectiveLevel() <= logging.INFO


_SHUTDOWN_NOISE = _ShutdownNoise()


class _LostWorkerNoise(logging.Filter):
    """Drops what a local cluster's scheduler and nannies log when a worker process dies
    (its restart, the tasks it held, ran again elsewhere): the fit says it in its own line
    and records it in the run file. ``kingen -v`` keeps them."""

    SAYINGS = ("Restarting worker", "workers died while", "caused the cluster to lose "
               "already computed", "was killed by signal", "was killed by unknown signal")

    def filter(self, record: logging.LogRecord) -> bool:
        return (not any(text in record.getMessage() for text in self.SAYINGS)
                or logging.getLogger().getEffectiveLevel() <= logging.INFO)


_LOST_WORKER_NOISE = _LostWorkerNoise()


class _KilledOnClose(logging.Filter):
    """Drops the nanny's "Worker process still alive after 4.0 seconds, killing" while
    kingen closes its own local cluster: a worker still running a fit (a batch stopped by
    Ctrl-C or by an error) is ended so, as intended; its run file is safe at any moment.
    Drops too the scheduler's "broadcast to ADDRESS failed" for a worker so ended: a fit
    stopped by Ctrl-C while its workers dropped its solver (a second press cuts that wait
    short) leaves the drop on its way to a worker busy with a shard. ``kingen -v`` keeps
    the lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        ended = "still alive after" in message or (message.startswith("broadcast to ")
                                                   and " failed: " in message)
        return not ended or logging.getLogger().getEffectiveLevel() <= logging.INFO


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


HOLD_S = 15.0
"""Seconds a Ctrl-C is held back while a local cluster starts: past them, the start itself
stops (a CUDA driver that hangs, say)."""


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold back a Ctrl-C while a local cluster starts, and deliver it once it is up.

    Ctrl-C reaches the worker processes as well as the driver. A worker that takes it
    while its interpreter starts, before kingen's preload ignores it, dies with a "Fatal
    Python error" and two tracebacks; a driver that takes it inside Dask's start-up leaves
    a half-started cluster that Dask's exit hook then fails to close, with a traceback.
    So the signal is blocked in the driver's main thread, and so in the threads Dask starts
    from it and in the worker processes they spawn, which inherit the blocked signal. A
    press is noted (a thread of kingen's own, not blocking the signal, takes it from the
    system; the main thread runs the handler when Dask's wait for the start ends, or every
    10 s) and raised as :class:`KeyboardInterrupt` on leaving, with a cluster to close.
    A start still running :data:`HOLD_S` seconds on is stopped by a press: one made
    before then at the first of those 10 s marks past :data:`HOLD_S`, a later one at the
    next mark.
    """
    if not (hasattr(signal, "pthread_sigmask") and _in_main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        # Windows; a library caller's thread, or its own handler; Ctrl-C ignored (nohup)
        yield
        return
    import _thread
    import multiprocessing.resource_tracker

    # Its first start unblocks every signal in the thread that starts it (Dask's event
    # loop, as the first worker is spawned); started now, it is left running as is. It
    # takes this interpreter's warning options: a worker process ended mid-start (a press
    # that stops a start) leaves a semaphore it cleans up, saying so in two warnings.
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    if quiet not in sys.warnoptions:
        sys.warnoptions.append(quiet)
    multiprocessing.resource_tracker.ensure_running()
    t0 = time.monotonic()
    presses: list[int] = []
    lock, left = threading.Lock(), threading.Event()

    def note(number: int, frame: object) -> None:
        presses.append(number)
        if time.monotonic() - t0 >= HOLD_S:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt

    def take() -> None:
        # The thread the system hands a press to, as long as the hold lasts (the main
        # thread blocks the signal, and Dask's threads inherit that). At HOLD_S, a press
        # noted early is handed to the main thread again.
        if not left.wait(HOLD_S):
            with lock:
                if not left.is_set() and presses:
                    _thread.interrupt_main()
            left.wait()

    threading.Thread(target=take, name="kingen-ctrl-c", daemon=True).start()
    signal.signal(signal.SIGINT, note)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # one held back is noted now
        with lock:
            left.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if presses:
            raise KeyboardInterrupt


class _AbandonedStarts(logging.Filter):
    """Drops, once :func:`_abandon_start` has ended a start: asyncio's "Task exception was
    never retrieved" for a nanny's cancelled start ("Nanny failed to start"), and Dask's
    warning that a worker process's "exit status was already read" (kingen reaped it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not ((isinstance(exc, RuntimeError) and str(exc).startswith("Nanny failed"))
                    or "exit status was already read" in record.getMessage())


_ABANDONED = _AbandonedStarts()


def _start_local_cluster(s: ClusterSettings, env: dict[str, str] | None) -> Any:
    """Start a local cluster with Ctrl-C held back (:func:`_ctrl_c_held`). A press stops
    the start with the cluster closed, or, for a start stopped midway, its new worker
    processes ended."""
    import multiprocessing

    from distributed.core import Status
    from distributed.deploy.spec import SpecCluster

    plan = local_plan(s)  # outside the hold: its look for GPUs could hang with the driver
    known = set(SpecCluster._instances)
    children = {process.pid for process in multiprocessing.active_children()}
    cluster = None
    try:
        with _ctrl_c_held():
            cluster = _local_cluster(s, env, plan)
    except KeyboardInterrupt:
        new = set(SpecCluster._instances) - known
        if cluster is None:  # raised in Dask's wait for the start: as it ended, or midway
            cluster = next((c for c in new if c.status == Status.running and c.workers and
                            all(w.status == Status.running for w in c.workers.values())),
                           None)
        if cluster is not None:
            _close_cluster(cluster, local=True)
        unfinished = {c for c in new if c is not cluster}
        if unfinished:
            _abandon_start(unfinished, children)
        raise
    return cluster


def _abandon_start(clusters: set[Any], children: set[int]) -> None:
    """End local clusters whose start was stopped midway: the worker processes started
    since (not in ``children``) are killed (they hold nothing yet), and Dask's exit hook is
    told to leave the clusters, which it cannot close (it asserts that every worker
    finished starting) and would say so in a traceback."""
    import multiprocessing

    for cluster in clusters:
        cluster.shutdown_on_close = False
    for name in ("asyncio", "distributed.process"):
        logging.getLogger(name).addFilter(_ABANDONED)
    for process in multiprocessing.active_children():
        if process.pid not in children and process.name.startswith("Dask Worker process"):
            process.kill()


def _close_cluster(cluster: Any, *, local: bool) -> None:
    """Close a cluster kingen started. While a ``local`` one closes (seconds: its nannies
    end a worker that does not stop within 4 s), another Ctrl-C is ignored: it would leave
    the closing half done, for Dask's exit hook to finish in silence and then print a
    traceback. A batch system's cluster closes by cancelling its jobs, which takes what
    the batch system takes: Ctrl-C stays as it is."""
    loggers = [logging.getLogger(name) for name in ("distributed.nanny",
                                                     "distributed.scheduler")]
    quiet = _KilledOnClose()
    handler = None
    try:
        if local and _in_main_thread():
            handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    finally:  # a press that came just before is raised above: close all the same
        for logger in loggers:
            logger.addFilter(quiet)
        try:
            cluster.close()
        finally:
            for logger in loggers:
                logger.removeFilter(quiet)
            if handler is not None:
                signal.signal(signal.SIGINT, handler)


def _need_submit_command(s: ClusterSettings) -> None:
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
        logging.getLogger(name).addFilter(_REFUSED)
    _REFUSED.said = ""
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
    said = _REFUSED.said or next((line.strip() for line in error.split("stderr:", 1)[-1]
                                  .splitlines() if line.strip()), "")
    command = "sbatch" if s.kind == "slurm" else "qsub"
    reason = (said if said.startswith(command) else
              f"{command} failed ({said or 'kingen -v shows more'})")
    raise KingenError(f"the batch system refused the worker jobs: {reason}", file=s.source,
                      field="cluster")


REMIND_S = 60.0
"""Seconds between the lines that say kingen still waits for a worker."""


class NoWorkerClock:
    """How long a cluster has had no worker, and when to say so again.

    Call :meth:`tick` each time the cluster is seen without a worker: it gives the seconds
    so far (counted from ``head_start_s`` before the first tick) and whether a line is due
    now (at the first tick if ``at_once``, then every :data:`REMIND_S`). :meth:`reset`
    when a worker is seen.

    >>> clock = NoWorkerClock(at_once=True)
    >>> waited, due = clock.tick()
    >>> due, clock.tick()[1]
    (True, False)
    """

    def __init__(self, *, at_once: bool = False, head_start_s: float = 0.0) -> None:
        self.at_once = at_once
        self.head_start_s = head_start_s
        self.since: float | None = None
        self.told: float | None = None

    def reset(self) -> None:
        self.since = self.told = None

    def tick(self) -> tuple[float, bool]:
        now = time.monotonic()
        if self.since is None:
            self.since, self.told = now, (None if self.at_once else now)
        due = self.told is None or now - self.told >= REMIND_S
        if due:
            self.told = now
        return now - self.since + self.head_start_s, due


def wait_for_a_worker(client: Any, say: Any = None, poll_s: float = 1.0) -> None:
    """Wait until the cluster has a worker: a batch system's jobs may wait in its queue for
    as long as it takes (stop with Ctrl-C). ``say`` (a callable taking a line) hears that it
    waits, and again every :data:`REMIND_S` seconds."""
    clock = NoWorkerClock(at_once=True)
    while not client.nthreads():
        waited, due = clock.tick()
        if say is not None and due:
            jobs = len(getattr(getattr(client, "cluster", None), "workers", {}) or {})
            say(f"waiting for the batch system to start a worker ({jobs} job"
                f"{'s' if jobs != 1 else ''} submitted, {waited:.0f} s so far)")
        time.sleep(poll_s)


WORKER_WAIT_S = 120.0
"""Seconds a local cluster or an existing scheduler is given to show its first worker, and
that a fit or batch waits while it has none."""

CONNECT_TIMEOUT_S = 20.0
"""Seconds given to reach an existing scheduler. (A fit or batch whose scheduler is lost
stops at once: Dask cancels its tasks as the connection drops.)"""


def within(seconds: float, call: Callable[..., object], *args: Any, **kwargs: Any
            ) -> tuple[bool, BaseException | None]:
    """Call ``call`` in a thread of its own and wait at most ``seconds``: (whether it
    returned, what it raised). A daemon thread: one that never returns does not hold the
    interpreter's exit."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call(*args, **kwargs)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome.append(exc)

    thread = threading.Thread(target=run, name="kingen-cluster-call", daemon=True)
    thread.start()
    thread.join(seconds)
    return (True, outcome[0]) if outcome else (False, None)


def scheduler_problem(address: str, timeout: float | None = None) -> str:
    """Why no Dask scheduler answers at ``address`` (empty if one does): a connection,
    Dask's handshake and the scheduler's identity, all within ``timeout`` seconds (default
    :data:`CONNECT_TIMEOUT_S`).

    Dask's own connection waits for the handshake's answer without a limit: forever, on a
    port that is not Dask's (the dashboard's, a web server's). So it is tried here first.
    """
    import asyncio

    from distributed.comm import connect

    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout

    async def ask() -> Any:
        # connect() gives up on a host that refuses or never answers within the timeout
        # (OSError); the outer limit is for a handshake that never comes back
        comm = await asyncio.wait_for(connect(address, timeout=timeout), timeout + 5.0)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await asyncio.wait_for(comm.read(), timeout)
        finally:
            comm.abort()

    box: list[Any] = []
    done, error = within(2 * timeout + 10.0, lambda: box.append(asyncio.run(ask())))
    answer = box[0] if box else (error if done else TimeoutError())
    if isinstance(answer, (asyncio.TimeoutError, TimeoutError)):
        return ("something there took the connection but did not answer as a Dask "
                "scheduler (a scheduler's port is 8786 unless it was started with another; "
                "8787 is its dashboard's)")
    if isinstance(answer, OSError) and "Timed out trying to connect" in str(answer):
        return f"cannot reach the scheduler: {one_line(answer)}"
    if isinstance(answer, BaseException):
        return f"not a Dask scheduler: {one_line(answer)}"
    kind = answer.get("type") if isinstance(answer, dict) else None
    if kind == "Scheduler":
        return ""
    if kind in ("Worker", "Nanny"):
        return f"that is a Dask {kind.lower()}: give its scheduler's address"
    return f"not a Dask scheduler (it says it is {kind!r})"


def one_line(exc: BaseException) -> str:
    """An exception as one line: ``Type: message``, its whitespace collapsed."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return " ".join(text.split())


def _first_worker(client: Any, s: ClusterSettings) -> None:
    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT_S)
    except (TimeoutError, OSError):  # Dask's WorkerStartTimeoutError is a TimeoutError
        where = (f"the scheduler at {s.address} has no worker (start some with: dask worker "
                 f"{s.address})" if s.kind == "address" else
                 "the local cluster started no worker")
        if s.source.startswith("--"):  # given on the command line
            raise KingenError(f"{where}; waited {WORKER_WAIT_S:g} s", field=s.source,
                              value=s.address or None) from None
        raise KingenError(f"{where}; waited {WORKER_WAIT_S:g} s", file=s.source,
                          field="cluster") from None


@contextlib.contextmanager
def open_client(s: ClusterSettings, *, wait: bool = True,
                env: dict[str, str] | None = None) -> Iterator[Any]:
    """A ``distributed.Client`` on the cluster ``s`` describes, closed (and the cluster
    with it, unless it is an existing scheduler) on leaving.

    The scheduler allows a task ``s.retries`` worker losses before it gives up on it.
    ``env`` (local clusters only) is added to the workers' environment; with it, the
    workers are plain processes even on a GPU host (``{"CUDA_VISIBLE_DEVICES": "0"}``
    puts them all on the first GPU).
    """
    import logging

    import dask
    from distributed import Client

    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        # Dask tells of every worker and connection at INFO: for kingen -v only
        for name in ("distributed", "dask_jobqueue", "dask_cuda"):
            logging.getLogger(name).setLevel(logging.WARNING)
    for name in ("asyncio", "distributed.client", "distributed.utils"):
        logging.getLogger(name).addFilter(_SHUTDOWN_NOISE)  # once: filters are a set
    for name in ("distributed.nanny", "distributed.scheduler"):
        logging.getLogger(name).addFilter(_LOST_WORKER_NOISE)
    with dask.config.set({"distributed.scheduler.allowed-failures": s.retries}):
        cluster = None
        try:
            if s.kind == "address":
                problem = scheduler_problem(s.address)
                try:
                    if problem:
                        raise OSError(problem)
                    client = Client(s.address, timeout=f"{CONNECT_TIMEOUT_S:g}s")
                except (OSError, ValueError, TypeError) as exc:
                    where = ({"field": s.source} if s.source.startswith("--") else
                             {"file": s.source, "field": "cluster.address"})
                    raise KingenError(problem or f"cannot reach the scheduler: "
                                      f"{one_line(exc)}", value=s.address, **where) from None
            else:
                if s.kind in ("slurm", "pbs"):
                    _need_submit_command(s)
                cluster = (_start_local_cluster(s, env) if s.kind == "local" else
                           jobqueue_cluster(s))
                if s.kind in ("slurm", "pbs"):
                    submit_jobs(cluster, s)
                # The driver runs beside the scheduler (local, or the batch system's login
                # node): results come straight from the workers, not through the scheduler.
                client = Client(cluster, direct_to_workers=True)
            try:
                if wait and s.kind in ("local", "address"):
                    _first_worker(client, s)
                yield client
            finally:
                client.close()
        finally:
            if cluster is not None:
                _close_cluster(cluster, local=s.kind == "local")
