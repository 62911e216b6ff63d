"""One fit across several workers: each generation's candidates cut into one shard per worker.

:class:`ShardedEvaluator` stands where the fit's :class:`~kingen.fitting.objective.Objective` stood
for the GA loop: one call per generation, with the same arguments and the same
:class:`~kingen.fitting.objective.Evaluation` back. Inside, the (N, P) parameters are cut into
contiguous row blocks, one per worker, each sent as a plain array argument of one task
(:func:`kingen.scaleout.worker.evaluate_shard`), and the results are concatenated in
shard order. Every row is scored alone by the same solver, so the result does not depend on
the number of shards: the same seed and backend give what one process gives. The GA's
random streams never leave the driver.

A worker lost while it holds a shard is Dask's to handle: the scheduler runs the shard
again on another worker (up to ``[cluster] retries`` times). The evaluator hears of it from
the scheduler's ``remove-worker`` events and keeps one record per shard run again
(:meth:`ShardedEvaluator.take_reruns`), which the fit writes to its run file.

A cluster that cannot go on stops the fit with one line (:class:`ClusterLost`), never a
silent wait: the scheduler lost, or no worker left for ``no_worker_s`` seconds. The calls
that every worker must answer (building and dropping the solver) are given a time limit: a
worker stuck on its way out (Dask leaves one so when it fails to start) answers nothing.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.fitting.objective import Evaluation, ProtocolData
from kingen.model.scheme import Scheme
from kingen.scaleout.cluster import NoWorkerClock, one_line
from kingen.scaleout.cluster import within as _within
from kingen.solve.options import SolverOptions

BUILD_WAIT_S = 900.0
"""Seconds the workers are given to build the solver (a cold compile takes minutes)."""

BUILD_RETRIES = 2
"""Times the solver is built again after a worker was lost while building it."""

DROP_WAIT_S = 30.0
"""Seconds the scheduler is given to drop the solver from its workers at the fit's end."""

class ClusterLost(KingenError):
    """The cluster could not score a generation: the scheduler was lost, no worker was
    left, or a shard failed on every worker it was given to. The run file keeps every
    committed generation: the fit can be resumed."""


@dataclass
class ShardTimings:
    """What :meth:`ShardedEvaluator.evaluate` returns beside the scores (the part of a
    :class:`~kingen.solve.batch.BatchResult` the fit reads): ``timings`` holds
    ``total_s`` and ``solve_s`` of the busiest worker (the critical path), its objective's
    ``score_s``, and ``dask_s``, the rest of the call's wall time (cutting, sending,
    waiting, gathering), split into ``dask_send_s``, ``dask_worker_s`` and
    ``dask_return_s`` (see :func:`_critical_path`)."""

    backend: str
    device: str
    timings: dict[str, float] = field(default_factory=dict)


class ShardedEvaluator:
    """Scores batches of candidates on a Dask cluster, one shard per worker.

    Parameters
    ----------
    client
        A connected ``distributed.Client``.
    scheme, items, backend, precision, step, courant
        The fit's objective, as :class:`~kingen.fitting.objective.Objective` takes it.
    warm
        One row of parameters each worker solves once at set-up (compiles its solver).
    shards
        Shards per call (default: the number of workers at each call, times ``pieces``).
    pieces
        Shards given to each worker at once (default 1). A worker solves its pieces one
        after the other, and Dask sends the second while the first is solved and returns
        the first while the second is. On one H100 at 65,536 R&H candidates two pieces
        gave the same speed as one (``benchmarks/results/h100/dask_scaling/
        shard_one_worker_pieces.json``): Dask's send and return there are latency, not
        transfer.
    no_worker_s
        Seconds a generation waits while the cluster has no worker before the fit stops
        (:class:`ClusterLost`); ``None``: as long as it takes (a batch system's jobs may
        wait in its queue). ``say`` (a callable taking a line) hears of the wait once a
        minute.

    Examples
    --------
    >>> import kingen
    >>> from distributed import Client, LocalCluster            # doctest: +SKIP
    >>> cfg = kingen.load_config(kingen.demo_config())          # doctest: +SKIP
    >>> with Client(LocalCluster(n_workers=2)) as client:       # doctest: +SKIP
    ...     ev = ShardedEvaluator.for_config(client, cfg)
    ...     scores, _ = ev.evaluate(cfg.pmap.to_params(cfg.pmap.start_genes()[None]))
    ...     ev.close()
    """

    def __init__(self, client: Any, scheme: Scheme, items: list[ProtocolData],
                 options: SolverOptions | None = None, *, warm: np.ndarray | None = None,
                 shards: int | None = None, pieces: int = 1, no_worker_s: float | None = 120.0,
                 say: Callable[[str], object] | None = None) -> None:
        from kingen.scaleout.worker import SolverPlugin, workers_per_host

        self.client = client
        self.token = uuid.uuid4().hex[:12]
        self.plugin = f"kingen-solver-{self.token}"
        if pieces < 1:
            raise KingenError("must be >= 1", field="pieces", value=pieces)
        self.shards = shards
        self.pieces = pieces
        self.no_worker_s = no_worker_s
        self.say = say
        self.calls = 0
        self._keys: dict[str, tuple[int, int, int]] = {}  # key -> (call, shard, rows)
        self._lost: list[dict[str, Any]] = []
        self._reruns: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.workers_seen: set[str] = set()
        self.backend, self.device = "", ""
        client.subscribe_topic("all", self._on_event)
        plugin = SolverPlugin(scheme, items, options if options is not None else SolverOptions(),
                              warm=warm, workers_per_host=workers_per_host(client))
        try:
            # the workers' statuses as the build starts: one stuck now may be gone when the
            # build's wait has run out, and the message must still name it (read inside the
            # try: Ctrl-C in this wait too must stop the scheduler writing to us)
            before = _worker_status(client)
            for attempt in range(1 + BUILD_RETRIES):
                done, error = _within(BUILD_WAIT_S, client.register_plugin, plugin,
                                      name=self.plugin)
                # A worker lost while it built (its connection closed) fails the whole
                # call, though the scheduler keeps the plugin for every worker that joins:
                # build again on those left (a nanny's restarted worker among them).
                if not (done and isinstance(error, OSError) and attempt < BUILD_RETRIES
                        and self._has_workers()):
                    break
        except BaseException:  # Ctrl-C: the scheduler must not write to a closing client
            with contextlib.suppress(Exception):  # a client already closed has no topics
                client.unsubscribe_topic("all")
            raise
        if not done or error is not None:
            # no worker that joins later may build this fit's solver
            _within(DROP_WAIT_S, client.unregister_worker_plugin, self.plugin)
            with contextlib.suppress(Exception):
                client.unsubscribe_topic("all")
            why = (one_line(error) if done else f"no answer within {BUILD_WAIT_S:g} s")
            why += _stuck_workers(client, before)
            raise KingenError(f"the workers could not build the solver: {why}",
                              field="--cluster") from None

    @classmethod
    def for_config(cls, client: Any, cfg: Any, **kwargs: Any) -> ShardedEvaluator:
        """An evaluator for a loaded :class:`~kingen.fitting.config.FitConfig`, scoring as
        ``Objective(cfg.scheme, cfg.protocols, cfg.solver)`` does: on relative errors
        unless the protocols carry a noise model. A fit scores the likelihood with the noise
        model it estimates at its start, so its evaluator is built from its objective
        instead (``kingen fit --cluster``: :mod:`kingen.scaleout.fitting`)."""
        warm = cfg.pmap.to_params(cfg.pmap.start_genes()[None, :])
        return cls(client, cfg.scheme, cfg.protocols, cfg.solver, warm=warm, **kwargs)

    # ------------------------------------------------------------------ events
    def _on_event(self, event: Any) -> None:
        """The scheduler's ``all`` topic: note the shards a removed worker held."""
        _, msg = event
        if not isinstance(msg, dict) or msg.get("action") != "remove-worker":
            return
        keys = set(msg.get("processing-tasks") or ()) | set(msg.get("lost-computed-tasks")
                                                             or ())
        with self._lock:
            for key in keys:
                if key in self._keys:
                    call, shard, rows = self._keys[key]
                    self._lost.append({"evaluation": call, "shard": shard, "rows": rows,
                                       "worker": str(msg.get("worker", "")),
                                       "time": _dt.datetime.now(_dt.timezone.utc).isoformat(
                                           timespec="seconds")})

    def take_reruns(self) -> list[dict[str, Any]]:
        """The shards run again since the last call (a lost worker held them): one dict per
        shard with ``evaluation`` (the call's number), ``shard``, ``rows``, ``worker`` (the
        lost one) and ``time``."""
        with self._lock:
            out, self._reruns = self._reruns, []
        return out

    def _has_workers(self) -> bool:
        try:
            return bool(self.client.nthreads())
        except Exception:  # noqa: BLE001 - the scheduler gone: nothing to build on
            return False

    @property
    def n_workers(self) -> int:
        """Workers the scheduler has now."""
        return len(self.client.nthreads())

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, params: np.ndarray, *, complete: bool = True,
                 while_solving: Callable[[], object] | None = None
                 ) -> tuple[Evaluation, ShardTimings]:
        """Score a batch: one task per shard, results in row order.

        Parameters
        ----------
        params
            (N, n_params) internal units.
        complete
            As :meth:`kingen.fitting.objective.Objective.evaluate`.
        while_solving
            Called once every shard is submitted, before waiting for them.

        Raises
        ------
        KingenError
            A shard failed on every worker it was given to (``[cluster] retries``
            exceeded), or the cluster has no worker.
        """
        import dask

        from kingen.scaleout.worker import evaluate_shard

        t0 = time.perf_counter()
        submitted = time.time()
        params = np.ascontiguousarray(np.atleast_2d(params), dtype=np.float64)
        self.calls += 1
        n = params.shape[0]
        try:
            workers = sorted(self.client.nthreads())
        except OSError as exc:  # Dask's CommClosedError too
            raise self._lost_scheduler(exc) from None
        if not workers:
            raise KingenError("the cluster has no worker", field="--cluster")
        k = max(1, min(self.shards or len(workers) * self.pieces, n))
        bounds = np.linspace(0, n, k + 1).round().astype(np.int64)
        futures = []
        keys: list[str] = []

        def send(i: int, key: str, worker: str | None) -> Any:
            with self._lock:
                self._keys[key] = (self.calls, i, int(bounds[i + 1] - bounds[i]))
            keys.append(key)
            # Dask's advice for large task arguments is to scatter them: by design they are
            # not (a lost worker would take them with it), so its warning would be no news
            with dask.config.set({"distributed.admin.large-graph-warning-threshold":
                                  "1 PiB"}):
                return self.client.submit(
                    evaluate_shard, self.plugin, params[bounds[i]:bounds[i + 1]], complete,
                    n, key=key, pure=False, retries=0, **({} if worker is None else {
                        "workers": [worker], "allow_other_workers": True}))

        for i in range(k):
            # each worker its share, but loosely: a lost worker's shards run elsewhere
            futures.append(send(i, f"kingen-shard-{self.token}-{self.calls}-{i}",
                                workers[i % len(workers)]))
        if while_solving is not None:
            try:  # its errors are the caller's, not a shard's
                while_solving()
            except BaseException:
                with self._lock:
                    for key in keys:
                        self._keys.pop(key, None)
                raise

        def again(i: int) -> Any:  # a shard Dask left waiting for its lost worker
            return send(i, f"kingen-shard-{self.token}-{self.calls}-{i}-again{len(keys)}",
                        None)

        try:
            self._wait(futures, again)
            parts = self.client.gather(futures)
        except ClusterLost:
            raise
        except Exception as exc:
            if isinstance(exc, OSError) or "scheduler-connection-lost" in str(exc):
                raise self._lost_scheduler(exc) from None
            if type(exc).__name__ == "KilledWorker":  # Dask's text runs to a paragraph
                why = ("each worker it was given to was lost (more times than [cluster] "
                       "retries allows)")
            else:
                why = f"failed: {one_line(exc)}"
            raise ClusterLost(f"a shard of evaluation {self.calls} {why}",
                              field="--cluster") from None
        finally:
            with self._lock:
                for key in keys:
                    self._keys.pop(key, None)
                lost, self._lost = self._lost, []
                self._reruns.extend(lost)
            del futures
        wall = time.perf_counter() - t0
        gathered = time.time()
        ev = Evaluation(fitness=np.concatenate([p["fitness"] for p in parts]),
                        errors=np.concatenate([p["errors"] for p in parts]),
                        fail=np.concatenate([p["fail"] for p in parts]),
                        amplitudes=np.concatenate([p["amplitudes"] for p in parts]))
        self.workers_seen.update(p["worker"] for p in parts)
        self.backend, self.device = parts[0]["backend"], parts[0]["device"]
        timings = _critical_path(parts, wall, submitted, gathered)
        timings["shards"] = float(k)
        return ev, ShardTimings(self.backend, self.device, timings)

    def _lost_scheduler(self, exc: BaseException) -> ClusterLost:
        address = getattr(getattr(self.client, "scheduler", None), "address", "") or "?"
        why = ("its connection dropped" if "scheduler-connection-lost" in str(exc)
               else one_line(exc))
        return ClusterLost(f"lost the scheduler at {address} ({why})", field="--cluster")

    def _wait(self, futures: list[Any], again: Callable[[int], Any] | None = None,
              poll_s: float = 2.0) -> None:
        """Wait for the shards, watching that the cluster still has a worker to run them.

        A shard whose every worker was lost at once (a one-GPU host's only worker) stays in
        Dask's ``no-worker`` state when a worker comes back (distributed 2026.7: its loose
        worker restriction is not looked at again), so ``again(i)`` sends shard ``i`` anew,
        with no restriction, in place of the one left waiting.
        """
        from distributed import wait

        # the first look comes a slice after the last, which may have found a worker
        clock = NoWorkerClock(head_start_s=poll_s)
        while True:
            try:
                wait(futures, timeout=poll_s)
                return
            except TimeoutError:
                pass
            if self.client.status != "running":  # closed: the futures say why
                return
            if self.client.nthreads():
                clock.reset()
                if again is not None:
                    for i in self._left_waiting(futures):
                        self.client.cancel(futures[i])
                        futures[i] = again(i)
                continue
            waited, due = clock.tick()
            if self.no_worker_s is not None and waited >= self.no_worker_s:
                raise ClusterLost(f"the cluster has had no worker for {waited:.0f} s "
                                  f"(evaluation {self.calls} waits for one)",
                                  field="--cluster")
            if self.say is not None and due:
                self.say(f"evaluation {self.calls} waits for a worker: the cluster has "
                         f"none ({waited:.0f} s so far)")

    def _left_waiting(self, futures: list[Any]) -> list[int]:
        """The shards the scheduler holds in its ``no-worker`` state though it has workers."""
        waiting = {f.key: i for i, f in enumerate(futures) if not f.done()}
        if not waiting:
            return []
        try:  # a lambda, sent by value: the scheduler need not import kingen
            stuck = self.client.run_on_scheduler(
                lambda dask_scheduler, keys=tuple(waiting): [
                    key for key in keys if key in dask_scheduler.tasks
                    and dask_scheduler.tasks[key].state == "no-worker"])
        except Exception:  # noqa: BLE001 - the scheduler gone: the futures say so next
            return []
        return [waiting[key] for key in stuck]

    def __call__(self, params: np.ndarray, while_solving: Callable[[], object] | None = None
                 ) -> tuple[Evaluation, dict[str, float]]:
        """The engine's evaluator (:class:`kingen.fitting.evaluator.Evaluator`): rate constants
        with derived rates computed, to scores and ``total_s``, ``solve_s``, ``dask_s``;
        ``while_solving`` is called once the shards are sent (see :meth:`evaluate`)."""
        ev, timing = self.evaluate(params, complete=False, while_solving=while_solving)
        return ev, timing.timings

    def close(self) -> None:
        """Stop listening to the scheduler and drop the workers' objectives. A scheduler
        that does not confirm the drop within :data:`DROP_WAIT_S` is left to it (``say``
        hears which workers did not answer): the fit itself is done.

        Listening stops first, and at once (a message, no wait): a Ctrl-C during the wait
        for the drop (a second press, as the first one's fit closes) used to skip it, and
        the scheduler then wrote the client's own removal to the closed client, logging a
        CRITICAL line and a traceback under "kingen: interrupted"."""
        try:
            self.client.unsubscribe_topic("all")
        except Exception:
            pass
        if self.client.status == "running":
            # as for the build: a worker stuck as the wait begins may be gone when it ends
            before = _worker_status(self.client) if self.say is not None else {}
            done, _ = _within(DROP_WAIT_S, self.client.unregister_worker_plugin, self.plugin)
            # an error means the cluster is gone: nothing is left to free
            if not done and self.say is not None:
                self.say(f"the scheduler did not confirm within {DROP_WAIT_S:g} s that its "
                         f"workers dropped this fit's solver"
                         f"{_stuck_workers(self.client, before)}")

    def __enter__(self) -> ShardedEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _critical_path(parts: list[dict[str, Any]], wall: float, submitted: float,
                   gathered: float) -> dict[str, float]:
    """The call's timings from the worker that was busy longest (the critical path).

    ``total_s``, ``solve_s``, ``prepare_s`` and ``finish_s`` are its solver calls' (summed
    over its shards) and ``score_s`` its objective's work beyond them, which one process
    does too. ``dask_s`` is the rest of the call's wall time, split into ``dask_send_s``
    (submit to its first shard's start), ``dask_worker_s`` (its tasks' time beyond the
    objective, and any gap between them) and ``dask_return_s`` (its last shard's end to the
    gathered result).
    """
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        by_worker.setdefault(p["worker"], []).append(p)
    busiest = max(by_worker.values(),
                  key=lambda ps: sum(p["total_s"] + p.get("score_s", 0.0) for p in ps))
    solver = sum(p["total_s"] for p in busiest)
    busy = solver + sum(p.get("score_s", 0.0) for p in busiest)
    # a worker that does not stamp its tasks leaves the split to the send
    first = min(p.get("started", submitted) for p in busiest)
    last = max(p.get("finished", gathered) for p in busiest)
    return {"total_s": solver, "solve_s": sum(p["solve_s"] for p in busiest),
            **{key: sum(p.get(key, 0.0) for p in busiest) for key in ("prepare_s", "finish_s")},
            "score_s": busy - solver, "dask_s": max(wall - busy, 0.0),
            "dask_send_s": max(first - submitted, 0.0),
            "dask_worker_s": max(last - first - busy, 0.0),
            "dask_return_s": max(gathered - last, 0.0)}


def _worker_status(client: Any) -> dict[str, str]:
    """Each worker the scheduler lists, with its status (empty if it does not answer
    within 10 s)."""
    box: list[dict[str, Any]] = []
    _within(10.0, lambda: box.append(client.scheduler_info(n_workers=-1)))
    workers = box[0].get("workers", {}) if box else {}
    return {address: str(w.get("status", "running")) for address, w in workers.items()}


def _stuck_workers(client: Any, before: dict[str, str] | None = None) -> str:
    """``; workers not running: ADDRESS (closing), ...`` for the workers a scheduler lists
    that are not running (one that failed to start can stay so), or nothing. ``before``:
    the statuses at the start of the wait; a worker not running then and gone since is
    named too (a nanny may be restarting it, or it finished closing)."""
    now = _worker_status(client)
    stuck = {a: s for a, s in (before or {}).items() if s != "running" and a not in now}
    stuck.update((a, s) for a, s in now.items() if s != "running")
    names = [f"{a} ({s})" for a, s in sorted(stuck.items())]
    return f"; workers not running: {', '.join(names)} (restart them)" if names else ""

