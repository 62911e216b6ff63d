"""The GA keeps its best."""

from __future__ import annotations

import numpy as np
import pytest
from test_fit_helpers import write_problem

from kingen.search.operators import keep_best
from kingen.search.run import fit
from kingen.store import RunStore

# --------------------------------------------------------------------------- elitism


@pytest.mark.parametrize("operators", ["deap", "numpy"])
def test_the_populations_best_never_gets_worse(tmp_path, operators):
    # 3 free rates, 6 parents and 6 children, tournaments of 2: without elitism the
    # tournaments pass over the best within these generations
    cfg = write_problem(tmp_path, free=["k2o", "ko2", "k01"],
                        ga=f'tournament = 2\ngenerations = 12\noperators = "{operators}"',
                        extra="[stop]\npatience = 0")
    fit(cfg, progress=False, overrides={"population": 6})
    with RunStore.open(tmp_path / "run.h5") as store:
        h = store.history(population=False)
    population_best = np.nanmin(np.where(np.isfinite(h["fitness"]), h["fitness"], np.nan),
                                axis=1)
    assert np.all(np.diff(population_best) <= 0), population_best
    # the population holds the hall of fame's best at every generation
    np.testing.assert_array_equal(population_best, h["best"])


def test_keep_best_gives_the_best_the_worst_survivors_place():
    fitness = np.array([0.4, np.nan, 0.1, 0.9, np.inf, 0.3])
    assert keep_best(fitness, np.array([0, 3, 5])).tolist() == [0, 2, 5]
    assert keep_best(fitness, np.array([0, 1, 4])).tolist() == [0, 2, 4]  # NaN is worst
    assert keep_best(fitness, np.array([2, 3])).tolist() == [2, 3]  # chosen already
    assert keep_best(np.array([np.inf, np.nan]), np.array([0])).tolist() == [0]
