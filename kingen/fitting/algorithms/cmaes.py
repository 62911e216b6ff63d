"""DEAP's CMA-ES (``deap.cma.Strategy``) in genes scaled to [0, 1] per gene.

Samples outside the box are clipped for evaluation and penalised by their squared distance
to it (:data:`CMA_PENALTY` per unit), so that the strategy learns to stay inside. Its
numbers come from numpy's global generator, as DEAP draws them.

Examples
--------
>>> import numpy as np
>>> from kingen.fitting.algorithms.base import GeneSpace, Randoms
>>> from kingen.fitting.config import GASettings
>>> from kingen.fitting.state import Population
>>> randoms = Randoms(0)
>>> randoms.seed_shared()
>>> es = CMAES(GASettings(offspring=6), GeneSpace(np.zeros(2), np.ones(2), np.zeros(2)),
...            randoms)
>>> genes = es.ask()
>>> es.tell(Population(genes, (genes ** 2).sum(axis=1), np.zeros((6, 1)), np.zeros(6, int)))
>>> state = es.state()
>>> state.population.genes.shape, state.C.shape
((6, 2), (2, 2))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from kingen.fitting.algorithms.base import Algorithm, GeneSpace, Randoms
from kingen.fitting.algorithms.deap_types import individual_class
from kingen.fitting.config import GASettings
from kingen.fitting.state import AlgorithmState, Fields, Population

CMA_PENALTY = 1.0  # fitness added per unit of squared distance outside the [0, 1] box

# The attributes of DEAP's cma.Strategy that change as it runs (the rest are constants
# DEAP computes from λ, μ and the dimension).
_VECTORS = ("centroid", "pc", "ps", "diagD")
_MATRICES = ("C", "B", "BD")
_FLOATS = ("sigma", "cond")
_INTS = ("update_count", "lambda_", "mu")


@dataclass
class CMAState(AlgorithmState):
    """CMA-ES's state: the population of the last generation, and the strategy's changing
    attributes (kept in the run file as ``cma_<name>``)."""

    centroid: np.ndarray
    pc: np.ndarray
    ps: np.ndarray
    diagD: np.ndarray  # noqa: N815 - DEAP's name
    C: np.ndarray  # noqa: N815
    B: np.ndarray  # noqa: N815
    BD: np.ndarray  # noqa: N815
    sigma: float
    cond: float
    update_count: int
    lambda_: int
    mu: int

    prefix: ClassVar[str] = "cma_"

    @classmethod
    def fields(cls, settings: Any, n_genes: int) -> dict[str, tuple[str, tuple[int, ...]]]:
        n = n_genes
        out: Fields = {f"cma_{a}": ("f8", (n,)) for a in _VECTORS}
        out.update({f"cma_{a}": ("f8", (n, n)) for a in _MATRICES})
        out.update({f"cma_{a}": ("f8", ()) for a in _FLOATS})
        out.update({f"cma_{a}": ("i8", ()) for a in _INTS})
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {
            f"cma_{a}": np.array(getattr(self, a), dtype=np.float64)
            for a in _VECTORS + _MATRICES + _FLOATS}
        out.update({f"cma_{a}": np.int64(getattr(self, a)) for a in _INTS})
        return out

    @classmethod
    def from_arrays(cls, population: Population, arrays: dict[str, np.ndarray]) -> CMAState:
        own: dict[str, Any] = {a: np.array(arrays[f"cma_{a}"]) for a in _VECTORS + _MATRICES}
        own.update({a: np.float64(arrays[f"cma_{a}"]) for a in _FLOATS})
        own.update({a: int(arrays[f"cma_{a}"]) for a in _INTS})
        return cls(population, **own)


class CMAES(Algorithm):
    """DEAP's CMA-ES (see the module docstring): λ candidates a generation, the best λ/2
    (at least 1) recombined."""

    name = "cmaes"
    state_type = CMAState

    def __init__(self, settings: GASettings, space: GeneSpace, randoms: Randoms) -> None:
        super().__init__(settings, space, randoms)
        self.strategy: Any = None
        self._asked: tuple[list, np.ndarray] | None = None

    @classmethod
    def population_size(cls, settings: GASettings) -> int:
        return settings.lambda_

    def ask(self) -> np.ndarray:
        if self.strategy is None:
            from deap import cma

            s, space = self.settings, self.space
            centroid = (self._to_unit(space.start) if s.start_from_model
                        else np.full(space.n, 0.5))
            self.strategy = cma.Strategy(centroid=list(centroid), sigma=s.sigma,
                                         lambda_=s.lambda_, mu=max(1, s.lambda_ // 2))
        inds = self.strategy.generate(individual_class())
        u = np.array([list(i) for i in inds], dtype=float)
        self._asked = (inds, u)
        return self.space.low + np.clip(u, 0.0, 1.0) * (self.space.up - self.space.low)

    def tell(self, scored: Population) -> None:
        assert self._asked is not None, "tell without ask"
        (inds, u), self._asked = self._asked, None
        inside = np.clip(u, 0.0, 1.0)
        penalty = CMA_PENALTY * ((u - inside) ** 2).sum(axis=1)
        for ind, f, p in zip(inds, scored.fitness, penalty, strict=True):
            # A failed candidate must still be rankable: worst, but finite for CMA's sort.
            ind.fitness.values = (float(f + p) if math.isfinite(f) else 1e300,)
        self.strategy.update(inds)
        self.population = scored

    def state(self) -> CMAState:
        st = self.strategy
        own: dict[str, Any] = {a: np.array(getattr(st, a), dtype=np.float64)
                               for a in _VECTORS + _MATRICES}
        own.update({a: np.float64(getattr(st, a)) for a in _FLOATS})
        own.update({a: int(getattr(st, a)) for a in _INTS})
        return CMAState(self.population, **own)

    @classmethod
    def from_state(cls, state: AlgorithmState, settings: GASettings, space: GeneSpace,
                   randoms: Randoms) -> CMAES:
        from deap import cma

        assert isinstance(state, CMAState)
        es = cls(settings, space, randoms)
        es.population = state.population
        # DEAP recomputes its constants from λ, μ and the dimension, as the run computed them
        st = cma.Strategy(centroid=list(state.centroid), sigma=float(state.sigma),
                          lambda_=state.lambda_, mu=state.mu)
        for a in _VECTORS + _MATRICES:
            setattr(st, a, np.array(getattr(state, a)))
        for a in _FLOATS:
            setattr(st, a, np.float64(getattr(state, a)))
        st.update_count = state.update_count
        es.strategy = st
        return es

    def _to_unit(self, genes: np.ndarray) -> np.ndarray:
        return (genes - self.space.low) / (self.space.up - self.space.low)
