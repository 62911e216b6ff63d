"""DEAP's individual type, created once, and DEAP's operators drawing from the search's own
generator.

Examples
--------
>>> ind = individual_class()([0.5, 0.25])
>>> ind.fitness.valid
False
"""

from __future__ import annotations

import contextlib
import importlib
import random
from collections.abc import Iterator
from typing import Any

# The modules of DEAP that draw from the module ``random`` they import.
_DEAP_RANDOM_USERS = ("deap.algorithms", "deap.tools.crossover", "deap.tools.mutation",
                      "deap.tools.selection")


def individual_class() -> Any:
    """``creator.KingenIndividual``: a list of genes with a minimised fitness (created on
    the first call; DEAP's ``creator`` is process-wide)."""
    from deap import base, creator

    if not hasattr(creator, "KingenFitness"):
        creator.create("KingenFitness", base.Fitness, weights=(-1.0,))
    if not hasattr(creator, "KingenIndividual"):
        creator.create("KingenIndividual", list, fitness=creator.KingenFitness)
    return creator.KingenIndividual


@contextlib.contextmanager
def deap_draws_from(generator: random.Random) -> Iterator[None]:
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
