"""Scale-out on a real two-process Dask LocalCluster (CPU), started once for the module.

Workers are killed with SIGKILL by a worker plugin of this module at a chosen task (a shard
of a given evaluation, or a fit once its run file has committed generations), once: the
first worker to get there creates a marker file and kills its own process. The nanny
starts a fresh worker in its place, as on a real cluster.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

# The plugin below is sent to the workers by value: they cannot import this test module.
import cloudpickle  # noqa: E402

import kingen  # noqa: E402
from kingen.scaleout.batch import run_batch  # noqa: E402
from kingen.scaleout.cluster import ClusterSettings, open_client  # noqa: E402
from kingen.scaleout.fitting import fit_on_cluster  # noqa: E402
from kingen.scaleout.manifest import load_manifest  # noqa: E402
from kingen.scaleout.shard import ShardedEvaluator  # noqa: E402
from kingen.solve.options import SolverOptions  # noqa: E402
from kingen.store import RunStore  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SMALL = {"generations": 3, "population": 8, "backend": "cpu"}


@pytest.fixture(scope="module")
def client():
    with open_client(ClusterSettings(workers=2, threads=1)) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


class KillOnce(distributed.WorkerPlugin):
    """SIGKILL the worker that starts a task whose key ends with ``suffix`` (once the fit's
    log, if given, shows generation ``after``); once, across workers. The log, not the run
    file, is watched: HDF5 must not open the file a second time in the writer's process."""

    def __init__(self, marker: str, suffix: str, log: str | None = None, after: int = 0):
        self.marker, self.suffix, self.run, self.after = marker, suffix, log, after

    def transition(self, key, start, finish, **kwargs):
        if finish != "executing" or not str(key).endswith(self.suffix):
            return
        if self.run is None:
            self._kill()
        else:
            threading.Thread(target=self._kill_when_committed, daemon=True).start()

    def _kill_when_committed(self):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if f"gen {self.after}/" in Path(self.run).read_text():
                    break
            except OSError:
                pass
            time.sleep(0.005)
        self._kill()

    def _kill(self):
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


def _restore_workers(client):
    """Wait for the fresh worker the nanny starts for the killed one. Before the kill
    plugin is unregistered: a worker still joining when a plugin is unregistered can be
    left hanging (seen with distributed 2026.8)."""
    client.wait_for_workers(2, timeout=120)


# ---------------------------------------------------------------------- one fit, sharded

def test_sharded_evaluation_is_the_one_process_evaluation(client):
    cfg = kingen.load_config(kingen.demo_config(), overrides=SMALL)
    rng = np.random.default_rng(3)
    params = cfg.pmap.to_params(rng.uniform(cfg.pmap.lower, cfg.pmap.upper, (37, cfg.pmap.n_genes)))
    local, _ = kingen.Objective(cfg.scheme, cfg.protocols,
                                options=SolverOptions(backend="cpu")).evaluate(params)
    assert client.direct_to_workers  # a local cluster's results come straight from workers
    with ShardedEvaluator.for_config(client, cfg) as ev:
        sharded, timing = ev.evaluate(params)
        assert timing.timings["shards"] == 2 and len(ev.workers_seen) == 2
        assert ev.take_reruns() == []
    # two pieces per worker, each worker given its share: the same scores, row for row
    with ShardedEvaluator.for_config(client, cfg, pieces=2) as ev:
        pieced, timing = ev.evaluate(params)
        assert timing.timings["shards"] == 4 and len(ev.workers_seen) == 2
    t = timing.timings
    # the objective's scoring on the worker is the objective's time, not Dask's
    assert t["score_s"] > 0 and t["total_s"] > 0
    assert 0 < t["prepare_s"] + t["finish_s"] < t["total_s"] - t["solve_s"] + 1e-6
    assert t["dask_send_s"] > 0 and t["dask_return_s"] > 0  # the stamps place the task
    assert t["dask_send_s"] + t["dask_worker_s"] + t["dask_return_s"] == pytest.approx(
        t["dask_s"], abs=2e-3)
    for name in ("fitness", "errors", "fail", "amplitudes"):
        np.testing.assert_array_equal(getattr(sharded, name), getattr(local, name))
        np.testing.assert_array_equal(getattr(pieced, name), getattr(local, name))


def test_the_sharded_evaluator_calls_back_once_the_shards_are_sent(client):
    # the engine starts its background work there; an error in it is the caller's own
    cfg = kingen.load_config(kingen.demo_config(), overrides=SMALL)
    params = cfg.pmap.to_params(np.repeat(cfg.pmap.start_genes()[None], 6, axis=0))
    calls: list[int] = []
    with ShardedEvaluator.for_config(client, cfg) as ev:
        ev(params, while_solving=lambda: calls.append(len(ev._keys)))
        assert calls == [2]  # once, with both shards out
        with pytest.raises(OSError, match="disk full"):
            ev(params, while_solving=lambda: (_ for _ in ()).throw(OSError("disk full")))
        assert ev._keys == {}
        ev(params)  # and the evaluator goes on


def test_large_shards_pass_as_arguments_without_dasks_scatter_advice(client):
    # Dask warns about task arguments above a size (10 MB by default, 32,768 R&H candidates
    # a shard): passing them is the design, so the user must not see the warning
    import dask

    cfg = kingen.load_config(kingen.demo_config(), overrides=SMALL)
    params = cfg.pmap.to_params(np.repeat(cfg.pmap.start_genes()[None], 4, axis=0))
    with ShardedEvaluator.for_config(client, cfg) as ev, \
            dask.config.set({"distributed.admin.large-graph-warning-threshold": "1B"}), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client.submit(len, params, pure=False).result()  # the warning, outside kingen
        ev.evaluate(params)
    said = [str(w.message) for w in caught if "Sending large graph" in str(w.message)]
    assert len(said) == 1  # Dask's own submit above warned; the shards did not


def _small_config(tmp_path: Path, name: str):
    cfg = kingen.load_config(kingen.demo_config(), overrides={
        **SMALL, "generations": 4, "output": str(tmp_path / f"{name}.h5")})
    cfg.polish = False
    return cfg


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The small fit in this process alone: what every sharded run must give."""
    cfg = _small_config(tmp_path_factory.mktemp("one"), "one")
    result = kingen.fit(cfg, progress=False)
    with RunStore.open(result.path) as store:
        return result, store.history()


def test_sharded_fit_equals_the_one_process_fit(client, tmp_path, one_process):
    reference, history = one_process
    result = fit_on_cluster(_small_config(tmp_path, "sharded"), ClusterSettings(),
                            client=client, progress=False)
    assert result.fitness == reference.fitness
    np.testing.assert_array_equal(result.params, reference.params)
    with RunStore.open(result.path) as store:
        sharded = store.history()
        assert store.lost_workers == []
    np.testing.assert_array_equal(sharded["population"], history["population"])
    np.testing.assert_array_equal(sharded["fitness"], history["fitness"])
    assert "dask_s" in result.timings and "shards_rerun" in sharded["stats"]


def test_a_worker_killed_mid_generation_has_its_shard_run_again(client, tmp_path,
                                                                  one_process, caplog):
    import io

    reference, history = one_process
    # evaluation 3 is generation 2's; its second shard's worker dies as it starts it
    client.register_plugin(KillOnce(str(tmp_path / "killed"), "-3-1"), name="kill-shard")
    said = io.StringIO()
    try:
        result = fit_on_cluster(_small_config(tmp_path, "killed"), ClusterSettings(),
                                client=client, progress=True, stream=said)
        _restore_workers(client)
    finally:
        client.unregister_worker_plugin("kill-shard")
    assert (tmp_path / "killed").exists()
    assert result.fitness == reference.fitness       # the fit went on, unchanged
    np.testing.assert_array_equal(result.params, reference.params)
    with RunStore.open(result.path) as store:
        lost = store.lost_workers
        stats = store.history()["stats"]
    assert [(e["generation"], e["shard"]) for e in lost] == [(2, 1)]
    assert lost[0]["rows"] > 0 and lost[0]["worker"].startswith("tcp://")
    assert list(stats["shards_rerun"]) == [0, 0, 1, 0, 0]
    # one line of kingen's, not the scheduler's and the nanny's
    assert (f"kingen: generation 2: worker {lost[0]['worker']} was lost; its shard of "
            f"{lost[0]['rows']} candidates ran again (recorded in the run file)"
            in said.getvalue().splitlines())
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("distributed")
                and r.levelno >= logging.WARNING and "worker" in r.getMessage().lower()]


def test_a_clusters_only_worker_killed_mid_generation_is_waited_for_not_forever(
        tmp_path, one_process):
    from concurrent.futures import ThreadPoolExecutor

    reference, _ = one_process
    with open_client(ClusterSettings(workers=1, threads=1)) as alone:
        # evaluation 3's only shard: its worker dies as it starts it; the nanny starts
        # another, which Dask does not give the shard (it waits for the lost worker)
        alone.register_plugin(KillOnce(str(tmp_path / "killed"), "-3-0"), name="kill-shard")
        pool = ThreadPoolExecutor(1)  # a shard waiting without end fails the test
        try:
            result = pool.submit(fit_on_cluster, _small_config(tmp_path, "alone"),
                                 ClusterSettings(), client=alone,
                                 progress=False).result(timeout=240)
            alone.wait_for_workers(1, timeout=120)
        finally:
            pool.shutdown(wait=False)
            alone.unregister_worker_plugin("kill-shard")
    assert (tmp_path / "killed").exists()
    assert result.fitness == reference.fitness
    with RunStore.open(result.path) as store:
        assert [(e["generation"], e["shard"]) for e in store.lost_workers] == [(2, 0)]


def test_the_commands_on_an_existing_scheduler(client, tmp_path, capsys):
    from kingen.cli import main

    address = client.scheduler.address
    assert main(["info", "--cluster", address, "--connect"]) == 0
    out = capsys.readouterr().out
    assert f"scheduler {address}: 2 workers" in out
    assert main(["info"]) == 0 and main(["info", "--cluster", "local:3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "Dask, --cluster local: distributed.LocalCluster (processes) on this host" in out[2]
    assert out[3] == "cluster: distributed.LocalCluster (processes) on this host, 3 workers"
    demo = kingen.demo_config()
    config = tmp_path / "fit.toml"
    config.write_text(demo.read_text().replace('"demo/', f'"{demo.parent}/demo/')
                      .replace("polish = true", "polish = false"))
    run = tmp_path / "demo.h5"
    assert main(["fit", str(config), "--generations", "2", "--population", "8", "--backend",
                 "cpu", "-o", str(run), "-q", "--cluster", address]) == 0
    assert "kingen fit: 2 generations" in capsys.readouterr().out
    assert main(["resume", str(run), "--generations", "3", "-q", "--cluster", address]) == 0
    with RunStore.open(run) as store:
        assert store.n_generations == 4 and len(store.resumed) == 1
        assert list(store.history()["stats"]["shards_rerun"]) == [0, 0, 0, 0]
    assert client.scheduler_info()["workers"]      # the scheduler's cluster is left running


# ---------------------------------------------------------------------- batches

def _write_manifest(tmp_path: Path, seeds: list[int], cells: str, generations: int) -> Path:
    p = tmp_path / "batch.toml"
    p.write_text(f'''config = "{kingen.demo_config()}"
output = "out"
seeds = {seeds}
[overrides]
polish = false
backend = "cpu"
ga = {{ population = 8, offspring = 8, generations = {generations} }}
stop = {{ patience = 0 }}
{cells}''')
    return p


TWINS = '''
[[cells]]
name = "a"
[[cells]]
name = "b"
'''


def _params(row: dict) -> dict:
    return {k: v for k, v in row.items() if "(" in k}


def test_batch_with_a_killed_worker_and_a_bad_entry(client, tmp_path):
    """Cells a and b hold the same data: each fit of a has an uninterrupted twin in b."""
    p = _write_manifest(tmp_path, [1, 2], TWINS + '''
[[cells]]
name = "bad"
recordings = { deactivation = "garbled.csv" }
[[cells]]
name = "unstable"
overrides = { step = 0.02, parameters = { k2o = { bounds = [20000, 90000] } } }
''', generations=8)
    (tmp_path / "garbled.csv").write_text("time_ms,current_pA\n0,abc\n")  # found at fit time
    m = load_manifest(p)
    victim = next(j for j in m.jobs if j.id == "a/jonas_1993_reversible/seed1")
    client.register_plugin(KillOnce(str(tmp_path / "killed"), victim.id,
                                    str(victim.log_path), after=2), name="kill-fit")
    try:
        rows = {r["id"]: r for r in run_batch(m, client=client, progress=False)}
        _restore_workers(client)
    finally:
        client.unregister_worker_plugin("kill-fit")
    assert (tmp_path / "killed").exists()
    ok = [i for i, r in rows.items() if r["status"] == "ok"]
    assert sorted(ok) == sorted(j.id for j in m.jobs if j.cell in ("a", "b")), rows
    for seed in (1, 2):
        bad = rows[f"bad/jonas_1993_reversible/seed{seed}"]
        assert bad["status"] == "failed"
        assert bad["reason"] == (f"{tmp_path / 'garbled.csv'}: current_pA row 2 = 'abc': "
                                 "not a number")
        unstable = rows[f"unstable/jonas_1993_reversible/seed{seed}"]
        assert unstable["status"] == "failed"
        assert unstable["reason"].endswith("every candidate failed to simulate (see the "
                                           "failure codes in the run file); check the bounds "
                                           "and the step")
    killed = rows[victim.id]
    assert killed["resumed"] == 1          # resumed from its run file, not started again
    twin = rows["b/jonas_1993_reversible/seed1"]
    assert twin["resumed"] == 0
    assert killed["fitness"] == twin["fitness"] and _params(killed) == _params(twin)
    for job in m.jobs:                                  # whole, every checksum verified
        if job.cell in ("a", "b"):
            with RunStore.open(job.run_path) as store:
                assert store.n_generations == 9 and store.finished
    with RunStore.open(victim.run_path) as store:
        hist = store.history(population=False)
    assert list(hist["generation"]) == list(range(9))
    log = victim.log_path.read_text()
    assert "resuming run.h5 from its last committed generation" in log
    summary = (m.output / "batch_summary.csv").read_text().splitlines()
    assert len(summary) == 1 + len(m.jobs)
    assert "Schemes ranked per cell" in (m.output / "batch_summary.html").read_text()


def test_batch_rerun_skips_finished_fits_and_resumes_unfinished(client, tmp_path):
    p = _write_manifest(tmp_path, [3], TWINS, generations=8)
    m = load_manifest(p)
    victim, twin = m.jobs
    # the victim's fit was killed (SIGKILL) in a process of its own, as a stopped batch's is
    victim.folder.mkdir(parents=True)
    victim.config_path.write_text(victim.config_text)
    log = victim.folder / "killed.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", "import sys, kingen; "
                                 "kingen.fit(sys.argv[1], progress=True)",
                                 str(victim.config_path)], stderr=err)
    deadline = time.monotonic() + 120
    while "gen 2/" not in log.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with RunStore.open(victim.run_path) as store:
        assert 0 < store.n_generations < 9 and not store.finished
    first = {r["id"]: r for r in run_batch(m, client=client, progress=False)}
    assert all(r["status"] == "ok" for r in first.values()), first
    assert first[victim.id]["resumed"] == 1 and first[twin.id]["resumed"] == 0
    # the GA's generations, as the configuration counts them (generation 0 left out)
    assert first[twin.id]["generations"] == 8
    assert first[twin.id]["search_s"] > 0
    assert _params(first[victim.id]) == _params(first[twin.id])
    assert "resuming run.h5" in victim.log_path.read_text()
    done = {j.id: j.run_path.stat().st_mtime_ns for j in m.jobs}
    second = {r["id"]: r for r in run_batch(p, client=client, progress=False)}
    assert second == {k: {**v, "wall_s": second[k]["wall_s"], "worker": second[k]["worker"]}
                      for k, v in first.items()}
    assert {j.id: j.run_path.stat().st_mtime_ns for j in m.jobs} == done   # not touched
    assert all("finished already" in j.log_path.read_text() for j in m.jobs)


def test_batch_rerun_fits_again_what_it_cannot_read_and_says_what_changed(client,
                                                                          tmp_path):
    import io
    from concurrent.futures import ThreadPoolExecutor

    p = _write_manifest(tmp_path, [1], TWINS, generations=2)
    first = {r["id"]: r for r in run_batch(p, client=client, progress=False)}
    assert [r["status"] for r in first.values()] == ["ok", "ok"]
    cut, kept = load_manifest(p).jobs
    with open(cut.run_path, "r+b") as f:  # a copy cut short: HDF5's SWMR reader hangs on it
        f.truncate(1000)
    kept_config = kept.config_path.read_text()
    p.write_text(p.read_text().replace("generations = 2", "generations = 3"))
    said = io.StringIO()
    pool = ThreadPoolExecutor(1)  # a hang (reading the cut file) fails, not waits
    try:
        rows = pool.submit(run_batch, p, client=client, progress=True, stream=said)
        second = {r["id"]: r for r in rows.result(timeout=300)}
    finally:
        pool.shutdown(wait=False)
    assert [r["status"] for r in second.values()] == ["ok", "ok"], second
    # the unreadable file is kept aside, and the fit runs again, as the manifest now says
    assert (cut.run_path.parent / "run.h5.unreadable").stat().st_size == 1000
    assert second[cut.id]["generations"] == 3 and "generations = 3" in cut.config_path.read_text()
    assert "kept as run.h5.unreadable, fitting from the start" in cut.log_path.read_text()
    # the finished one is kept as it ran, with its configuration, and the user is told
    assert second[kept.id]["generations"] == 2 and kept.config_path.read_text() == kept_config
    assert "the manifest has changed since this fit started" in kept.log_path.read_text()
    assert ("kingen: 1 fit went on as it started, though the manifest has changed since "
            "(each fit's log says so; delete a fit's run.h5 to fit it again with the new "
            "configuration)") in said.getvalue().splitlines()


def test_a_batch_whose_summary_cannot_be_written_runs_every_fit_and_says_so(client,
                                                                           tmp_path):
    import io

    from kingen.errors import KingenError

    p = _write_manifest(tmp_path, [1, 2], "", generations=1)
    m = load_manifest(p)
    (m.output / "batch_summary.csv").mkdir(parents=True)  # in the way of the summary
    said = io.StringIO()
    with pytest.raises(KingenError) as caught:
        run_batch(m, client=client, progress=True, stream=said)
    assert str(caught.value).startswith(
        f"{m.output}: every fit ended (their run files hold the results), but the summary "
        "could not be written: it is a folder")
    for job in m.jobs:
        with RunStore.open(job.run_path) as store:
            assert store.finished
    assert [line for line in said.getvalue().splitlines() if "summary" in line] == [
        "kingen: cannot write the batch's summary (it is a folder); the fits go on"]


def _sleep_then(seconds: float, value: str) -> str:
    time.sleep(seconds)
    return value


def _when_set(event: str, value: str) -> str:
    distributed.Event(event).wait()
    return value


def test_the_batch_driver_wakes_when_a_fit_ends_not_at_its_next_poll(client):
    import uuid

    from kingen.scaleout.batch import finished_queue, next_finished

    # the slow fit ends when the test says so, not after a sleep long enough to be sure
    go = distributed.Event(f"slow-{uuid.uuid4().hex}", client=client)
    quick = client.submit(_sleep_then, 0.1, "quick", pure=False)
    slow = client.submit(_when_set, go.name, "slow", pure=False)
    finished = finished_queue([quick, slow])
    try:
        # a wait of a minute returns with the first fit to end, as soon as it ends
        t0 = time.monotonic()
        assert next_finished(finished, timeout=60.0) == [quick]
        assert time.monotonic() - t0 < 30.0
        assert next_finished(finished, timeout=0.01) == []
    finally:
        go.set()  # a worker of the module's cluster is held until then
    t0 = time.monotonic()
    assert next_finished(finished, timeout=60.0) == [slow]
    assert time.monotonic() - t0 < 30.0
    assert slow.result() == "slow"


# ---------------------------------------------------------------------- a batch system
# Slurm's commands, stood in for: `sbatch` starts the job script on this host after a
# queue wait (as its own process group, which `scancel` ends), or refuses it.

_SBATCH = """#!/usr/bin/env bash
copy="{jobs}/job-$$.sh"
cp "$1" "$copy"
setsid bash -c "sleep {wait}; exec bash $copy" > "{jobs}/job-$$.log" 2>&1 < /dev/null &
echo "Submitted batch job $!"
"""
_SCANCEL = """#!/usr/bin/env bash
for job in "$@"; do kill -- "-$job" 2>/dev/null || kill "$job" 2>/dev/null; done
exit 0
"""
_REFUSE = """#!/usr/bin/env bash
echo "sbatch: error: invalid partition specified: gpux" >&2
exit 1
"""


def _fake_slurm(tmp_path: Path, monkeypatch, sbatch: str, kind: str = "slurm") -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    submit, cancel = ("sbatch", "scancel") if kind == "slurm" else ("qsub", "qdel")
    for name, text in ((submit, sbatch), (cancel, _SCANCEL)):
        (bin_dir / name).write_text(text.format(jobs=tmp_path, wait=1))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cluster = tmp_path / f"{kind}.toml"
    cluster.write_text(f'[cluster]\nkind = "{kind}"\ncores = 1\nmemory = "2GB"\n'
                       'walltime = "00:10:00"\n')
    return cluster


def test_a_sharded_fit_on_a_batch_system_waits_for_its_queued_job(tmp_path, monkeypatch,
                                                                  capsys, one_process):
    from kingen.scaleout.cluster import parse_cluster_option

    reference, _ = one_process
    settings = parse_cluster_option(str(_fake_slurm(tmp_path, monkeypatch, _SBATCH)))
    result = fit_on_cluster(_small_config(tmp_path, "slurm"), settings, progress=False)
    # the job waited 1 s in the "queue": the fit waited for its worker, and said so
    assert "waiting for the batch system to start a worker (1 job submitted" in \
        capsys.readouterr().err
    assert result.fitness == reference.fitness
    np.testing.assert_array_equal(result.params, reference.params)


def test_a_batch_system_refusing_the_jobs_is_one_line(tmp_path, monkeypatch, capsys):
    from test_fit_helpers import write_problem

    from kingen.cli import main as cli

    cluster = _fake_slurm(tmp_path, monkeypatch, _REFUSE)
    path = write_problem(tmp_path, ga="generations = 2")
    out = tmp_path / "never.h5"
    assert cli(["fit", str(path), "--cluster", str(cluster), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kingen: error: {cluster}: cluster: the batch system refused the worker "
                   "jobs: sbatch: error: invalid partition specified: gpux"]
    assert not out.exists()


def test_a_batch_system_whose_commands_are_not_here_is_one_line(tmp_path, monkeypatch,
                                                               capsys):
    from test_fit_helpers import write_problem

    from kingen.cli import main as cli

    cluster = _fake_slurm(tmp_path, monkeypatch, _REFUSE)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))  # no sbatch on it
    path = write_problem(tmp_path, ga="generations = 2")
    out = tmp_path / "never.h5"
    assert cli(["fit", str(path), "--cluster", str(cluster), "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"kingen: error: {cluster}: cluster.kind = 'slurm': sbatch is not on this machine's "
        "PATH: run kingen where Slurm's commands are (the cluster's login node, or after "
        "`module load slurm`)"]
    assert not out.exists()


def test_a_pbs_system_refusing_the_jobs_without_a_word_is_one_line(tmp_path, monkeypatch,
                                                                  capsys):
    from kingen.cli import main as cli

    cluster = _fake_slurm(tmp_path, monkeypatch, "#!/usr/bin/env bash\nexit 3\n", "pbs")
    assert cli(["batch", str(_write_manifest(tmp_path, [1], "", generations=1)),
                "--cluster", str(cluster)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"kingen: error: {cluster}: cluster: the batch system refused the worker jobs: qsub "
        "failed (kingen -v shows more)"]


def test_an_existing_scheduler_without_workers_is_one_line(tmp_path, monkeypatch, capsys):
    from test_fit_helpers import write_problem

    import kingen.scaleout.cluster as cluster_module
    from kingen.cli import main as cli

    monkeypatch.setattr(cluster_module, "WORKER_WAIT_S", 1.0)
    path = write_problem(tmp_path, ga="generations = 2")
    out = tmp_path / "never.h5"
    with distributed.LocalCluster(n_workers=0, dashboard_address=None) as empty:
        address = empty.scheduler_address
        assert cli(["fit", str(path), "--cluster", address, "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"kingen: error: --cluster = '{address}': the scheduler at {address} has no worker "
        f"(start some with: dask worker {address}); waited 1 s")
    assert not out.exists()


def test_an_evaluator_that_cannot_be_built_leaves_the_run_files_as_they_were(tmp_path):
    from kingen.errors import KingenError

    # what a sharded fit's evaluator raises when the workers cannot build the solver
    def workers_cannot(objective):
        raise KingenError("the workers could not build the solver: no GPU",
                          field="--cluster")

    fresh = _small_config(tmp_path, "fresh")
    with pytest.raises(KingenError, match="could not build the solver"):
        kingen.fit(fresh, progress=False, evaluator=workers_cannot)
    assert not Path(fresh.output).exists()          # no empty run file in the way
    done = kingen.fit(_small_config(tmp_path, "done"), progress=False)
    with pytest.raises(KingenError, match="could not build the solver"):
        kingen.resume(done.path, generations=8, progress=False, evaluator=workers_cannot)
    with RunStore.open(done.path) as store:          # still finished, never resumed
        assert store.finished and store.resumed == [] and store.n_generations == 5
