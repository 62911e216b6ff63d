"""Reference kernels with known answers, and the :class:`KernelCase` every analysed kernel uses.

:func:`cases_for` maps a ``kingen analyze`` target to its cases; the solver's own cases come
from :func:`kingen.analysis.solver_cases.analysis_cases`.
"""

from kingen.analysis.kernels.base import KernelCase, cases_for, rel_error

__all__ = ["KernelCase", "cases_for", "rel_error"]
