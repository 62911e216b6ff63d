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

The settings are :mod:`kingen.scaleout.settings`'s; each of their public names is
importable from here too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kingen.errors import KingenError
from kingen.scaleout.interrupts import ctrl_c_held, in_main_thread
from kingen.scaleout.jobqueue import jobqueue_cluster, need_submit_command, submit_jobs
from kingen.scaleout.local_worker import PRELOAD
from kingen.scaleout.logfilters import (
    ABANDONED,
    LOST_WORKER_NOISE,
    KilledOnClose,
    quiet_shutdown,
)
from kingen.scaleout.settings import (
    KINDS,
    ClusterSettings,
    address_problem,
    cluster_settings,
    parse_cluster_option,
    scheduler_address,
    settings_from_file,
    settings_from_text,
    walltime_seconds,
)

# the settings are importable from here too, as they were before their own module
__all__ = [
    "KINDS", "ClusterSettings", "cluster_settings", "address_problem", "scheduler_address",
    "walltime_seconds", "parse_cluster_option", "settings_from_file", "settings_from_text",
    "local_gpus", "has_dask_cuda", "local_plan", "describe", "connected_lines",
    "jobqueue_cluster", "submit_jobs", "REMIND_S", "NoWorkerClock", "wait_for_a_worker",
    "WORKER_WAIT_S", "CONNECT_TIMEOUT_S", "within", "scheduler_problem", "one_line",
    "open_client",
]


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


"""Seconds a Ctrl-C is held back while a local cluster starts: past them, the start itself
stops (a CUDA driver that hangs, say)."""


def _start_local_cluster(s: ClusterSettings, env: dict[str, str] | None) -> Any:
    """Start a local cluster with Ctrl-C held back
    (:func:`~kingen.scaleout.interrupts.ctrl_c_held`). A press stops the start with the
    cluster closed, or, for a start stopped midway, its new worker processes ended."""
    import multiprocessing

    from distributed.core import Status
    from distributed.deploy.spec import SpecCluster

    plan = local_plan(s)  # outside the hold: its look for GPUs could hang with the driver
    known = set(SpecCluster._instances)
    children = {process.pid for process in multiprocessing.active_children()}
    cluster = None
    try:
        with ctrl_c_held():
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
        logging.getLogger(name).addFilter(ABANDONED)
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
    quiet = KilledOnClose()
    handler = None
    try:
        if local and in_main_thread():
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
    quiet_shutdown()
    for name in ("distributed.nanny", "distributed.scheduler"):
        logging.getLogger(name).addFilter(LOST_WORKER_NOISE)
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
                    need_submit_command(s)
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
