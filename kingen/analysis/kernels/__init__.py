"""Reference kernels with known answers, and the :class:`KernelCase` every analysed kernel uses.

:func:`cases_for` maps a ``kingen analyze`` target to its cases; the solver's own cases come
from ``kingen.solve.cuda.analysis_cases()`` when that function exists.
"""

from kingen.analysis.kernels.base import KernelCase, cases_for, rel_error

__all__ = ["KernelCase", "cases_for", "rel_error"]
