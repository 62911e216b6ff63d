"""The search: batched evaluation, determinism, operators, CMA-ES, resume, the demo files."""

from __future__ import annotations

import filecmp
import io
import random
from pathlib import Path

import numba
import numpy as np
import pytest
from deap import tools
from test_fit_helpers import ROOT, TRUTH_MODEL, whole_and_half_run, write_problem

import kingen.fitting.operators
import kingen.solve.batch as batch
from kingen.cli.fit import demo_config
from kingen.fitting.config import load_config
from kingen.fitting.operators import np_poly_bounded, np_sbx_bounded
from kingen.fitting.params import PARALLEL_FROM_ROWS
from kingen.fitting.progress import Progress
from kingen.fitting.selection import (
    keep_best,
    np_sel_tournament,
    pool_origin,
    survivors,
    take_pool,
    take_survivors,
)
from kingen.runs.fit import fit, resume
from kingen.store import RunStore


@pytest.fixture
def solver_calls(monkeypatch):
    calls: list[tuple[str, int]] = []
    original = batch.Simulator.run

    def counting(self, params, mode="objective", **kw):
        calls.append((mode, np.atleast_2d(params).shape[0]))
        return original(self, params, mode, **kw)

    monkeypatch.setattr(batch.Simulator, "run", counting)
    return calls


def test_one_batched_solver_call_per_generation(tmp_path, solver_calls):
    cfg = write_problem(tmp_path, ga="offspring = 12")
    result = fit(cfg, progress=False)
    objective_calls = [n for mode, n in solver_calls if mode == "objective"]
    # generation 0 (μ = 8), 3 generations (at most λ = 12 each), the final best: one each
    assert len(objective_calls) == 1 + 3 + 1
    assert objective_calls[0] == 8 and all(n <= 12 for n in objective_calls[1:4])
    assert sum(objective_calls[1:4]) > 12  # whole offspring batches, not single candidates
    # the noise model at the search's start and at its best, the hall of fame (10) scored
    # on it, the traces of the best, then the local uncertainty on the same noise model:
    # the best with its 2 forward-difference perturbations (the Jacobian) in one call
    assert [n for m, n in solver_calls if m == "traces"] == [1, 1, 10, 1, 3]
    assert result.generations == 3 and np.isfinite(result.fitness)
    assert len(result.timings["solver_s"]) == 4


@pytest.mark.parametrize("operators", ["deap", "numpy"])
def test_the_generation_timings_split_the_ga_and_the_objective(tmp_path, operators):
    result = fit(write_problem(tmp_path, ga=f'operators = "{operators}"'), progress=False)
    t = {k: np.asarray(v, dtype=float) for k, v in result.timings.items() if k != "wall_s"}
    parts = [f"ga_{k}" for k in ("variation_s", "hof_s", "select_s")]
    for key in parts:  # the initial population is drawn, not varied or selected
        assert np.isnan(t[key][0]) and np.all(t[key][1:] > 0), key
    assert np.all(t["ga_stats_s"] > 0)
    assert np.all(sum(t[k][1:] for k in parts) + t["ga_stats_s"][1:] <= t["ga_s"][1:] + 1e-6)
    assert np.all((t["params_s"] > 0) & (t["params_s"] <= t["objective_s"] + 1e-6))
    host = t["solver_prepare_s"] + t["solver_finish_s"]  # the solver's host work
    assert np.all((t["solver_prepare_s"] > 0) & (host < t["solver_s"]))


def test_same_seed_same_result_and_another_seed_differs(tmp_path):
    runs = []
    for name, seed in (("a", None), ("b", None), ("c", 99)):
        d = tmp_path / name
        d.mkdir()
        runs.append(fit(write_problem(d), progress=False, overrides={"seed": seed}))
    a, b, c = runs
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.history["best"], b.history["best"])
    assert not np.array_equal(a.params, c.params)


def test_numpy_operators_and_cmaes_are_deterministic(tmp_path):
    results = []
    for k in range(2):
        d = tmp_path / str(k)
        d.mkdir()
        results.append(fit(write_problem(d, ga='operators = "numpy"'), progress=False))
    np.testing.assert_array_equal(results[0].params, results[1].params)
    d = tmp_path / "cma"
    d.mkdir()
    r = fit(write_problem(d, ga='algorithm = "cmaes"\noffspring = 10\ngenerations = 4'),
            progress=False)
    assert r.generations == 4 and np.isfinite(r.fitness)
    assert r.history["best"][-1] <= r.history["best"][0]


def test_numbers_drawn_during_the_solve_are_those_drawn_in_turn(tmp_path, monkeypatch):
    from kingen.fitting.algorithms.base import Randoms

    ga = 'operators = "numpy"\noffspring = 12\ngenerations = 5'
    ahead = fit(write_problem(tmp_path, ga=ga), progress=False)
    monkeypatch.setattr(Randoms, "draw_ahead", lambda self, draw: None)  # drawn in turn
    (tmp_path / "turn").mkdir()
    in_turn = fit(write_problem(tmp_path / "turn", ga=ga), progress=False)
    np.testing.assert_array_equal(ahead.params, in_turn.params)
    with RunStore.open(ahead.path) as a, RunStore.open(in_turn.path) as b:
        np.testing.assert_array_equal(a.history()["population"], b.history()["population"])
        np.testing.assert_array_equal(a.last_state()[1]["rng_pcg64"],
                                      b.last_state()[1]["rng_pcg64"])


def test_the_write_and_the_draws_start_after_the_solve_is_prepared(tmp_path, monkeypatch):
    # Started before, they would compete with the solve's preparation for the interpreter's
    # lock: the background work of each generation starts between preparing and solving.
    from kingen.fitting.algorithms.base import Randoms
    from kingen.fitting.engine import Engine

    events: list[str] = []
    start_write, draw_ahead = Engine._start_write, Randoms.draw_ahead
    rates = batch.solver_rates

    def logged_write(self):
        if self._queued is not None:
            events.append("write")
        start_write(self)

    def logged_draws(self, draw):
        if self._ahead is None:
            events.append("draws")
        draw_ahead(self, draw)

    monkeypatch.setattr(Engine, "_start_write", logged_write)
    monkeypatch.setattr(Randoms, "draw_ahead", logged_draws)
    cpu_call = batch.Simulator._cpu_call
    monkeypatch.setattr(batch, "solver_rates",
                        lambda *a, **k: (events.append("prepare"), rates(*a, **k))[1])
    monkeypatch.setattr(batch.Simulator, "_cpu_call",
                        lambda self, *a: (events.append("solve"), cpu_call(self, *a))[1])
    ga = 'operators = "numpy"\noffspring = 12\ngenerations = 3'
    fit(write_problem(tmp_path, ga=ga), progress=False)
    # the initial population, then each generation: prepare, the last write and the next
    # numbers, solve (on the CPU the work starts just before the solve, on the GPU once its
    # kernels are launched); the last generation's write is the run's final flush (what
    # follows, the best candidate's polish and traces, starts no background work)
    # (the first solve, before the search, is the noise model at its start)
    expected = (["prepare", "solve"] + ["prepare", "draws", "solve"]
                + ["prepare", "write", "draws", "solve"] * 3 + ["write"])
    assert events[:len(expected)] == expected
    assert set(events[len(expected):]) <= {"prepare", "solve"}


def test_an_evaluator_without_the_hook_gets_the_background_work_started_before_it(
        tmp_path):
    from kingen.fitting.engine import Engine
    from kingen.fitting.evaluator import FromFunction
    from kingen.fitting.objective import Evaluation

    cfg = load_config(write_problem(tmp_path, ga='operators = "numpy"\noffspring = 8'))
    seen: list[bool] = []

    def by_sum(params):  # the shape of the Evaluate doctest: no while_solving
        seen.append(engine._queued is None)
        n = params.shape[0]
        return Evaluation(fitness=params.sum(axis=1), errors=np.zeros((n, 1)),
                          fail=np.zeros(n, dtype=np.int64), amplitudes=np.ones((n, 1))), {}

    class Store:
        def append_generation(self, **_):
            pass

    class Obj:
        n_protocols = 1

    engine = Engine(cfg, Obj(), Store(), Progress(2, enabled=False),
                    evaluate=FromFunction(by_sum))
    state = engine.start()
    engine.record(state, 0.0)
    assert engine._queued is not None
    engine.generation(state)
    assert seen == [True, True]  # the queued write had started when it was called


def test_numpy_operators_follow_deaps_formulas():
    rng = np.random.default_rng(0)
    low, up = np.zeros(5), np.ones(5)
    p1, p2 = rng.random((20000, 5)), rng.random((20000, 5))
    rows = np.arange(20000)
    kids = np_sbx_bounded(np.vstack([p1, p2]), rows, rows + 20000, 15.0, low, up, rng)
    assert np.all((kids >= 0) & (kids <= 1))
    # the same statistics as DEAP's operator on the same parents
    random.seed(0)
    deap_kids = np.array([tools.cxSimulatedBinaryBounded(list(a), list(b), 15.0, 0.0, 1.0)[0]
                          for a, b in zip(p1, p2, strict=True)])
    for x in (kids, deap_kids):
        changed = np.mean(np.abs(x - p1) > 1e-12)
        assert 0.4 < changed < 0.6  # each gene crosses with probability 0.5
    assert np.mean(np.abs(kids - p1)) == pytest.approx(np.mean(np.abs(deap_kids - p1)),
                                                       rel=0.05)
    m = np_poly_bounded(p1, rows, 20.0, low, up, 0.2, rng)
    assert np.mean(m != p1) == pytest.approx(0.2, abs=0.01)
    random.seed(1)
    dm = np.array([tools.mutPolynomialBounded(list(a), 20.0, 0.0, 1.0, 0.2)[0] for a in p1])
    assert np.mean(np.abs(m - p1)) == pytest.approx(np.mean(np.abs(dm - p1)), rel=0.1)
    fit_ = np.array([3.0, 1.0, 2.0, 0.5])
    chosen = np_sel_tournament(fit_, 4000, 3, rng)
    # P(best of 4 wins a 3-tournament) = 1 - (3/4)^3
    assert np.mean(chosen == 3) == pytest.approx(1 - 0.75 ** 3, abs=0.03)


def _feed(monkeypatch, values):
    """Make DEAP's operators draw ``values`` from random.random, in order."""
    it = iter(values)
    monkeypatch.setattr(random, "random", lambda: float(next(it)))


@pytest.mark.parametrize("parallel", [False, True], ids=["one-thread", "all-threads"])
def test_numpy_operators_give_deaps_children_exactly(monkeypatch, parallel):
    # Small batches run on the calling thread alone; both paths must give DEAP's children.
    monkeypatch.setattr(kingen.fitting.operators, "PARALLEL_FROM_GENES", 0 if parallel else 1 << 40)
    threads = numba.get_num_threads()
    rng = np.random.default_rng(3)
    n, m = 300, 6
    low, up = rng.uniform(-3.0, 0.0, m), rng.uniform(0.5, 3.0, m)
    pop = rng.uniform(low, up, (2 * n, m))
    pop[n: n + 20] = pop[:20]  # identical parents do not cross
    first, second = np.arange(n), np.arange(n, 2 * n)
    kids = np_sbx_bounded(pop, first, second, 15.0, low, up, np.random.default_rng(7))
    cross, spread, swap = np.random.default_rng(7).random((3, n, m))
    for k in range(n):
        p1, p2 = pop[first[k]], pop[second[k]]
        draws = []
        for j in range(m):
            draws.append(cross[k, j])
            if cross[k, j] <= 0.5 and abs(p1[j] - p2[j]) > 1e-14:
                draws += [spread[k, j], swap[k, j]]
        _feed(monkeypatch, draws)
        child = tools.cxSimulatedBinaryBounded(list(p1), list(p2), 15.0, list(low), list(up))[0]
        np.testing.assert_array_equal(kids[k], child)

    parents = rng.integers(0, 2 * n, n)
    out, rows = np.full((n + 5, m), np.nan), rng.permutation(n + 5)[:n]
    np_poly_bounded(pop, parents, 20.0, low, up, 0.3, np.random.default_rng(8), out=out,
                    rows=rows)
    mutate, rand = np.random.default_rng(8).random((2, n, m))
    for k in range(n):
        draws = []
        for j in range(m):
            draws.append(mutate[k, j])
            if mutate[k, j] <= 0.3:
                draws.append(rand[k, j])
        _feed(monkeypatch, draws)
        mutant = tools.mutPolynomialBounded(list(pop[parents[k]]), 20.0, list(low), list(up),
                                            0.3)[0]
        np.testing.assert_array_equal(out[rows[k]], mutant)
    assert np.isnan(out[np.setdiff1d(np.arange(n + 5), rows)]).all()  # other rows untouched
    assert numba.get_num_threads() == threads
    with pytest.raises(IndexError):
        np_poly_bounded(pop, [2 * n], 20.0, low, up, 0.3, rng)


def test_tournament_picks_as_argmin_with_ties_infinities_and_nans():
    rng = np.random.default_rng(4)
    fitness = rng.integers(0, 4, 50).astype(float)
    fitness[rng.random(50) < 0.2] = np.inf
    fitness[rng.random(50) < 0.1] = np.nan
    chosen = np_sel_tournament(fitness, 2000, 3, np.random.default_rng(5))
    aspirants = np.random.default_rng(5).integers(0, 50, size=(2000, 3))
    expected = aspirants[np.arange(2000), np.argmin(fitness[aspirants], axis=1)]
    np.testing.assert_array_equal(chosen, expected)


def test_survivors_are_the_pools_rows_without_building_the_pool():
    rng = np.random.default_rng(6)
    mu, lam = 40, 70
    chosen = rng.integers(0, mu + lam, mu)
    chosen[:2] = [mu - 1, mu]  # the last parent and the first child
    for parents, offspring in ((rng.random((mu, 5)), rng.random((lam, 5))),
                               (rng.random((mu, 2, 3)), rng.random((lam, 2, 3))),
                               (rng.integers(0, 9, mu), rng.integers(0, 9, lam))):
        got = take_survivors(parents, offspring, chosen)
        want = np.concatenate([parents, offspring]).take(chosen, 0)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    # an evaluator's narrower failure codes: concatenate's type, not the parents'
    got = take_survivors(np.zeros(mu, np.int32), np.arange(lam), chosen)
    assert got.dtype == np.int64 and got[1] == 0 and got.max() == chosen.max() - mu
    with pytest.raises(IndexError):
        take_survivors(parents, offspring, [mu + lam])
    with pytest.raises(ValueError, match="differ in shape"):
        take_survivors(np.zeros((3, 2)), np.zeros((3, 4)), [0])


def _survival_by_parts(origin, aspirants, parents, new):
    """(mu + lambda) survival as the fit did it array by array before the fused passes."""
    pool_f = take_pool(origin, np.arange(origin.size), parents[0], new[0])
    chosen = keep_best(pool_f, np_sel_tournament(pool_f, *aspirants.shape, None, aspirants))
    return (pool_f.take(chosen),) + tuple(take_pool(origin, chosen, a, b)
                                          for a, b in zip(parents[1:], new[1:], strict=True))


@pytest.mark.parametrize("mu", [40, PARALLEL_FROM_ROWS])  # calling thread; numba's threads
@pytest.mark.parametrize("seed", range(4))
def test_fused_survival_chooses_and_copies_the_rows_of_the_parts(mu, seed):
    rng = np.random.default_rng(seed)
    lam = mu + 7
    source = np.where(rng.random(lam) < 0.3, rng.integers(0, mu, lam), -1)
    n_new = int((source < 0).sum())

    def scored(n):
        f = rng.integers(0, 5, n).astype(float)  # ties
        for value, share in ((np.inf, 0.2), (np.nan, 0.1), (-np.inf, 0.02 * (seed % 2))):
            f[rng.random(n) < share] = value
        if seed == 3:
            f[:] = np.nan  # no finite fitness: nothing kept
        return f, rng.random((n, 3)), rng.random((n, 4)), rng.integers(0, 3, n)

    parents, new = scored(mu), scored(n_new)
    origin = pool_origin(mu, source)
    aspirants = rng.integers(0, mu + lam, (mu, 3))
    if seed == 1:
        aspirants[:, :] = np.argmax(origin == -1)  # only one new row taken: best kept
    got = survivors(origin, aspirants, parents, new)
    want = _survival_by_parts(origin, aspirants, parents, new)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_fused_survival_refuses_rows_out_of_range():
    origin = pool_origin(2, np.array([-1, 0]))
    rows = (np.zeros(2), np.zeros((2, 1)), np.zeros((2, 1)), np.zeros(2, int))
    new = tuple(a[:1] for a in rows)
    with pytest.raises(IndexError):
        survivors(origin, np.array([[0, 4]]), rows, new)
    with pytest.raises(IndexError):
        survivors(origin, np.array([[0, 2]]), rows, tuple(a[:0] for a in rows))
    with pytest.raises(ValueError, match="differ in shape"):
        survivors(origin, np.array([[0, 2]]), rows, (new[0], np.zeros((1, 2)), *new[2:]))


def test_resume_ends_as_an_uninterrupted_run(tmp_path):
    full, part = whole_and_half_run(tmp_path, "generations = 4", 2)
    resumed = resume(part / "run.h5", progress=False, generations=4)
    assert resumed.generations == 4
    np.testing.assert_array_equal(resumed.params, full.params)
    np.testing.assert_array_equal(resumed.history["best"], full.history["best"])


def test_progress_line_on_a_terminal_and_in_a_log():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, log = Tty(), io.StringIO()
    for stream in (tty, log):
        p = Progress(10, stream=stream)
        p.update(1, 0.5, 0.9, 1234.0, 65.0)
        p.update(2, 0.4, 0.8, 1234.0, 5.0)
        p.close()
    assert tty.getvalue().count("\r") == 2 and tty.getvalue().endswith("\n")
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "gen 1/10" in lines[0] and "ETA 1m05s" in lines[0]
    assert "cand/s" in lines[1]


def test_a_fits_first_lines_say_why_it_waits_and_guess_no_eta_from_the_solvers_load(
        tmp_path):
    cfg = write_problem(tmp_path, ga="generations = 3")
    for run in (lambda out: fit(cfg, stream=out),
                lambda out: resume(tmp_path / "run.h5", stream=out, generations=6)):
        out = io.StringIO()
        run(out)
        lines = [line for line in out.getvalue().splitlines() if line.startswith("gen ")]
        first = int(lines[0].split()[1].split("/")[0])
        assert "compiles its solver" in lines[0] and "ETA" not in lines[0]
        # the first generation's time includes loading the solver: no ETA from it
        assert lines[1].startswith(f"gen {first}/") and lines[1].endswith("ETA ?")
        assert all("ETA ?" not in line for line in lines[2:]) and len(lines) >= 4


def test_a_fit_that_can_break_reversibility_says_so_first(tmp_path):
    cfg = write_problem(tmp_path, ga="generations = 1")
    # the published Jonas scheme, whose cycles have no derived rate (the problem's truth
    # model derives k42 and k54)
    (tmp_path / "model.toml").write_text((ROOT / "models" / "jonas_1993.toml").read_text())
    out = io.StringIO()
    fit(cfg, progress=False, stream=out)
    # k2o and ko2 are fitted: only the cycle through O can leave reversibility
    assert out.getvalue().splitlines() == [
        'kingen: warning: cycle C4-C5-O-C2-C4 has no derived rate, so the fit searches rates '
        'that break microscopic reversibility; mark one derived, e.g. "C4 -> C5" = '
        '{ rate = "k45", derived = true } (or set model.check_reversibility = false)']
    out = io.StringIO()
    (tmp_path / "model.toml").write_text(TRUTH_MODEL.read_text())
    fit(cfg, progress=False, stream=out, overwrite=True)
    assert out.getvalue() == ""


def test_polish_reports_before_and_after(tmp_path):
    r = fit(write_problem(tmp_path, extra="polish = true\npolish_evaluations = 5"),
            progress=False)
    assert r.polish is not None and r.polish["objective"] == "chi2"
    assert r.polish["chi2_after"] <= r.polish["chi2_before"]
    assert r.polish["chi2_after"] == r.fitness and r.polish["starts"] == 4
    assert "refinement: χ²" in r.summary()


def test_bundled_demo_matches_the_example_data():
    cfg = demo_config()
    bundled = cfg.parent / "demo"
    for f in bundled.iterdir():
        assert filecmp.cmp(f, ROOT / "data" / f.name, shallow=False), f.name
    loaded = load_config(cfg, overrides={"backend": "cpu"})
    assert [p.protocol.kind for p in loaded.protocols] == [
        "deactivation", "desensitization", "recovery", "dose_response"]
    assert all(p.recording is not None and p.recording.meta.get("synthetic")
               for p in loaded.protocols)
    assert Path(loaded.output).name == "kingen_demo.h5"
