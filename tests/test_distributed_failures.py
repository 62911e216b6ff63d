"""What a user sees when the cluster under a fit or batch fails: one line, never a wait
without end, and a run file that resumes.

Real Dask, no mocks: a scheduler and workers started as ``dask scheduler`` and ``dask
worker`` would be (processes of their own, each worker in a process group of its own, so
that killing the group takes its nanny too), and Ctrl-C sent to a whole process group as a
terminal sends it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import cloudpickle  # noqa: E402

import kingen  # noqa: E402
import kingen.scaleout.cluster as cluster_module  # noqa: E402
import kingen.scaleout.shard as shard_module  # noqa: E402
from kingen.cli import main as cli  # noqa: E402
from kingen.errors import KingenError  # noqa: E402
from kingen.scaleout.shard import ShardedEvaluator  # noqa: E402
from kingen.store import RunStore  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

DASK_ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


class Scheduler:
    """A ``dask scheduler`` process, and ``dask worker`` processes joined to it."""

    def __init__(self, folder: Path, env: dict[str, str] | None = None) -> None:
        self.folder = folder
        self.env = {**DASK_ENV, **(env or {})}
        info = folder / "scheduler.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
             "--dashboard-address", ":0", "--scheduler-file", str(info)], env=self.env,
            stdout=subprocess.DEVNULL, stderr=open(folder / "scheduler.log", "w"),
            start_new_session=True, cwd=folder)
        self.workers: list[subprocess.Popen] = []
        # the scheduler writes the file once it listens; one read may catch it half written
        deadline = time.monotonic() + 60
        while True:
            try:
                self.address = json.loads(info.read_text())["address"]
                break
            except (OSError, ValueError):
                assert self.proc.poll() is None and time.monotonic() < deadline, \
                    (folder / "scheduler.log").read_text()
                time.sleep(0.02)

    def add_worker(self, env: dict[str, str] | None = None) -> subprocess.Popen:
        n = len(self.workers)
        proc = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.address,
             "--nthreads", "1", "--dashboard-address", ":0"], env={**self.env, **(env or {})},
            stdout=subprocess.DEVNULL, stderr=open(self.folder / f"worker{n}.log", "w"),
            start_new_session=True, cwd=self.folder)  # not the checkout: kingen from env
        self.workers.append(proc)
        return proc

    def close(self) -> None:
        for proc in [*self.workers, self.proc]:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


@pytest.fixture
def scheduler(tmp_path) -> Iterator[Scheduler]:
    s = Scheduler(tmp_path)
    try:
        yield s
    finally:
        s.close()


def _wait_for_workers(address: str, n: int) -> None:
    with distributed.Client(address, timeout="30s") as c:
        c.wait_for_workers(n, timeout=120)


class AtEvaluation(distributed.WorkerPlugin):
    """Kills ``pid``'s process group (``pid`` 0: the worker's own, its nanny with it) as a
    worker starts a shard of evaluation ``evaluation``."""

    def __init__(self, evaluation: int, pid: int = 0) -> None:
        self.mark = f"-{evaluation}-"
        self.pid = pid

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and str(key).startswith("kingen-shard-") \
                and self.mark in str(key)[len("kingen-shard-") + 12:]:
            os.killpg(os.getpgid(self.pid or os.getpid()), signal.SIGKILL)


def _register(address: str, plugin: distributed.WorkerPlugin, name: str) -> None:
    with distributed.Client(address, timeout="30s") as c:
        c.register_plugin(plugin, name=name)


def _unregister(address: str, name: str) -> None:
    with distributed.Client(address, timeout="30s") as c:
        c.unregister_worker_plugin(name)


def _config(tmp_path: Path, generations: int, population: int = 8) -> Path:
    demo = kingen.demo_config()
    path = tmp_path / "fit.toml"
    text = (demo.read_text().replace('"demo/', f'"{demo.parent}/demo/')
            .replace("polish = true", "polish = false")
            .replace("patience = 15", "patience = 0")
            .replace("generations = 40", f"generations = {generations}")
            .replace("population = 48", f"population = {population}")
            .replace("offspring = 48", f"offspring = {population}"))
    path.write_text(text)
    return path


def _fit_args(config: Path, run: Path, address: str) -> list[str]:
    return ["fit", str(config), "--backend", "cpu", "-o", str(run), "-q",
            "--cluster", address]


# ---------------------------------------------------------------------- wrong addresses

def test_a_port_that_is_not_a_schedulers_is_one_line_not_a_hang(scheduler, tmp_path,
                                                                  monkeypatch, capsys):
    import http.server
    import socketserver

    # Dask's own connection waits without end for a web server's answer to its handshake
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    web = socketserver.TCPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    # the connection to this host's port takes well under it; the handshake's answer is
    # waited for 5 s past it
    monkeypatch.setattr(cluster_module, "CONNECT_TIMEOUT_S", 1.0)
    try:
        config, run = _config(tmp_path, generations=2), tmp_path / "run.h5"
        address = f"tcp://127.0.0.1:{web.server_address[1]}"
        t0 = time.monotonic()
        assert cli(_fit_args(config, run, address)) == 2
        assert time.monotonic() - t0 < 30
        err = capsys.readouterr().err.strip()
        assert err == (f"kingen: error: --cluster = '{address}': something there took the "
                       "connection but did not answer as a Dask scheduler (a scheduler's port"
                       " is 8786 unless it was started with another; 8787 is its "
                       "dashboard's)")
        assert not run.exists()
    finally:
        web.shutdown()
        web.server_close()
    worker = scheduler.add_worker()
    _wait_for_workers(scheduler.address, 1)
    with distributed.Client(scheduler.address, timeout="30s") as client:
        (worker_address,) = client.nthreads()
    assert worker.poll() is None
    assert cluster_module.scheduler_problem(worker_address, 10) == (
        "that is a Dask worker: give its scheduler's address")
    assert cluster_module.scheduler_problem(scheduler.address, 10) == ""


def test_a_fits_output_and_a_runs_state_are_checked_before_the_cluster(tmp_path, capsys):
    config, run = _config(tmp_path, generations=2), tmp_path / "run.h5"
    assert cli(["fit", str(config), "--backend", "cpu", "-o", str(run), "-q"]) == 0
    nowhere = "tcp://127.0.0.1:9"  # nothing listens there: any wait would show
    capsys.readouterr()
    t0 = time.monotonic()
    assert cli(_fit_args(config, run, nowhere)) == 2
    assert capsys.readouterr().err.strip() == (
        f"kingen: error: {run}: run file already exists (choose another output file, or "
        "overwrite it)")
    assert cli(["resume", str(run), "-q", "--cluster", nowhere]) == 2
    assert capsys.readouterr().err.strip().startswith(
        f"kingen: error: {run}: the run has already finished (maximum generations (2); "
        "not converged: ")
    assert time.monotonic() - t0 < 5


def test_a_fit_stopped_before_its_first_generation_leaves_no_run_file(tmp_path,
                                                                       monkeypatch):
    from kingen.fitting.engine import Engine

    def interrupted(self, genes):
        raise KeyboardInterrupt

    config, run = _config(tmp_path, generations=2), tmp_path / "run.h5"
    monkeypatch.setattr(Engine, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        kingen.fit(config, progress=False, overrides={"output": str(run), "backend": "cpu"})
    assert not run.exists()  # nothing in it to resume: running it again just works


def test_the_hint_to_resume_gives_the_cluster_as_the_user_gave_it():
    from kingen.cli.fit import BARE_CLUSTER, _cluster
    from kingen.scaleout.fitting import _spec

    table = '[cluster]\nkind = "local"\nworkers = 2\n'
    assert _spec(_cluster(BARE_CLUSTER, Path("run.h5"), table)) == ""   # --cluster alone
    assert _spec(_cluster("local:3", Path("fit.toml"))) == "local:3"
    assert _spec(_cluster("tcp://10.0.0.5:8786", Path("fit.toml"))) == "tcp://10.0.0.5:8786"


def test_a_worker_lost_while_the_solver_is_built_does_not_stop_the_fit(tmp_path,
                                                                        monkeypatch):
    from distributed.comm.core import CommClosedError

    calls = []
    real = distributed.Client.register_plugin

    def lost_once(client, plugin, name=None, **kwargs):
        calls.append(name)
        if len(calls) == 1:  # what the client hears when a worker dies mid-build
            raise CommClosedError("in <TCP (closed) ConnectionPool.register_worker_plugin "
                                  "local=tcp://127.0.0.1:1 remote=tcp://127.0.0.1:2>: "
                                  "Stream is closed")
        return real(client, plugin, name=name, **kwargs)

    cfg = kingen.load_config(_config(tmp_path, generations=2), overrides={"backend": "cpu"})
    monkeypatch.setattr(distributed.Client, "register_plugin", lost_once)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        with ShardedEvaluator.for_config(client, cfg) as ev:
            scores, _ = ev.evaluate(cfg.pmap.to_params(cfg.pmap.start_genes()[None]))
        assert np.isfinite(scores.fitness).all() and calls == [ev.plugin, ev.plugin]


def test_a_solver_that_cannot_be_built_is_not_left_on_the_scheduler(scheduler, tmp_path):
    fake = tmp_path / "no_kingen" / "kingen"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("kingen is not installed here")\n')
    scheduler.add_worker(env={"PYTHONPATH": str(fake.parent)})
    _wait_for_workers(scheduler.address, 1)
    cfg = kingen.load_config(kingen.demo_config(), overrides={"backend": "cpu"})
    with distributed.Client(scheduler.address, timeout="30s") as client:
        with pytest.raises(KingenError, match="could not build the solver"):
            ShardedEvaluator.for_config(client, cfg)
        plugins = client.run_on_scheduler(lambda dask_scheduler: list(
            dask_scheduler.worker_plugins))
    # a worker that joins later (a restarted one) must not build a failed fit's solver
    assert not [name for name in plugins if name.startswith("kingen-solver-")]


# ---------------------------------------------------------------------- lost workers

def test_a_fit_whose_workers_are_all_lost_stops_in_one_line_and_resumes(
        scheduler, tmp_path, monkeypatch, capsys):
    # the fit's first look for a worker, a poll (2 s) after its last, is its last
    monkeypatch.setattr(cluster_module, "WORKER_WAIT_S", 2.0)
    config, run = _config(tmp_path, generations=6), tmp_path / "run.h5"
    for _ in range(2):
        scheduler.add_worker()
    # while the workers' interpreters start
    reference = kingen.fit(config, progress=False, overrides={
        "backend": "cpu", "output": str(tmp_path / "one.h5")})
    _wait_for_workers(scheduler.address, 2)
    # both workers die (nanny and all) as they start evaluation 3, generation 2's
    _register(scheduler.address, AtEvaluation(3), "kill-all")
    assert cli(_fit_args(config, run, scheduler.address)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert re.fullmatch(
        rf"kingen: error: --cluster: the cluster has had no worker for \d+ s \(evaluation 3 "
        rf"waits for one\); the run file keeps every committed generation: go on with "
        rf"kingen resume {re.escape(str(run))} --cluster {re.escape(scheduler.address)}",
        err[0]), err[0]
    with RunStore.open(run) as store:
        assert store.n_generations == 2 and not store.finished
    # what the line says to do works
    _unregister(scheduler.address, "kill-all")
    for _ in range(2):
        scheduler.add_worker()
    _wait_for_workers(scheduler.address, 2)
    assert cli(["resume", str(run), "-q", "--cluster", scheduler.address]) == 0
    with RunStore.open(run) as store:
        assert store.finished and store.n_generations == 7 and len(store.resumed) == 1
        best = store.best()
    assert best["fitness"] == reference.fitness
    np.testing.assert_array_equal(best["params"], reference.params)


def test_a_batch_whose_workers_are_all_lost_stops_in_one_line(scheduler, tmp_path,
                                                              monkeypatch, capsys):
    monkeypatch.setattr(cluster_module, "WORKER_WAIT_S", 2.0)
    monkeypatch.setattr(cluster_module, "REMIND_S", 1.0)
    manifest = tmp_path / "batch.toml"
    manifest.write_text(f'config = "{_config(tmp_path, generations=4)}"\noutput = "out"\n'
                        'seeds = [1, 2]\n[overrides]\nbackend = "cpu"\n')
    scheduler.add_worker()
    _wait_for_workers(scheduler.address, 1)
    with distributed.Client(scheduler.address, timeout="30s") as c:
        # the worker dies as it starts its first fit
        c.register_plugin(_KillOnFit(), name="kill-fit")
    assert cli(["batch", str(manifest), "--cluster", scheduler.address]) == 2
    err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    assert err[-1] == ("kingen: error: the cluster has had no worker for 2 s, with 2 fits "
                       "unfinished: start workers, then run the batch again to resume them")
    waiting = [line for line in err[:-1] if not line.startswith("batch: ")]
    assert waiting and all(re.fullmatch(r"the cluster has no worker \(\d s so far\): the "
                                        r"batch stops at 2 s unless one joins", line)
                           for line in waiting), waiting
    _unregister(scheduler.address, "kill-fit")
    scheduler.add_worker()
    _wait_for_workers(scheduler.address, 1)
    assert cli(["batch", str(manifest), "--cluster", scheduler.address]) == 0


class _KillOnFit(distributed.WorkerPlugin):
    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and str(key).startswith("kingen-fit-"):
            os.killpg(os.getpgid(os.getpid()), signal.SIGKILL)


# ---------------------------------------------------------------------- lost scheduler

def test_a_fit_whose_scheduler_is_lost_stops_in_one_line(scheduler, tmp_path, monkeypatch,
                                                         capsys):
    monkeypatch.setattr(cluster_module, "CONNECT_TIMEOUT_S", 3.0)
    config, run = _config(tmp_path, generations=6), tmp_path / "run.h5"
    scheduler.add_worker()
    _wait_for_workers(scheduler.address, 1)
    _register(scheduler.address, AtEvaluation(3, pid=scheduler.proc.pid), "kill-scheduler")
    assert cli(_fit_args(config, run, scheduler.address)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"kingen: error: --cluster: lost the scheduler at "
                             f"{scheduler.address} ("), err[0]
    assert err[0].endswith(f"); the run file keeps every committed generation: go on with "
                           f"kingen resume {run} --cluster {scheduler.address}")
    with RunStore.open(run) as store:
        assert store.n_generations == 2 and not store.finished


# ---------------------------------------------------------------------- a stuck worker

def test_a_worker_that_never_answers_does_not_hold_the_fit(tmp_path, monkeypatch):
    # A worker that cannot import kingen joins while a fit's solver plugin is registered:
    # it fails to start, and Dask (2026.8) leaves it "closing", answering nothing: the
    # calls every worker must answer would wait for it without end.
    fake = tmp_path / "no_kingen" / "kingen"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("kingen is not installed here")\n')
    s = Scheduler(tmp_path)
    try:
        s.add_worker()
        _wait_for_workers(s.address, 1)
        cfg = kingen.load_config(kingen.demo_config(), overrides={"backend": "cpu"})
        said: list[str] = []
        with distributed.Client(s.address, timeout="30s") as client:
            ev = ShardedEvaluator.for_config(client, cfg, say=said.append)
            # both waits below are waited out (the stuck worker never answers); the build
            # above, on a healthy worker, had the default's time
            monkeypatch.setattr(shard_module, "DROP_WAIT_S", 1.0)
            monkeypatch.setattr(shard_module, "BUILD_WAIT_S", 1.0)
            stuck = s.add_worker(env={"PYTHONPATH": str(fake.parent)})
            deadline = time.monotonic() + 60
            while not _closing(client):
                assert stuck.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            (address,) = _closing(client)
            scores, _ = ev.evaluate(cfg.pmap.to_params(cfg.pmap.start_genes()[None]))
            assert np.isfinite(scores.fitness).all()   # the fit goes on without it
            t0 = time.monotonic()
            ev.close()
            assert time.monotonic() - t0 < 10
            assert said == [f"the scheduler did not confirm within 1 s that its workers "
                            f"dropped this fit's solver; workers not running: {address} "
                            f"(closing) (restart them)"]
            with pytest.raises(KingenError) as caught:   # the next fit's solver
                ShardedEvaluator.for_config(client, cfg)
            assert str(caught.value) == (
                f"--cluster: the workers could not build the solver: no answer within 1 s; "
                f"workers not running: {address} (closing) (restart them)")
    finally:
        s.close()


def test_a_worker_stuck_when_a_wait_began_is_named_though_gone_when_it_ran_out():
    # a stuck worker can finish closing (or its nanny restart it) while a build's wait runs
    # out: the message names the workers not running at the start and gone since, with those
    # not running at the end, and never one that is running now
    class Client:
        def __init__(self, answers):
            self.answers = iter(answers)

        def scheduler_info(self, n_workers):
            return {"workers": next(self.answers)}

    a, b, c = "tcp://10.0.0.1:1", "tcp://10.0.0.2:2", "tcp://10.0.0.3:3"
    start = {a: {"status": "running"}, b: {"status": "closing"}, c: {"status": "init"}}
    end = {a: {"status": "running"}, c: {"status": "running"}}
    client = Client([start, end])
    before = shard_module._worker_status(client)
    assert shard_module._stuck_workers(client, before) == (
        f"; workers not running: {b} (closing) (restart them)")
    assert shard_module._stuck_workers(Client([end])) == ""
    assert shard_module._stuck_workers(Client([start])) == (
        f"; workers not running: {b} (closing), {c} (init) (restart them)")


def _closing(client) -> list[str]:
    workers = client.scheduler_info(n_workers=-1)["workers"]
    return [a for a, w in workers.items() if w.get("status") == "closing"]


# ---------------------------------------------------------------------- Ctrl-C

def test_a_local_worker_leaves_out_only_what_its_closing_causes():
    from distributed.comm.core import CommClosedError

    from kingen.scaleout.local_worker import _DriverGone

    def record(message: str, exc: BaseException | None = None) -> logging.LogRecord:
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, message,
                                 None, (type(exc), exc, None) if exc else None)

    heartbeat = "Failed to communicate with scheduler during heartbeat."
    quiet = _DriverGone()
    assert not quiet.filter(record(heartbeat, CommClosedError("ConnectionPool closing.")))
    assert not quiet.filter(record(heartbeat, CommClosedError(
        "in <TCP (closed) ConnectionPool.heartbeat_worker local=tcp://a:1 remote=tcp://b:2>:"
        " Stream is closed")))
    assert quiet.filter(record(heartbeat, OSError("Timed out trying to connect")))
    assert not quiet.filter(record("failed during get data with tcp://a:1 -> None"))
    assert quiet.filter(record("failed during get data with tcp://a:1 -> tcp://b:2"))
    assert quiet.filter(record("Compute Failed"))


def test_closing_a_local_cluster_leaves_out_only_what_the_closing_causes():
    """A worker busy with a shard as kingen closes its local cluster (Ctrl-C) is killed by
    its nanny; a drop of the fit's solver still on its way to it then fails."""
    from kingen.scaleout.logfilters import KilledOnClose

    def record(name: str, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, message, None, None)

    quiet = KilledOnClose()
    assert not quiet.filter(record("distributed.nanny", "Worker process still alive after "
                                                        "4.0 seconds, killing"))
    assert not quiet.filter(record(
        "distributed.scheduler", "broadcast to tcp://127.0.0.1:46477 failed: CommClosedError:"
        " in <TCP (closed) Scheduler Broadcast local=tcp://127.0.0.1:40498 remote=tcp://"
        "127.0.0.1:46477>: Stream is closed"))
    assert quiet.filter(record("distributed.scheduler", "Lost all workers"))
    assert quiet.filter(record("distributed.scheduler", "Unexpected worker failure"))


def _ctrl_c_as_dask_starts_a_call() -> None:
    """Ctrl-C in the first moment of a call into Dask (``distributed.utils.sync``): its
    first wait is interrupted, and its cancel runs before the call has a task to cancel."""
    import types

    import distributed.utils as dask_utils
    from distributed.utils import LoopRunner

    class Interrupted(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            raise KeyboardInterrupt

    runner = LoopRunner(asynchronous=False)
    runner.start()  # its own start waits on an event: the press comes after it
    try:
        shim = types.SimpleNamespace(**{name: getattr(threading, name) for name in dir(threading)
                                        if not name.startswith("__")})
        shim.Event = Interrupted

        async def work() -> int:
            return 1

        # the event loop held until the press has been seen: the call's start, then the
        # cancel, queued in that order behind the hold, run in that order after it
        hold = threading.Event()
        runner.loop.add_callback(hold.wait, 30)
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(dask_utils, "threading", shim)
                with pytest.raises(KeyboardInterrupt):
                    dask_utils.sync(runner.loop, work)
        finally:
            hold.set()
        # the cancel runs on the event loop's thread: a round trip through it after the cancel
        dask_utils.sync(runner.loop, work)
    finally:
        runner.stop()


def test_ctrl_c_as_dask_starts_a_call_is_not_followed_by_a_traceback(monkeypatch, caplog):
    """Dask's cancel then fails (``NameError``: no task yet) and the event loop logs it with
    its traceback under kingen's "kingen: interrupted"; kingen's filter drops it."""
    from kingen.scaleout.logfilters import SHUTDOWN_LOGGERS, SHUTDOWN_NOISE, quiet_shutdown

    for name in SHUTDOWN_LOGGERS:  # as before open_client: the bare record, first
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    with caplog.at_level(logging.ERROR):
        _ctrl_c_as_dask_starts_a_call()
    said = [r for r in caplog.records if "sync.<locals>.cancel" in r.getMessage()]
    assert [(r.name, type(r.exc_info[1])) for r in said] == [("tornado.application", NameError)]
    caplog.clear()
    quiet_shutdown()  # as open_client does (on the test's own lists of filters)
    assert all(SHUTDOWN_NOISE in logging.getLogger(name).filters for name in SHUTDOWN_LOGGERS)
    with caplog.at_level(logging.ERROR):
        _ctrl_c_as_dask_starts_a_call()
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_ctrl_c_while_the_workers_build_the_solver_leaves_the_scheduler_quiet(
        tmp_path, monkeypatch, caplog):
    def interrupted(seconds, call, *args, **kwargs):
        threading.Thread(target=call, args=args, kwargs=kwargs, daemon=True).start()
        time.sleep(0.5)  # the workers are building it
        raise KeyboardInterrupt  # what the wait for them raises on Ctrl-C

    cfg = kingen.load_config(_config(tmp_path, generations=2))
    monkeypatch.setattr(shard_module, "_within", interrupted)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as client:
            with pytest.raises(KeyboardInterrupt):
                ShardedEvaluator.for_config(client, cfg)
        time.sleep(0.5)  # the scheduler has seen the client leave
    errors = [r.getMessage() for r in caplog.records
              if r.name.startswith("distributed") and r.levelno >= logging.WARNING]
    assert errors == []


def test_ctrl_c_while_a_fit_drops_its_solver_leaves_the_scheduler_quiet(
        tmp_path, monkeypatch, caplog):
    """A second press as the first one's fit closes lands most often in the wait for the
    workers to drop its solver. It cut the close short before the client stopped listening
    to the scheduler, which then wrote the client's own removal to the closed client: a
    CRITICAL line and a traceback under "kingen: interrupted" (now and then, in
    test_ctrl_c_on_a_local_cluster_is_one_line)."""
    real = shard_module._within

    def pressed_while_dropping(seconds, call, *args, **kwargs):
        if getattr(call, "__name__", "") == "unregister_worker_plugin":
            raise KeyboardInterrupt  # what the wait for the drop raises on Ctrl-C
        return real(seconds, call, *args, **kwargs)

    cfg = kingen.load_config(_config(tmp_path, generations=2))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as client:
            ev = ShardedEvaluator.for_config(client, cfg)
            monkeypatch.setattr(shard_module, "_within", pressed_while_dropping)
            with pytest.raises(KeyboardInterrupt):
                ev.close()
        time.sleep(0.5)  # the scheduler has seen the client leave
    errors = [r.getMessage() for r in caplog.records
              if r.name.startswith("distributed") and r.levelno >= logging.WARNING]
    assert errors == []


# Each case: how long every worker process takes as its interpreter starts, and when Ctrl-C
# is pressed, counted from the first worker process's spawn (the hold, HOLD_S, is 3 s).
SLOW_STARTS = {"hangs-pressed-early": (120, 0.5), "hangs-pressed-past-the-hold": (120, 4.0),
               "slow-pressed-early": (5, 0.5)}


@pytest.fixture(scope="module")
def slow_starts(tmp_path_factory) -> dict[str, tuple[int, list[str], bool]]:
    """Each case of SLOW_STARTS: a fit on a local cluster, Ctrl-C pressed as the cluster
    starts; the driver's exit status, its stderr's lines, and whether its process group
    (the worker processes) ended. The drivers run at once: each spends about 10 s waiting,
    not computing, for Dask's wait for the start to wake."""
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    try:
        for case, (start_s, _) in SLOW_STARTS.items():
            folder = tmp_path_factory.mktemp(case)
            slow = folder / "slow"
            slow.mkdir()
            (slow / "sitecustomize.py").write_text(
                f'import sys, time\nif "--multiprocessing-fork" in sys.argv:\n'
                f'    time.sleep({start_s})\n')
            # no BLAS threads: kingen's own thread is then the only one the press can reach
            env = {**DASK_ENV, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                   "MKL_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
                       [str(slow), *filter(None, [os.environ.get("PYTHONPATH")])])}
            args = ["fit", str(_config(folder, generations=4)), "--backend", "cpu",
                    "-o", str(folder / "run.h5"), "--cluster", "local:2"]
            code = ("import sys, kingen.scaleout.interrupts as c; c.HOLD_S = 3.0; "
                    "from kingen.cli import main; sys.exit(main(sys.argv[1:]))")
            logs[case] = folder / "err.txt"
            procs[case] = subprocess.Popen(
                [sys.executable, "-c", code, *args], env=env, stdout=subprocess.DEVNULL,
                stderr=open(logs[case], "w"), start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        spawned: dict[str, float] = {}
        pressed: set[str] = set()
        deadline = time.monotonic() + 120
        while len(pressed) < len(procs):
            now = time.monotonic()
            waiting = {p.pid for c, p in procs.items() if c not in spawned}
            counts = _spawned_workers_of(waiting) if waiting else {}
            for case, proc in procs.items():
                if case not in spawned:
                    assert proc.poll() is None and now < deadline, logs[case].read_text()
                    if counts.get(proc.pid):
                        spawned[case] = now
                elif case not in pressed and now >= spawned[case] + SLOW_STARTS[case][1]:
                    os.killpg(proc.pid, signal.SIGINT)
                    pressed.add(case)
            time.sleep(0.01)
        said = {}
        for case, proc in procs.items():
            code = proc.wait(timeout=60)
            said[case] = (code, [line for line in logs[case].read_text().splitlines()
                                 if line.strip()])
        return {case: (*said[case], _group_ended(proc.pid)) for case, proc in procs.items()}
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
@pytest.mark.parametrize("case", list(SLOW_STARTS))
def test_ctrl_c_while_a_local_cluster_starts_slowly_or_never(slow_starts, case):
    # held back until the start ends, or for HOLD_S, then seen when Dask's wait for the
    # start wakes (every 10 s)
    code, lines, ended = slow_starts[case]
    assert code in (130, -signal.SIGINT)
    assert lines == ["kingen: interrupted"], lines
    assert ended, "a worker process is still running"  # the workers were ended


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_a_stopped_start_ends_only_its_own_worker_processes():
    import multiprocessing

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as running, \
            distributed.Client(running) as client:
        before = {p.pid for p in multiprocessing.active_children()}
        working = client.run(os.getpid)  # the running cluster's worker process
        assert set(working.values()) == before
        # what a start stopped midway leaves: a worker process that never came up
        stuck = multiprocessing.get_context("spawn").Process(
            target=time.sleep, args=(120,), name="Dask Worker process (from Nanny)",
            daemon=True)
        stuck.start()
        try:
            cluster_module._abandon_start(set(), before)
            stuck.join(timeout=10)
            assert stuck.exitcode == -signal.SIGKILL
            time.sleep(1.0)  # a worker process killed by mistake is seen gone by now
            assert all(_state(pid) not in ("", "Z") for pid in before)
            assert client.run(os.getpid) == working
        finally:
            if stuck.is_alive():
                stuck.kill()


@pytest.mark.parametrize("held", [True, False], ids=["started-by-the-hold", "started-bare"])
def test_a_semaphore_left_by_a_stopped_start_is_cleaned_up_in_silence(held):
    # what a worker process killed mid-start leaves registered with the resource tracker
    code = ("import multiprocessing.resource_tracker as rt, kingen.scaleout.interrupts as c\n"
            + ("with c.ctrl_c_held():\n    pass\n" if held else "rt.ensure_running()\n")
            + "rt.register('/mp-kingen-test-leak', 'semaphore')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    said = done.stderr  # the tracker ends after the interpreter, writing to the same stderr
    if held:
        assert said == ""
    else:  # the warnings the hold keeps out of a Ctrl-C's one line
        assert "leaked semaphore" in said


def _state(pid: int) -> str:
    """A process's state letter from /proc ("" once it is gone)."""
    fields = _stat(Path(f"/proc/{pid}"))
    return fields[0] if fields else ""


def _group_ended(pgid: int, seconds: float = 30.0) -> bool:
    """Whether every process of group ``pgid`` ends within ``seconds``. One that has ended
    but is not yet reaped (a zombie, whose parent was the driver) has ended: the init
    process that inherits it may take seconds to reap it."""
    deadline = time.monotonic() + seconds
    while _running_in_group(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _stat(entry: Path) -> list[str] | None:
    """The fields of the stat of the process in /proc folder ``entry`` after its command
    name (state, parent, process group, ...); None once the process is gone. The name is
    cut at the last ")": it may hold spaces and parentheses of its own."""
    try:
        return (entry / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _processes() -> Iterator[tuple[int, list[str], Path]]:
    """Every process now (Linux's /proc): its pid, its :func:`_stat` fields, and its /proc
    folder."""
    for entry in Path("/proc").iterdir():
        fields = _stat(entry) if entry.name.isdigit() else None
        if fields is not None:
            yield int(entry.name), fields, entry


def _running_in_group(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that have not ended."""
    return [pid for pid, fields, _ in _processes()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X")]


def _wait_for_the_group_to_end(pgid: int, seconds: float = 30.0) -> None:
    assert _group_ended(pgid, seconds), "a worker process is still running"


def _spawned_workers_of(pids: set[int]) -> dict[int, int]:
    """How many worker processes each of ``pids`` has spawned so far, in one look through
    /proc."""
    counts: dict[int, int] = {}
    for _, fields, entry in _processes():
        parent = int(fields[1])
        if parent not in pids:
            continue
        try:
            spawned = b"spawn_main" in (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if spawned:
            counts[parent] = counts.get(parent, 0) + 1
    return counts


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
@pytest.mark.parametrize("command, when", [("fit", "mid-generation"), ("batch", "mid-fit"),
                                           ("fit", "worker-starting"),
                                           ("fit", "thrice-mid-generation")])
def test_ctrl_c_on_a_local_cluster_is_one_line(tmp_path, command, when):
    config = _config(tmp_path, generations=100000, population=64)
    if command == "fit":
        args = ["fit", str(config), "--backend", "cpu", "-o", str(tmp_path / "run.h5"),
                "--cluster", "local:2"]
        started = "gen 2/"
    else:
        manifest = tmp_path / "batch.toml"
        manifest.write_text(f'config = "{config}"\noutput = "out"\nseeds = [1, 2]\n'
                            '[overrides]\nbackend = "cpu"\n')
        args, started = ["batch", str(manifest), "--cluster", "local:2"], "2 running"
    err_path = tmp_path / "err.txt"
    # as a terminal starts it: its own process group, Ctrl-C not ignored
    proc = subprocess.Popen([sys.executable, "-m", "kingen", *args], env=DASK_ENV,
                            stdout=subprocess.DEVNULL, stderr=open(err_path, "w"),
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 180
        while (not _spawned_workers_of({proc.pid}) if when == "worker-starting" else
               started not in err_path.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.005)
        if when != "worker-starting":
            time.sleep(1.0)  # the workers are mid-task
        os.killpg(proc.pid, signal.SIGINT)  # to the driver and its workers, as Ctrl-C does
        for _ in range(15 if when == "worker-starting" else 0):
            time.sleep(0.1)  # again and again while the workers' interpreters start
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
        for _ in range(2 if when.startswith("thrice") else 0):
            time.sleep(0.2)  # impatient: again as the driver closes the cluster
            os.killpg(proc.pid, signal.SIGINT)
        # 130, or killed by the signal itself (a shell's $? is 130 either way): a press
        # that lands after kingen's handler, as the interpreter exits, ends it so
        assert proc.wait(timeout=60) in (130, -signal.SIGINT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = err_path.read_text().replace("\r", "\n").splitlines()
    said = [line for line in lines
            if line.strip() and not line.startswith(("gen ", "batch: ", "note: ",
                                                      "strongly correlated"))]
    assert said == ["kingen: interrupted"], said
    _wait_for_the_group_to_end(proc.pid)  # no worker outlives the driver
