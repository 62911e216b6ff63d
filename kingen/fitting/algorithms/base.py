"""What every algorithm is, and what the controller lends it: the genes' box and the
random generators.

An :class:`Algorithm` is the ask/tell shape of PINTS' optimisers: :meth:`Algorithm.ask`
gives the genes to score, :meth:`Algorithm.tell` takes them scored, and
:meth:`Algorithm.state` / :meth:`Algorithm.from_state` save and restore it through the run
file (:mod:`kingen.fitting.state`). It never calls the evaluator, writes a file or decides
when to stop: the controller (:class:`kingen.fitting.engine.Engine`) does.

Examples
--------
An algorithm that scores fresh uniform draws each generation (the population is the last
batch):

>>> import numpy as np
>>> from kingen.fitting.config import GASettings
>>> class Uniform(Algorithm):
...     name = "uniform"
...     def ask(self):
...         return self.randoms.rng.uniform(self.space.low, self.space.up,
...                                         size=(self.settings.population, self.space.n))
...     def tell(self, scored):
...         self.population = scored
>>> space = GeneSpace(np.zeros(2), np.ones(2), np.full(2, 0.5))
>>> search = Uniform(GASettings(population=4), space, Randoms(0))
>>> genes = search.ask()
>>> search.tell(Population(genes, genes.sum(axis=1), np.zeros((4, 1)), np.zeros(4, int)))
>>> search.state().population.genes.shape
(4, 2)
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from kingen.fitting.config import GASettings
from kingen.fitting.state import AlgorithmState, Population, RandomStates

T = TypeVar("T")


@dataclass(frozen=True)
class GeneSpace:
    """The box the genes live in: ``low`` and ``up`` bounds ``(n_genes,)``, and ``start``,
    the genes of the model file's own values (given with ``start_from_model``)."""

    low: np.ndarray
    up: np.ndarray
    start: np.ndarray | None = None

    @property
    def n(self) -> int:
        """Number of genes."""
        return int(self.low.size)


class Randoms:
    """The search's random generators, seeded from the fit's seed, whose states the resume
    state keeps.

    ``rng`` is the fit's own PCG64 generator; ``python`` the generator DEAP's operators draw
    from (:func:`~kingen.fitting.algorithms.deap_types.deap_draws_from`); DEAP's CMA-ES
    draws from numpy's global generator. An algorithm may draw a generation's numbers from
    ``rng`` ahead, on the controller's thread for it, while the last generation is solved
    (:meth:`draw_ahead`): the numbers, and the state the generator is left in, are those
    drawing them in turn would give.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.python = random.Random(seed)  # seeded as random.seed(seed) seeds the module's
        self.executor: Executor | None = None  # lent by the controller while it runs
        self._ahead: Future | None = None
        self._mark: dict[str, Any] | None = None

    def seed_shared(self) -> None:
        """Seed the generators a fresh search starts from (numpy's global one too)."""
        self.python.seed(self.seed)
        np.random.seed(self.seed % (2 ** 32))  # noqa: NPY002 - DEAP's CMA-ES draws from it

    def states(self) -> RandomStates:
        """The generators' states as of now; ``rng``'s before any numbers drawn ahead."""
        pcg = self._mark if self._ahead is not None else self.rng.bit_generator.state
        return RandomStates(self.python.getstate(), np.random.get_state(), pcg)  # noqa: NPY002

    def restore(self, states: RandomStates) -> None:
        """Set the generators to stored states."""
        self.python.setstate(states.python)
        np.random.set_state(states.np_global)  # noqa: NPY002
        self.rng.bit_generator.state = states.pcg64

    def draw_ahead(self, draw: Callable[[np.random.Generator], T]) -> None:
        """Start ``draw(rng)`` on the controller's drawing thread, unless there is none or
        numbers drawn ahead are still untaken. Nothing else may draw from ``rng`` until
        :meth:`take` takes them."""
        if self.executor is None or self._ahead is not None:
            return
        self._mark = self.rng.bit_generator.state
        self._ahead = self.executor.submit(draw, self.rng)

    def take(self, draw: Callable[[np.random.Generator], T]) -> T:
        """The numbers drawn ahead, or ``draw(rng)`` now if none were."""
        if self._ahead is None:
            return draw(self.rng)
        ahead, self._ahead = self._ahead, None
        return ahead.result()

    def settle(self) -> None:
        """Forget numbers drawn ahead for a generation that never came (the search ended):
        ``rng`` goes back to its state before them."""
        if self._ahead is not None:
            wait([self._ahead])  # its error, if any, is no longer the run's
            self._ahead = None
            self.rng.bit_generator.state = self._mark


class Algorithm(ABC):
    """One search algorithm, ask/tell: the controller asks for genes, scores them and tells.

    A subclass sets ``name`` (what ``[ga] algorithm`` calls it), implements :meth:`ask`
    and :meth:`tell`, and if it keeps more than its population, a ``state_type`` of its own
    with :meth:`state` and :meth:`from_state` to match.

    Parameters
    ----------
    settings
        The ``[ga]`` settings.
    space
        The genes' box.
    randoms
        The search's random generators (the only ones an algorithm may draw from, so that
        a resumed run ends as an uninterrupted one would).
    """

    name: ClassVar[str]
    state_type: ClassVar[type[AlgorithmState]] = AlgorithmState

    def __init__(self, settings: GASettings, space: GeneSpace, randoms: Randoms) -> None:
        self.settings = settings
        self.space = space
        self.randoms = randoms
        self.timings: dict[str, float] = {}  # parts of this generation's step, seconds
        self._population: Population | None = None

    @classmethod
    def population_size(cls, settings: GASettings) -> int:
        """Candidates in the population a generation records (the resume state's size)."""
        return settings.population

    @property
    def population(self) -> Population:
        """The population as of the last :meth:`tell`."""
        if self._population is None:
            raise RuntimeError(f"{self.name}: nothing told yet")
        return self._population

    @population.setter
    def population(self, value: Population) -> None:
        self._population = value

    @property
    def started(self) -> bool:
        """Whether a population was told (the first ask gives the initial population)."""
        return self._population is not None

    @abstractmethod
    def ask(self) -> np.ndarray:
        """The genes to score next, ``(N, n_genes)`` inside the box (N may be 0)."""

    @abstractmethod
    def tell(self, scored: Population) -> None:
        """The genes of the last :meth:`ask`, scored (same rows, same order)."""

    def state(self) -> AlgorithmState:
        """What the algorithm keeps, as of now (see :mod:`kingen.fitting.state`)."""
        return self.state_type(self.population)

    @classmethod
    def from_state(cls, state: AlgorithmState, settings: GASettings, space: GeneSpace,
                   randoms: Randoms) -> Algorithm:
        """The algorithm as :meth:`state` left it (the random generators are restored by
        the controller)."""
        algorithm = cls(settings, space, randoms)
        algorithm.population = state.population
        return algorithm

    def warm_up(self) -> None:  # noqa: B027 - a hook: most algorithms need none
        """Compile or load whatever the first generation would wait for (called once)."""

    def draw_ahead(self) -> None:  # noqa: B027 - a hook: most algorithms need none
        """Start drawing the next ask's random numbers while the last ask's genes are solved
        (through :meth:`Randoms.draw_ahead`); nothing by default."""
