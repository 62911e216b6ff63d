"""The scale-out layer's inputs, without a cluster: the [cluster] table and --cluster option,
the SLURM/PBS job scripts dask-jobqueue generates from them, the batch manifest, the TOML
writer, and the summary's AIC/BIC and ranking."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

import kingen
from kingen.errors import KingenError
from kingen.model.fields import loads_toml
from kingen.model.scheme import Scheme
from kingen.scaleout.cluster import (
    cluster_settings,
    jobqueue_cluster,
    local_plan,
    parse_cluster_option,
    settings_from_file,
)
from kingen.scaleout.manifest import load_manifest
from kingen.scaleout.summary import aic_bic, csv_text, html_text, ranking
from kingen.scaleout.tomlout import dumps_toml
from kingen.solve.options import SolverOptions


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------------- [cluster]

SLURM = {"kind": "slurm", "queue": "gpu", "account": "lab42", "jobs": 4, "gpus_per_job": 2,
         "cores": 16, "memory": "64GB", "walltime": "04:00:00",
         "job_extra": ["--constraint=h100"], "prologue": ["module load cuda/12.4"]}


def test_slurm_job_script_from_a_cluster_table():
    cluster = jobqueue_cluster(cluster_settings(SLURM, "batch.toml"))
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    lines = script.splitlines()
    assert "#SBATCH -p gpu" in lines
    assert "#SBATCH -A lab42" in lines
    # the job asks for all its cores and memory ...
    assert "#SBATCH --cpus-per-task=16" in lines
    assert "#SBATCH --mem=60G" in lines             # 64 GB, rounded up in GiB
    assert "#SBATCH -t 04:00:00" in lines
    assert "#SBATCH --gres=gpu:2" in lines
    assert "#SBATCH --constraint=h100" in lines
    assert "module load cuda/12.4" in lines
    # one `dask cuda worker` per job: one worker process per GPU of the job
    command = [line for line in lines if " -m dask cuda worker " in line]
    assert len(command) == 1 and "--resources GPU=2" in command[0]
    # ... and each of its GPU workers runs one task at a time, with its GPU's share of the
    # memory (`dask cuda worker` gives every worker it starts these)
    assert "--nthreads 1 " in command[0] and "--memory-limit 29.80GiB" in command[0]


def test_kingen_info_gives_a_batch_systems_workers_in_all():
    from kingen.scaleout.cluster import describe

    lines = describe(cluster_settings(SLURM, "batch.toml"))
    assert lines[0].startswith("cluster: slurm (4 jobs), each job 2 GPUs (one worker per GPU)")
    assert lines[1] == "  8 workers on 8 GPUs in all"
    adaptive = describe(cluster_settings({"kind": "pbs", "workers_per_job": 2, "cores": 4,
                                          "adaptive": True, "maximum_jobs": 5}, "b.toml"))
    assert adaptive[1] == "  up to 10 workers in all"


def test_slurm_cpu_workers_and_pbs_gpus():
    cpu = jobqueue_cluster(cluster_settings({"kind": "slurm", "workers_per_job": 4,
                                             "cores": 8}, "b.toml"))
    try:
        script = cpu.job_script()
    finally:
        cpu.close()
    assert "--nworkers 4" in script and "dask cuda" not in script and "--gres" not in script
    pbs = jobqueue_cluster(cluster_settings({"kind": "pbs", "queue": "gpuq", "gpus_per_job": 1,
                                             "cores": 8, "memory": "32GB"}, "b.toml"))
    try:
        script = pbs.job_script()
    finally:
        pbs.close()
    assert "#PBS -q gpuq" in script
    assert "#PBS -l select=1:ncpus=8:ngpus=1:mem=32GB" in script
    # PBS has no days- prefix: the hours run on
    days = jobqueue_cluster(cluster_settings({"kind": "pbs", "walltime": "1-12:00:00"},
                                             "b.toml"))
    try:
        assert "#PBS -l walltime=36:00:00" in days.job_script().splitlines()
    finally:
        days.close()


@pytest.mark.parametrize("table, message", [
    ({"kind": "sge"}, "batch.toml: cluster.kind = 'sge': must be one of local, address, "
                      "slurm, pbs"),
    ({"kind": "slurm", "jobs": 0}, "batch.toml: cluster.jobs = 0: must be >= 1"),
    ({"kind": "slurm", "walltime": "4h"}, "batch.toml: cluster.walltime = '4h': must be a "
                                          "time above zero such as \"02:00:00\""),
    # Slurm reads a zero limit as none at all; minutes and seconds run to 59
    ({"kind": "slurm", "walltime": "00:00:00"}, "batch.toml: cluster.walltime = '00:00:00': "
                                                "must be a time above zero"),
    ({"kind": "pbs", "walltime": "1:99:99"}, "batch.toml: cluster.walltime = '1:99:99': "
                                             "must be a time above zero"),
    ({"kind": "slurm", "memory": "lots"}, "batch.toml: cluster.memory = 'lots': must be a "
                                          "size above zero such as \"32GB\""),
    ({"kind": "slurm", "memory": "0GB"}, "batch.toml: cluster.memory = '0GB': must be a "
                                         "size above zero"),
    # dask-jobqueue would start each worker with cores // workers = 0 threads
    ({"kind": "slurm", "cores": 1, "workers_per_job": 4},
     "batch.toml: cluster.workers_per_job = 4: must be <= cores (1)"),
    ({"address": "tcp://10.0.0.5:notaport"}, "batch.toml: cluster.address = "
                                             "'tcp://10.0.0.5:notaport': the port must be a "
                                             "number from 1 to 65535"),
    ({"address": "tcp://10.0.0.5:99999"}, "batch.toml: cluster.address = "
                                          "'tcp://10.0.0.5:99999': the port must be a number"),
    # what Dask itself would refuse with a traceback
    ({"address": "tcp://10.0.0.5"}, "batch.toml: cluster.address = 'tcp://10.0.0.5': needs "
                                    "the scheduler's port: tcp://host:8786"),
    ({"address": "tls://10.0.0.5:8786"}, "batch.toml: cluster.address = "
                                         "'tls://10.0.0.5:8786': kingen reaches a scheduler "
                                         "over TCP"),
    ({"address": "inproc://10.0.0.5:8786"}, "batch.toml: cluster.address = "
                                            "'inproc://10.0.0.5:8786': kingen reaches"),
    ({"kind": "slurm", "gpus_per_job": "2"}, "batch.toml: cluster.gpus_per_job = '2': must "
                                             "be an integer"),
    ({"kind": "slurm", "gpu": 2}, "batch.toml: cluster.gpu: unknown field"),
    ({"kind": "local", "queue": "gpu"}, "batch.toml: cluster.queue = 'gpu': only for kind = "
                                        "\"slurm\" or \"pbs\""),
    ({"kind": "address"}, "batch.toml: cluster.address: missing"),
    ({"address": "host:8786"}, "batch.toml: cluster.address = 'host:8786': must be a "
                               "scheduler address"),
    ({"kind": "slurm", "minimum_jobs": 5, "maximum_jobs": 2},
     "batch.toml: cluster.minimum_jobs = 5: must be <= maximum_jobs (2)"),
    ({"kind": "slurm", "job_extra": ["--a\n--b"]}, "batch.toml: cluster.job_extra[0]"),
    ({"kind": "slurm", "gpus_per_job": 1, "workers_per_job": 2},
     "batch.toml: cluster.workers_per_job = 2: with gpus_per_job"),
    ({"kind": "slurm", "gpus": False}, "batch.toml: cluster.gpus = False: only for kind = "
                                       "\"local\""),
    ({"gpus": "no"}, "batch.toml: cluster.gpus = 'no': must be"),
])
def test_cluster_table_errors_are_one_line(table, message):
    with pytest.raises(KingenError) as exc:
        cluster_settings(table, "batch.toml")
    assert _one_line(exc).startswith(message)


def test_cluster_option(tmp_path):
    assert parse_cluster_option("local").kind == "local"
    assert parse_cluster_option("local:3").workers == 3
    s = parse_cluster_option("tcp://10.1.2.3:8786")
    assert (s.kind, s.address) == ("address", "tcp://10.1.2.3:8786")
    # as Dask takes it: its own parser refuses the closing slash with a traceback
    assert parse_cluster_option("TCP://10.1.2.3:8786/").address == "tcp://10.1.2.3:8786"
    assert cluster_settings({"address": "tcp://h:1/"}, "c.toml").address == "tcp://h:1"
    f = tmp_path / "c.toml"
    f.write_text('[cluster]\nkind = "slurm"\njobs = 2\n')
    assert parse_cluster_option(str(f)).jobs == 2
    for bad, message in (("local:0", "--cluster = 'local:0': local:N needs"),
                         ("tcp://a b", "--cluster = 'tcp://a b': must be a scheduler "
                                       "address"),
                         ("tcp://127.0.0.1:notaport", "--cluster = 'tcp://127.0.0.1:notaport'"
                                                      ": the port must be a number"),
                         ("ucx://127.0.0.1:8786", "--cluster = 'ucx://127.0.0.1:8786': kingen "
                                                  "reaches a scheduler over TCP"),
                         ("nowhere.toml", "--cluster = 'nowhere.toml': file not found"),
                         ("nowhere", "--cluster = 'nowhere': must be local")):
        with pytest.raises(KingenError) as exc:
            parse_cluster_option(bad)
        assert _one_line(exc).startswith(message)
    g = tmp_path / "none.toml"
    g.write_text('model = "m.toml"\n')
    assert settings_from_file(g) is None
    with pytest.raises(KingenError, match=r"none.toml: cluster: no \[cluster\] table"):
        parse_cluster_option(str(g))


def test_kingen_info_refuses_what_it_would_not_do_before_it_says_anything(capsys):
    from kingen.cli import main

    assert main(["info", "model.toml", "--cluster", "local"]) == 2
    assert main(["info", "--cluster", "local:2", "--connect"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "kingen: error: --cluster = 'local': describes a cluster: give it without a scheme "
        "file (kingen info SCHEME describes the scheme)",
        "kingen: error: --cluster = 'local:2': --connect asks an existing scheduler: give "
        "--cluster tcp://HOST:PORT"]


def test_gpus_false_plans_cpu_workers_with_the_gpus_hidden():
    s = cluster_settings({"gpus": False, "workers": 3}, "fit.toml")
    plan = local_plan(s)
    assert (plan["cluster"], plan["workers"], plan["gpus"]) == (
        "distributed.LocalCluster (processes)", 3, [])
    assert plan["threads"] == max(1, (os.cpu_count() or 1) // 3)
    assert "do not see this host's GPUs" in plan["note"]
    assert local_plan(cluster_settings({}, "fit.toml"))["note"] == ""


def test_a_fit_configuration_may_hold_a_cluster_table(tmp_path):
    text = kingen.demo_config().read_text() + '\n[cluster]\nkind = "slurm"\njobs = 3\n'
    cfg = tmp_path / "fit.toml"
    cfg.write_text(text.replace('"demo/', f'"{kingen.demo_config().parent}/demo/'))
    assert kingen.load_config(cfg).ga.population == 48
    assert settings_from_file(cfg).jobs == 3


# ---------------------------------------------------------------------- manifest

def _manifest(tmp_path: Path, text: str) -> Path:
    (tmp_path / "rec.csv").write_text("not used here\n")
    p = tmp_path / "batch.toml"
    p.write_text(f'config = "{kingen.demo_config()}"\n' + text)
    return p


def test_manifest_is_the_product_of_cells_schemes_and_seeds(tmp_path):
    model = kingen.demo_config().parent / "demo" / "jonas_1993_reversible.toml"
    p = _manifest(tmp_path, f'''
output = "out"
seeds = [4, 5]
[overrides]
polish = false
ga = {{ generations = 3 }}
[[cells]]
name = "c1"
recordings = {{ deactivation = "rec.csv" }}
[[cells]]
name = "c2"
overrides = {{ ga = {{ population = 6 }} }}
[[schemes]]
name = "jonas"
model = "{model}"
parameters = {{ fixed = ["k34"] }}
[[schemes]]
name = "jonas_b"
model = "{model}"
''')
    m = load_manifest(p)
    assert m.output == tmp_path / "out"
    assert [j.id for j in m.jobs] == [f"{c}/{s}/seed{k}" for c in ("c1", "c2")
                                      for s in ("jonas", "jonas_b") for k in (4, 5)]
    first = loads_toml(m.jobs[0].config_text, "<job>")
    assert first["seed"] == 4 and first["polish"] is False
    assert first["ga"] == {"population": 48, "offspring": 48, "generations": 3, "cxpb": 0.6,
                           "mutpb": 0.3}
    assert first["parameters"] == {"fixed": ["k34"]}       # replaced, not merged
    assert first["protocols"][0]["recording"] == str(tmp_path / "rec.csv")
    assert first["output"] == str(tmp_path / "out" / "c1" / "jonas" / "seed4" / "run.h5")
    # every other path made absolute: the fit's configuration lives in its own folder
    assert Path(first["protocols"][1]["recording"]).is_absolute()
    assert Path(first["protocols"][2]["protocol"]).is_file()
    c2 = loads_toml(m.jobs[5].config_text, "<job>")
    assert c2["ga"]["population"] == 6 and c2["ga"]["generations"] == 3
    assert "fixed" in loads_toml(m.jobs[1].config_text, "<j>")["parameters"]
    assert "k01" in loads_toml(m.jobs[2].config_text, "<j>")["parameters"]


@pytest.mark.parametrize("text, message", [
    ("seeds = 3\n", "seeds = 3: must be a non-empty array of integers"),
    ("seeds = [1, 1]\n", "seeds = [1, 1]: a seed is listed twice"),
    ("seeds = [1, 2.5]\n", "seeds[1] = 2.5: must be an integer"),
    ("sedes = [1]\n", "sedes: unknown field"),
    ("[[cells]]\nname = \"a/b\"\n", "cells[0].name = 'a/b': must be a folder name"),
    ("[[cells]]\nname = \"a\"\n[[cells]]\nname = \"a\"\n",
     "cells[1].name = 'a': two entries with the same name"),
    ("[[cells]]\nname = \"a\"\nrecordings = { deact = \"rec.csv\" }\n",
     "cells[0].recordings.deact = 'deact': no protocol of this name in the configuration "
     "(protocols are deactivation, desensitization, recovery, dose_response)"),
    ("[[cells]]\nname = \"a\"\nrecordings = { deactivation = 3 }\n",
     "cells[0].recordings.deactivation = 3: must be a file name"),
    ("[[schemes]]\nname = \"s\"\n", "schemes[0].model: missing"),
    ("[overrides]\nseed = 3\n", "overrides.seed = 3: set by the batch for each fit"),
    ("[[cells]]\nname = \"a\"\noverrides = { output = \"x.h5\" }\n",
     "cells[0].overrides.output = 'x.h5': set by the batch"),
    ("[cluster]\nkind = \"slurm\"\njobs = -1\n", "cluster.jobs = -1: must be >= 1"),
    ("seeds = [\n", "malformed TOML"),
])
def test_manifest_errors_are_one_line(tmp_path, text, message):
    p = _manifest(tmp_path, text)
    with pytest.raises(KingenError) as exc:
        load_manifest(p)
    line = _one_line(exc)
    assert line.startswith(f"{p}: ") and message in line


def test_manifest_without_its_configuration(tmp_path):
    p = tmp_path / "b.toml"
    p.write_text('config = "nope.toml"\n')
    with pytest.raises(KingenError) as exc:
        load_manifest(p)
    assert _one_line(exc) == f"{p}: config = 'nope.toml': configuration file not found"
    with pytest.raises(KingenError, match="manifest not found"):
        load_manifest(tmp_path / "missing.toml")


def test_manifest_over_a_configuration_its_cells_cannot_address(tmp_path):
    (tmp_path / "none.toml").write_text('model = "m.toml"\nprotocols = []\n')
    p = tmp_path / "b.toml"
    p.write_text('config = "none.toml"\n')
    with pytest.raises(KingenError) as exc:
        load_manifest(p)
    assert _one_line(exc) == (f"{tmp_path / 'none.toml'}: protocols: must be a non-empty "
                              "array of tables ([[protocols]])")
    # two protocols called deactivation: a cell's deactivation recording would go to both
    (tmp_path / "twice.toml").write_text(
        'model = "m.toml"\n[[protocols]]\nprotocol = "deactivation"\n'
        '[[protocols]]\nprotocol = "deactivation"\nexchange = 0.5\n')
    p.write_text('config = "twice.toml"\n[[cells]]\nname = "c"\n'
                 'recordings = { deactivation = "x.csv" }\n')
    with pytest.raises(KingenError) as exc:  # a typo is found before any fit runs
        load_manifest(p)
    assert _one_line(exc) == (f"{p}: cells[0].recordings.deactivation = 'x.csv': file not "
                              "found")
    (tmp_path / "x.csv").write_text("")
    with pytest.raises(KingenError) as exc:
        load_manifest(p)
    assert _one_line(exc).startswith(
        f"{tmp_path / 'twice.toml'}: protocols = 'deactivation': 2 protocols are called "
        "'deactivation'")


def test_a_manifest_naming_what_is_not_there_stops_before_any_fit(tmp_path):
    demo = kingen.demo_config()
    (tmp_path / "fit.toml").write_text(demo.read_text().replace('"demo/',
                                                                f'"{demo.parent}/demo/'))
    p = tmp_path / "b.toml"
    for text, message in (
            ('[[schemes]]\nname = "x"\nmodel = "nonexistent.toml"\n',
             "schemes[0].model = 'nonexistent.toml': scheme file not found"),
            ('[[cells]]\nname = "batch_summary.csv"\n',
             "cells[0].name = 'batch_summary.csv': is the name of the batch's own summary")):
        p.write_text('config = "fit.toml"\n' + text)
        with pytest.raises(KingenError) as exc:
            load_manifest(p)
        assert _one_line(exc) == f"{p}: {message}"


def test_a_fit_checks_its_cluster_table_without_cluster_and_says_where_a_config_went(
        tmp_path, capsys):
    from kingen.cli import main

    demo = kingen.demo_config()
    config = tmp_path / "fit.toml"
    config.write_text(demo.read_text().replace('"demo/', f'"{demo.parent}/demo/')
                      + '\n[cluster]\nkind = "locl"\n')
    run = tmp_path / "run.h5"
    assert main(["fit", str(config), "-q", "-o", str(run), "--generations", "1"]) == 2
    assert main(["fit", "--cluster", str(config)]) == 2  # the option took the file
    assert capsys.readouterr().err.splitlines() == [
        f"kingen: error: {config}: cluster.kind = 'locl': must be one of local, address, "
        "slurm, pbs",
        f"kingen: error: kingen fit: give a configuration file or --demo (one of them); "
        f"--cluster took {config} as its value: put the configuration first (kingen fit "
        f"{config} --cluster)"]
    assert not run.exists()


def test_toml_writer_round_trips_a_configuration():
    doc = loads_toml(kingen.demo_config().read_text(), "<demo>")
    doc["odd key"] = {"a \"b\"": [1.5, float("inf"), True, "x\ny\u00e9"]}
    assert loads_toml(dumps_toml(doc), "<out>") == doc


# ---------------------------------------------------------------------- summary

def test_aic_bic_and_the_ranking():
    ssr, n, k = 3.0, 200, 5
    aic, bic = aic_bic(ssr, n, k)
    assert aic == pytest.approx(n * math.log(ssr / n) + 2 * k)
    assert bic == pytest.approx(n * math.log(ssr / n) + k * math.log(n))
    assert all(math.isnan(v) for v in aic_bic(math.inf, n, k))
    rows = [
        {"id": "c/a/seed1", "cell": "c", "scheme": "a", "seed": 1, "status": "ok",
         "converged": True, "aic": 10.0, "bic": 20.0, "fitness": 0.1},
        {"id": "c/a/seed2", "cell": "c", "scheme": "a", "seed": 2, "status": "ok",
         "converged": True, "aic": 8.0, "bic": 18.0, "fitness": 0.09},
        {"id": "c/b/seed1", "cell": "c", "scheme": "b", "seed": 1, "status": "ok",
         "converged": True, "aic": 12.0, "bic": 15.0, "fitness": 0.2},
        {"id": "d/b/seed1", "cell": "d", "scheme": "b", "seed": 1, "status": "failed",
         "reason": "x.csv: file not found"},
    ]
    ranked = ranking(rows)
    assert list(ranked) == ["c"]
    assert [(r["scheme"], r["seed"], r["d_aic"], r["d_bic"]) for r in ranked["c"]] == [
        ("a", 2, 0.0, 3.0), ("b", 1, 4.0, 0.0)]
    assert ranked["c"][0]["weight"] == pytest.approx(1 / (1 + math.exp(-2)))
    text = csv_text(rows)
    assert text.splitlines()[4].startswith("d/b/seed1,d,b,1,failed,x.csv: file not found,")
    page = html_text(rows + [{"id": "<x>", "cell": "<c>", "scheme": "s", "seed": 0,
                              "status": "failed", "reason": "<script>"}], "t")
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_the_slurm_how_to_example(tmp_path):
    import re

    page = Path(__file__).resolve().parents[1] / "docs" / "howto" / "slurm.md"
    block = next(b for b in re.findall(r"```toml\n(.*?)```", page.read_text(encoding="utf-8"),
                                       re.S)
                 if 'kind = "slurm"' in b)
    demo = kingen.demo_config()
    (tmp_path / "fit.toml").write_text(demo.read_text().replace('"demo/',
                                                                f'"{demo.parent}/demo/'))
    (tmp_path / "batch.toml").write_text(block)
    for name in re.findall(r'"((?:cell0\d|models)/[^"]+)"', block):  # the lab's files
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    m = load_manifest(tmp_path / "batch.toml")
    assert len(m.jobs) == 2 * 2 * 3 and m.output == tmp_path / "runs"
    assert m.cluster.kind == "slurm" and m.cluster.jobs == 4
    cluster = jobqueue_cluster(m.cluster)
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    for line in ("#SBATCH -p gpu", "#SBATCH --gres=gpu:2", "#SBATCH --constraint=a100",
                 "module load cuda/12.4", "#SBATCH -t 08:00:00"):
        assert line in script.splitlines()
    job = loads_toml(m.jobs[-1].config_text, "<job>")
    assert job["model"] == str(tmp_path / "models" / "robert_howe_2003.toml")
    assert job["parameters"] == {"fixed": ["gamma0"]}
    # the example's fixed parameters are the scheme's own: its fits can run
    shipped = Scheme.load(Path(__file__).resolve().parents[1] / "models" /
                          "robert_howe_2003.toml")
    assert set(job["parameters"]["fixed"]) <= set(shipped.param_names)
    assert job["protocols"][2]["targets"] == str(tmp_path / "cell02" / "recovery.csv")


def test_each_worker_of_a_host_takes_its_share_of_the_cores(monkeypatch):
    # a GPU host's workers (one per GPU) must not each start a thread per core
    import kingen.scaleout.worker as worker
    from kingen.scaleout.worker import SolverPlugin, solver_threads

    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    monkeypatch.setattr(worker, "_numba_pool", lambda: 64)
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(32)), raising=False)
    assert solver_threads("tcp://10.0.0.7:40123", {"10.0.0.7": 2}) == 16
    assert solver_threads("tcp://10.0.0.7:40123", {"10.0.0.7": 8, "10.0.0.8": 1}) == 4
    assert solver_threads("tcp://10.0.0.9:1", {"10.0.0.7": 2}) == 32  # alone on its host
    assert solver_threads("tcp://10.0.0.7:1", {"10.0.0.7": 64}) == 1
    assert solver_threads("ucx://10.0.0.7:1", {"10.0.0.7": 2}) >= 1  # whatever ucx names
    assert solver_threads("", {"10.0.0.7": 2}) == 32
    # pinned to its GPU's NUMA node (half the host), as dask-cuda does: 8 workers on two
    # nodes share each node four ways
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    assert solver_threads("tcp://10.0.0.7:1", {"10.0.0.7": 8}) == 4
    assert solver_threads("tcp://10.0.0.7:1", {"10.0.0.7": 2}) == 16
    monkeypatch.setattr(worker, "_numba_pool", lambda: 8)  # numba's pool caps it
    assert solver_threads("tcp://10.0.0.9:1", {}) == 8
    monkeypatch.setenv("NUMBA_NUM_THREADS", "3")  # kingen's local CPU cluster set the share
    assert solver_threads("tcp://10.0.0.7:1", {"10.0.0.7": 2}) == 3

    class Worker:
        address = "tcp://10.0.0.7:40123"

    monkeypatch.delenv("NUMBA_NUM_THREADS")
    monkeypatch.setattr(worker.numba, "set_num_threads", lambda n: None)  # no pool of 8 here
    cfg = kingen.load_config(kingen.demo_config())
    plugin = SolverPlugin(cfg.scheme, cfg.protocols,
                          options=SolverOptions(backend="cpu"), workers_per_host={"10.0.0.7": 8})
    plugin.setup(Worker())
    assert plugin.threads == 4 and plugin.objective is not None  # its node, shared 4 ways


def test_an_empty_cluster_value_is_refused_not_taken_for_the_configurations_table(
        tmp_path, capsys):
    from kingen.cli import main

    demo = kingen.demo_config()
    config = tmp_path / "fit.toml"
    config.write_text(demo.read_text().replace('"demo/', f'"{demo.parent}/demo/')
                      + '\n[cluster]\nkind = "local"\nworkers = 1\n')
    run = tmp_path / "run.h5"
    assert main(["fit", str(config), "-q", "-o", str(run), "--cluster", ""]) == 2
    assert main(["batch", str(tmp_path / "m.toml"), "--cluster", " "]) == 2
    message = ("is empty: give local, local:N, a scheduler address (tcp://host:8786) or a "
               "TOML file with a [cluster] table")
    assert capsys.readouterr().err.splitlines() == [
        f"kingen: error: --cluster = '': {message}",
        f"kingen: error: --cluster = ' ': {message}"]
    assert not run.exists()
