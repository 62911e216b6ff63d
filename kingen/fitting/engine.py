"""The search's controller: one generation at a time, reported to the driver.

:class:`Engine` runs one search: it asks the algorithm (:mod:`kingen.fitting.algorithms`,
named by ``[ga] algorithm``) for genes, scores them through the evaluator in ONE call,
keeps the hall of fame, tells the algorithm the scores, and stops when a rule holds
(maximum generations, patience, target error, wall time). It knows no algorithm by name.
Each generation's population and resume state go to the driver's store
(``append_generation``) on a background thread, during the next generation's solve.

The evaluator (:class:`~kingen.fitting.evaluator.Evaluator`) is by default the objective's
batched solve in this process (:class:`~kingen.fitting.evaluator.InProcess`); a scale-out
engine replaces it and nothing else changes.

Examples
--------
A search of two genes scored by a stand-in evaluator, its generations kept in a list:

>>> import numpy as np
>>> from kingen.fitting.config import demo_config, load_config
>>> from kingen.fitting.evaluator import FromFunction
>>> from kingen.fitting.objective import Evaluation
>>> from kingen.fitting.progress import Progress
>>> cfg = load_config(demo_config(), overrides={"output": "unused.h5", "population": 6,
...                                             "generations": 3})
>>> def by_sum(params):
...     n = params.shape[0]
...     return Evaluation(fitness=params.sum(axis=1), errors=np.zeros((n, 4)),
...                       fail=np.zeros(n, dtype=np.int64), amplitudes=np.ones((n, 4))), {}
>>> class Objective:
...     n_protocols = 4
>>> class Store:
...     generations = []
...     def append_generation(self, **fields):
...         self.generations.append(int(fields["generation"]))
>>> engine = Engine(cfg, Objective(), Store(), Progress(3, enabled=False),
...                 evaluate=FromFunction(by_sum))
>>> state, reason = engine.run(None)
>>> reason, Store.generations
('maximum generations (3)', [0, 1, 2, 3])
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from kingen.fitting.algorithms import algorithm_class
from kingen.fitting.algorithms.base import Algorithm, GeneSpace, Randoms
from kingen.fitting.config import FitConfig, StopSettings
from kingen.fitting.evaluator import Evaluator, InProcess
from kingen.fitting.objective import Evaluation, Objective
from kingen.fitting.progress import Progress
from kingen.fitting.state import (
    HallOfFame,
    Population,
    SearchState,
    checked_state,
    encode,
)

_GA_PARTS = ("variation_s", "hof_s", "select_s", "stats_s")  # timed parts of ga_s
_SOLVER_PARTS = ("prepare_s", "finish_s")  # the host's parts of solver_s


class Engine:
    """One run of the search: the loop, the evaluator, the hall of fame, the stop rules.

    Parameters
    ----------
    cfg
        The fit's configuration (``[ga] algorithm`` names the algorithm).
    objective
        The run's objective (the engine reads ``n_protocols``; it solves through
        ``evaluate``).
    store
        Where generations go: anything with ``append_generation(**fields)`` (a
        :class:`~kingen.store.RunStore` in a fit), and ``record_lost_workers(events)``
        for an evaluator that can lose workers.
    progress
        The live progress line.
    evaluate
        Scores a generation's candidates in ONE call; by default
        :class:`~kingen.fitting.evaluator.InProcess` over ``objective``.
    """

    def __init__(self, cfg: FitConfig, objective: Objective, store: Any,
                 progress: Progress, evaluate: Evaluator | None = None) -> None:
        self.cfg = cfg
        self._evaluate: Evaluator = evaluate if evaluate is not None else InProcess(objective)
        self.stop: StopSettings = cfg.stop
        self.n_protocols = objective.n_protocols
        self.store = store
        self.progress = progress
        self.pmap = cfg.pmap
        self.randoms = Randoms(cfg.seed)
        self.space = GeneSpace(self.pmap.lower, self.pmap.upper,
                               self.pmap.start_genes() if cfg.ga.start_from_model else None)
        self.algorithm_type: type[Algorithm] = algorithm_class(cfg.ga.algorithm)
        self.algorithm: Algorithm = self.algorithm_type(cfg.ga, self.space, self.randoms)
        # shards a lost worker held, since the last recorded generation (see record)
        self._lost_workers: list[dict[str, Any]] = []
        self._loses_workers = False  # whether the evaluator reports reruns at all
        self.timings: list[dict[str, float]] = []
        self.evaluations = 0
        self._asked = 0
        self._eval_clock: dict[str, float] = {}
        self._writer: ThreadPoolExecutor | None = None
        self._queued: Callable[[], None] | None = None
        self._pending = None

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, genes: np.ndarray) -> Evaluation:
        """Score rows of genes: ONE call of the evaluator."""
        t0 = time.perf_counter()
        params = self.pmap.to_params(genes, clip=True)
        c = self._eval_clock
        c["params_s"] = c.get("params_s", 0.0) + time.perf_counter() - t0
        # The last generation's write runs during the solve, not during the array work here,
        # and so does the drawing of the next generation's random numbers.
        ev, timings = self._evaluate(params, while_solving=self._start_background)
        self._start_background()  # in case the evaluator did not: nothing if it did
        c["solver_s"] = c.get("solver_s", 0.0) + timings.get("total_s", 0.0)
        c["kernel_s"] = c.get("kernel_s", 0.0) + timings.get("solve_s", 0.0)
        for key in timings:  # a sharded evaluator's overhead (kingen.scaleout)
            if key.startswith("dask_"):
                c[key] = c.get(key, 0.0) + timings[key]
        for key in _SOLVER_PARTS:  # the host's share of the solver call
            if key in timings:
                c[f"solver_{key}"] = c.get(f"solver_{key}", 0.0) + timings[key]
        reruns = self._evaluate.take_reruns()
        if reruns is not None:
            self._loses_workers = True
            self._lost_workers.extend(reruns)
        c["evaluate_s"] = c.get("evaluate_s", 0.0) + time.perf_counter() - t0
        self.evaluations += genes.shape[0]
        return ev

    def _score(self, genes: np.ndarray) -> Population:
        """The genes scored (no evaluator call for none)."""
        self._asked = genes.shape[0]
        if genes.shape[0] == 0:
            return Population(genes, np.zeros(0), np.zeros((0, self.n_protocols)),
                              np.zeros(0, dtype=np.int64))
        ev = self.evaluate(genes)
        return Population(genes, ev.fitness, ev.errors, ev.fail)

    # ------------------------------------------------------------------ generations
    def start(self) -> SearchState:
        """A fresh search: the generators seeded, the initial population scored."""
        self.randoms.seed_shared()
        genes = self.algorithm.ask()
        scored = self._score(genes)
        self.algorithm.tell(scored)
        hof = HallOfFame(np.zeros((0, self.space.n)), np.zeros(0))
        return SearchState(algorithm=self.algorithm.state(),
                           hall_of_fame=hof.merged(genes, scored.fitness,
                                                   self.cfg.ga.hall_of_fame))

    def generation(self, state: SearchState) -> SearchState:
        """One generation: ask, score, keep the best in the hall of fame, tell."""
        state.generation += 1
        genes = self.algorithm.ask()
        scored = self._score(genes)
        t = time.perf_counter()
        state.hall_of_fame = state.hall_of_fame.merged(genes, scored.fitness,
                                                       self.cfg.ga.hall_of_fame)
        self._eval_clock["hof_s"] = time.perf_counter() - t
        self.algorithm.tell(scored)
        self._eval_clock.update(self.algorithm.timings)
        self.algorithm.timings = {}
        state.algorithm = self.algorithm.state()
        return state

    def unpack(self, arrays: dict[str, np.ndarray], path: str) -> SearchState:
        """The search state from a run file's resume arrays (checked by
        :func:`~kingen.fitting.state.checked_state`), with the algorithm and the random
        generators as they were."""
        state, randoms = checked_state(arrays, self.cfg, self.n_protocols, path)
        self.randoms.restore(randoms)
        self.algorithm = self.algorithm_type.from_state(state.algorithm, self.cfg.ga,
                                                        self.space, self.randoms)
        self.evaluations = state.evaluations
        return state

    # ------------------------------------------------------------------ the loop
    def record(self, state: SearchState, t_start: float) -> dict[str, float]:
        """Report the generation to the store; returns the generation's statistics.

        The write (the population's parameters, the resume state's arrays, compression,
        flush) runs on a background thread during the next generation's solver call; the
        next generation's record waits for it to finish.
        """
        t_stats = time.perf_counter()
        pop = state.population
        f = pop.fitness
        finite = f[np.isfinite(f)]
        hof = state.hall_of_fame
        best = float(hof.fitness[0]) if hof.fitness.size else math.inf
        ref = state.reference
        if math.isfinite(best) and (not math.isfinite(ref)
                                    or best < ref * (1.0 - self.stop.min_improvement)):
            state.reference = best
            state.since_improvement = 0
        elif state.generation > 0:
            state.since_improvement += 1
        state.best = best
        stats = {"best": best, "median": float(np.median(finite)) if finite.size else math.inf,
                 "mean": float(finite.mean()) if finite.size else math.inf,
                 "population_best": float(finite.min()) if finite.size else math.inf,
                 "n_failed": float(int((pop.fail != 0).sum())),
                 "evaluations": float(self.evaluations)}
        lost, self._lost_workers = self._lost_workers, []
        for event in lost:
            event["generation"] = int(state.generation)
            self.progress.message(
                f"kingen: generation {event['generation']}: worker {event['worker']} was "
                f"lost; its shard of {event['rows']} candidates ran again (recorded in the "
                "run file)")
        if self._loses_workers:
            stats["shards_rerun"] = float(len(lost))
        t_io = time.perf_counter()
        self._eval_clock["stats_s"] = t_io - t_stats
        state.elapsed += t_io - t_start
        state.evaluations = self.evaluations
        snapshot = encode(state, self.randoms.states())
        self.flush()
        now = time.perf_counter()
        io = now - t_io
        state.elapsed += io
        timing = self._timing(now - t_start, io)
        index = len(self.timings) - 1

        def write() -> None:
            t = time.perf_counter()
            if lost:  # before the commit that follows: the record never trails its generation
                self.store.record_lost_workers(lost)
            self.store.append_generation(
                generation=snapshot["generation"], population=self.pmap.to_params(
                    snapshot["genes"], threads=False), errors=snapshot["errors"],
                fitness=snapshot["fitness"], fail=snapshot["fail"], stats=stats,
                timings=timing, state=snapshot)
            self.timings[index]["write_s"] = time.perf_counter() - t

        self._queued = write
        return stats

    def _timing(self, total: float, io: float) -> dict[str, float]:
        """The generation's timings from its clock (which starts afresh)."""
        c = self._eval_clock
        timing = {"solver_s": c.get("solver_s", 0.0), "kernel_s": c.get("kernel_s", 0.0),
                  "objective_s": (c.get("evaluate_s", 0.0) - c.get("solver_s", 0.0)
                                  - c.get("dask_s", 0.0)),
                  "io_s": io, "total_s": total}
        timing.update({key: value for key, value in c.items() if key.startswith("dask_")})
        timing["ga_s"] = max(total - c.get("evaluate_s", 0.0) - io, 0.0)
        # where the GA's and the objective's shares go (parts of ga_s and objective_s)
        timing.update({f"ga_{key}": c[key] for key in _GA_PARTS if key in c})
        timing.update({f"solver_{key}": c[f"solver_{key}"] for key in _SOLVER_PARTS
                       if f"solver_{key}" in c})
        if "params_s" in c:
            timing["params_s"] = c["params_s"]
        self.timings.append(dict(timing))
        self._eval_clock = {}
        return timing

    def _start_background(self) -> None:
        """Start the last generation's write and the drawing of the next generation's
        numbers, on their threads (each at most once per generation)."""
        self._start_write()
        self.algorithm.draw_ahead()

    def _start_write(self) -> None:
        if self._queued is not None:
            job, self._queued = self._queued, None
            if self._writer is None:
                job()
            else:
                self._pending = self._writer.submit(job)

    def flush(self) -> None:
        """Finish the last generation's write (and raise its error, if any)."""
        self._start_write()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def stop_reason(self, state: SearchState) -> str | None:
        """Why the search stops now, or None while it goes on."""
        s = self.stop
        if s.target_error > 0 and state.best <= s.target_error:
            return f"target error {s.target_error:g} reached"
        if s.patience > 0 and state.since_improvement >= s.patience:
            return f"no improvement for {s.patience} generations"
        if s.wall_time > 0 and state.elapsed >= s.wall_time:
            return f"wall-time limit {s.wall_time:g} s"
        if state.generation >= self.cfg.ga.generations:
            return f"maximum generations ({self.cfg.ga.generations})"
        return None

    def run(self, state: SearchState | None) -> tuple[SearchState, str]:
        """Run the search from ``state`` (None: a fresh one) until a stopping rule holds;
        the last state and the rule's reason."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kingen-store") as pool, \
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="kingen-draws") as drawer:
            self._writer, self.randoms.executor = pool, drawer
            try:
                t0 = time.perf_counter()
                self.algorithm.warm_up()
                if state is None:
                    self.progress.starting(0)
                    state = self.start()
                    self._show(state, self.record(state, t0))
                elif self.stop_reason(state) is None:
                    self.progress.starting(state.generation + 1)
                while True:
                    reason = self.stop_reason(state)
                    if reason is not None:
                        return state, reason
                    t0 = time.perf_counter()
                    state = self.generation(state)
                    self._show(state, self.record(state, t0))
            finally:
                try:
                    self.flush()
                finally:
                    self._writer = self.randoms.executor = None
                    self.randoms.settle()  # numbers drawn for a generation that never came

    def _show(self, state: SearchState, stats: dict[str, float]) -> None:
        t = self.timings[-1]
        rate = self._asked / max(t["total_s"], 1e-9)
        # The first generation a process runs also loads its solver (compiles it, on a
        # scheme's first fit on a machine): it says nothing of the generations to come.
        recent = [x["total_s"] for x in self.timings[1:][-5:]]
        left = self.cfg.ga.generations - state.generation
        eta = left * float(np.mean(recent)) if recent else (0.0 if left <= 0 else math.nan)
        if self.stop.wall_time > 0:
            eta = min(eta, max(self.stop.wall_time - state.elapsed, 0.0))
        self.progress.update(state.generation, stats["best"], stats["median"], rate, eta)


# How a stopping reason starts when the search has converged (see Engine.stop_reason).
CONVERGED_REASONS = ("no improvement for ", "target error ")


def convergence_of(finished: str | None) -> tuple[bool | None, str]:
    """Whether a run converged, and its summary line, from its ``/run/finished`` text;
    ``(None, "")`` while it runs or if it was killed. For a file written before kingen
    said so, from the stopping reason alone.

    Examples
    --------
    >>> convergence_of("maximum generations (40); not converged: maximum generations (40) "
    ...                "reached while the best still improved by 3 % over the last 20 "
    ...                "generations")[0]
    False
    >>> convergence_of("no improvement for 15 generations")
    (True, 'converged: no improvement for 15 generations')
    """
    text = finished or ""
    for mark, ok in (("; not converged: ", False), ("; converged: ", True)):
        if mark in text:
            return ok, text[text.index(mark) + 2:]
    if not text:
        return None, ""
    if text.startswith(CONVERGED_REASONS) and "every candidate failed" not in text:
        return True, f"converged: {text}"
    return False, f"not converged: {text}"


def verdict(reason: str, best: np.ndarray, stop: StopSettings) -> tuple[bool, str]:
    """Whether a search that stopped for ``reason`` converged, and its summary line.

    It converged when it stopped on stagnation (the best improved by less than
    ``stop.min_improvement``, relative, for ``stop.patience`` generations) or reached the
    target error; not when a maximum (generations, wall time) stopped it first. The line
    then says how much the best still improved over the last generations.

    Parameters
    ----------
    reason
        Why the search stopped (:meth:`Engine.stop_reason`).
    best
        The best fitness so far at every generation (the hall of fame's first).
    stop
        The stopping rules.

    Examples
    --------
    >>> from kingen.fitting.config import StopSettings
    >>> stop = StopSettings(patience=3)
    >>> verdict("no improvement for 3 generations", np.array([2.0, 1.0, 1.0, 1.0, 1.0]), stop)
    (True, 'converged: the best improved by less than 1e-06 (relative) for 3 generations')
    >>> ok, line = verdict("maximum generations (4)", np.array([2.0, 1.5, 1.2, 1.0, 0.9]),
    ...                    stop)
    >>> ok, line.split(" while ")[1]
    (False, 'the best still improved by 40 % over the last 3 generations')
    """
    if reason.startswith(CONVERGED_REASONS[0]):
        return True, (f"converged: the best improved by less than {stop.min_improvement:g} "
                      f"(relative) for {stop.patience} generations")
    if reason.startswith(CONVERGED_REASONS[1]):
        return True, f"converged: the best fitness reached the target error {stop.target_error:g}"
    b = np.asarray(best, dtype=float)
    n = min(stop.patience if stop.patience > 0 else 20, b.size - 1)
    if n < 1 or not (math.isfinite(b[-1]) and math.isfinite(b[-1 - n]) and b[-1 - n] > 0):
        return False, f"not converged: {reason} reached before the best could settle"
    gain = (b[-1 - n] - b[-1]) / b[-1 - n]
    if gain > stop.min_improvement:
        return False, (f"not converged: {reason} reached while the best still improved by "
                       f"{100 * gain:.2g} % over the last {n} generations")
    rule = ("the stagnation rule is off ([stop] patience = 0)" if stop.patience == 0 else
            f"fewer than the {stop.patience} generations without improvement that count")
    return False, f"not converged: {reason} reached; {rule}"
