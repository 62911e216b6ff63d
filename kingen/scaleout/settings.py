"""Where the work runs, as the user says it: a ``[cluster]`` table or a ``--cluster`` value,
checked into :class:`ClusterSettings` (the cluster it builds is
:mod:`kingen.scaleout.cluster`'s).

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

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kingen.errors import KingenError
from kingen.model.fields import Fields, join, loads_toml

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
    """Where a fit or a batch runs (see the module docstring and the documentation's
    "Scale out" how-to).

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
