"""DEAP's (μ + λ), elitist: ``varOr`` variation, tournament survival over parents and
offspring, the pool's best always kept.

Two implementations of the same operators: DEAP's own, one individual at a time, and the
array operators of :mod:`kingen.fitting.operators` (the same formulas and probabilities)
from ``NUMPY_OPERATORS_FROM`` offspring on, or with ``operators = "numpy"``. The array
operators' random numbers come from the search's PCG64 generator, drawn ahead while the
last generation is solved.

Examples
--------
>>> import numpy as np
>>> from kingen.fitting.algorithms.base import GeneSpace, Randoms
>>> from kingen.fitting.config import GASettings
>>> from kingen.fitting.state import Population
>>> ga = MuPlusLambda(GASettings(population=4, operators="numpy"),
...                   GeneSpace(np.zeros(2), np.ones(2), np.full(2, 0.5)), Randoms(0))
>>> def scored(genes):
...     n = len(genes)
...     return Population(genes, genes.sum(axis=1), np.zeros((n, 1)), np.zeros(n, int))
>>> ga.tell(scored(ga.ask()))            # the initial population
>>> ga.tell(scored(ga.ask()))            # one generation: the new offspring scored
>>> ga.population.genes.shape
(4, 2)
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kingen.fitting import operators, selection
from kingen.fitting.algorithms.base import Algorithm, GeneSpace, Randoms
from kingen.fitting.algorithms.deap_types import deap_draws_from, individual_class
from kingen.fitting.config import NUMPY_OPERATORS_FROM, GASettings
from kingen.fitting.state import Population


class MuPlusLambda(Algorithm):
    """DEAP's (μ + λ), elitist (see the module docstring)."""

    name = "mu_plus_lambda"

    def __init__(self, settings: GASettings, space: GeneSpace, randoms: Randoms) -> None:
        super().__init__(settings, space, randoms)
        self.lambda_ = settings.lambda_
        self.indpb = settings.indpb or 1.0 / space.n
        self.numpy_ops = settings.operators == "numpy" or (
            settings.operators == "auto" and self.lambda_ >= NUMPY_OPERATORS_FROM)
        self._toolbox: Any = None
        self._asked: tuple[Any, ...] = ()  # what the last ask made, for its tell

    # ------------------------------------------------------------------ ask/tell
    def ask(self) -> np.ndarray:
        if not self.started:
            s, space = self.settings, self.space
            genes = self.randoms.rng.uniform(space.low, space.up, size=(s.population, space.n))
            if s.start_from_model:
                genes[0] = space.start
            self._asked = ("initial",)
            return genes
        t = time.perf_counter()
        genes = self._ask_arrays() if self.numpy_ops else self._ask_deap()
        self.timings = {"variation_s": time.perf_counter() - t}
        return genes

    def tell(self, scored: Population) -> None:
        asked, self._asked = self._asked, ()
        if asked[0] == "initial":
            self.population = scored
            return
        t = time.perf_counter()
        if asked[0] == "arrays":
            self._tell_arrays(scored, *asked[1:])
        else:
            self._tell_deap(scored, *asked[1:])
        self.timings["select_s"] = time.perf_counter() - t

    def warm_up(self) -> None:
        if self.numpy_ops:
            operators.warm_up_operators(self.space.n)

    def draw_ahead(self) -> None:
        if self.numpy_ops:
            self.randoms.draw_ahead(self._draw_generation)

    # ------------------------------------------------------------------ array operators
    def _draw_generation(self, rng: np.random.Generator
                         ) -> tuple[operators.VariationDraws, np.ndarray]:
        """A generation's random numbers, in the order the operators draw them: the
        variation's, then the tournament's."""
        s = self.settings
        variation = operators.draw_variation(rng, s.population, self.lambda_, s.cxpb,
                                             s.mutpb, self.space.n)
        aspirants = selection.draw_aspirants(rng, s.population + self.lambda_, s.population,
                                             s.tournament)
        return variation, aspirants

    def _ask_arrays(self) -> np.ndarray:
        s, space = self.settings, self.space
        variation, aspirants = self.randoms.take(self._draw_generation)
        new, source = operators.np_var_or_new(
            self.population.genes, self.lambda_, s.cxpb, s.mutpb, s.eta_cx, s.eta_mut,
            self.indpb, space.low, space.up, None, draws=variation)
        self._asked = ("arrays", source, aspirants)
        return new

    def _tell_arrays(self, scored: Population, source: np.ndarray, aspirants: np.ndarray
                     ) -> None:
        # offspring copied from a parent (neither crossed nor mutated) keep its scores: the
        # pool's rows are read where they live, parents' or new, never gathered first
        pop = self.population
        origin = selection.pool_origin(pop.genes.shape[0], source)
        fitness, genes, errors, fail = selection.survivors(
            origin, aspirants, (pop.fitness, pop.genes, pop.errors, pop.fail),
            (scored.fitness, scored.genes, scored.errors, scored.fail))
        self.population = Population(genes=genes, fitness=fitness, errors=errors, fail=fail)

    # ------------------------------------------------------------------ DEAP's operators
    def _toolbox_get(self) -> Any:
        if self._toolbox is None:
            from deap import base, tools

            s = self.settings
            tb = base.Toolbox()
            low, up = list(self.space.low), list(self.space.up)
            tb.register("mate", tools.cxSimulatedBinaryBounded, eta=s.eta_cx, low=low, up=up)
            tb.register("mutate", tools.mutPolynomialBounded, eta=s.eta_mut, low=low, up=up,
                        indpb=self.indpb)
            tb.register("select", tools.selTournament, tournsize=s.tournament)
            self._toolbox = tb
        return self._toolbox

    def _ask_deap(self) -> np.ndarray:
        from deap import algorithms

        tb = self._toolbox_get()
        cls = individual_class()
        pop = []
        p = self.population
        for g, f, e, fl in zip(p.genes, p.fitness, p.errors, p.fail, strict=True):
            ind = cls(float(x) for x in g)
            ind.fitness.values = (float(f),)
            ind.errors = np.asarray(e)
            ind.fail = int(fl)
            pop.append(ind)
        with deap_draws_from(self.randoms.python):
            offspring = algorithms.varOr(pop, tb, self.lambda_, self.settings.cxpb,
                                         self.settings.mutpb)
        invalid = [ind for ind in offspring if not ind.fitness.valid]
        self._asked = ("deap", pop, offspring, invalid)
        return np.array([list(ind) for ind in invalid], dtype=float).reshape(-1, self.space.n)

    def _tell_deap(self, scored: Population, pop: list, offspring: list, invalid: list
                   ) -> None:
        for ind, f, e, fl in zip(invalid, scored.fitness, scored.errors, scored.fail,
                                 strict=True):
            ind.fitness.values = (float(f),)
            ind.errors = e
            ind.fail = int(fl)
        pool = pop + offspring
        with deap_draws_from(self.randoms.python):
            selected = self._toolbox_get().select(pool, self.settings.population)
        # elitism as the array operators keep it: by pool index (a tournament returns the
        # pool's own individuals, one of them perhaps twice)
        where = {id(ind): k for k, ind in enumerate(pool)}
        chosen = selection.keep_best(np.array([ind.fitness.values[0] for ind in pool]),
                                     np.array([where[id(ind)] for ind in selected]))
        survivors = [pool[k] for k in chosen]
        self.population = Population(
            genes=np.array([list(i) for i in survivors], dtype=float),
            fitness=np.array([i.fitness.values[0] for i in survivors]),
            errors=np.array([i.errors for i in survivors]),
            fail=np.array([i.fail for i in survivors], dtype=np.int64))
