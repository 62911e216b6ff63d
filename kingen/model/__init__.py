"""The model layer: a kinetic scheme as a user writes it, checked and ready to solve.

==========================  ===============================================================
module                      its one job
==========================  ===============================================================
:mod:`.scheme`              the scheme file: states, parameters, transitions, the generator
                            matrix Q(c); :class:`Scheme`
:mod:`.fields`              the one type-checked reader of TOML fields (every kind of file)
:mod:`.units`               unit factors to the internal units (ms, mM, pS, pA, mV)
:mod:`.limits`              resource limits checked before anything is allocated
:mod:`.shipped`             the scheme files kingen ships, found by name
==========================  ===============================================================
"""

from kingen.model.scheme import Scheme
from kingen.model.shipped import resolve_model, shipped_models

__all__ = ["Scheme", "resolve_model", "shipped_models"]
