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

import numpy as np

from kingen.errors import KingenError
from kingen.identify.likelihood import Likelihood
from kingen.identify.noise import NoiseModel, estimate_noise
from kingen.identify.problem import rebuild
from kingen.identify.profile import ProfileEngine
from kingen.identify.refine import stored_noise
from kingen.identify.table import disagreements, local_rows, rows_from_results, table

MIN_POINTS, MAX_POINTS = 5, 1000
UPDATE_GAIN = 1e-9  # χ² gain (relative) over the run's best that makes a profile point the best
PROGRESS_EVERY_S = 10.0  # a progress line this often when not on a terminal
# The state goes to the run file at most this often while a profile runs, and when it stops
# or finishes: a commit (the engine's state as JSON, two flushes) took about 38 ms on the H200
# machine's host, three times a GPU LM step, a third of a 3.4 s profile when made after
# every step. An interrupted profile resumes from its last commit, taking the same steps.
COMMIT_EVERY_S = 1.0


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


def run_noise(problem: Any, best: dict[str, Any] | None) -> NoiseModel:
    """The noise model of a run's likelihood: the one its fit stored with the best, else
    (a run written before the fit minimised the likelihood) estimated at its best."""
    stored = stored_noise(best)
    if stored is not None:
        return stored
    return estimate_noise(problem.objective,
                          problem.pmap.to_params(problem.best_genes[None, :]))


def run_likelihood(store: Any, backend: str | None = None) -> tuple[Likelihood, Any]:
    """The likelihood ``kingen profile`` computes for a run file open for reading (a
    :class:`~kingen.store.RunStore`), and the run's problem
    (:func:`~kingen.identify.problem.rebuild`)."""
    problem = rebuild(store, backend)
    noise = run_noise(problem, store.best())
    return Likelihood(problem.objective, problem.pmap, noise, problem.best_genes), problem


def _update_best(f: Any, path: Path, problem: Any, best: dict[str, Any] | None,
                 engine: ProfileEngine) -> dict[str, Any] | None:
    """Make the lowest point the profile found the run's best, when it is better than the
    best a fit on the likelihood stored (a run fitted on the old objective keeps its best:
    its fitness is not a χ²). Returns the note written, or None."""
    from kingen.store import RunStore
    from kingen.store.best import update_best

    if stored_noise(best) is None:
        return None
    chi2 = np.where(np.isfinite(engine.chi2), engine.chi2, np.inf)
    k = int(np.argmin(chi2))
    old = float(best["fitness"])
    if not chi2[k] < old - UPDATE_GAIN * max(abs(old), 1.0):
        return None
    writer = RunStore(f, path, "w")
    return update_best(writer, problem.objective, problem.pmap, engine.x[k], float(chi2[k]),
                       "kingen profile: a lower χ² on a profile")


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
            best = store.best()
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
                     run_noise(problem, best))
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
            steps = committed = 0
            tty = bool(getattr(out, "isatty", lambda: False)())
            shown = last_commit = time.perf_counter()
            while not engine.done and (max_steps is None or steps < max_steps):
                t_step = time.perf_counter()
                if not engine.step():
                    break
                steps += 1
                now = time.perf_counter()
                if not engine.done and now - last_commit >= COMMIT_EVERY_S:
                    commit_state(f, {**base, "engine": engine.to_state(), "results": None})
                    committed, last_commit = steps, time.perf_counter()
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
            note = None
            if not finished and steps > committed:  # stopped between steps: resumable here
                commit_state(f, {**base, "engine": engine.to_state(), "results": None})
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
                note = _update_best(f, path, problem, best, engine)
        finally:
            f.close()
    finally:
        lock.release()
    warnings = list(noise.notes)
    if finished:
        warnings += disagreements(results)
        gain = results["chi2_optimum"] - results["chi2_min"]
        if note is not None:
            warnings.append(f"the profile found a better point than the run's best: χ² "
                            f"{note['old_fitness']:.10g} -> {note['new_fitness']:.10g}; the "
                            "run's best is now that point (noted in the run file); report, "
                            "plots and exports use it")
        elif gain > 0.1:
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
        extra={"solver_s": lik.solver_s, "finished": finished,
               "steps_s": getattr(lik, "steps_s", 0.0),
               "step_log": getattr(lik, "step_log", []),
               "device": str(getattr(lik.objective.simulator, "device", ""))})
