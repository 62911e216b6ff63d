"""Search algorithms as ask/tell classes: a new one is one class, registered and driven by the
controller (resume included); the shipped ones resume run files written before they were
classes, and continue them exactly as those runs did."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_fit_helpers import write_problem

from kingen.errors import KingenError
from kingen.fitting import algorithms
from kingen.fitting.algorithms.base import Algorithm
from kingen.fitting.config import load_config
from kingen.fitting.evaluator import FromFunction
from kingen.fitting.objective import Evaluation
from kingen.fitting.state import Population
from kingen.runs.fit import fit, resume
from kingen.store import RunStore

OLD_STATES = Path(__file__).parent / "fixtures" / "resume" / "resume_states_v2.json"


# ---------------------------------------------------------------- a new algorithm, one class
class RandomSearch(Algorithm):
    """Uniform draws in the box each generation; the population keeps the μ best so far."""

    name = "random_search"

    def ask(self) -> np.ndarray:
        size = (self.settings.lambda_ if self.started else self.settings.population,
                self.space.n)
        return self.randoms.rng.uniform(self.space.low, self.space.up, size=size)

    def tell(self, scored: Population) -> None:
        if self.started:
            old = self.population
            scored = Population(*(np.concatenate([a, b]) for a, b in zip(
                (old.genes, old.fitness, old.errors, old.fail),
                (scored.genes, scored.fitness, scored.errors, scored.fail), strict=True)))
        keep = np.argsort(scored.fitness, kind="stable")[:self.settings.population]
        self.population = Population(scored.genes[keep], scored.fitness[keep],
                                     scored.errors[keep], scored.fail[keep])


@pytest.fixture
def random_search():
    algorithms.register(RandomSearch)
    yield RandomSearch
    algorithms.unregister(RandomSearch.name)


GA = 'algorithm = "random_search"\noffspring = 6\ngenerations = 4'


def test_a_new_algorithm_is_one_registered_class_driven_by_the_controller(tmp_path,
                                                                           random_search):
    whole = fit(write_problem(tmp_path, ga=GA), progress=False)
    assert whole.generations == 4 and np.isfinite(whole.fitness)
    with RunStore.open(whole.path) as store:
        history = store.history()
        assert history["fitness"].shape == (5, 8)  # the population it tells, every generation
        assert store.last_state()[1]["evaluations"] == 8 + 4 * 6
    # the hall of fame kept by the controller: the best of every candidate scored
    assert np.all(np.diff(whole.history["best"]) <= 0)
    assert whole.history["best"][-1] == np.min(history["fitness"])
    # stopped after 2 generations, then resumed to 4: as the uninterrupted run
    (tmp_path / "part").mkdir()
    part = write_problem(tmp_path / "part", ga=GA.replace("generations = 4", "generations = 2"))
    assert fit(part, progress=False).generations == 2
    resumed = resume(tmp_path / "part" / "run.h5", progress=False, generations=4)
    assert resumed.generations == 4
    np.testing.assert_array_equal(resumed.params, whole.params)
    np.testing.assert_array_equal(resumed.history["best"], whole.history["best"])


def test_an_algorithm_name_is_one_the_registry_knows(tmp_path, random_search):
    algorithms.unregister(RandomSearch.name)
    with pytest.raises(KingenError, match="random_search"):
        load_config(write_problem(tmp_path, ga=GA))
    algorithms.register(RandomSearch)
    assert load_config(write_problem(tmp_path, ga=GA)).ga.algorithm == "random_search"
    with pytest.raises(ValueError, match="registered already"):
        algorithms.register(type("Other", (RandomSearch,), {}))
    assert algorithms.algorithm_names()[-1] == "random_search"


# ---------------------------------------------------------------- run files of before
def _by_distance(objective):
    """Scores without the solver (the same numbers on every machine): squared distance of
    the rate constants to 1."""
    n_protocols = objective.n_protocols

    def evaluate(params):
        n = params.shape[0]
        return Evaluation(fitness=((params - 1.0) ** 2).sum(axis=1),
                          errors=np.zeros((n, n_protocols)), fail=np.zeros(n, dtype=np.int64),
                          amplitudes=np.ones((n, n_protocols))), {}

    return FromFunction(evaluate)


def _decoded(entry: dict) -> np.ndarray:
    dtype = np.dtype(entry["dtype"])
    data = [int(x) for x in entry["data"]] if dtype.kind == "u" else entry["data"]
    return np.array(data, dtype=dtype).reshape(entry["shape"])


def _assert_same_state(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, entry in want.items():
        expected = _decoded(entry)
        assert got[name].dtype == expected.dtype and got[name].shape == expected.shape, name
        if name == "elapsed":  # wall time
            continue
        if expected.dtype.kind == "f":  # the rate constants' powers may differ in the last bit
            np.testing.assert_allclose(got[name], expected, rtol=1e-12, atol=0, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], expected, err_msg=name)


@pytest.mark.parametrize("case, ga", [
    ("deap", 'operators = "deap"\noffspring = 6\ngenerations = 2'),
    ("numpy", 'operators = "numpy"\noffspring = 6\ngenerations = 2'),
    ("cmaes", 'algorithm = "cmaes"\noffspring = 6\ngenerations = 2')])
def test_run_files_written_before_the_algorithm_classes_resume_as_they_did(tmp_path, case, ga):
    old = json.loads(OLD_STATES.read_text(encoding="utf-8"))["cases"][case]
    first = fit(write_problem(tmp_path, ga=ga), progress=False, evaluator=_by_distance)
    with RunStore.open(first.path) as store:
        # the run file holds what the earlier code wrote, array for array
        _assert_same_state(store.last_state()[1], old["generation_2"])
    resumed = resume(first.path, progress=False, generations=4, evaluator=_by_distance)
    assert resumed.generations == 4
    with RunStore.open(resumed.path) as store:
        _assert_same_state(store.last_state()[1], old["generation_4"])


def _hall_by_ranking_all(hall, genes, fitness, k):
    """The hall's rule spelled out: the k best distinct finite rows of hall then batch,
    ties in that order."""
    g, f = np.vstack([hall.genes, genes]), np.concatenate([hall.fitness, fitness])
    g, f = g[np.isfinite(f)], f[np.isfinite(f)]
    _, first = np.unique(g, axis=0, return_index=True)
    g, f = g[np.sort(first)], f[np.sort(first)]
    order = np.argsort(f, kind="stable")[:k]
    return g[order], f[order]


def test_the_hall_of_fame_keeps_the_k_best_distinct_of_all_it_was_shown():
    from kingen.fitting.state import HallOfFame

    rng = np.random.default_rng(3)
    k = 10
    hall = HallOfFame(np.zeros((0, 3)), np.zeros(0))
    admitted = 0
    for size in (4, 30, 2000, 7, 2000, 2000):
        genes = rng.integers(0, 50, (size, 3)).astype(float)
        fitness = rng.random(size) * 2.0 ** -len(hall.fitness)
        fitness[rng.random(size) < 0.1] = np.nan
        if hall.fitness.size == k:  # ties with the hall's last, and copies of its rows
            fitness[:3] = hall.fitness[-1]
            genes[3:5], fitness[3:5] = hall.genes[:2], hall.fitness[:2] / 2.0
        want_g, want_f = _hall_by_ranking_all(hall, genes, fitness, k)
        before = hall.fitness.copy()
        hall = hall.merged(genes, fitness, k)
        np.testing.assert_array_equal(hall.genes, want_g)
        np.testing.assert_array_equal(hall.fitness, want_f)
        admitted += before.size == k and not np.array_equal(hall.fitness, before)
    assert admitted >= 2  # the full hall's fast path was taken, and let rows in
