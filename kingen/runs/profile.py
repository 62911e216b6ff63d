"""``kingen profile``: profile likelihoods of a finished fit, written to its run file.

:func:`profile_run` rebuilds the fit's problem from the run file
(:mod:`kingen.identify.problem`), estimates the noise (:mod:`kingen.identify.noise`),
and runs :class:`~kingen.identify.profile.ProfileEngine` one batched solver call a step,
committing its whole state to ``/profiles`` after every step (:mod:`kingen.store.profiles`),
so that a killed computation continues where it stopped when run again with the same
settings. The run file is locked against a second writer meanwhile; a fit still running
cannot be profiled.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kingen.errors import KingenError
from kingen.identify.likelihood import Likelihood
from kingen.identify.noise import NoiseModel, estimate_noise
from kingen.identify.problem import rebuild
from kingen.identify.profile import ProfileEngine
from kingen.identify.table import disagreements, local_rows, rows_from_results, table

MIN_POINTS, MAX_POINTS = 5, 1000
PROGRESS_EVERY_S = 10.0  # a progress line this often when not on a terminal


@dataclass
class ProfileResult:
    """The outcome of ``kingen profile``.

    Attributes
    ----------
    path
        The run file.
    level, threshold
        Confidence level and its Δχ² threshold.
    rows
        Per profiled parameter: ``name``, ``unit`` (the scheme file's), ``best``, ``lower``,
        ``upper`` (file units; None: open), ``identifiable``, ``flat``, ``pairs``,
        ``fisher_lower``, ``fisher_upper``, ``se_log10``.
    warnings
        Lines worth telling (noise, disagreement of the quadratic approximation, a better
        optimum found).
    results
        The engine's results (genes, grids, Δχ² profiles; see
        :meth:`~kingen.identify.profile.ProfileEngine.results`).
    noise
        The noise model, as stored.
    steps, solver_calls, candidates, wall_s
        Work done (this invocation's wall time; the counts include earlier invocations).
    """

    path: str
    level: float
    threshold: float
    rows: list[dict[str, Any]]
    warnings: list[str]
    results: dict[str, Any]
    noise: dict[str, Any]
    steps: int = 0
    solver_calls: int = 0
    candidates: int = 0
    wall_s: float = 0.0
    resumed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """The intervals as a plain-text table (see :func:`table`)."""
        head = (f"kingen profile: {len(self.rows)} parameters, {self.steps} steps, "
                f"{self.solver_calls} solver calls, {self.candidates} candidates "
                f"({self.path})")
        return "\n".join([head, "", table(self.rows, self.level)]
                         + [f"note: {w}" for w in self.warnings])


def _validate(points: int, level: float, path: str) -> None:
    if not isinstance(points, int) or not MIN_POINTS <= points <= MAX_POINTS:
        raise KingenError(f"must be an integer from {MIN_POINTS} to {MAX_POINTS}", file=path,
                          field="--points", value=points)
    if not (isinstance(level, float | int) and 0.5 <= float(level) < 1.0):
        raise KingenError("must be a probability from 0.5 to below 1", file=path,
                          field="--level", value=level)


def _chosen(pmap, parameters: list[str] | None, path: str) -> list[int]:
    names = pmap.gene_names
    if not parameters:
        return list(range(len(names)))
    out = []
    for p in parameters:
        if p not in names:
            raise KingenError(f"not a free parameter of this fit (free parameters are "
                              f"{', '.join(names)})", file=path, field="--parameters", value=p)
        if names.index(p) not in out:
            out.append(names.index(p))
    return out


def profile_run(run: str | os.PathLike[str], *, parameters: list[str] | None = None,
                points: int = 25, level: float = 0.95, backend: str | None = None,
                restart: bool = False, progress: bool = True, stream: TextIO | None = None,
                max_steps: int | None = None) -> ProfileResult:
    """Profile the free parameters of a finished fit, writing ``/profiles`` as it goes.

    Parameters
    ----------
    run
        The run file of a finished fit.
    parameters
        Names of the free parameters to profile (default: all).
    points
        Grid points per parameter before widening.
    level
        Confidence level of the intervals.
    backend
        Solver backend (default: auto: a GPU where there is one, else the CPU cores).
    restart
        Discard an unfinished profile state with the same settings instead of continuing it.
    max_steps
        Stop after this many steps (the state is kept: run again to continue).

    Raises
    ------
    KingenError
        One line: a bad setting, an unknown parameter, a run file without a finished fit,
        a damaged file, a run file another process writes.

    Examples
    --------
    >>> import kingen
    >>> result = kingen.profile("kingen_demo.h5", points=11)  # doctest: +SKIP
    >>> print(result.summary())  # doctest: +SKIP
    """
    from kingen.store import RunStore, WriterLock
    from kingen.store.integrity import open_append
    from kingen.store.profiles import add_group, commit_state, write_local

    t0 = time.perf_counter()
    path = Path(run)
    name = str(path)
    _validate(points, level, name)
    out = stream if stream is not None else sys.stderr
    lock = WriterLock(path)
    if not path.is_file():
        raise KingenError("run file not found", file=name)
    lock.acquire()
    try:
        with RunStore.open(path, "r") as store:
            problem = rebuild(store, backend)
            genes = _chosen(problem.pmap, parameters, name)
            previous = store.profiles()
            scheme = store.scheme()
            group = store.has_profiles_group
        settings = {"genes": genes, "points": int(points), "level": float(level)}
        state = None
        if previous is not None and not restart and previous.get("settings") == settings:
            state = previous
        pmap, objective = problem.pmap, problem.objective
        names = pmap.gene_names
        try:
            noise = (NoiseModel.from_dict(state["noise"]) if state is not None else
                     estimate_noise(objective, pmap.to_params(problem.best_genes[None, :])))
            lik = Likelihood(objective, pmap, noise, problem.best_genes)
            engine = ProfileEngine(lik, genes, points, float(level), problem.best_genes,
                                   problem.hof_genes,
                                   state=None if state is None else state["engine"])
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            if state is None:
                raise
            raise KingenError(f"malformed profile state ({type(exc).__name__}: {exc}); "
                              "start again with kingen profile --restart", file=name,
                              field="/profiles") from None
        if progress:
            what = ("continuing the profiles stored in the run file" if state is not None
                    else f"profiling {len(genes)} parameters at {points} points")
            out.write(f"kingen profile: {what} ({objective.simulator.backend}, "
                      f"{objective.simulator.device})\n")
            for line in noise.notes:
                out.write(f"kingen: note: {line}\n")
            out.flush()
        if not group:
            add_group(path)
        f = open_append(path)
        try:
            f.swmr_mode = True
            base = {"settings": settings, "noise": noise.to_dict(), "names": names}
            steps = 0
            tty = bool(getattr(out, "isatty", lambda: False)())
            shown = time.perf_counter()
            while not engine.done and (max_steps is None or steps < max_steps):
                t_step = time.perf_counter()
                if not engine.step():
                    break
                steps += 1
                results = engine.results(names) if engine.done else None
                commit_state(f, {**base, "engine": engine.to_state(), "results": results})
                now = time.perf_counter()
                if progress and (tty or now - shown > PROGRESS_EVERY_S or engine.done):
                    shown = now
                    active = int((engine.status != 2).sum())
                    rate = lik.candidates / max(lik.solver_s, 1e-9)
                    line = (f"step {engine.steps}: {active} sub-problems at work, "
                            f"{engine.candidates} candidates, {rate:,.0f} cand/s, "
                            f"{now - t_step:.2f} s a step")
                    out.write(f"\r{line}   " if tty else f"{line}\n")
                    out.flush()
            if progress and steps and tty:
                out.write("\n")
                out.flush()
            finished = engine.done
            results = engine.results(names)
            if finished:
                rows = rows_from_results(results, scheme, pmap)
                commit_state(f, {**base, "engine": engine.to_state(), "results": results,
                                 "table": rows})
                local = dict(results["fisher"])
                local.update(best_log10=[float(v) for v in engine.x[0]],
                             chi2=float(engine.chi2[0]), noise=noise.to_dict(),
                             log=[bool(v) for v in pmap.log], level=float(level))
                local["table"] = local_rows(local, scheme, pmap, float(level))
                write_local(f, local)
        finally:
            f.close()
    finally:
        lock.release()
    warnings = list(noise.notes)
    if finished:
        warnings += disagreements(results)
        gain = results["chi2_optimum"] - results["chi2_min"]
        if gain > 0.1:
            warnings.append(f"a profile found parameters {gain:.3g} lower in χ² than the "
                            "fit's best: the fit had not converged; intervals are relative "
                            "to the lowest point found")
    else:
        warnings.append(f"stopped after {steps} steps (not finished): run kingen profile "
                        "again with the same settings to continue")
    return ProfileResult(
        path=name, level=float(level), threshold=float(results["threshold"]),
        rows=rows if finished else [],
        warnings=warnings, results=results, noise=noise.to_dict(), steps=engine.steps,
        solver_calls=engine.calls, candidates=engine.candidates,
        wall_s=time.perf_counter() - t0, resumed=state is not None,
        extra={"solver_s": lik.solver_s, "finished": finished})
