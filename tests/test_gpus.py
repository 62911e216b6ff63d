"""One fit over several GPUs of one process (``kingen fit --gpus``): the row blocks' scores
are the one call's, bit for bit, and so is the fit. The blocks run here on the CPU backend
(no device to select) and under the CUDA simulator."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import kingen
from kingen.cli import main
from kingen.errors import KingenError
from kingen.fitting.gpus import GpuEvaluators, GpuShards, gpu_devices, parse_gpus
from kingen.fitting.scores import NoiseWeights
from kingen.solve import batch
from kingen.solve.batch import Simulator
from kingen.store import RunStore


@pytest.fixture(scope="module")
def demo():
    cfg = kingen.load_config(kingen.demo_config(), overrides={"backend": "cpu"})
    return cfg


def _objective(cfg):
    return kingen.Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu"))


def _rates(cfg, n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rates = cfg.scheme.values * np.exp(rng.normal(0.0, 0.4, (n, cfg.scheme.n_params)))
    rates = cfg.scheme.complete(rates)
    rates[2] = np.nan  # fails (code 4) without being solved, in its own block
    return rates


@pytest.mark.parametrize("blocks", [2, 3, 9])
def test_blocks_score_as_one_call(demo, blocks):
    objective = _objective(demo)
    # the likelihood, so that the copies must carry the noise model too
    objective.set_noise([NoiseWeights(trace=2.0, targets=np.ones(len(p.targets)))
                         for p in objective.plans])
    rates = _rates(demo, 7)
    reference, _ = objective.evaluate(rates, complete=False)
    with GpuShards(objective, [0] * blocks, select=None) as shards:
        ev, timings = shards(rates)
        assert len(shards.objectives) == blocks
    for name in ("fitness", "errors", "fail", "amplitudes", "chi2"):
        np.testing.assert_array_equal(getattr(ev, name), getattr(reference, name),
                                      err_msg=name)
    assert ev.fail[2] != 0 and ev.fail[[0, 1, 3]].tolist() == [0, 0, 0]
    assert timings["total_s"] >= timings["solve_s"] + timings["prepare_s"] > 0.0


def test_blocks_start_from_the_resting_occupancies_of_one_call(demo, monkeypatch):
    # Robert & Howe's resting class has two states: a block below 64 rows solved on its own
    # would take NumPy's solve, the whole batch the compiled loop, which differ at rounding
    scheme = kingen.Scheme.load(Path(__file__).resolve().parents[1] / "models"
                                / "robert_howe_2003.toml")
    objective = kingen.Objective(scheme, demo.protocols, demo.solver.replace(backend="cpu"))
    rng = np.random.default_rng(1)
    rates = scheme.complete(scheme.values * np.exp(rng.normal(0.0, 0.4,
                                                               (100, scheme.n_params))))
    whole = objective.simulator.inputs(objective.guard(rates, complete=False),
                                       complete=False)[1]
    started: dict[int, np.ndarray] = {}
    solver_rest = batch.solver_rest

    def record(*args, **kw):
        started[len(started)] = solver_rest(*args, **kw)[0]
        raise KingenError("stop before the solve")  # the kernels need not compile here

    with GpuShards(objective, [0, 0], select=None) as shards:
        monkeypatch.setattr(batch, "solver_rest", record)
        with pytest.raises(KingenError, match="stop before the solve"):
            shards(rates)
    blocks = sorted(started.values(), key=lambda s0: s0.shape[1])  # two of 50 rows
    assert [b.shape[1] for b in blocks] == [50, 50]
    got = {tuple(b[:, 0]): b for b in blocks}
    np.testing.assert_array_equal(np.hstack([got[tuple(whole[:, 0])],
                                             got[tuple(whole[:, 50])]]), whole)


def test_while_solving_is_called_once_on_the_callers_thread_after_every_launch(demo):
    launched = []
    original = kingen.Objective.evaluate

    def evaluate(self, params, *, while_solving=None, **kw):
        def note():
            launched.append(threading.get_ident())
            while_solving()
        return original(self, params, while_solving=note, **kw)

    called = []
    with GpuShards(_objective(demo), [0, 0, 0], select=None) as shards:
        kingen.Objective.evaluate = evaluate
        try:
            shards(_rates(demo, 7), while_solving=lambda: called.append(
                (threading.get_ident(), len(launched))))
        finally:
            kingen.Objective.evaluate = original
    assert called == [(threading.get_ident(), 3)]
    assert threading.get_ident() not in launched  # the blocks ran on their own threads


def test_the_switch_interval_is_short_during_a_call_and_restored_after(demo):
    import sys

    seen = []
    before = sys.getswitchinterval()
    def fails(*args, **kw):
        raise KingenError("a block failed")

    with GpuShards(_objective(demo), [0, 0], select=None, switch_interval=1e-3) as shards:
        shards(_rates(demo, 4), while_solving=lambda: seen.append(sys.getswitchinterval()))
        shards.objectives[1].evaluate = fails
        with pytest.raises(KingenError, match="a block failed"):
            shards(_rates(demo, 4))
        assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError):  # closed: its threads are gone
        shards(_rates(demo, 4))
    assert seen == [pytest.approx(1e-3)] and sys.getswitchinterval() == before


def test_a_blocks_error_reaches_the_caller_after_every_block_ended(demo):
    with GpuShards(_objective(demo), [0, 0], select=None) as shards:
        with pytest.raises(KingenError, match="params must have"):
            shards(np.ones((4, demo.scheme.n_params + 1)))
        ev, _ = shards(_rates(demo, 3))  # the threads are still there for the next call
    assert ev.fitness.shape == (3,)


def test_the_resting_occupancies_are_solved_once_on_the_callers_thread(demo, monkeypatch):
    import kingen.fitting.gpus as gpus
    import kingen.solve.inputs as inputs

    made = []

    def record(where, original, rows=-1):  # rows: the argument that holds the rows
        def call(*args, **kw):
            made.append((where, threading.get_ident(), len(args[rows])))
            return original(*args, **kw)
        return call

    rates = _rates(demo, 70)  # from 64 rows the compiled loop solves the occupancies
    reference, _ = _objective(demo).evaluate(rates, complete=False)
    with GpuShards(_objective(demo), [0, 0, 0], select=None) as shards:
        monkeypatch.setattr(gpus, "rest_occupancy_batch",
                            record("rest", gpus.rest_occupancy_batch))
        monkeypatch.setattr(inputs, "rest_occupancy_batch",
                            record("rest again", inputs.rest_occupancy_batch))
        monkeypatch.setattr(batch, "solver_rates", record("rates", batch.solver_rates, 1))
        ev, _ = shards(rates)
    here = threading.get_ident()
    # the occupancies once for the whole batch here (while the blocks start), each block's
    # rates on its own thread, and no block solves occupancies of its own
    assert [m for m in made if m[0] == "rest"] == [("rest", here, 70)]
    rates_made = [m for m in made if m[0] == "rates"]
    assert sorted(m[2] for m in rates_made) == [23, 23, 24]
    assert here not in {m[1] for m in rates_made} and len(made) == 4
    np.testing.assert_array_equal(ev.fitness, reference.fitness)
    np.testing.assert_array_equal(ev.fail, reference.fail)


def test_a_failed_solve_of_the_occupancies_ends_the_call_and_its_blocks(demo,
                                                                        monkeypatch):
    # the blocks wait on the caller's solve: it failing must end them, not leave them (and
    # the call, which waits for every block) waiting
    import kingen.fitting.gpus as gpus

    solve = gpus.rest_occupancy_batch

    def fails(*args):
        raise KingenError("no resting state")

    shards = GpuShards(_objective(demo), [0, 0], select=None)
    monkeypatch.setattr(gpus, "rest_occupancy_batch", fails)
    raised: list[BaseException] = []

    def call() -> None:
        try:
            shards(_rates(demo, 4))
        except BaseException as error:
            raised.append(error)

    # on its own thread, so that a call left waiting fails this test rather than hangs it
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(60.0)
    assert not caller.is_alive(), "the call still waits on blocks that wait on the solve"
    assert len(raised) == 1 and "no resting state" in str(raised[0])
    monkeypatch.setattr(gpus, "rest_occupancy_batch", solve)
    with shards:
        ev, _ = shards(_rates(demo, 4))  # the threads are free for the next call
    assert ev.fitness.shape == (4,)


def test_a_batch_with_the_wrong_columns_is_refused_before_any_loop_reads_it(demo,
                                                                           monkeypatch):
    import kingen.fitting.gpus as gpus

    read = []  # the occupancies' compiled loop reads the columns unchecked
    monkeypatch.setattr(gpus, "rest_occupancy_batch", lambda *a: read.append(a))
    with GpuShards(_objective(demo), [0, 0], select=None) as shards:
        for columns in (demo.scheme.n_params - 1, demo.scheme.n_params + 1):
            with pytest.raises(KingenError, match="params must have"):
                shards(np.ones((100, columns)))
    assert read == []


def test_each_block_takes_the_whole_batchs_launch(demo, monkeypatch):
    asked = []
    original = Simulator.launch_config

    def record(self, n_candidates=None):
        asked.append(n_candidates)
        return original(self, n_candidates)

    monkeypatch.setattr(Simulator, "launch_config", record)
    with GpuShards(_objective(demo), [0, 0], select=None) as shards:
        asked.clear()
        shards(_rates(demo, 5))
    assert asked == [5, 5]


def test_fit_over_blocks_equals_the_one_call_fit(demo, tmp_path):
    def config(name):
        cfg = kingen.load_config(kingen.demo_config(), overrides={
            "backend": "cpu", "generations": 3, "population": 8,
            "output": str(tmp_path / f"{name}.h5")})
        cfg.polish = False
        return cfg

    one = kingen.fit(config("one"), progress=False)
    made = []

    def blocks(objective):
        made.append(GpuShards(objective, [0, 0], select=None))
        return made[-1]

    try:
        spread = kingen.fit(config("blocks"), progress=False, evaluator=blocks)
    finally:
        for shards in made:
            shards.close()
    assert spread.fitness == one.fitness
    np.testing.assert_array_equal(spread.params, one.params)
    with RunStore.open(one.path) as a, RunStore.open(spread.path) as b:
        np.testing.assert_array_equal(a.history()["population"], b.history()["population"])
        np.testing.assert_array_equal(a.history()["fitness"], b.history()["fitness"])


def test_a_workqueue_threading_layer_is_refused(demo, monkeypatch):
    import numba

    monkeypatch.setattr(numba, "threading_layer", lambda: "workqueue")
    with pytest.raises(KingenError, match="omp or tbb threading layer"):
        GpuShards(_objective(demo), [0, 0], select=None)


@pytest.mark.parametrize("value, message", [
    ("two", "--gpus = 'two': give a number of GPUs or all"),
    ("0", "--gpus = '0': must be >= 1"),
    ("9" * 5000, "give a number of GPUs or all"),
])
def test_bad_gpu_counts_are_one_line(value, message):
    with pytest.raises(KingenError, match=message[:20]):
        parse_gpus(value)


def test_several_gpus_need_the_gpu_backend():
    assert gpu_devices("1", "cpu") == [0]
    with pytest.raises(KingenError, match="several GPUs need the GPU backend; this run "
                                          "solves on cpu"):
        gpu_devices("2", "cpu")
    with pytest.raises(KingenError, match="several GPUs need the GPU backend"):
        GpuEvaluators("all")(_objective(kingen.load_config(kingen.demo_config())))


@pytest.mark.parametrize("argv, message", [
    (["fit", "--demo", "--gpus", "two", "-q"], "--gpus = 'two': give a number of GPUs or all"),
    (["fit", "--demo", "--gpus", "2", "--backend", "cpu", "-q"],
     "several GPUs need the GPU backend; this run solves on cpu"),
    (["fit", "--demo", "--gpus", "2", "--cluster", "local:2", "-q"],
     "give --gpus or --cluster, not both"),
])
def test_the_gpus_option_on_the_command_line(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(argv + ["-o", str(tmp_path / "run.h5")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run.h5").exists()


def test_blocks_on_the_cuda_simulator_score_as_one_call():
    """The GPU path itself (a block's thread selects its device and solves there), on the
    CUDA simulator. One block: the simulator keeps the kernel it runs in one global, so two
    threads must not launch at once there (on GPUs they do; the two-GPU benchmark checks
    that the fit is the one-GPU fit)."""
    from test_fit_helpers import FOUR_STATE

    from kingen.experiment.protocol import standard_protocol
    from kingen.experiment.recordings import Recording
    from kingen.fitting.objective import Objective, ProtocolData
    from kingen.model.scheme import Scheme
    from kingen.solve import simulate_exact
    from kingen.solve.options import SolverOptions

    scheme = Scheme.loads(FOUR_STATE, "four_state.toml")
    protocol = standard_protocol("deactivation", dt=0.1)
    clean = simulate_exact(scheme, protocol).sweeps
    recording = Recording(protocol.name, [s.times() for s in protocol.sweeps],
                          [1.01 * c.current for c in clean],
                          [s.label for s in protocol.sweeps])
    objective = Objective(scheme, [ProtocolData(protocol, recording)],
                          SolverOptions(backend="cuda"))
    assert objective.simulator.backend == "cuda"
    rates = np.vstack([scheme.values * f for f in (1.0, 1.2, 0.8)])
    reference, _ = objective.evaluate(rates)
    with GpuShards(objective, [0]) as shards:
        ev, _ = shards(scheme.complete(rates))
        assert shards._pools[0].submit(threading.current_thread).result().name.startswith(
            "kingen-gpu0")
    np.testing.assert_array_equal(ev.fitness, reference.fitness)
    np.testing.assert_array_equal(ev.amplitudes, reference.amplitudes)


def test_kingen_info_names_the_gpus_option_on_a_machine_with_several(monkeypatch, capsys):
    from numba import cuda

    import kingen.solve.backends as backends

    monkeypatch.setattr(backends, "cuda_status", lambda: backends.CudaStatus(
        usable=True, simulator=False, device="NVIDIA H200", reason=""))
    from types import SimpleNamespace

    monkeypatch.setattr(cuda, "gpus", [SimpleNamespace(name=b"NVIDIA H200")] * 2)
    assert main(["info"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("GPU:"))
    assert line == ("GPU: NVIDIA H200 (the cuda backend is used by default; 2 GPUs: kingen "
                    "fit --gpus 2 spreads a fit over them)")
