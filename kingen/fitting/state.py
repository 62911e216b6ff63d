"""The search state, typed, and the resume arrays a run file keeps of it after every generation.

Plain arrays only (never a pickle): the population and its scores, the hall of fame, the
algorithm's own arrays (CMA-ES's strategy), and the states of the three random generators
the search draws from (Python's ``random``, numpy's global generator that DEAP's CMA-ES
uses, and the fit's own PCG64).

- :class:`SearchState` is what the controller holds: counters, the hall of fame and the
  algorithm's :class:`AlgorithmState` (its population, and whatever else the algorithm keeps,
  in a subclass of its own);
- :class:`RandomStates` are the generators' states;
- :func:`state_fields` declares the arrays (the run file is created with these datasets),
  :func:`encode` turns the state into them, and :func:`checked_state` checks a file's arrays
  before any is used and turns them back into a typed state.

Examples
--------
>>> from kingen.fitting.config import demo_config, load_config
>>> cfg = load_config(demo_config(), overrides={"output": "unused.h5"})
>>> fields = state_fields(cfg, n_protocols=4)
>>> fields["genes"][0], fields["genes"][1] == (cfg.ga.population, cfg.pmap.n_genes)
('f8', True)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kingen.errors import KingenError
from kingen.fitting.config import FitConfig

STATE_VERSION = 2  # 2: plain arrays in the run file (1 was a pickle)

Fields = dict[str, tuple[str, tuple[int, ...]]]
"""Resume arrays: name -> (dtype, typical shape)."""

_STATE_INTS = ("version", "generation", "since_improvement", "evaluations")
_STATE_FLOATS = ("best", "reference", "elapsed")
_POPULATION = ("genes", "fitness", "errors", "fail")
_U64 = (1 << 64) - 1


@dataclass
class Population:
    """Candidates and their scores: genes ``(N, n_genes)``, fitness ``(N,)``, errors per
    protocol ``(N, n_protocols)``, failure codes ``(N,)``."""

    genes: np.ndarray
    fitness: np.ndarray
    errors: np.ndarray
    fail: np.ndarray

    @classmethod
    def fields(cls, size: int, n_genes: int, n_protocols: int) -> Fields:
        """The population's resume arrays for ``size`` candidates."""
        return {"genes": ("f8", (size, n_genes)), "fitness": ("f8", (size,)),
                "errors": ("f8", (size, n_protocols)), "fail": ("i8", (size,))}


@dataclass
class HallOfFame:
    """The best distinct candidates so far, best first (finite fitness only)."""

    genes: np.ndarray
    fitness: np.ndarray

    def merged(self, genes: np.ndarray, fitness: np.ndarray, k: int) -> HallOfFame:
        """The ``k`` best distinct candidates of this hall and a new batch.

        Examples
        --------
        >>> hof = HallOfFame(np.zeros((0, 1)), np.zeros(0))
        >>> hof = hof.merged(np.array([[1.0], [2.0], [1.0]]), np.array([3.0, np.nan, 3.0]), 2)
        >>> hof.genes.tolist(), hof.fitness.tolist()
        ([[1.0]], [3.0])
        """
        if self.fitness.size >= k:
            # A full hall admits only what beats its last: one comparison per candidate,
            # where ranking a batch of 65,536 cost most of a millisecond. A tie does not
            # enter (the stable sort below ranks the hall's own rows first).
            better = np.flatnonzero(fitness < self.fitness[k - 1])
            genes, fitness = genes[better], fitness[better]
        if fitness.size > k:
            # Only the k best of a batch can enter: keeps the row-unique step small at large λ.
            keep = np.argpartition(np.where(np.isfinite(fitness), fitness, np.inf), k)[:k]
            keep.sort()
            genes, fitness = genes[keep], fitness[keep]
        g = np.vstack([self.genes, genes])
        f = np.concatenate([self.fitness, fitness])
        ok = np.isfinite(f)
        g, f = g[ok], f[ok]
        _, first = np.unique(g, axis=0, return_index=True)  # distinct candidates only
        first = np.sort(first)
        g, f = g[first], f[first]
        order = np.argsort(f, kind="stable")[:k]
        return HallOfFame(g[order], f[order])


@dataclass
class AlgorithmState:
    """What an algorithm keeps between generations: its population (the candidates a
    generation records), and in a subclass whatever else it needs, as named arrays
    (:meth:`arrays`, :meth:`from_arrays`, declared by :meth:`fields`)."""

    population: Population

    prefix: ClassVar[str] = ""  # the algorithm's own arrays are named with it

    @classmethod
    def fields(cls, settings: Any, n_genes: int) -> Fields:
        """The algorithm's own resume arrays, beyond the population (none here)."""
        return {}

    def arrays(self) -> dict[str, np.ndarray]:
        """The algorithm's own arrays as of now (copies of anything it updates in place)."""
        return {}

    @classmethod
    def from_arrays(cls, population: Population, arrays: dict[str, np.ndarray]
                    ) -> AlgorithmState:
        """The state from a run file's checked arrays."""
        return cls(population)


@dataclass
class SearchState:
    """The controller's state of a search: counters, the hall of fame, the algorithm's
    state. ``reference`` is the best an improvement is measured against (infinite until a
    finite best was seen)."""

    algorithm: AlgorithmState
    hall_of_fame: HallOfFame
    generation: int = 0
    best: float = math.inf
    reference: float = math.inf
    since_improvement: int = 0
    elapsed: float = 0.0
    evaluations: int = 0

    @property
    def population(self) -> Population:
        """The algorithm's population (what a generation records)."""
        return self.algorithm.population


@dataclass
class RandomStates:
    """The three generators' states, in the form ``random.setstate``,
    ``np.random.set_state`` and ``PCG64.state`` take."""

    python: tuple
    np_global: tuple
    pcg64: dict[str, Any] = field(default_factory=dict)

    def arrays(self) -> dict[str, np.ndarray]:
        """The states as resume arrays."""
        version, words, gauss = self.python
        out: dict[str, Any] = {
            "python_random": np.array(words, dtype=np.int64),
            "python_random_version": np.int64(version),
            "python_random_has_gauss": np.int64(gauss is not None),
            "python_random_gauss": np.float64(0.0 if gauss is None else gauss)}
        _, key, pos, has_gauss, cached = self.np_global
        out.update(np_global_key=np.array(key, dtype=np.uint32), np_global_pos=np.int64(pos),
                   np_global_has_gauss=np.int64(has_gauss),
                   np_global_gauss=np.float64(cached))
        st = self.pcg64
        words128 = [st["state"]["state"], st["state"]["inc"]]
        out["rng_pcg64"] = np.array([w >> s & _U64 for w in words128 for s in (64, 0)],
                                    dtype=np.uint64)
        out["rng_has_uint32"] = np.int64(st["has_uint32"])
        out["rng_uinteger"] = np.uint64(st["uinteger"])
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], path: str) -> RandomStates:
        """The states from resume arrays, each tried on a throw-away generator."""
        gauss = (float(arrays["python_random_gauss"])
                 if int(arrays["python_random_has_gauss"]) else None)
        python_state = (int(arrays["python_random_version"]),
                        tuple(int(v) for v in arrays["python_random"]), gauss)
        np_state = ("MT19937", np.array(arrays["np_global_key"]),
                    int(arrays["np_global_pos"]), int(arrays["np_global_has_gauss"]),
                    float(arrays["np_global_gauss"]))
        pcg = [int(v) for v in arrays["rng_pcg64"]]
        pcg_state = {"bit_generator": "PCG64",
                     "state": {"state": pcg[0] << 64 | pcg[1], "inc": pcg[2] << 64 | pcg[3]},
                     "has_uint32": int(arrays["rng_has_uint32"]),
                     "uinteger": int(arrays["rng_uinteger"])}
        try:
            random.Random().setstate(python_state)
            np.random.RandomState().set_state(np_state)
            np.random.PCG64().state = pcg_state
        except (ValueError, TypeError, OverflowError) as exc:
            raise KingenError(f"malformed resume state: a random generator's state is "
                              f"invalid ({' '.join(str(exc).split())})", file=path,
                              field="/resume") from None
        return cls(python_state, np_state, pcg_state)


def _random_fields() -> Fields:
    return {
        # Python's random: (version, 624 Mersenne Twister words and the position,
        # the cached Gaussian or None)
        "python_random": ("i8", (625,)), "python_random_version": ("i8", ()),
        "python_random_has_gauss": ("i8", ()), "python_random_gauss": ("f8", ()),
        # numpy's global (legacy) generator, which DEAP's CMA-ES draws from
        "np_global_key": ("u4", (624,)), "np_global_pos": ("i8", ()),
        "np_global_has_gauss": ("i8", ()), "np_global_gauss": ("f8", ()),
        # the fit's PCG64: 128-bit state and increment as (high, low) 64-bit words
        "rng_pcg64": ("u8", (4,)), "rng_has_uint32": ("i8", ()),
        "rng_uinteger": ("u8", ()),
    }


def state_fields(cfg: FitConfig, n_protocols: int) -> Fields:
    """The resume state's arrays, name -> (dtype, typical shape), as the run file keeps them.

    Plain numbers only: the population, the hall of fame, the algorithm's own arrays, the
    random generators' states (see the documentation, "The run file").
    """
    from kingen.fitting.algorithms import algorithm_class

    ga = cfg.ga
    algorithm = algorithm_class(ga.algorithm)
    n, k = cfg.pmap.n_genes, ga.hall_of_fame
    fields: Fields = {name: ("i8", ()) for name in _STATE_INTS}
    fields.update({name: ("f8", ()) for name in _STATE_FLOATS})
    fields.update(Population.fields(algorithm.population_size(ga), n, n_protocols))
    fields.update({"hof_genes": ("f8", (k, n)), "hof_fitness": ("f8", (k,))})
    fields.update(_random_fields())
    fields.update(algorithm.state_type.fields(ga, n))
    return fields


def checked_state(arrays: dict[str, np.ndarray], cfg: FitConfig, n_protocols: int,
                  path: str) -> tuple[SearchState, RandomStates]:
    """Check a run file's resume arrays before any is used; nothing in them is executed.

    Every array must have the type and shape this configuration implies; the random
    generators' states are tried on throw-away generators.

    Returns
    -------
    state, randoms
        The typed search state and the three generators' states.

    Raises
    ------
    KingenError
        Naming the array that is missing or malformed.
    """
    from kingen.fitting.algorithms import algorithm_class

    want = state_fields(cfg, n_protocols)
    k = cfg.ga.hall_of_fame
    for name, (dtype, shape) in want.items():
        if name not in arrays:
            raise KingenError("malformed resume state: missing", file=path,
                              field=f"/resume/{name}")
        arr = arrays[name]
        ok_shape = arr.shape == shape or (name.startswith("hof_") and arr.ndim == len(
            shape) and arr.shape[0] <= k and arr.shape[1:] == shape[1:])
        if np.dtype(arr.dtype) != np.dtype(dtype) or not ok_shape:
            raise KingenError(f"malformed resume state: {arr.dtype} of shape {arr.shape} "
                              f"where this run needs {np.dtype(dtype)} of shape {shape}",
                              file=path, field=f"/resume/{name}")
    extra = sorted(set(arrays) - set(want))
    if extra:
        raise KingenError("malformed resume state: fields this run does not have",
                          file=path, field="/resume", value=extra)
    if int(arrays["version"]) != STATE_VERSION:
        raise KingenError("resume state of another kingen version; cannot resume",
                          file=path, field="/resume/version", value=int(arrays["version"]))
    randoms = RandomStates.from_arrays(arrays, path)
    population = Population(*(np.array(arrays[name]) for name in _POPULATION))
    own = algorithm_class(cfg.ga.algorithm).state_type.from_arrays(population, arrays)
    state = SearchState(
        algorithm=own, hall_of_fame=HallOfFame(np.array(arrays["hof_genes"]),
                                               np.array(arrays["hof_fitness"])),
        **{name: int(arrays[name]) for name in _STATE_INTS if name != "version"},
        **{name: float(arrays[name]) for name in _STATE_FLOATS})
    return state, randoms


def encode(state: SearchState, randoms: RandomStates) -> dict[str, np.ndarray]:
    """The resume state as of now, as the plain arrays of :func:`state_fields`.

    The population arrays are shared with ``state`` (a generation replaces them and never
    writes into them); the algorithm's own arrays are copies (see
    :meth:`AlgorithmState.arrays`).
    """
    out: dict[str, Any] = {"version": np.int64(STATE_VERSION)}
    out.update({name: np.int64(getattr(state, name)) for name in _STATE_INTS[1:]})
    out.update({name: np.float64(getattr(state, name)) for name in _STATE_FLOATS})
    pop = state.population
    out.update(genes=pop.genes, fitness=pop.fitness, errors=pop.errors, fail=pop.fail,
               hof_genes=state.hall_of_fame.genes, hof_fitness=state.hall_of_fame.fitness)
    out.update(randoms.arrays())
    out.update(state.algorithm.arrays())
    return out
