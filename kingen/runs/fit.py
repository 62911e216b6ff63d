"""Run a fit, or resume one: the drivers that open the run file and hand it to the engine.

:func:`fit` runs a configuration (:mod:`kingen.fitting.config`) to its end and returns a
:class:`~kingen.runs.result.FitResult`; :func:`resume` continues a run file from its last
completed generation. Both create or open the run file (:class:`~kingen.store.RunStore`),
so this module sits in the persistence layer, below the rest of :mod:`kingen.fitting`.
The result is read back through the run file's :class:`~kingen.store.RunView`, the same
view the plots, the report and the export read.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numba
import numpy as np

from kingen.base.allocator import keep_freed_memory
from kingen.errors import KingenError
from kingen.fitting.algorithms import algorithm_class
from kingen.fitting.config import (
    FitConfig,
    load_config,
    loads_config,
    stored_settings,
)
from kingen.fitting.engine import Engine, verdict
from kingen.fitting.evaluator import Evaluator as Evaluate
from kingen.fitting.objective import Objective
from kingen.fitting.params import to_file_units
from kingen.fitting.progress import Progress
from kingen.fitting.state import checked_state, state_fields
from kingen.identify.refine import Finish, finish
from kingen.runs.result import FitResult
from kingen.store import RunStore, RunView, WriterLock
from kingen.store.best import write_best

Evaluator = Callable[[Objective], Evaluate]
"""Makes the engine's evaluator from the run's objective (see
:class:`kingen.fitting.evaluator.Evaluator`); None: :class:`kingen.fitting.evaluator.InProcess`."""


def fit(config: FitConfig | str | os.PathLike[str], *, overwrite: bool = False,
        progress: bool = True, overrides: dict[str, Any] | None = None,
        stream: TextIO | None = None, evaluator: Evaluator | None = None) -> FitResult:
    """Run a fit to its end.

    Parameters
    ----------
    config
        A configuration file or a loaded :class:`~kingen.fitting.config.FitConfig`.
    overwrite
        Replace an existing run file.
    progress
        Show the live progress line (on ``stream``, default stderr).
    overrides
        Command-line values replacing the file's (see :func:`load_config`).
    evaluator
        Makes the function that scores each generation's candidates, from the run's
        objective (see :data:`Evaluator`); by default the objective's batched solve in this
        process.

    Raises
    ------
    KingenError
        For any problem with the configuration, its files or the output, before any
        simulation.

    Examples
    --------
    The bundled demo, briefly (a few seconds on a laptop's CPU):

    >>> import kingen
    >>> result = kingen.fit(kingen.demo_config(), overwrite=True, progress=False,
    ...                     overrides={"output": "demo.h5", "generations": 2,
    ...                                "population": 8})  # doctest: +SKIP
    >>> print(result.summary())  # doctest: +SKIP
    kingen fit: 2 generations, ...
    """
    cfg = config if isinstance(config, FitConfig) else load_config(config, overrides=overrides)
    check_output(cfg, overwrite)
    objective = _objective(cfg)
    if objective.late_starts:  # a new fit only: a run that has one is still resumed
        raise objective.late_starts[0]
    # built before the run file: an evaluator that cannot be built (workers that cannot
    # build the solver) leaves no file behind
    evaluate = None if evaluator is None else evaluator(objective)
    _warn(_start_warnings(cfg, objective), stream)
    mu = algorithm_class(cfg.ga.algorithm).population_size(cfg.ga)
    store = RunStore.create(
        cfg.output, config_text=cfg.text, config=cfg.settings, scheme=cfg.scheme,
        protocols=objective.protocols, recordings=cfg.recordings, targets=cfg.targets,
        free_mask=cfg.pmap.free_mask, population_size=mu,
        environment=_environment(objective, cfg.precision),
        state_fields=state_fields(cfg, objective.n_protocols), inputs=_inputs(cfg),
        overwrite=overwrite, chains={p.protocol.name: p.chain for p in cfg.protocols})
    try:
        with store:
            return _search(cfg, objective, store, None, progress, stream, evaluate)
    except BaseException:
        _drop_if_empty(cfg.output)
        raise


def check_output(cfg: FitConfig, overwrite: bool = False) -> None:
    """Refuse, before anything runs, an output :func:`fit` could not write: a folder, one
    of the fit's inputs, or an existing file (unless ``overwrite``).

    Raises
    ------
    KingenError
        Naming the file.
    """
    RunStore.check_new(cfg.output, inputs=_inputs(cfg), overwrite=overwrite)


def _drop_if_empty(path: str) -> None:
    """Remove a run file a fit stopped before its first generation was committed: it holds
    nothing to resume or read, and would only stand in the way of running it again."""
    try:
        with RunStore.open(path, "r", verify=False) as reader:
            empty = reader.n_generations == 0 and reader.finished is None
    except (KingenError, OSError):
        return
    if empty:
        Path(path).unlink(missing_ok=True)


def _refuse_changed_recordings(cfg: FitConfig, stored: dict[str, Any], path: str) -> None:
    """A resumed fit must fit the data it started on: the recordings read again from disk
    are compared, sample by sample, with the copies the run file keeps."""
    def samples(rec: Any) -> list[np.ndarray]:
        out = []
        for x in (rec.time_ms, rec.current_pA):
            out.extend(np.asarray(a) for a in (x if isinstance(x, list) else [x]))
        return out

    for item in cfg.protocols:
        now, then = item.recording, stored.get(item.protocol.name)
        if now is None or then is None:
            continue
        a, b = samples(now), samples(then)
        if len(a) != len(b) or not all(np.array_equal(x, y) for x, y in zip(a, b,
                                                                            strict=True)):
            raise KingenError(f"the recording of protocol {item.protocol.name} "
                              f"({now.source}) differs from the copy the run started with: "
                              "a resumed fit needs the same data (restore the file, or "
                              "start a new fit)", file=path)


def check_resumable(reader: RunStore, generations: int | None) -> None:
    """Refuse, before anything runs, a run file :func:`resume` could not continue: one
    with no committed generation, or a finished one without new ``generations``.

    Raises
    ------
    KingenError
        Naming the file.
    """
    finished = reader.finished
    if finished and generations is None:
        raise KingenError(f"the run has already finished ({finished}); give "
                          "--generations to continue it further", file=str(reader.path))
    if reader.n_generations == 0:
        raise KingenError("no completed generation to resume from", file=str(reader.path))


def resume(path: str | os.PathLike[str], *, progress: bool = True,
           generations: int | None = None, stream: TextIO | None = None,
           evaluator: Evaluator | None = None) -> FitResult:
    """Continue a run file from its last completed generation.

    The configuration is rebuilt from the text stored in the run file, with the settings
    the run started with, and with the scheme stored in the run file (not the model file
    on disk, which may have been edited since: a line on ``stream`` says so when it
    differs). The protocols' data files are read again from the original configuration's
    folder.

    The run file is checked whole first (every checksum, every counter) and locked against
    a second writer; a damaged file is never written to.

    Parameters
    ----------
    path
        The run file.
    generations
        A new maximum number of generations (default: the run's own).
    evaluator
        As for :func:`fit`.

    Examples
    --------
    >>> import kingen
    >>> result = kingen.resume("demo.h5", generations=4, progress=False)  # doctest: +SKIP
    """
    # The lock is taken before the file is read: a run another process is writing is refused
    # as such (not read mid-write). Everything is read and checked (every checksum, the
    # resume state) before the file is opened for writing: a damaged or malformed file is
    # never written to.
    p = Path(path)
    if not p.is_file():
        raise KingenError("run file not found", file=str(path))
    lock = WriterLock(p)
    lock.acquire()
    try:
        cfg, objective, arrays = _read_for_resume(path, generations, stream)
        # built before the file is opened for writing: one that cannot be built leaves
        # the run as it was (a finished run stays finished)
        evaluate = None if evaluator is None else evaluator(objective)
        store = RunStore.open(path, mode="a", verify=False, lock=lock)
    except BaseException:
        lock.release()
        raise
    with store:
        return _search(cfg, objective, store, arrays, progress, stream, evaluate)


def _read_for_resume(path: str | os.PathLike[str], generations: int | None,
                     stream: TextIO | None) -> tuple[FitConfig, Objective, Any]:
    """The configuration, objective and resume state of a run file, read and checked
    whole (the caller holds its writer lock)."""
    with RunStore.open(path, mode="r") as reader:
        check_resumable(reader, generations)  # opening to append clears "finished"
        settings = reader.config
        cfg_path = settings.get("config_path", "<config>")
        base = Path(cfg_path).parent if cfg_path[:1] != "<" else Path(".")
        scheme = reader.scheme()
        # the size limits were passed (or lifted) when the run started
        cfg = loads_config(reader.config_text, path=cfg_path, base=base, scheme=scheme,
                           overrides={"force": True})
        _refuse_changed_recordings(cfg, reader.recordings(), str(path))
        _, arrays = reader.last_state()
    cfg.ga, cfg.stop, cfg.seed, cfg.backend, cfg.precision = stored_settings(settings,
                                                                           str(path))
    if generations is not None:
        cfg.ga.generations = int(generations)
    cfg.output = str(path)
    cfg.settings = settings
    objective = _objective(cfg)
    checked_state(arrays, cfg, objective.n_protocols, str(path))
    _say_if_model_changed(scheme, cfg.model_path, stream)
    _warn(_start_warnings(cfg, objective), stream)
    return cfg, objective, arrays


def _say_if_model_changed(scheme: Any, model_path: str, stream: TextIO | None) -> None:
    """One line (also with ``progress=False``: it is not progress) when the model file on
    disk is not the scheme the run stored."""
    p = Path(model_path)
    try:
        same = p.read_text(encoding="utf-8") == scheme.text
        what = "differs from"
    except (OSError, UnicodeDecodeError):
        same, what = False, "cannot be read; it is not needed:"
    if not same:
        out = stream if stream is not None else sys.stderr
        out.write(f"kingen: note: the model file {model_path} {what} the scheme stored in the "
                  "run file; resuming with the stored scheme\n")
        out.flush()


def _start_warnings(cfg: FitConfig, objective: Objective) -> list[str]:
    """What a user must hear before a fit starts: cycles the fit can take out of
    microscopic reversibility (see :meth:`~kingen.model.scheme.Scheme.reversibility_warnings`),
    recordings with an offset the model cannot fit (:attr:`Objective.warnings`)."""
    varied = set(cfg.pmap.gene_names) | set(cfg.ties)
    return cfg.scheme.reversibility_warnings(varied) + objective.warnings


def _warn(lines: list[str], stream: TextIO | None) -> None:
    """``kingen: <line>`` on ``stream`` (default stderr), also with ``progress=False``."""
    if not lines:
        return
    out = stream if stream is not None else sys.stderr
    for line in lines:
        out.write(f"kingen: {line}\n")
    out.flush()


def _inputs(cfg: FitConfig) -> dict[str, str]:
    """The fit's input files (path -> what it is), which its output must never replace."""
    out = {} if cfg.path[:1] == "<" else {cfg.path: "configuration"}
    out[cfg.model_path] = "model file"
    for item in cfg.protocols:
        if Path(item.protocol.source).is_file():
            out[item.protocol.source] = "protocol file"
        if item.recording is not None:
            for f in item.recording.meta.get("files", [item.recording.source]):
                out[str(f)] = "recording"
        if item.targets is not None:
            for f in item.targets.sources:
                out[str(f)] = "targets file"
    return {k: v for k, v in out.items() if Path(k).exists()}


def _objective(cfg: FitConfig) -> Objective:
    """The fit's objective, scoring the likelihood (:func:`kingen.identify.refine.start_noise`)."""
    from kingen.identify.refine import start_noise

    objective = Objective(cfg.scheme, cfg.protocols, cfg.solver)
    start_noise(objective, cfg.pmap, cfg.pmap.start_genes())
    return objective


def _search(cfg: FitConfig, objective: Objective, store: Any,
            blob: dict[str, np.ndarray] | None,
            show: bool, stream: TextIO | None, evaluate: Evaluate | None
            ) -> FitResult:
    wall0 = time.perf_counter()
    keep_freed_memory()  # each generation's arrays reuse the last one's memory
    progress = Progress(cfg.ga.generations, stream=stream, enabled=show)
    engine = Engine(cfg, objective, store, progress, evaluate=evaluate)
    state = engine.unpack(blob, cfg.output) if blob is not None else None
    state, reason = engine.run(state)
    progress.close()
    hof_g, hof_f = state.hall_of_fame.genes, state.hall_of_fame.fitness
    if hof_f.size == 0:
        store.mark_finished(f"{reason}; every candidate failed")
        raise KingenError("every candidate failed to simulate (see the failure codes in the "
                          "run file); check the bounds and the step", file=cfg.output)
    if cfg.polish:
        progress.message(f"refining the best {min(cfg.polish_starts, hof_f.size)} of the hall "
                         "of fame by Levenberg-Marquardt on the likelihood ...")
    done = finish(objective, cfg.pmap, hof_g, starts=cfg.polish_starts,
                  max_iter=cfg.polish_evaluations, refine=cfg.polish)
    store.write_hall_of_fame(cfg.pmap.to_params(done.hof_genes), done.hof_chi2)
    best_genes = done.genes
    write_best(store, objective, cfg.pmap, best_genes, done.chi2, done.report)
    converged, line = verdict(reason, store.history(population=False)["best"], cfg.stop)
    if cfg.polish:
        converged, line = done.converged, _refined_line(done, line)
    store.mark_finished(f"{reason}; {line}")
    _warn(objective.amplitude_warnings(store.best()["amplitudes"]), stream)
    _local_uncertainty(objective, cfg, best_genes, store, stream, done.noise)
    # the initial population has no variation, selection or Dask call: NaN in those lists
    keys = dict.fromkeys(k for t in engine.timings for k in t)
    timings: dict[str, Any] = {k: [t.get(k, np.nan) for t in engine.timings] for k in keys}
    timings["wall_s"] = time.perf_counter() - wall0
    return _result(RunView(store), cfg, generations=state.generation, reason=reason,
                   timings=timings, evaluations=engine.evaluations,
                   backend=objective.simulator.backend, device=objective.simulator.device,
                   converged=converged, convergence=line)


def _refined_line(done: Finish, search: str) -> str:
    """The converged line of a refined fit: the refinement's verdict, then the search's."""
    rep = done.report
    word = "converged" if done.converged else "not converged"
    return (f"{word}: the Levenberg-Marquardt refinement from {rep['starts']} of the hall of "
            f"fame stopped on its {rep['stopped']} after {rep['iterations']} iterations, "
            f"χ² {rep['chi2_before']:.10g} -> {rep['chi2_after']:.10g} (the search: "
            f"{search})")


def _local_uncertainty(objective: Objective, cfg: FitConfig, genes: np.ndarray, store: Any,
                       stream: TextIO | None, noise: Any = None) -> None:
    """Standard errors and correlations at the best (two small solver calls), into the
    run file (``/profiles/local``). The fit is finished and marked so by then: a failure
    here, whatever it is, is said in one line and leaves the run file as it is."""
    from kingen.identify.local import local_at_best

    try:
        local = local_at_best(objective, cfg.pmap, np.asarray(genes, dtype=float),
                              noise=noise)
    except Exception as exc:  # noqa: BLE001 - the fit is done and recorded: say it, go on
        _warn([f"note: the local uncertainty was not computed ({type(exc).__name__}: "
               f"{exc}); kingen profile RUN.h5 computes it"], stream)
        return
    if hasattr(store, "write_local_uncertainty"):
        store.write_local_uncertainty(local)


def _result(run: RunView, cfg: FitConfig, **engine: Any) -> FitResult:
    """The FitResult of a finished run, read back from its run file; ``engine`` holds
    what only the engine knows (generations, reason, timings, evaluations, backend,
    device)."""
    best = run.best
    scheme = run.scheme
    params = best["params"]
    lo, hi = (to_file_units(scheme, b) for b in run.bounds)
    hist = run.history()
    return FitResult(
        path=cfg.output, params=params, values=to_file_units(scheme, params),
        units={p.name: p.unit for p in scheme.parameters}, fitness=best["fitness"],
        errors=best["errors"], amplitudes=run.amplitudes(),
        history={"best": np.asarray(hist["best"]), "median": np.asarray(hist["median"])},
        polish=best["polish"], features=best["features"], free=cfg.pmap.gene_names,
        bounds={n: (lo[n], hi[n]) for n in lo}, status=run.roles(cfg.ties),
        uncertainty=run.local_uncertainty, **engine)


def _environment(objective: Objective, precision: str) -> dict[str, str]:
    import deap
    import scipy

    from kingen._version import __version__

    env = {"kingen": __version__, "python": platform.python_version(),
           "platform": platform.platform(), "numpy": np.__version__,
           "scipy": scipy.__version__, "numba": numba.__version__, "deap": deap.__version__,
           "backend": objective.simulator.backend, "device": objective.simulator.device,
           "precision": precision, "cpu_count": str(os.cpu_count())}
    try:
        import h5py

        env["h5py"] = h5py.__version__
    except ImportError:  # pragma: no cover
        pass
    return env
