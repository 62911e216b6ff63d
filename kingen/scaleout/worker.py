"""What runs on a Dask worker for a sharded fit: the solver, built once, and one shard.

:class:`SolverPlugin` is a ``distributed.WorkerPlugin``: registered once per fit, it builds
the fit's :class:`~kingen.fitting.objective.Objective` on every worker (those there now and any that
join or restart later) and solves two candidates so that the solver is compiled (or loaded
from Numba's cache) before the first shard arrives. :func:`evaluate_shard` is the task: a
plain array of parameters in, plain arrays of scores out. Nothing is scattered, so a lost
worker takes nothing with it that the scheduler cannot compute again elsewhere.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numba
import numpy as np

from kingen.base.allocator import keep_freed_memory
from kingen.fitting.objective import Objective, ProtocolData
from kingen.model.scheme import Scheme
from kingen.solve.options import SolverOptions

try:  # the `dask` extra; kingen without it never imports this module
    from distributed import WorkerPlugin, get_worker
except ImportError:  # pragma: no cover
    WorkerPlugin = object  # type: ignore[assignment,misc]


class SolverPlugin(WorkerPlugin):  # type: ignore[misc,valid-type]
    """Builds a fit's objective (and compiles its solver) once per worker.

    Parameters
    ----------
    scheme, items, options
        What :class:`~kingen.fitting.objective.Objective` takes: the same values as the driver's
        (``options``: :class:`~kingen.solve.options.SolverOptions`), so that every worker
        scores a candidate exactly as one process would.
    warm
        One row of parameters solved at set-up (compiles the solver there, not in a task).
    workers_per_host
        How many workers each host runs (:func:`workers_per_host`): each takes its share
        of its host's cores for the solver's threads (:func:`solver_threads`).
    """

    def __init__(self, scheme: Scheme, items: list[ProtocolData], options: SolverOptions, *,
                 warm: np.ndarray | None = None,
                 workers_per_host: Mapping[str, int] | None = None) -> None:
        self.scheme = scheme
        self.items = items
        self.options = options
        self.warm = warm
        self.workers_per_host = dict(workers_per_host or {})
        self.threads = 0
        self.objective: Objective | None = None
        self.setup_s = 0.0

    def setup(self, worker: Any = None) -> None:
        t0 = time.perf_counter()
        keep_freed_memory()  # the nanny started it trimming freed memory at once
        address = getattr(worker, "address", "") or ""
        self.threads = solver_threads(address, self.workers_per_host)
        numba.set_num_threads(self.threads)
        self.objective = Objective(self.scheme, self.items, self.options)
        if self.warm is not None:
            self.objective.evaluate(np.atleast_2d(self.warm))
        self.setup_s = time.perf_counter() - t0

    def teardown(self, worker: Any = None) -> None:
        self.objective = None


def evaluate_shard(plugin: str, params: np.ndarray, complete: bool = True,
                   batch_rows: int | None = None) -> dict[str, Any]:
    """Score one shard on the worker that runs it, with the objective ``plugin`` built,
    with the default launch of the whole batch of ``batch_rows`` it is a part of.

    Returns plain arrays (``fitness``, ``errors``, ``fail``, ``amplitudes``), the solver's
    seconds (``total_s``, ``solve_s``, and its host's ``prepare_s`` and ``finish_s``), the
    objective's own beyond them (``score_s``: its checks of the rates and the errors from
    the solver's sums, as one process spends them), the task's start and end (``started``,
    ``finished``: ``time.time()``) and the worker's address.
    """
    started = time.time()
    worker = get_worker()
    built = worker.plugins[plugin]
    objective = built.objective
    if built.threads:  # numba's thread count is the calling thread's: set it in this one
        numba.set_num_threads(built.threads)
    # Dask hands a task's array argument over in its message's buffer, at any byte offset:
    # unaligned, every array operation on it is slower, and numba compiles its loops apart
    params = np.require(params, np.float64, ("C", "A"))
    t0 = time.perf_counter()
    # the whole generation's launch, so that the shard scores as one process would
    ev, res = objective.evaluate(params, complete=complete, batch_rows=batch_rows)
    scored = time.perf_counter() - t0
    total = float(res.timings.get("total_s", 0.0))
    # wall-clock stamps (the driver's clock on one host) place the task's start and end
    # between the driver's submit and gather: the send, the worker's own share, the return
    return {"fitness": ev.fitness, "errors": ev.errors, "fail": ev.fail,
            "amplitudes": ev.amplitudes, "total_s": total,
            "solve_s": float(res.timings.get("solve_s", 0.0)),
            "prepare_s": float(res.timings.get("prepare_s", 0.0)),
            "finish_s": float(res.timings.get("finish_s", 0.0)),
            "score_s": max(scored - total, 0.0), "worker": worker.address,
            "backend": objective.simulator.backend, "device": objective.simulator.device,
            "threads": numba.get_num_threads(), "started": started, "finished": time.time()}


def workers_per_host(client: Any) -> dict[str, int]:
    """How many workers each host of a cluster runs now.

    Parameters
    ----------
    client
        A connected ``distributed.Client``.

    Returns
    -------
    dict
        Host -> number of workers. A worker whose address names no host (a protocol
        without one) is left out: it is taken as alone on its host.
    """
    counts: Counter[str] = Counter()
    for address in client.nthreads():
        host = _host(address)
        if host:
            counts[host] += 1
    return dict(counts)


def solver_threads(address: str, per_host: Mapping[str, int]) -> int:
    """The threads a worker gives its compiled loops (the resting occupancies; on a CPU
    worker the solver too).

    ``NUMBA_NUM_THREADS`` where it is set (kingen's local CPU cluster sets each worker's
    share). Otherwise the cores this process may use, divided among the workers that share
    them. Without that share every worker of a GPU host started a thread per core: two
    workers on a 32-core host ran 64 threads. A worker pinned to part of the host (dask-cuda
    pins each to its GPU's NUMA node) shares its part with the workers pinned alike: as
    many as the host's workers times the part's fraction of the host.

    Parameters
    ----------
    address
        The worker's address (``tcp://host:port``); empty: alone on its host.
    per_host
        Workers per host (:func:`workers_per_host`), as the fit saw them when it began.

    Returns
    -------
    int
        Between 1 and the size of numba's thread pool.

    Examples
    --------
    More workers on a host than it has cores: one thread each.

    >>> solver_threads("tcp://10.0.0.7:40123", {"10.0.0.7": 10**6})
    1
    >>> solver_threads("tcp://10.0.0.7:40123", {"10.0.0.7": 1}) == min(
    ...     len(os.sched_getaffinity(0)), _numba_pool())  # alone: every core it may use
    True
    """
    pool = _numba_pool()
    if os.environ.get("NUMBA_NUM_THREADS"):
        return max(1, min(int(os.environ["NUMBA_NUM_THREADS"]), pool))
    total = os.cpu_count() or 1
    try:
        mine = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux: no pinning to see
        mine = total
    workers = max(1, int(per_host.get(_host(address), 1))) if address else 1
    sharing = max(1, round(workers * mine / total))
    return max(1, min(mine // sharing, pool))


def _host(address: str) -> str:
    from distributed.comm import get_address_host

    try:
        return str(get_address_host(address))
    except Exception:  # a protocol whose addresses name no host (ucx://, inproc://)
        return ""


def _numba_pool() -> int:
    """The size of numba's thread pool, which ``set_num_threads`` may not exceed (fixed
    when numba started its threads; ``numba.config`` can be reloaded since)."""
    from numba.np.ufunc import parallel

    return int(getattr(parallel, "NUM_THREADS", numba.config.NUMBA_NUM_THREADS))
