"""The evaluator: what scores a generation's candidates, in ONE call.

:class:`Evaluator` is the protocol the controller (:class:`kingen.fitting.engine.Engine`)
calls; its hooks are declared, never probed for. :class:`InProcess` is the default: the
objective's batched solve on this machine. A scale-out evaluator replaces it (for example
:class:`kingen.scaleout.shard.ShardedEvaluator`, which shards the batch across GPUs) and
nothing else changes. :class:`FromFunction` makes an evaluator of a plain function.

Examples
--------
A plain function that scores each candidate by the sum of its rate constants:

>>> import numpy as np
>>> from kingen.fitting.objective import Evaluation
>>> def by_sum(params):
...     n = params.shape[0]
...     ev = Evaluation(fitness=params.sum(axis=1), errors=np.zeros((n, 1)),
...                     fail=np.zeros(n, dtype=np.int64), amplitudes=np.ones((n, 1)))
...     return ev, {"total_s": 0.0, "solve_s": 0.0}
>>> evaluate = FromFunction(by_sum)
>>> ev, timings = evaluate(np.array([[1.0, 2.0], [0.5, 0.5]]), while_solving=lambda: None)
>>> ev.fitness.tolist(), evaluate.take_reruns()
([3.0, 1.0], None)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from kingen.fitting.objective import Evaluation, Objective

Timings = Mapping[str, float]


class Evaluator(Protocol):
    """Scores a batch: ``(N, n_params)`` rate constants (internal units, derived and tied
    rates already computed) -> ``(Evaluation, timings)``.

    ``timings`` may hold ``total_s`` (the solver call) and ``solve_s`` (the kernel alone),
    ``prepare_s`` and ``finish_s`` (the host's parts), and ``dask_*`` (a sharded
    evaluator's overhead), in seconds; the controller adds them to the generation's
    timings. Called once per generation (twice at most: the initial population, or a
    polish).

    Hooks:

    ``while_solving``
        Called by the evaluator once the solve is under way and nothing is left for this
        process but to wait (the GPU's kernels launched, the shards sent): the controller's
        background work (the last generation's write, the next generation's random
        numbers) starts then, and does not slow the solve's preparation. At most once, on
        the thread that called the evaluator, before returning. An evaluator with no such
        moment calls it first (:class:`FromFunction` does); one that never calls it gets
        the work started when it returns.
    :meth:`take_reruns`
        The shards a lost worker held and that ran again since the last call, one dict
        each (``worker``, ``rows``); the run file records them, and their number per
        generation (``shards_rerun``). None from an evaluator that has no workers to lose
        (no such column then).
    """

    def __call__(self, params: np.ndarray, while_solving: Callable[[], object] | None = None
                 ) -> tuple[Evaluation, Timings]:
        ...

    def take_reruns(self) -> list[dict[str, Any]] | None:
        """Shards run again since the last call (see the class docstring)."""
        ...


class InProcess:
    """The default evaluator: the objective's batched solve, in this process.

    Parameters
    ----------
    objective
        The run's objective.
    """

    def __init__(self, objective: Objective) -> None:
        self.objective = objective

    def __call__(self, params: np.ndarray, while_solving: Callable[[], object] | None = None
                 ) -> tuple[Evaluation, Timings]:
        ev, res = self.objective.evaluate(params, complete=False, while_solving=while_solving)
        return ev, res.timings

    def take_reruns(self) -> None:
        return None


class FromFunction:
    """An evaluator of a plain function ``params -> (Evaluation, timings)``: the
    controller's background work starts just before the function is called.

    Parameters
    ----------
    func
        The function.
    """

    def __init__(self, func: Callable[[np.ndarray], tuple[Evaluation, Timings]]) -> None:
        self.func = func

    def __call__(self, params: np.ndarray, while_solving: Callable[[], object] | None = None
                 ) -> tuple[Evaluation, Timings]:
        if while_solving is not None:
            while_solving()
        return self.func(params)

    def take_reruns(self) -> None:
        return None
