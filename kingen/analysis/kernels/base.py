"""A kernel the analysis can time, check and profile, independent of what it computes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kingen.errors import KingenError

TARGETS = ("rk4", "stencil", "sgemm", "all")


@dataclass
class KernelCase:
    """One kernel variant on one prepared problem.

    Parameters
    ----------
    name
        Short unique name, e.g. ``"stencil_tiled"``; used in tables, JSON and by the profiler
        worker to find the case again in a fresh process.
    launch
        Runs the kernel once on device data prepared beforehand (allocation and
        compilation happen on the first call, so callers warm up before timing). It must not
        synchronize: callers time it with CUDA events.
    flops
        Floating-point operations one launch does (an FMA counts 2).
    bytes
        Fewest bytes one launch must move through device memory (each input read once,
        each output written once).
    check
        Runs the kernel on fresh random inputs with a poisoned output and returns the
        relative error ``||out - ref|| / ||ref||`` against a numpy reference (``inf`` when an
        element was left unwritten or is not finite).
    kernel_regex
        Regular expression matching the kernel's function name, for ``ncu -k regex:...``.
    group
        The target this case belongs to (``"stencil"``, ``"sgemm"``, ``"rk4"``).
    precision
        ``"float32"`` or ``"float64"`` (the names of :class:`kingen.solve.SolverOptions`): the
        precision the kernel is meant to compute in; float64 instructions in a float32 kernel
        are reported as accidental.
    tolerance
        Largest relative error :meth:`verify` accepts.
    note
        One line on what the variant does, for reports.
    kernel_count
        Kernels one :attr:`launch` runs: 1 (the profiler takes the matching kernel of the
        second launch), or 0 for "several" (it profiles every kernel of one launch and
        merges them into one record).
    worker_args
        How the profiler's worker process rebuilds this case (default: ``--target group
        --case name``, enough for the reference kernels).
    """

    name: str
    launch: Callable[[], None]
    flops: float
    bytes: float
    check: Callable[[], float]
    kernel_regex: str
    group: str = ""
    precision: str = "float32"
    tolerance: float = 1e-4
    note: str = ""
    extra: dict = field(default_factory=dict)
    kernel_count: int = 1
    worker_args: list[str] = field(default_factory=list)

    def verify(self) -> tuple[bool, float]:
        """Run :attr:`check`; return (passed, relative error)."""
        err = float(self.check())
        return bool(np.isfinite(err) and err <= self.tolerance), err


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    """``||out - ref|| / ||ref||`` in float64; ``inf`` if any element of ``out`` is not finite."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def rk4_cases(model: str | None = None, n_candidates: int = 16384,
              precision: str | None = None, protocols: str = "desensitization",
              variants: tuple | None = None) -> list[KernelCase]:
    """The solver's cases (:func:`kingen.analysis.solver_cases.analysis_cases`).

    Raises
    ------
    KingenError
        When this installation's solver cannot launch its kernel on its own
        (``Simulator.prepare_launch`` missing: a partial or older build).
    """
    try:
        from kingen.solve.batch import Simulator
    except ImportError as exc:
        raise KingenError(
            f"the solver kernel is not available (kingen.solve.batch: {exc})", field="rk4"
        ) from exc
    if not hasattr(Simulator, "prepare_launch"):
        raise KingenError(
            "the solver kernel is not available: the solver has no prepare_launch()",
            field="rk4",
        )
    from kingen.analysis.solver_cases import analysis_cases

    cases = list(analysis_cases(model, n_candidates, precision, protocols, variants))
    for c in cases:
        c.group = c.group or "rk4"
    return cases


def cases_for(target: str, size: str = "default",
              rk4: dict | None = None) -> list[KernelCase]:
    """The kernel cases of one ``kingen analyze`` target.

    Parameters
    ----------
    target
        ``"stencil"``, ``"sgemm"``, ``"rk4"`` or ``"all"`` (rk4 is skipped in ``all`` when the
        solver kernel is not available).
    size
        ``"default"`` (fills an H100), ``"small"`` (quick) or ``"tiny"`` (simulator tests).
    rk4
        Keyword arguments of :func:`rk4_cases` (model, n_candidates, precision, protocols,
        variants).
    """
    if target not in TARGETS:
        raise KingenError(f"unknown target; choose one of {', '.join(TARGETS)}", value=target)
    from kingen.analysis.kernels import sgemm, stencil

    out: list[KernelCase] = []
    if target in ("stencil", "all"):
        out += stencil.cases(size)
    if target in ("sgemm", "all"):
        out += sgemm.cases(size)
    if target == "rk4":
        out += rk4_cases(**(rk4 or {}))
    elif target == "all":
        try:
            out += rk4_cases(**(rk4 or {}))
        except KingenError:
            pass  # the caller reports the missing solver kernel on its own line
    return out
