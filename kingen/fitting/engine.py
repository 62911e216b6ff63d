"""The search's controller: one generation at a time, written through a run store.

:class:`Engine` holds one run's state and drives it: the initial population, then
generation after generation of DEAP's (μ + λ) (elitist: the pool's best always survives)
or CMA-ES until a stopping rule holds, each
generation's population and resume state written through the store (on a background
thread, during the next generation's solve).

Every candidate a generation must score goes through ONE call of the engine's
:data:`Evaluate` callable: rate constants in, scores out. The default,
:func:`in_process`, is the objective's batched solve on this machine; a scale-out engine
replaces it (for example one that shards the batch across GPUs) and nothing else changes.

Examples
--------
An evaluator is any callable of this shape; this one scores each candidate by the sum of
its rate constants:

>>> import numpy as np
>>> from kingen.fitting.objective import Evaluation
>>> def by_sum(params):
...     n = params.shape[0]
...     ev = Evaluation(fitness=params.sum(axis=1), errors=np.zeros((n, 1)),
...                     fail=np.zeros(n, dtype=np.int64), amplitudes=np.ones((n, 1)))
...     return ev, {"total_s": 0.0, "solve_s": 0.0}
>>> ev, timings = by_sum(np.array([[1.0, 2.0], [0.5, 0.5]]))
>>> ev.fitness.tolist()
[3.0, 1.0]
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from typing import Any

import numpy as np

from kingen.fitting import operators
from kingen.fitting.config import NUMPY_OPERATORS_FROM, FitConfig, GASettings, StopSettings
from kingen.fitting.objective import Evaluation, Objective
from kingen.fitting.progress import Progress
from kingen.fitting.state import STATE_VERSION, checked_state, cma_strategy, encode

_GA_PARTS = ("variation_s", "hof_s", "select_s", "stats_s")  # timed parts of ga_s
_SOLVER_PARTS = ("prepare_s", "finish_s")  # the host's parts of solver_s

CMA_PENALTY = 1.0  # fitness added per unit of squared distance outside the [0, 1] box

Evaluate = Callable[..., "tuple[Evaluation, Mapping[str, float]]"]
"""Scores a batch: ``(N, n_params)`` rate constants (internal units, derived and tied
rates already computed) -> ``(Evaluation, timings)``. ``timings`` may hold ``total_s``
(the solver call) and ``solve_s`` (the kernel alone), in seconds; the engine adds them to
the generation's timings. Called once per generation (twice at most: the initial
population, or a polish).

An evaluator that also takes a keyword ``while_solving`` calls it once the solve is under
way and nothing is left for this process but to wait (the GPU's kernels launched, the
shards sent): the engine's background work (the last generation's write, the next
generation's random numbers) starts then, and does not slow the solve's preparation. It
calls it at most once, on the thread that called the evaluator, before returning. Any other
evaluator is called after that work has started."""


# The modules of DEAP that draw from the module ``random`` they import.
_DEAP_RANDOM_USERS = ("deap.algorithms", "deap.tools.crossover", "deap.tools.mutation",
                      "deap.tools.selection")


@contextlib.contextmanager
def _deap_draws_from(generator: random.Random):
    """DEAP's operators draw from ``generator`` while the block runs.

    The process's shared generator (the module ``random``) is also drawn from by other
    threads: a Dask worker's or client's event loop uses it for jitter and choices, at
    times of its own, so a fit drawing from it there would not repeat. The block is the
    GA's own step, on the thread that runs the fit.
    """
    modules = [importlib.import_module(m) for m in _DEAP_RANDOM_USERS]
    saved = [m.random for m in modules]
    for m in modules:
        m.random = generator
    try:
        yield
    finally:
        for m, r in zip(modules, saved, strict=True):
            m.random = r


def in_process(objective: Objective) -> Evaluate:
    """The default evaluator: the objective's batched solve, in this process.

    Parameters
    ----------
    objective
        The run's objective.
    """

    def evaluate(params: np.ndarray, while_solving: Callable[[], object] | None = None
                 ) -> tuple[Evaluation, Mapping[str, float]]:
        ev, res = objective.evaluate(params, complete=False, while_solving=while_solving)
        return ev, res.timings

    return evaluate


class Engine:
    """One run of the search: state, one generation at a time, written through the store.

    Parameters
    ----------
    cfg
        The fit's configuration.
    objective
        The run's objective (the engine reads ``n_protocols``; it solves through
        ``evaluate``).
    store
        Where generations go: anything with ``append_generation(**fields)`` (a
        :class:`~kingen.store.RunStore` in a fit).
    progress
        The live progress line.
    evaluate
        Scores a generation's candidates in ONE call (see :data:`Evaluate`); by default
        :func:`in_process` over ``objective``.
    """

    def __init__(self, cfg: FitConfig, objective: Objective, store: Any,
                 progress: Progress, evaluate: Evaluate | None = None) -> None:
        self.cfg = cfg
        self._evaluate = evaluate if evaluate is not None else in_process(objective)
        self.ga: GASettings = cfg.ga
        self.stop: StopSettings = cfg.stop
        self.obj = objective
        self.store = store
        self.progress = progress
        self.pmap = cfg.pmap
        self.low, self.up = self.pmap.lower, self.pmap.upper
        self.n = self.pmap.n_genes
        self.lambda_ = self.ga.lambda_
        self.indpb = self.ga.indpb or 1.0 / self.n
        self.numpy_ops = (self.ga.operators == "numpy" or (
            self.ga.operators == "auto" and self.lambda_ >= NUMPY_OPERATORS_FROM))
        self.rng = np.random.Generator(np.random.PCG64(cfg.seed))
        # DEAP's operators draw from this one (see _deap_draws_from), seeded as
        # random.seed(seed) would seed the module's
        self.py_random = random.Random(cfg.seed)
        # shards a lost worker held, since the last recorded generation (see record)
        self._lost_workers: list[dict[str, Any]] = []
        self._takes_reruns = callable(getattr(self._evaluate, "take_reruns", None))
        self._takes_hook = _takes_keyword(self._evaluate, "while_solving")
        self.timings: list[dict[str, float]] = []
        self.evaluations = 0
        self._eval_clock: dict[str, float] = {}
        self._toolbox = None
        self._writer = None
        self._queued: Callable[[], None] | None = None
        self._pending = None
        # The next generation's random numbers, drawn on a thread of their own while this
        # generation is solved (see _start_draws); the generator's state before them, for
        # the resume state.
        self._drawer = None
        self._drawn: Future | None = None
        self._rng_mark: dict | None = None

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, genes: np.ndarray) -> Evaluation:
        """Score rows of genes: ONE call of the evaluator."""
        t0 = time.perf_counter()
        params = self.pmap.to_params(genes, clip=True)
        c = self._eval_clock
        c["params_s"] = c.get("params_s", 0.0) + time.perf_counter() - t0
        # The last generation's write runs during the solve, not during the array work here,
        # and so does the drawing of the next generation's random numbers. to_params has
        # just computed the derived rates, from the objective's scheme.
        if self._takes_hook:
            ev, timings = self._evaluate(params, while_solving=self._start_background)
        else:
            self._start_background()
            ev, timings = self._evaluate(params)
        self._start_background()  # in case the evaluator did not: nothing if it did
        c["solver_s"] = c.get("solver_s", 0.0) + timings.get("total_s", 0.0)
        c["kernel_s"] = c.get("kernel_s", 0.0) + timings.get("solve_s", 0.0)
        for key in timings:  # a sharded evaluator's overhead (kingen.scaleout)
            if key.startswith("dask_"):
                c[key] = c.get(key, 0.0) + timings[key]
        for key in _SOLVER_PARTS:  # the host's share of the solver call
            if key in timings:
                c[f"solver_{key}"] = c.get(f"solver_{key}", 0.0) + timings[key]
        if self._takes_reruns:
            self._lost_workers.extend(self._evaluate.take_reruns())  # type: ignore[attr-defined]
        c["evaluate_s"] = c.get("evaluate_s", 0.0) + time.perf_counter() - t0
        self.evaluations += genes.shape[0]
        return ev

    # ------------------------------------------------------------------ state
    def initial(self) -> dict[str, Any]:
        self.py_random.seed(self.cfg.seed)
        np.random.seed(self.cfg.seed % (2 ** 32))  # noqa: NPY002 - DEAP's CMA-ES draws from it
        state: dict[str, Any] = {"version": STATE_VERSION, "generation": 0, "best": math.inf,
                                 "since_improvement": 0, "elapsed": 0.0, "evaluations": 0,
                                 "hof_genes": np.zeros((0, self.n)), "hof_fitness": np.zeros(0)}
        if self.ga.algorithm == "cmaes":
            from deap import cma

            centroid = (self._to_unit(self.pmap.start_genes()) if self.ga.start_from_model
                        else np.full(self.n, 0.5))
            state["cma"] = cma.Strategy(centroid=list(centroid), sigma=self.ga.sigma,
                                        lambda_=self.lambda_, mu=max(1, self.lambda_ // 2))
            return self._cma_generation(state)
        genes = self.rng.uniform(self.low, self.up, size=(self.ga.population, self.n))
        if self.ga.start_from_model:
            genes[0] = self.pmap.start_genes()
        ev = self.evaluate(genes)
        state.update(genes=genes, fitness=ev.fitness, errors=ev.errors, fail=ev.fail)
        self._update_hof(state, genes, ev.fitness)
        return state

    def _update_hof(self, state: dict, genes: np.ndarray, fitness: np.ndarray) -> None:
        k = self.ga.hall_of_fame
        if fitness.size > k:
            # Only the k best of a batch can enter: keeps the row-unique step small at large λ.
            keep = np.argpartition(np.where(np.isfinite(fitness), fitness, np.inf), k)[:k]
            keep.sort()
            genes, fitness = genes[keep], fitness[keep]
        g = np.vstack([state["hof_genes"], genes])
        f = np.concatenate([state["hof_fitness"], fitness])
        ok = np.isfinite(f)
        g, f = g[ok], f[ok]
        _, first = np.unique(g, axis=0, return_index=True)  # distinct candidates only
        first = np.sort(first)
        g, f = g[first], f[first]
        order = np.argsort(f, kind="stable")[:k]
        state["hof_genes"], state["hof_fitness"] = g[order], f[order]

    # ------------------------------------------------------------------ (μ + λ)
    def _toolbox_get(self):
        if self._toolbox is None:
            from deap import base, creator, tools

            if not hasattr(creator, "KingenFitness"):
                creator.create("KingenFitness", base.Fitness, weights=(-1.0,))
            if not hasattr(creator, "KingenIndividual"):
                creator.create("KingenIndividual", list, fitness=creator.KingenFitness)
            tb = base.Toolbox()
            low, up = list(self.low), list(self.up)
            tb.register("mate", tools.cxSimulatedBinaryBounded, eta=self.ga.eta_cx, low=low,
                        up=up)
            tb.register("mutate", tools.mutPolynomialBounded, eta=self.ga.eta_mut, low=low,
                        up=up, indpb=self.indpb)
            tb.register("select", tools.selTournament, tournsize=self.ga.tournament)
            tb.register("evaluate", _no_single_evaluation)
            tb.register("map", self._batched_map)
            self._toolbox = tb
            self._creator = creator
        return self._toolbox

    def _batched_map(self, func, individuals: list) -> list[tuple[float]]:
        """The toolbox's ``map``: every individual of the call in ONE solver call."""
        if not individuals:
            return []
        ev = self.evaluate(np.array([list(ind) for ind in individuals], dtype=float))
        for i, ind in enumerate(individuals):
            ind.errors = ev.errors[i]
            ind.fail = int(ev.fail[i])
        return [(float(f),) for f in ev.fitness]

    def _individuals(self, genes: np.ndarray, fitness: np.ndarray, errors: np.ndarray,
                     fail: np.ndarray) -> list:
        cls = self._creator.KingenIndividual
        out = []
        for g, f, e, fl in zip(genes, fitness, errors, fail, strict=True):
            ind = cls(float(x) for x in g)
            ind.fitness.values = (float(f),)
            ind.errors = np.asarray(e)
            ind.fail = int(fl)
            out.append(ind)
        return out

    def mu_plus_lambda_generation(self, state: dict) -> dict:
        """One generation of DEAP's (μ + λ), elitist: the best of parents and offspring
        survives (:func:`~kingen.fitting.operators.keep_best`)."""
        if self.numpy_ops:
            t = time.perf_counter()
            variation, aspirants = self._take_draws()
            kids, source = operators.np_var_or(
                state["genes"], self.lambda_, self.ga.cxpb, self.ga.mutpb, self.ga.eta_cx,
                self.ga.eta_mut, self.indpb, self.low, self.up, None, draws=variation)
            self._eval_clock["variation_s"] = time.perf_counter() - t
            fit = np.empty(self.lambda_)
            err = np.empty((self.lambda_, self.obj.n_protocols))
            fail = np.zeros(self.lambda_, dtype=np.int64)
            copied = np.flatnonzero(source >= 0)
            parent = source[copied]
            fit[copied] = state["fitness"].take(parent)
            err[copied] = state["errors"].take(parent, axis=0)
            fail[copied] = state["fail"].take(parent)
            new = np.flatnonzero(source < 0)
            new_genes = kids.take(new, axis=0)
            if new.size:
                ev = self.evaluate(new_genes)
                fit[new], err[new], fail[new] = ev.fitness, ev.errors, ev.fail
            t = time.perf_counter()
            self._update_hof(state, new_genes, fit.take(new))
            self._eval_clock["hof_s"] = time.perf_counter() - t
            pool_f = np.concatenate([state["fitness"], fit])
            t = time.perf_counter()
            chosen = operators.keep_best(pool_f, operators.np_sel_tournament(
                pool_f, self.ga.population, self.ga.tournament, None, aspirants))
            self._eval_clock["select_s"] = time.perf_counter() - t
            state.update({key: operators.take_survivors(state[key], offspring, chosen)
                          for key, offspring in (("genes", kids), ("errors", err),
                                                 ("fail", fail))},
                         fitness=pool_f.take(chosen))
            return state
        from deap import algorithms

        tb = self._toolbox_get()
        pop = self._individuals(state["genes"], state["fitness"], state["errors"],
                                state["fail"])
        t = time.perf_counter()
        with _deap_draws_from(self.py_random):
            offspring = algorithms.varOr(pop, tb, self.lambda_, self.ga.cxpb, self.ga.mutpb)
        self._eval_clock["variation_s"] = time.perf_counter() - t
        invalid = [ind for ind in offspring if not ind.fitness.valid]
        for ind, fit in zip(invalid, tb.map(tb.evaluate, invalid), strict=True):
            ind.fitness.values = fit
        t = time.perf_counter()
        kids = np.array([list(ind) for ind in invalid]).reshape(-1, self.n)
        self._update_hof(state, kids, np.array([ind.fitness.values[0] for ind in invalid]))
        self._eval_clock["hof_s"] = time.perf_counter() - t
        t = time.perf_counter()
        pool = pop + offspring
        with _deap_draws_from(self.py_random):
            selected = tb.select(pool, self.ga.population)
        # elitism as the numpy operators keep it: by pool index (a tournament returns the
        # pool's own individuals, one of them perhaps twice)
        where = {id(ind): k for k, ind in enumerate(pool)}
        chosen = operators.keep_best(np.array([ind.fitness.values[0] for ind in pool]),
                                     np.array([where[id(ind)] for ind in selected]))
        pop = [pool[k] for k in chosen]
        self._eval_clock["select_s"] = time.perf_counter() - t
        state.update(genes=np.array([list(i) for i in pop], dtype=float),
                     fitness=np.array([i.fitness.values[0] for i in pop]),
                     errors=np.array([i.errors for i in pop]),
                     fail=np.array([i.fail for i in pop], dtype=np.int64))
        return state

    def _draw_generation(self) -> tuple[operators.VariationDraws, np.ndarray]:
        """A (μ + λ) generation's random numbers from ``self.rng``, in the order the
        operators draw them: the variation's, then the tournament's."""
        mu, lam = self.ga.population, self.lambda_
        variation = operators.draw_variation(self.rng, mu, lam, self.ga.cxpb, self.ga.mutpb,
                                             self.n)
        aspirants = operators.draw_aspirants(self.rng, mu + lam, mu, self.ga.tournament)
        return variation, aspirants

    def _start_draws(self) -> None:
        """Draw the next generation's numbers on the drawing thread (numpy operators).

        Nothing else draws from ``self.rng`` until they are taken: the numbers, and the
        state the generator is left in, are those drawing them in turn would give. The
        generator's state now (the end of this generation's numbers) is what this
        generation's resume state records.
        """
        if self._drawer is None or self._drawn is not None or not (
                self.numpy_ops and self.ga.algorithm != "cmaes"):
            return
        self._rng_mark = self.rng.bit_generator.state
        self._drawn = self._drawer.submit(self._draw_generation)

    def _take_draws(self) -> tuple[operators.VariationDraws, np.ndarray]:
        if self._drawn is None:
            return self._draw_generation()
        drawn, self._drawn = self._drawn, None
        return drawn.result()

    # ------------------------------------------------------------------ CMA-ES
    def _to_unit(self, genes: np.ndarray) -> np.ndarray:
        return (genes - self.low) / (self.up - self.low)

    def _cma_generation(self, state: dict) -> dict:
        from deap import base, creator

        if not hasattr(creator, "KingenFitness"):
            creator.create("KingenFitness", base.Fitness, weights=(-1.0,))
        if not hasattr(creator, "KingenIndividual"):
            creator.create("KingenIndividual", list, fitness=creator.KingenFitness)
        strategy = state["cma"]
        inds = strategy.generate(creator.KingenIndividual)
        u = np.array([list(i) for i in inds], dtype=float)
        inside = np.clip(u, 0.0, 1.0)
        genes = self.low + inside * (self.up - self.low)
        ev = self.evaluate(genes)
        penalty = CMA_PENALTY * ((u - inside) ** 2).sum(axis=1)
        for ind, f, p in zip(inds, ev.fitness, penalty, strict=True):
            # A failed candidate must still be rankable: worst, but finite for CMA's sort.
            ind.fitness.values = (float(f + p) if math.isfinite(f) else 1e300,)
        strategy.update(inds)
        state.update(genes=genes, fitness=ev.fitness, errors=ev.errors, fail=ev.fail)
        self._update_hof(state, genes, ev.fitness)
        return state

    # ------------------------------------------------------------------ the loop
    def snapshot(self, state: dict) -> dict[str, np.ndarray]:
        """The resume state as of now, as plain arrays (written later, on the writer's
        thread; see :func:`kingen.fitting.state.encode`)."""
        # the generator may already be drawing the next generation's numbers
        rng = self._rng_mark if self._drawn is not None else self.rng.bit_generator.state
        return encode(state, rng, self.evaluations, self.py_random)

    def unpack(self, arrays: dict[str, np.ndarray], path: str) -> dict:
        """The search state from a run file's resume arrays (checked by
        :func:`checked_state`), with the random generators set to their stored states."""
        s, python_state, np_state, pcg_state = checked_state(arrays, self.cfg,
                                                             self.obj.n_protocols, path)
        self.py_random.setstate(python_state)
        np.random.set_state(np_state)  # noqa: NPY002
        self.rng.bit_generator.state = pcg_state
        if self.ga.algorithm == "cmaes":
            s["cma"] = cma_strategy(arrays)
        self.evaluations = s["evaluations"]
        return s

    def record(self, state: dict, t_start: float) -> dict[str, float]:
        """Write the generation through the store; returns the generation's statistics.

        The write (the population's parameters, the resume state's arrays, compression,
        flush) runs on a background thread during the next generation's solver call; the
        next generation's record waits for it to finish.
        """
        t_stats = time.perf_counter()
        f = state["fitness"]
        finite = f[np.isfinite(f)]
        best = float(state["hof_fitness"][0]) if state["hof_fitness"].size else math.inf
        ref = state.get("reference", math.inf)
        if math.isfinite(best) and (not math.isfinite(ref)
                                    or best < ref * (1.0 - self.stop.min_improvement)):
            state["reference"] = best
            state["since_improvement"] = 0
        elif state["generation"] > 0:
            state["since_improvement"] += 1
        state["best"] = best
        stats = {"best": best, "median": float(np.median(finite)) if finite.size else math.inf,
                 "mean": float(finite.mean()) if finite.size else math.inf,
                 "population_best": float(finite.min()) if finite.size else math.inf,
                 "n_failed": float(int((state["fail"] != 0).sum())),
                 "evaluations": float(self.evaluations)}
        lost, self._lost_workers = self._lost_workers, []
        for event in lost:
            event["generation"] = int(state["generation"])
            self.progress.message(
                f"kingen: generation {event['generation']}: worker {event['worker']} was "
                f"lost; its shard of {event['rows']} candidates ran again (recorded in the "
                "run file)")
        if self._takes_reruns:
            stats["shards_rerun"] = float(len(lost))
        t_io = time.perf_counter()
        self._eval_clock["stats_s"] = t_io - t_stats
        state["elapsed"] += t_io - t_start
        snapshot = self.snapshot(state)
        self.flush()
        now = time.perf_counter()
        io = now - t_io
        state["elapsed"] += io
        c = self._eval_clock
        timing = {"solver_s": c.get("solver_s", 0.0), "kernel_s": c.get("kernel_s", 0.0),
                  "objective_s": (c.get("evaluate_s", 0.0) - c.get("solver_s", 0.0)
                                  - c.get("dask_s", 0.0)),
                  "io_s": io, "total_s": now - t_start}
        timing.update({key: value for key, value in c.items() if key.startswith("dask_")})
        timing["ga_s"] = max(timing["total_s"] - c.get("evaluate_s", 0.0) - io, 0.0)
        # where the GA's and the objective's shares go (parts of ga_s and objective_s)
        timing.update({f"ga_{key}": c[key] for key in _GA_PARTS if key in c})
        timing.update({f"solver_{key}": c[f"solver_{key}"] for key in _SOLVER_PARTS
                       if f"solver_{key}" in c})
        if "params_s" in c:
            timing["params_s"] = c["params_s"]
        self.timings.append(dict(timing))
        self._eval_clock = {}
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

    def _start_background(self) -> None:
        """Start the last generation's write and the drawing of the next generation's
        numbers, on their threads (each at most once per generation)."""
        self._start_write()
        self._start_draws()

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

    def stop_reason(self, state: dict) -> str | None:
        s = self.stop
        if s.target_error > 0 and state["best"] <= s.target_error:
            return f"target error {s.target_error:g} reached"
        if s.patience > 0 and state["since_improvement"] >= s.patience:
            return f"no improvement for {s.patience} generations"
        if s.wall_time > 0 and state["elapsed"] >= s.wall_time:
            return f"wall-time limit {s.wall_time:g} s"
        if state["generation"] >= self.ga.generations:
            return f"maximum generations ({self.ga.generations})"
        return None

    def run(self, state: dict | None) -> tuple[dict, str]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kingen-store") as pool, \
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="kingen-draws") as drawer:
            self._writer, self._drawer = pool, drawer
            try:
                t0 = time.perf_counter()
                if self.numpy_ops and self.ga.algorithm != "cmaes":
                    operators.warm_up_operators(self.n)
                if state is None:
                    self.progress.starting(0)
                    state = self.initial()
                    self._show(state, self.record(state, t0))
                elif self.stop_reason(state) is None:
                    self.progress.starting(state["generation"] + 1)
                while True:
                    reason = self.stop_reason(state)
                    if reason is not None:
                        return state, reason
                    t0 = time.perf_counter()
                    state["generation"] += 1
                    if self.ga.algorithm == "cmaes":
                        state = self._cma_generation(state)
                    else:
                        state = self.mu_plus_lambda_generation(state)
                    self._show(state, self.record(state, t0))
            finally:
                try:
                    self.flush()
                finally:
                    self._writer = self._drawer = None
                    if self._drawn is not None:  # numbers for a generation that never came
                        wait([self._drawn])  # its error, if any, is no longer the run's
                        self._drawn = None
                        self.rng.bit_generator.state = self._rng_mark

    def _show(self, state: dict, stats: dict[str, float]) -> None:
        t = self.timings[-1]
        n_eval = self.lambda_ if state["generation"] else len(state["fitness"])
        rate = n_eval / max(t["total_s"], 1e-9)
        # The first generation a process runs also loads its solver (compiles it, on a
        # scheme's first fit on a machine): it says nothing of the generations to come.
        recent = [x["total_s"] for x in self.timings[1:][-5:]]
        left = self.ga.generations - state["generation"]
        eta = left * float(np.mean(recent)) if recent else (0.0 if left <= 0 else math.nan)
        if self.stop.wall_time > 0:
            eta = min(eta, max(self.stop.wall_time - state["elapsed"], 0.0))
        self.progress.update(state["generation"], stats["best"], stats["median"], rate, eta)


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


def _takes_keyword(func: Callable, name: str) -> bool:
    """Whether ``func`` can be called with the keyword ``name``."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # a builtin or extension callable: assume not
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                 for p in params.values())


def _no_single_evaluation(*_args: Any) -> None:
    raise RuntimeError("individuals are evaluated in batches by the toolbox's map")


