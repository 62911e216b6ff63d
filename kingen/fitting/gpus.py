"""One fit over several GPUs of this machine, in one process (``kingen fit --gpus``).

:class:`GpuShards` stands where :class:`~kingen.fitting.evaluator.InProcess` stands for the
GA loop. Each generation's candidates are cut into contiguous row blocks, one per GPU, and
each block is scored by an objective of its own on its GPU: the fit's objective for the
first, copies built as a Dask worker builds one (the scheme, the protocols with their noise
model, the solver options) for the others. Every block is solved with the launch the whole
batch would take: each candidate is scored exactly as on one GPU, and so the fit is the
same, generation by generation.

A thread per GPU drives it: the thread makes its GPU current once (``select_device``), and
each call prepares its block on the host, launches the kernels, waits for them and reads the
scores back, while the other threads do the same for theirs. The waits release Python's
lock, and the host's parts are numpy and numba work on each thread's share of the cores.
The resting occupancies are solved for the whole batch on the caller's thread while the
blocks start (their sample kernels wait for them; their matrix builds do not), as one call
solves them (a block of fewer rows could take another solve,
equal only up to rounding), on all cores (on the two-H200 machine a block's thread got no
speed-up from numba's parallel loops). The rest of a block's
inputs (its rates in the solver's layout) is made on its own thread, beside the other
blocks': made on the caller's thread before the blocks start, it was slower
(``docs/performance.md``).
Two threads enter numba's parallel loops at once, which its ``omp`` and ``tbb`` threading
layers allow and its ``workqueue`` layer does not: :class:`GpuShards` refuses to start on
that one. The blocks and their scores stay in this process's memory, where Dask's workers
(:mod:`kingen.scaleout.shard`) pay a send and a return of them every generation.

One thread driving every GPU in turn (each block's device made current over the last, the
next block prepared while the last one's GPU computes) was slower on two H200s
(``docs/performance.md``, "Scale-out").

Examples
--------
Three blocks on the CPU backend (no device to make current), scored as one call would:

>>> import kingen, numpy as np
>>> cfg = kingen.load_config(kingen.demo_config())
>>> objective = kingen.Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu"))
>>> rates = cfg.scheme.complete(np.stack([cfg.scheme.values * f for f in (1.0, 1.1, 0.9)]))
>>> with GpuShards(objective, [0, 0, 0], select=None) as shards:
...     ev, timings = shards(rates)
>>> bool(np.array_equal(ev.fitness, objective.evaluate(rates)[0].fitness))
True
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Any

import numba
import numpy as np

from kingen.errors import KingenError
from kingen.fitting.objective import Evaluation, Objective
from kingen.solve.inputs import checked_shape
from kingen.solve.rest import rest_occupancy_batch

__all__ = ["GpuEvaluators", "GpuShards", "gpu_devices", "join_evaluations", "parse_gpus",
           "threading_layer"]

_OPTIONAL = ("sweep_amplitudes", "offsets", "chi2")

SWITCH_INTERVAL_S = 2e-4
"""Python's thread switch interval while the blocks are scored (``sys.setswitchinterval``;
5 ms by default). A block's thread that comes back from numpy or numba work, which ran
without Python's lock, waits for the lock until the thread holding it lets it go, at most
this long. At 65,536 Robert & Howe candidates over two H200s a generation took 0.157–0.161
s with 0.2 ms, 0.160–0.168 s with 5 ms (``docs/performance.md``, "Scale-out")."""


def threading_layer() -> str:
    """The threading layer numba's parallel loops run on (``omp``, ``tbb`` or
    ``workqueue``), or ``none`` before any has run.

    >>> threading_layer() in ("omp", "tbb", "workqueue", "none")
    True
    """
    try:
        return str(numba.threading_layer())
    except ValueError:  # no parallel loop has run yet
        return "none"


def _select_cuda(device: int) -> None:
    from numba import cuda

    cuda.select_device(device)

def parse_gpus(value: int | str) -> int | None:
    """``--gpus VALUE`` as a count (None: ``all``).

    Examples
    --------
    >>> parse_gpus("2"), parse_gpus("all")
    (2, None)
    >>> parse_gpus("0")
    Traceback (most recent call last):
    ...
    kingen.errors.KingenError: --gpus = '0': must be >= 1
    """
    if value == "all":
        return None
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise KingenError("give a number of GPUs or all", field="--gpus", value=value) from None
    if count < 1:
        raise KingenError("must be >= 1", field="--gpus", value=value)
    return count


def gpu_devices(value: int | str, backend: str) -> list[int]:
    """The GPUs ``--gpus VALUE`` names: ``all`` or a count, from device 0.

    Parameters
    ----------
    value
        A count (at least 1) or ``"all"``.
    backend
        The run's solver backend: several GPUs need ``cuda``.

    Raises
    ------
    KingenError
        Not a count, more GPUs than the machine has, or a CPU run asked for more than one.

    Examples
    --------
    >>> gpu_devices(1, "cpu")
    [0]
    >>> gpu_devices("two", "cuda")
    Traceback (most recent call last):
    ...
    kingen.errors.KingenError: --gpus = 'two': give a number of GPUs or all
    """
    count = parse_gpus(value)
    if count == 1:
        return [0]
    if backend != "cuda":
        raise KingenError(f"several GPUs need the GPU backend; this run solves on {backend}",
                          field="--gpus", value=value)
    from numba import cuda

    have = len(cuda.gpus)
    if count is None:
        return list(range(have))
    if count > have:
        raise KingenError(f"this machine has {have} GPU{'s' if have != 1 else ''}",
                          field="--gpus", value=value)
    return list(range(count))


def join_evaluations(parts: Sequence[Evaluation]) -> Evaluation:
    """One :class:`~kingen.fitting.objective.Evaluation` of row blocks' evaluations, in
    their order.

    Examples
    --------
    >>> one = Evaluation(np.array([1.0]), np.ones((1, 2)), np.zeros(1, np.int64),
    ...                  np.ones((1, 2)))
    >>> join_evaluations([one, one]).errors.shape
    (2, 2)
    """
    joined = {name: np.concatenate([getattr(p, name) for p in parts])
              for name in ("fitness", "errors", "fail", "amplitudes")}
    for name in _OPTIONAL:
        if getattr(parts[0], name) is not None:
            joined[name] = np.concatenate([getattr(p, name) for p in parts])
    return Evaluation(**joined)


class GpuShards:
    """Scores each batch over several GPUs of this process, one row block per GPU, each on
    a thread of its own.

    Parameters
    ----------
    objective
        The fit's objective: it scores the first block, and the others' objectives are
        built from its scheme, protocols (with their noise model) and solver options.
    devices
        The GPUs, one block each (:func:`gpu_devices`); the first must be the one the
        objective runs on (device 0). The same device twice gives it two blocks (tests do,
        to run the path on one GPU or none).
    select
        Makes a device current on the calling thread (default: ``numba.cuda.select_device``);
        None: nothing to select (the CPU backend, in tests).
    switch_interval
        Python's thread switch interval during a call, restored after it
        (:data:`SWITCH_INTERVAL_S`); None: leave it as it is.

    Raises
    ------
    KingenError
        Numba runs its parallel loops on its ``workqueue`` threading layer, which two
        threads must not enter at once.
    """

    def __init__(self, objective: Objective, devices: Sequence[int], *,
                 select: Callable[[int], None] | None = _select_cuda,
                 switch_interval: float | None = SWITCH_INTERVAL_S) -> None:
        if not devices:
            raise KingenError("no GPU to score on", field="--gpus")
        self.devices = list(devices)
        self.select = select
        self.switch_interval = switch_interval
        # each block's numba loops get their share of the cores the caller has
        self.threads = max(1, numba.get_num_threads() // len(self.devices))
        self._pools = [ThreadPoolExecutor(1, thread_name_prefix=f"kingen-gpu{d}")
                       for d in self.devices]
        self.objectives: list[Objective] = []
        try:
            built = [pool.submit(self._build, objective, i)
                     for i, pool in enumerate(self._pools)]
            wait_all(built)
            self.objectives = [f.result() for f in built]
        except BaseException:
            self.close()
            raise
        self._check_threading_layer()

    def _build(self, objective: Objective, i: int) -> Objective:
        if self.select is not None:
            self.select(self.devices[i])
        numba.set_num_threads(self.threads)
        if i == 0:
            return objective
        copy = Objective(objective.scheme, objective.items, objective.simulator.options)
        # compiles (or loads) the solver on this GPU now, not in the first generation
        copy.evaluate(objective.scheme.values[None, :])
        return copy

    def _check_threading_layer(self) -> None:
        if threading_layer() == "workqueue" and len(self.devices) > 1:
            self.close()
            raise KingenError("several GPUs need numba's omp or tbb threading layer (this "
                              "process has only workqueue, which two threads must not "
                              "enter at once): pip install tbb", field="--gpus",
                              value=len(self.devices))

    def __call__(self, params: np.ndarray, while_solving: Callable[[], object] | None = None
                 ) -> tuple[Evaluation, dict[str, float]]:
        """The engine's evaluator (:class:`kingen.fitting.evaluator.Evaluator`): rate
        constants with derived rates computed, to scores and timings. ``while_solving`` is
        called on the caller's thread once every block's kernels are launched.

        ``total_s`` is the call's wall time; ``solve_s``, ``prepare_s`` and ``finish_s``
        are the slowest block's (the critical path); ``rest_s`` is the caller's solve of
        the resting occupancies, from the call's start (the blocks' threads start theirs
        meanwhile).
        """
        t0 = time.perf_counter()
        scheme = self.objectives[0].scheme
        # the resting occupancies' compiled loop reads the columns unchecked
        params = np.ascontiguousarray(checked_shape(scheme, params))
        n = params.shape[0]
        k = max(1, min(len(self.objectives), n))
        bounds = np.linspace(0, n, k + 1).round().astype(np.int64)
        launched = [threading.Event() for _ in range(k)]
        interval = sys.getswitchinterval()
        futures = []
        solved: Future = Future()
        try:
            if self.switch_interval is not None:
                sys.setswitchinterval(self.switch_interval)
            # solved here for the whole batch, so that every row starts where one call
            # starts it (a block below 64 rows would take NumPy's solve, the batch the
            # compiled loop: they differ at rounding) and on all cores (on a block's thread
            # it took 3-7 times as long on two H200s, though the generation did not change),
            # while the blocks' threads upload their rates and queue their matrix builds:
            # each takes its slice when its sample kernel needs it
            for i in range(k):
                a, b = bounds[i], bounds[i + 1]
                futures.append(self._pools[i].submit(
                    self._solve, i, params[a:b], n, launched[i],
                    lambda a=a, b=b: solved.result()[a:b]))
            solved.set_result(rest_occupancy_batch(scheme, params))
            rest_s = time.perf_counter() - t0
            if while_solving is not None:
                for event in launched:  # set at the launch, or when its block ends early
                    event.wait()
                while_solving()
        finally:  # no block may still run while the caller goes on (Ctrl-C, an error)
            if not solved.done():  # the blocks waiting on the solve end, not hang
                solved.set_exception(KingenError("the generation's call ended before its "
                                                 "resting occupancies were solved"))
            wait_all(futures)
            sys.setswitchinterval(interval)
        parts = [f.result() for f in futures]  # the first failed block's error, if any
        ev = join_evaluations([p[0] for p in parts])
        slowest = max((p[1] for p in parts), key=lambda t: t.get("total_s", 0.0))
        timings = {key: float(slowest[key]) for key in ("solve_s", "prepare_s", "finish_s")
                   if key in slowest}
        timings["rest_s"] = rest_s
        timings["total_s"] = time.perf_counter() - t0
        return ev, timings

    def _solve(self, i: int, block: np.ndarray, batch_rows: int, launched: threading.Event,
               rest: Callable[[], np.ndarray]) -> tuple[Evaluation, dict[str, float]]:
        try:
            ev, res = self.objectives[i].evaluate(block, complete=False,
                                                  while_solving=launched.set,
                                                  batch_rows=batch_rows, rest=rest)
        finally:
            launched.set()
        return ev, res.timings

    def take_reruns(self) -> None:
        """No workers to lose (see :class:`kingen.fitting.evaluator.Evaluator`)."""
        return None

    def close(self) -> None:
        """Let the threads go and drop the copies' objectives (their GPU buffers with
        them)."""
        for pool in self._pools:
            pool.shutdown(wait=True)
        del self.objectives[1:]

    def __enter__(self) -> GpuShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GpuEvaluators:
    """Makes the engine's evaluator from the run's objective (:func:`kingen.fit`'s
    ``evaluator``), and closes what it made.

    Parameters
    ----------
    gpus
        ``--gpus``: a count or ``"all"`` (:func:`gpu_devices`).
    """

    def __init__(self, gpus: int | str) -> None:
        parse_gpus(gpus)  # a bad value is told before anything runs
        self.gpus = gpus
        self.made: list[GpuShards] = []

    def __call__(self, objective: Objective) -> Any:
        from kingen.fitting.evaluator import InProcess

        devices = gpu_devices(self.gpus, objective.simulator.backend)
        if len(devices) == 1:
            return InProcess(objective)
        shards = GpuShards(objective, devices)
        self.made.append(shards)
        return shards

    def close(self) -> None:
        for shards in self.made:
            shards.close()

    def __enter__(self) -> GpuEvaluators:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
