"""The HDF5 run file: round trips, crash safety under SIGKILL, live reading, clear errors.

``make_run`` builds a small real run file (Jonas 1993, standard protocols, exact traces);
the plot, report and export tests import it from here.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from kingen.errors import KingenError
from kingen.experiment.features import protocol_features
from kingen.experiment.protocol import Protocol, standard_protocol
from kingen.experiment.recordings import Recording, RecoveryTable, Target, Targets
from kingen.model.scheme import Scheme
from kingen.solve import simulate_exact
from kingen.store import LAYOUT_VERSION, RunStore

ROOT = Path(__file__).resolve().parents[1]
N_POP = 12
STATE_FIELDS = {"generation": ("i8", ()), "pop": ("f8", (N_POP, 16))}
JONAS = ROOT / "models" / "jonas_1993.toml"
# Fitted amplitudes: numbers of channels (the scheme file says 100).
AMPLITUDES = {"deactivation": 125.0, "desensitization": 90.0, "recovery": 100.0,
              "dose_response": 110.0}


def small_protocols(names: tuple[str, ...] = ("deactivation", "desensitization", "recovery",
                                              "dose_response")) -> list[Protocol]:
    """Standard protocols on coarse grids (fast exact simulation)."""
    dts = {"deactivation": 0.05, "desensitization": 0.1, "recovery": 0.5, "dose_response": 0.2}
    return [standard_protocol(n, dt=dts[n]) for n in names]


def one_line(exc: pytest.ExceptionInfo[KingenError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def make_run(path: Path, *, protocols: list[Protocol] | None = None, generations: int = 6,
             best: bool = True, finished: str | None = "max_generations",
             seed: int = 3) -> dict[str, Any]:
    """Write a small run file; returns what went in (for checks)."""
    scheme = Scheme.load(JONAS)
    protocols = protocols if protocols is not None else small_protocols()
    rng = np.random.default_rng(seed)
    fitted = scheme.values * np.exp(rng.normal(0, 0.05, scheme.n_params))
    recordings: dict[str, Recording | None] = {}
    traces, feats = {}, {}
    for p in protocols:
        amp = AMPLITUDES.get(p.name, 100.0)
        truth = simulate_exact(scheme, p)
        data = [c + rng.normal(0, 0.5, c.size) for c in truth.currents]
        fit = simulate_exact(scheme, p, fitted, channels=amp)
        times = [s.time for s in fit.sweeps]
        fit_pA = fit.currents
        recordings[p.name] = Recording(p.name, times, data, [s.label for s in fit.sweeps],
                                       holding_mV=-60.0, meta={"synthetic": True})
        traces[p.name] = {"time_ms": times, "fit_pA": fit_pA, "data_pA": data,
                          "labels": [s.label for s in fit.sweeps]}
        feats[p.name] = {"fit": protocol_features(p, times, fit_pA),
                         "data": protocol_features(p, times, data)}
    targets = {p.name: None for p in protocols}
    if "recovery" in targets:
        targets["recovery"] = Targets({"tau_rec_ms": Target(60.0, 2.0, 5.0)},
                                      recovery=RecoveryTable(np.array([5.0, 50.0]),
                                                             np.array([0.05, 0.5])))
    lo, hi = np.log(scheme.lower), np.log(scheme.upper)
    store = RunStore.create(path, config_text="[ga]\npopulation = 12\n", config={"seed": seed},
                            scheme=scheme, protocols=protocols, recordings=recordings,
                            targets=targets, free_mask=scheme.free_mask,
                            population_size=N_POP, environment={"backend": "cpu"},
                            state_fields=STATE_FIELDS, overwrite=True)
    pops = []
    with store:
        for g in range(generations):
            pop = np.exp(rng.uniform(lo, hi, (N_POP, scheme.n_params)))
            pop[0] = fitted * np.exp(rng.normal(0, 0.3 / (g + 1), scheme.n_params))
            err = rng.random((N_POP, len(protocols))) / (g + 1)
            err[0] /= 10
            fitness = err.sum(axis=1)
            store.append_generation(
                generation=g, population=pop, errors=err, fitness=fitness,
                fail=np.zeros(N_POP, int),
                stats={"best": fitness.min(), "median": float(np.median(fitness)),
                       "mean": fitness.mean(), "n_failed": 0},
                timings={"solver_s": 0.2, "ga_s": 0.01, "io_s": 0.001, "total_s": 0.25},
                state={"generation": np.int64(g), "pop": pop})
            pops.append(pop)
        if generations:
            store.write_hall_of_fame(np.vstack([fitted, pops[-1][:4]]), np.arange(5.0))
        if best:
            store.write_best(params=fitted, fitness=0.05,
                             errors={p.name: 0.01 * (k + 1) for k, p in enumerate(protocols)},
                             amplitudes={p.name: AMPLITUDES.get(p.name, 100.0)
                                         for p in protocols},
                             traces=traces, features=feats,
                             polish={"error_before": 0.06, "error_after": 0.05})
        if finished:
            store.mark_finished(finished)
    return {"scheme": scheme, "protocols": protocols, "recordings": recordings,
            "fitted": fitted, "traces": traces, "features": feats, "pops": pops,
            "targets": targets}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("run") / "run.h5"
    return path, make_run(path)


# --------------------------------------------------------------------------- round trips

def test_static_groups_read_back(run: tuple[Path, dict[str, Any]]) -> None:
    path, made = run
    with RunStore.open(path) as st:
        assert st.config_text == "[ga]\npopulation = 12\n" and st.config == {"seed": 3}
        env = st.environment
        assert env["backend"] == "cpu" and env["h5py"] == h5py.version.version
        assert "kingen" in env and "numpy" in env
        assert st.scheme().text == made["scheme"].text
        assert st.param_names == made["scheme"].param_names
        assert st.protocol_names == [p.name for p in made["protocols"]]
        assert st.protocols() == made["protocols"]
        np.testing.assert_array_equal(st.free_mask, made["scheme"].free_mask)
        recs = st.recordings()
        for name, rec in made["recordings"].items():
            got = recs[name]
            assert got.sweep_labels == rec.sweep_labels and got.holding_mV == -60.0
            for a, b in zip(got.currents_list(), rec.currents_list(), strict=True):
                np.testing.assert_array_equal(a, b)
        tg = st.targets()
        assert tg["deactivation"] is None
        assert tg["recovery"].features["tau_rec_ms"] == Target(60.0, 2.0, 5.0)
        np.testing.assert_array_equal(tg["recovery"].recovery.ratio, [0.05, 0.5])
        f = st._f
        assert f.attrs["kingen_run"] == "kingen run file"
        assert f.attrs["layout_version"] == LAYOUT_VERSION
        assert f.attrs["layout"].startswith("## The run file")  # the file explains itself
        assert f["scheme/states"].attrs["unit_conductance"] == "pS"
        assert f["generations/fail"].compression == "gzip"  # float arrays: uncompressed


def test_generations_best_and_hall_of_fame(run: tuple[Path, dict[str, Any]]) -> None:
    path, made = run
    with RunStore.open(path) as st:
        assert st.n_generations == 6 and st.finished == "max_generations"
        h = st.history()
        np.testing.assert_array_equal(h["generation"], np.arange(6))
        np.testing.assert_array_equal(h["population"], np.stack(made["pops"]))
        assert h["errors"].shape == (6, N_POP, 4) and h["fail"].shape == (6, N_POP)
        np.testing.assert_allclose(h["best"], h["fitness"].min(axis=1))
        assert set(h["timings"]) == {"solver_s", "ga_s", "io_s", "total_s"}
        assert set(h["stats"]) == {"best", "median", "mean", "n_failed"}
        gen, state = st.last_state()
        assert gen == 5 and state["generation"] == 5 and state["generation"].shape == ()
        np.testing.assert_array_equal(state["pop"], made["pops"][-1])
        params, fit = st.hall_of_fame()
        np.testing.assert_array_equal(params[0], made["fitted"])
        np.testing.assert_array_equal(fit, np.arange(5.0))
        best = st.best()
        np.testing.assert_array_equal(best["params"], made["fitted"])
        assert best["errors"]["desensitization"] == 0.02
        assert best["amplitudes"]["deactivation"] == 125.0
        assert best["polish"] == {"error_before": 0.06, "error_after": 0.05}
        tr = best["traces"]["recovery"]
        want = made["traces"]["recovery"]
        assert tr["labels"] == want["labels"] and len(tr["time_ms"]) == 9
        for a, b in zip(tr["fit_pA"], want["fit_pA"], strict=True):
            np.testing.assert_array_equal(a, b)
        feats = best["features"]["recovery"]["fit"]
        assert feats["tau_rec_ms"] == pytest.approx(
            made["features"]["recovery"]["fit"]["tau_rec_ms"])
        gens, best_rows, _ = st.best_per_generation()
        np.testing.assert_array_equal(best_rows[-1], made["pops"][-1][0])


def test_growing_population_and_new_stat_columns(tmp_path: Path) -> None:
    make_run(tmp_path / "r.h5", protocols=small_protocols(("deactivation",)), generations=0,
             best=False, finished=None)
    with RunStore.open(tmp_path / "r.h5", "a") as st:
        with pytest.raises(KingenError, match="no completed generation"):
            st.last_state()
        for g, n in enumerate((N_POP, 3 * N_POP)):
            st.append_generation(generation=g, population=np.ones((n, 16)),
                                 errors=np.ones((n, 1)), fitness=np.ones(n),
                                 fail=np.zeros(n, int), stats={"best": 1.0, f"extra{g}": g},
                                 timings={}, state={"generation": np.int64(g),
                                                    "pop": np.full((3 - g, 16), g + 0.5)})
    with RunStore.open(tmp_path / "r.h5") as st:
        h = st.history()
        assert h["population"].shape == (2, 3 * N_POP, 16)
        np.testing.assert_array_equal(h["size"], [N_POP, 3 * N_POP])
        assert np.isnan(h["fitness"][0, N_POP:]).all() and (h["fail"][0, N_POP:] == -1).all()
        assert np.isnan(h["stats"]["extra1"][0]) and h["stats"]["extra1"][1] == 1
        gen, state = st.last_state()
        assert gen == 1 and state["pop"].shape == (2, 16) and (state["pop"] == 1.5).all()
        assert st.generation(0)["population"].shape == (N_POP, 16)
        assert st.generation(-1)["fail"].shape == (3 * N_POP,)
        assert st.finished is None and st.best() is None


def test_create_refuses_an_existing_file(run: tuple[Path, dict[str, Any]], tmp_path: Path
                                         ) -> None:
    path = tmp_path / "exists.h5"
    path.write_bytes(b"keep me")
    with pytest.raises(KingenError) as exc:
        make_run_like(path, overwrite=False)
    assert "already exists" in one_line(exc) and path.read_bytes() == b"keep me"


def make_run_like(path: Path, overwrite: bool) -> RunStore:
    scheme = Scheme.load(JONAS)
    return RunStore.create(path, config_text="", config={}, scheme=scheme,
                           protocols=small_protocols(("deactivation",)), recordings={},
                           targets={}, free_mask=scheme.free_mask, population_size=4,
                           environment={}, overwrite=overwrite)


def test_a_reader_cannot_write(run: tuple[Path, dict[str, Any]]) -> None:
    with RunStore.open(run[0]) as st, pytest.raises(KingenError, match="for reading"):
        st.mark_finished("x")


# --------------------------------------------------------------------------- crash safety

WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from kingen.experiment.protocol import standard_protocol
    from kingen.model.scheme import Scheme
    from kingen.store import RunStore

    path, n_gen, n_pop, pause, mode = sys.argv[1:6]
    n_gen, n_pop, pause = int(n_gen), int(n_pop), float(pause)
    scheme = Scheme.load(sys.argv[6])
    if mode == "create":
        protocols = [standard_protocol("deactivation"), standard_protocol("desensitization")]
        st = RunStore.create(path, config_text="", config={}, scheme=scheme,
                             protocols=protocols, recordings={}, targets={},
                             free_mask=scheme.free_mask, population_size=n_pop,
                             environment={}, overwrite=True,
                             state_fields={"generation": ("i8", ()), "blob": ("u1", (5000,))})
    else:
        st = RunStore.open(path, "a")
    for g in range(st.n_generations, n_gen):
        rng = np.random.default_rng(g)
        pop = rng.random((n_pop, scheme.n_params))
        err = rng.random((n_pop, 2))
        state = {"generation": np.int64(g),
                 "blob": np.frombuffer(rng.bytes(5000 + 97 * g), dtype=np.uint8)}
        st.append_generation(generation=g, population=pop, errors=err, fitness=err.sum(1),
                             fail=np.zeros(n_pop, int), stats={"best": err.sum(1).min()},
                             timings={"total_s": 0.0}, state=state)
        print(g, flush=True)
        time.sleep(pause)
    st.mark_finished("max_generations")
    st.close()
""")


def expected_generation(g: int, n_pop: int) -> tuple[np.ndarray, bytes]:
    rng = np.random.default_rng(g)
    pop = rng.random((n_pop, 16))
    rng.random((n_pop, 2))
    return pop, rng.bytes(5000 + 97 * g)


def start_writer(tmp_path: Path, path: Path, n_gen: int, n_pop: int, pause: float,
                 mode: str = "create") -> subprocess.Popen[str]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER, encoding="utf-8")
    return subprocess.Popen([sys.executable, str(script), str(path), str(n_gen), str(n_pop),
                             str(pause), mode, str(JONAS)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)


def check_generations(path: Path, n_pop: int) -> int:
    """Every committed generation is whole; the resume state is the last one's."""
    with RunStore.open(path) as st:
        n = st.n_generations
        h = st.history()
        np.testing.assert_array_equal(h["generation"], np.arange(n))
        for g in range(n):
            np.testing.assert_array_equal(h["population"][g], expected_generation(g, n_pop)[0])
        gen, state = st.last_state()
        assert gen == n - 1 and state["generation"] == gen
        assert state["blob"].tobytes() == expected_generation(gen, n_pop)[1]
    return n


@pytest.mark.parametrize("trial", range(2))
def test_sigkill_leaves_every_completed_generation(tmp_path: Path, trial: int) -> None:
    path = tmp_path / "killed.h5"
    n_pop = 2000  # large enough that a kill often lands inside a generation's writes
    proc = start_writer(tmp_path, path, 100_000, n_pop, 0.0)
    printed = -1
    while printed < 4:  # several generations completed
        line = proc.stdout.readline()
        assert line, "the writer died"
        printed = int(line)
    time.sleep(random.Random(trial).uniform(0.0, 0.05))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    n = check_generations(path, n_pop)
    assert n >= printed + 1  # everything reported done is in the file
    # A new writer continues it (the killed writer's file is rebuilt from what it committed).
    proc = start_writer(tmp_path, path, n + 3, n_pop, 0.0, mode="resume")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert check_generations(path, n_pop) == n + 3
    with RunStore.open(path) as st:
        assert st.finished == "max_generations"
        assert len(st._f["run"].attrs["resumed"]) > 2


def test_a_reader_follows_a_live_run(tmp_path: Path) -> None:
    path = tmp_path / "live.h5"
    n_gen = 30
    proc = start_writer(tmp_path, path, n_gen, 50, 0.03)
    assert proc.stdout.readline().strip() == "0"
    seen = []
    with RunStore.open(path) as st:
        assert st._f.swmr_mode  # reading as an SWMR reader while the writer runs
        while True:
            st.refresh()
            h = st.history()
            n = h["generation"].size
            assert h["population"].shape[0] == n and st.n_generations >= n
            np.testing.assert_array_equal(h["generation"], np.arange(n))
            if n:
                np.testing.assert_array_equal(h["population"][n - 1],
                                              expected_generation(n - 1, 50)[0])
            seen.append(n)
            if st.finished:
                break
            time.sleep(0.02)
    proc.communicate(timeout=30)
    assert seen == sorted(seen) and seen[-1] == n_gen
    assert any(0 < s < n_gen for s in seen)  # saw the run part-way


# --------------------------------------------------------------------------- errors

def test_missing_file_and_not_hdf5(tmp_path: Path) -> None:
    with pytest.raises(KingenError) as exc:
        RunStore.open(tmp_path / "nope.h5")
    assert one_line(exc).endswith("nope.h5: run file not found")
    text = tmp_path / "notes.h5"
    text.write_text("not HDF5\n", encoding="utf-8")
    with pytest.raises(KingenError) as exc:
        RunStore.open(text)
    assert "notes.h5: not an HDF5 file" in one_line(exc)
    empty = tmp_path / "empty.h5"
    empty.touch()
    with pytest.raises(KingenError, match="not an HDF5 file"):
        RunStore.open(empty)


def test_hdf5_that_is_not_a_run(tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(KingenError) as exc:
        RunStore.open(other)
    assert "other.h5: an HDF5 file, but not a kingen run file" in one_line(exc)


def test_truncated_run_file(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    size = run[0].stat().st_size
    for fraction in (0.999, 0.5, 0.05):
        bad = tmp_path / f"cut{fraction}.h5"
        shutil.copy(run[0], bad)
        with open(bad, "r+b") as fh:
            fh.truncate(int(size * fraction))
        for mode in ("r", "a"):
            with pytest.raises(KingenError) as exc:
                RunStore.open(bad, mode)
            assert f"cut{fraction}.h5: truncated run file" in one_line(exc)


def test_corrupt_run_file(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.h5"
    shutil.copy(run[0], bad)
    with open(bad, "r+b") as fh:
        fh.seek(2048)
        fh.write(b"\xff" * 4096)
    with pytest.raises(KingenError) as exc:
        with RunStore.open(bad) as st:
            st.history()
            st.best()
            st.recordings()
    assert "corrupt.h5: not a readable HDF5 file: corrupt or truncated run file" in one_line(exc)


def test_newer_layout_version(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    newer = tmp_path / "newer.h5"
    shutil.copy(run[0], newer)
    with h5py.File(newer, "a") as f:
        f.attrs["layout_version"] = LAYOUT_VERSION + 1
    with pytest.raises(KingenError) as exc:
        RunStore.open(newer)
    msg = one_line(exc)
    assert f"/layout_version = {LAYOUT_VERSION + 1}" in msg and "upgrade kingen" in msg


def test_missing_group(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    edited = tmp_path / "edited.h5"
    shutil.copy(run[0], edited)
    with h5py.File(edited, "a") as f:
        del f["hall_of_fame"]
    with pytest.raises(KingenError) as exc:
        RunStore.open(edited)
    assert "edited.h5: /hall_of_fame: missing group" in one_line(exc)


def test_bad_inputs_to_create(tmp_path: Path) -> None:
    scheme = Scheme.load(JONAS)
    kwargs: dict[str, Any] = dict(config_text="", config={}, scheme=scheme,
                                  protocols=small_protocols(("deactivation",)), targets={},
                                  population_size=4, environment={})
    with pytest.raises(KingenError) as exc:
        RunStore.create(tmp_path / "a.h5", recordings={"recovery": Recording(
            None, np.arange(3.0), np.zeros(3), ["a"])}, free_mask=scheme.free_mask, **kwargs)
    assert "recordings = 'recovery': recordings for a protocol that is not defined" in \
        one_line(exc)
    with pytest.raises(KingenError, match="free mask"):
        RunStore.create(tmp_path / "b.h5", recordings={}, free_mask=np.ones(3, bool), **kwargs)
    assert not (tmp_path / "a.h5").exists() and not (tmp_path / "b.h5").exists()
