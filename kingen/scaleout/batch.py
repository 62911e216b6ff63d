"""``kingen batch MANIFEST.toml``: many fits, one Dask task each, resumable.

Each fit (:class:`~kingen.scaleout.manifest.FitJob`) is one task, :func:`run_fit`, that
writes its own run file and log in its own folder. The task decides from the run file what
to do, so the same task serves a first run, a rerun of the batch and a retry after a lost
worker:

- no run file, or one with no committed generation: fit from the start;
- a run file whose fit has not finished (it was killed with its worker, or the batch was
  stopped): resume it from its last committed generation (:func:`kingen.runs.fit.resume`);
- a finished run file: read its result, fit nothing.

When a worker dies, the scheduler gives its task to another worker (up to
``[cluster] retries`` times); that run of the task finds the run file and resumes it. A fit
that fails (bad file, every candidate failing) returns a failed row with its one-line
reason; the batch goes on. The driver shows one progress line and writes
``batch_summary.csv`` and ``batch_summary.html`` (:mod:`kingen.scaleout.summary`) as
fits finish.
"""

from __future__ import annotations

import math
import os
import platform
import queue
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from kingen.base.console import LiveLine, duration
from kingen.base.files import atomic_write, check_replaceable
from kingen.errors import KingenError
from kingen.scaleout.cluster import ClusterSettings, open_client
from kingen.scaleout.manifest import FitJob, Manifest, load_manifest
from kingen.scaleout.summary import (
    CSV_NAME,
    HTML_NAME,
    aic_bic,
    aic_bic_chi2,
    ranking_lines,
    write_summary,
)

# ---------------------------------------------------------------------- on the worker

def run_fit(task: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume, or read) one fit of a batch; returns its summary row.

    Never raises for a problem of the fit itself: a :class:`KingenError` (or any other
    error) becomes a failed row with a one-line reason. Runs on a worker.
    """
    from kingen.runs.fit import fit, resume
    from kingen.store import RunStore

    t0 = time.perf_counter()
    row: dict[str, Any] = {"id": task["id"], "cell": task["cell"], "scheme": task["scheme"],
                           "seed": task["seed"], "run_file": task["run"],
                           "worker": f"{platform.node()}:{os.getpid()}"}
    run = Path(task["run"])
    log_path = Path(task["log"])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        def say(text: str) -> None:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
            log.flush()

        try:
            state = _run_state(run)
            if state in ("finished", "resumable"):
                row["changed"] = _config_changed(run, task["config_text"])
                if row["changed"]:
                    say("the manifest has changed since this fit started: it goes on as it "
                        f"started (its configuration is in {run.name}); delete {run.name} "
                        "to fit it again with the new one")
            if state == "finished":
                say(f"finished already; reading {run.name}")
            elif state == "resumable":
                say(f"resuming {run.name} from its last committed generation "
                    f"(process {os.getpid()} on {platform.node()})")
                resume(run, progress=True, stream=log)
            else:
                _write_config(Path(task["config"]), task["config_text"])
                if state == "unreadable":
                    aside = _set_aside(run)
                    say(f"{run.name} had no generation kingen can read: "
                        + (f"kept as {aside.name}, " if aside else "it was empty; ")
                        + "fitting from the start")
                say(f"fitting {task['config']} (process {os.getpid()} on "
                    f"{platform.node()})")
                fit(task["config"], overwrite=True, progress=True, stream=log)
            with RunStore.open(run, "r", verify=False) as store:
                row.update(result_row(store))
            row["status"], row["reason"] = "ok", ""
            say(f"done: fitness {row['fitness']:.6g}, {row['stopped']}")
        except KingenError as exc:
            row.update(status="failed", reason=str(exc))
            say(f"failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - a batch outlives any one fit
            reason = " ".join(f"internal error: {type(exc).__name__}: {exc}".split())
            row.update(status="failed", reason=reason)
            say(f"failed: {reason}")
    row["wall_s"] = time.perf_counter() - t0
    return row


def _run_state(run: Path) -> str:
    """``"new"``, ``"resumable"`` or ``"finished"``, from what the run file has committed;
    ``"unreadable"`` for a file with no generation that can be read (one killed before
    its first commit, an empty or cut-short file)."""
    from kingen.store import RunStore

    if not run.exists():
        return "new"
    try:
        with RunStore.open(run, "r", verify=False) as store:
            if store.finished and store.best() is not None:
                return "finished"
            if store.finished:  # it ended without a best (every candidate failed)
                raise KingenError(f"the fit ended without a result ({store.finished}); "
                                  "delete its run file to fit it again", file=str(run))
            return "resumable" if store.n_generations > 0 else "new"
    except KingenError as exc:
        if "ended without a result" in exc.message:
            raise
        # Killed before its first commit, a file HDF5 cannot open is all it can leave;
        # with no generation committed there is nothing to lose by starting again (the
        # file is kept aside). Anything else (damage after a commit) is for resume to
        # report.
        return "resumable" if _has_commit(run) else "unreadable"


def _has_commit(run: Path) -> bool:
    try:
        import h5py

        # Not in SWMR mode: on a damaged file its reader retries without end, holding the GIL
        with h5py.File(run, "r", libver="latest") as f:
            return int(f["run/commit"][0]) > 0
    except Exception:  # noqa: BLE001 - unreadable: no committed generation can be used
        return False


def _set_aside(run: Path) -> Path | None:
    """Move a run file with no readable generation out of the fit's way, as
    ``run.h5.unreadable`` (``.unreadable2``, ... if taken); an empty one is removed.
    Done under the run file's writer lock: a file another process is writing is refused
    (:class:`KingenError`), never moved."""
    from kingen.store import WriterLock

    lock = WriterLock(run)
    lock.acquire()
    try:
        if run.stat().st_size == 0:
            run.unlink()
            return None
        aside, n = run.with_name(f"{run.name}.unreadable"), 1
        while aside.exists():
            n += 1
            aside = run.with_name(f"{run.name}.unreadable{n}")
        run.rename(aside)
        return aside
    except OSError as exc:
        raise KingenError(f"cannot move the unreadable run file aside: {exc.strerror}",
                          file=str(run)) from None
    finally:
        lock.release()


def result_row(store: Any) -> dict[str, Any]:
    """A summary row's values from a finished run file: error per protocol, parameters in
    file units, AIC/BIC (see :mod:`kingen.scaleout.summary`)."""
    from kingen.fitting.config import loads_config
    from kingen.fitting.engine import convergence_of
    from kingen.fitting.objective import Objective
    from kingen.fitting.params import to_file_units

    best = store.best()
    if best is None:
        raise KingenError("the run file has no best candidate (the fit did not finish)",
                          file=str(store.path))
    settings = store.config
    cfg_path = settings.get("config_path", "<config>")
    base = Path(cfg_path).parent if cfg_path[:1] != "<" else Path(".")
    cfg = loads_config(store.config_text, path=cfg_path, base=base, scheme=store.scheme(),
                       overrides={"force": True})
    objective = Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu"))
    n = int(np.count_nonzero(objective.weight)) + sum(len(p.targets) for p in objective.plans)
    # the searched rates, and the amplitudes and offsets solved per recording
    k = cfg.pmap.n_genes + sum(p.chain.scale_parameters(p.protocol.n_sweeps,
                                                        p.amplitude is not None)
                               for p in cfg.protocols if p.recording is not None)
    # a fit on the likelihood, its σ from the baselines (and its τ never from a misfit's
    # residuals: kingen.identify.noise): the fitness is χ² on the noise of the data alone
    record = best.get("polish") or {}
    noise = record.get("noise") if record.get("objective") == "chi2" else None
    known = isinstance(noise, dict) and all(s in ("baseline", "") for s in noise["source"])
    aic, bic = (aic_bic_chi2 if known else aic_bic)(best["fitness"], n, k)
    converged, line = convergence_of(store.finished)
    row: dict[str, Any] = {"fitness": best["fitness"], "n_free": k, "n_samples": n,
                           "converged": converged is True, "convergence": line,
                           "aic": aic, "bic": bic,
                           # the GA's generations; generation 0 is the initial population
                           "generations": max(store.n_generations - 1, 0),
                           "stopped": store.finished or "", "resumed": len(store.resumed)}
    try:  # the search's own seconds, as its run file counts them: the same on every rerun
        row["search_s"] = float(store.last_state()[1]["elapsed"])
    except (KingenError, KeyError):
        row["search_s"] = math.nan
    for name, err in best["errors"].items():
        row[f"error:{name}"] = err
    values = to_file_units(cfg.scheme, best["params"])
    units = {p.name: p.unit for p in cfg.scheme.parameters}
    for name, v in values.items():
        row[f"{name} ({units[name]})"] = float(v)
    return row


# ---------------------------------------------------------------------- on the driver

class BatchProgress(LiveLine):
    """The batch's one progress line: fits done, running, failed, ETA."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        super().__init__(stream, enabled)
        self.total = total
        self.t0 = time.perf_counter()
        self._last: Any = None

    def line(self, done: int, running: int, failed: int, done_here: int) -> str:
        """The text: ``done_here`` fits finished in this run (the ETA's rate)."""
        elapsed = time.perf_counter() - self.t0
        left = self.total - done
        eta = "?"
        if left == 0:
            eta = "0s"
        elif done_here > 0:
            eta = duration(elapsed / done_here * left)
        return (f"batch: {done}/{self.total} done, {running} running, {failed} failed, "
                f"ETA {eta}")

    def update(self, done: int, running: int, failed: int, done_here: int) -> None:
        if not self.enabled:
            return
        text = self.line(done, running, failed, done_here)
        # a terminal's line follows the clock; a log gets a line when the counts change
        key = text if self.tty else (done, running, failed)
        if key == self._last:
            return
        self._last = key
        self.show(text)


def _write_configs(jobs: list[FitJob]) -> None:
    """Each new fit's configuration. A fit with a run file keeps the one beside it (the
    one it started with); its task writes the new one if it has to start again."""
    for job in jobs:
        if not job.run_path.exists():
            _write_config(job.config_path, job.config_text)


def _write_config(path: Path, text: str) -> None:
    try:
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return
        atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except OSError as exc:
        raise KingenError(f"cannot write the fit's configuration: {exc.strerror or exc}",
                          file=str(path)) from None


def _config_changed(run: Path, text: str) -> bool:
    """Whether a fit's configuration from the manifest now differs from the one its run
    file started with."""
    from kingen.store import RunStore

    with RunStore.open(run, "r", verify=False) as store:
        return store.config_text != text


def run_batch(manifest: str | os.PathLike[str] | Manifest, *,
              cluster: ClusterSettings | None = None, progress: bool = True,
              stream: TextIO | None = None, client: Any = None) -> list[dict[str, Any]]:
    """Run every fit of a manifest (resuming unfinished ones, skipping finished ones);
    returns the summary rows, also written to ``batch_summary.csv`` and ``.html`` in the
    batch's folder.

    Parameters
    ----------
    manifest
        The manifest file, or one already read by
        :func:`~kingen.scaleout.manifest.load_manifest`.
    cluster
        Where to run (default: the manifest's ``[cluster]``, else this host).
    client
        An existing ``distributed.Client`` to use instead (``cluster`` is then ignored).

    Examples
    --------
    >>> from kingen.scaleout import run_batch
    >>> rows = run_batch("batch.toml")                      # doctest: +SKIP
    >>> [(r["id"], r["status"]) for r in rows]              # doctest: +SKIP
    [('cell01/jonas/seed1', 'ok'), ...]
    """
    m = manifest if isinstance(manifest, Manifest) else load_manifest(manifest)
    for path in (m.output / CSV_NAME, m.output / HTML_NAME):  # before any fit is started
        check_replaceable(path, "output", kind="batch summary", inputs=m.inputs)
    settings = cluster or m.cluster or ClusterSettings()
    try:
        m.output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KingenError(f"cannot create the batch's folder: {exc.strerror}",
                          file=str(m.output)) from None
    _write_configs(m.jobs)
    bar = BatchProgress(len(m.jobs), stream, progress)
    if client is not None:
        return _run(m, client, bar)
    with open_client(settings) as own:
        return _run(m, own, bar, queued=settings.kind in ("slurm", "pbs"))


def _run(m: Manifest, client: Any, bar: BatchProgress, queued: bool = False
         ) -> list[dict[str, Any]]:
    """Submit the fits and follow them. ``queued``: the workers come from a batch system's
    queue (wait for them however long; say so once a minute). Otherwise a cluster with no
    worker for :data:`~kingen.scaleout.cluster.WORKER_WAIT_S` stops the batch."""
    import uuid

    title = f"kingen batch {m.path.name}"
    token = uuid.uuid4().hex[:8]
    rows: dict[str, dict[str, Any]] = {}
    futures = {client.submit(run_fit, job.as_task(), key=f"kingen-fit-{token}-{job.id}",
                             pure=False, retries=0): job for job in m.jobs}
    pending = set(futures)
    finished = finished_queue(list(futures))
    done_here = failed = changed = 0
    unwritten = ""  # why the summary could not be written (the fits go on regardless)
    alone = _NoWorker(queued)
    try:
        while pending:
            got = next_finished(finished, timeout=REFRESH_S)
            if not got:  # nothing finished: the line's clock and running count move on
                running = _running(client, pending)
                if running is None:
                    alone.check(bar, len(pending))
                else:
                    alone.reset()
                bar.update(len(rows), running or 0, failed, done_here)
                continue
            for fut in got:
                pending.discard(fut)
                job = futures[fut]
                row = _collect(fut, job)
                if row.pop("changed", False):  # said once at the end, not a column
                    changed += 1
                rows[job.id] = row
                done_here += 1
                if row["status"] != "ok":
                    failed += 1
                    bar.message(f"failed: {job.id}: {row['reason']}")
            try:
                write_summary(m.output, list(rows.values()), title)
                unwritten = ""
            except OSError as exc:
                if not unwritten:
                    bar.message(f"kingen: cannot write the batch's summary "
                                f"({exc.strerror or exc}); the fits go on")
                unwritten = f"{exc.strerror or exc}: {exc.filename or m.output}"
            bar.update(len(rows), _running(client, pending), failed, done_here)
    finally:
        bar.close()
    if unwritten:
        raise KingenError(f"every fit ended (their run files hold the results), but the summary "
                          f"could not be written: {unwritten}; free the space or fix the "
                          f"folder and run the batch again to write it", file=str(m.output))
    ordered = [rows[j.id] for j in m.jobs if j.id in rows]
    if changed:
        bar.message(f"kingen: {changed} fit{'s' if changed > 1 else ''} went on as "
                    f"{'they' if changed > 1 else 'it'} started, though the manifest has "
                    "changed since (each fit's log says so; delete a fit's run.h5 to fit it "
                    "again with the new configuration)")
    for line in ranking_lines(ordered):
        bar.message(line)
    return ordered


REFRESH_S = 0.25
"""Seconds between refreshes of the progress line while no fit finishes."""


def finished_queue(futures: list[Any]) -> queue.SimpleQueue:
    """A queue that each of ``futures`` enters as it finishes (done, failed or cancelled),
    from Dask's callback thread: the driver wakes when a fit ends, not at its next poll."""
    out: queue.SimpleQueue = queue.SimpleQueue()
    for fut in futures:
        fut.add_done_callback(out.put)
    return out


def next_finished(finished: queue.SimpleQueue, timeout: float) -> list[Any]:
    """The futures that have finished since the last call: waits up to ``timeout`` seconds
    for the first (an empty list if none came), then takes every other one waiting.

    Examples
    --------
    >>> import queue
    >>> q = queue.SimpleQueue()
    >>> next_finished(q, timeout=0.01)
    []
    >>> q.put("a"); q.put("b")
    >>> next_finished(q, timeout=0.01)
    ['a', 'b']
    """
    try:
        got = [finished.get(timeout=timeout)]
    except queue.Empty:
        return []
    while True:
        try:
            got.append(finished.get_nowait())
        except queue.Empty:
            return got


def _running(client: Any, pending: set) -> int | None:
    """How many of the ``pending`` fits run now; ``None`` when the cluster has no worker."""
    try:
        processing = client.processing()
        threads = client.nthreads()
    except Exception:  # noqa: BLE001 - the count is cosmetic
        return 0
    if not processing:  # one entry per worker, busy or not
        return None
    keys = {f.key for f in pending}
    # a worker's list holds the fits queued on it too: it runs one per thread
    return sum(min(sum(1 for k in tasks if k in keys), threads.get(worker, 1))
               for worker, tasks in processing.items())


class _NoWorker:
    """Watches how long the batch's cluster has had no worker."""

    def __init__(self, queued: bool) -> None:
        from kingen.scaleout.cluster import NoWorkerClock

        self.queued = queued
        self.clock = NoWorkerClock()

    def reset(self) -> None:
        self.clock.reset()

    def check(self, bar: BatchProgress, unfinished: int) -> None:
        from kingen.scaleout import cluster

        waited, due = self.clock.tick()
        if not self.queued and waited >= cluster.WORKER_WAIT_S:
            raise KingenError(f"the cluster has had no worker for {waited:.0f} s, with "
                              f"{unfinished} fit{'s' if unfinished != 1 else ''} unfinished: "
                              "start workers, then run the batch again to resume them")
        if due:
            bar.message(f"waiting for the batch system to start a worker ({waited:.0f} s so "
                        "far)" if self.queued else
                        f"the cluster has no worker ({waited:.0f} s so far): the batch stops "
                        f"at {cluster.WORKER_WAIT_S:g} s unless one joins")


def _collect(fut: Any, job: FitJob) -> dict[str, Any]:
    try:
        return fut.result()
    except Exception as exc:  # noqa: BLE001 - e.g. KilledWorker after the retries
        name = type(exc).__name__
        if name == "KilledWorker":
            reason = (f"lost its worker too many times ({name}); rerun the batch to resume "
                      "it from its run file")
        elif "scheduler-connection-lost" in str(exc):
            reason = ("lost the scheduler before the fit ended; rerun the batch to resume "
                      "it from its run file")
        else:
            reason = f"{name}: {exc}"
        return {"id": job.id, "cell": job.cell, "scheme": job.scheme, "seed": job.seed,
                "status": "failed", "reason": " ".join(reason.split()),
                "run_file": str(job.run_path), "fitness": math.nan}
