"""The search algorithms, one class per file, each named in the registry.

An algorithm is an ask/tell class (:class:`~kingen.fitting.algorithms.base.Algorithm`):
``ask()`` gives the genes to score, ``tell(evaluation)`` takes their scores, ``state()`` and
``from_state()`` save and restore it. The controller (:class:`kingen.fitting.engine.Engine`)
runs the loop, the evaluator, the hall of fame and the stopping rules, and knows no
algorithm by name: the configuration's ``[ga] algorithm = "..."`` is looked up here.

==================  ============================================  =========================
name                class                                         file
==================  ============================================  =========================
``mu_plus_lambda``  :class:`~.mu_plus_lambda.MuPlusLambda`        DEAP's (μ + λ), elitist
``cmaes``           :class:`~.cmaes.CMAES`                        DEAP's CMA-ES
==================  ============================================  =========================

Adding an algorithm is one file: a subclass of ``Algorithm`` with a ``name``, given to
:func:`register`.

Examples
--------
>>> algorithm_names()[:2]
('mu_plus_lambda', 'cmaes')
>>> algorithm_class("cmaes").__name__
'CMAES'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kingen.fitting.algorithms.base import Algorithm

# The shipped algorithms, imported when first named (DEAP loads with them).
_SHIPPED = {"mu_plus_lambda": ("kingen.fitting.algorithms.mu_plus_lambda", "MuPlusLambda"),
            "cmaes": ("kingen.fitting.algorithms.cmaes", "CMAES")}
_REGISTERED: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Make ``cls`` the algorithm its ``name`` names in a configuration (usable as a class
    decorator).

    Raises
    ------
    ValueError
        If another class already has the name.
    """
    name = cls.name
    taken = _REGISTERED.get(name) or (name in _SHIPPED and algorithm_class(name))
    if taken and taken is not cls:
        raise ValueError(f"an algorithm named {name!r} is registered already ({taken!r})")
    _REGISTERED[name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a registered algorithm (the shipped ones stay)."""
    if name not in _SHIPPED:
        _REGISTERED.pop(name, None)


def algorithm_names() -> tuple[str, ...]:
    """The names a configuration's ``[ga] algorithm`` may take, the shipped ones first."""
    return tuple(_SHIPPED) + tuple(n for n in _REGISTERED if n not in _SHIPPED)


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm ``name`` names (one of :func:`algorithm_names`).

    Raises
    ------
    KeyError
        For a name no algorithm has (the configuration refuses those first).
    """
    if name not in _REGISTERED:
        if name not in _SHIPPED:
            raise KeyError(f"no algorithm named {name!r}; known: {', '.join(algorithm_names())}")
        module, attr = _SHIPPED[name]
        _REGISTERED[name] = getattr(importlib.import_module(module), attr)
    return _REGISTERED[name]
