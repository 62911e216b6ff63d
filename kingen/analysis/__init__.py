"""Measure GPU kernels and say what limits them: compute, memory or latency.

The method (issue 6): measure the device's ceilings (:mod:`.hardware`), profile one launch of
a kernel (:mod:`.profile`), derive instruction:byte ratios and percentages of each ceiling
(:mod:`.metrics`), classify and advise (:mod:`.classify`), and check the framework on
reference kernels whose answer is known (:mod:`.kernels`). :mod:`.tune` picks the fastest of
several variants of one kernel; :mod:`.optimize` is ``kingen tune``, the solver kernel's
optimization loop (verdict -> transformations -> check, time, re-classify, keep >= 5 %
steps), with the solver's cases in :mod:`.solver_cases`. Nothing here imports numba-cuda at
import time, so ``import kingen.analysis`` works on a machine without a GPU.
"""

from kingen.analysis.classify import Thresholds, Verdict, classify
from kingen.analysis.kernels.base import KernelCase
from kingen.analysis.metrics import MetricSet

__all__ = ["KernelCase", "MetricSet", "Thresholds", "Verdict", "classify"]
