"""The GA keeps its best, the figures show the reported best, and a fit says whether it
converged: stagnation stops it, a maximum does not count as converging."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_fit_helpers import write_problem

from kingen.fitting.engine import convergence_of, verdict
from kingen.fitting.selection import keep_best
from kingen.runs.fit import fit
from kingen.store import RunStore, RunView

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


# --------------------------------------------------------------------------- the figure

def test_the_parameter_figure_plots_the_reported_best_not_the_populations(tmp_path):
    from test_store import JONAS, STATE_FIELDS, small_protocols

    from kingen.model.scheme import Scheme
    from kingen.outputs.searchplots import parameter_figure

    scheme = Scheme.load(JONAS)
    protocols = small_protocols(("deactivation",))
    lo, hi = scheme.lower, scheme.upper
    # generation 0's best (A) is lost in generation 1, whose best (B) is worse; the
    # reported best (C, the polished hall of fame's first) is neither
    a, b, c = (lo * (hi / lo) ** q for q in (0.2, 0.8, 0.5))
    path = tmp_path / "run.h5"
    store = RunStore.create(path, config_text="", config={}, scheme=scheme,
                            protocols=protocols, recordings={}, targets={},
                            free_mask=scheme.free_mask, population_size=2,
                            environment={}, state_fields=STATE_FIELDS, overwrite=True)
    with store:
        for g, (best, fitness) in enumerate(((a, 0.1), (b, 0.5))):
            store.append_generation(
                generation=g, population=np.vstack([best, hi]),
                errors=np.array([[fitness], [9.0]]), fitness=np.array([fitness, 9.0]),
                fail=np.zeros(2, int), stats={"best": 0.1}, timings={"total_s": 0.1},
                state={"generation": np.int64(g), "pop": np.zeros((12, 16))})
        store.write_hall_of_fame(a[None, :], np.array([0.1]))
        store.write_best(params=c, fitness=0.05, errors={"deactivation": 0.05},
                         amplitudes={"deactivation": 100.0}, traces={}, features={},
                         polish=None)
    with RunStore.open(path) as st:
        fig = parameter_figure(RunView(st))
    ax = fig.axes[0]
    free = np.flatnonzero(scheme.free_mask)
    names = set(scheme.param_names)
    lines = [line for line in ax.get_lines() if line.get_label() in names]
    dots = [line for line in ax.get_lines() if line.get_gid() == "reported best"]
    assert len(lines) == len(dots) == free.size
    for line, dot, j in zip(lines, dots, free, strict=True):
        p = scheme.parameters[j]
        y = line.get_ydata()
        expect = [np.log10(a[j] / p.lower) / np.log10(p.upper / p.lower)] * 2  # best so far
        np.testing.assert_allclose(y, expect, rtol=1e-9)
        np.testing.assert_allclose(dot.get_ydata(), [0.5], rtol=1e-9)
    assert "reported best" in ax.get_title()


# --------------------------------------------------------------------------- stopping

def test_a_fit_that_stagnates_stops_converged_and_says_so(tmp_path):
    cfg = write_problem(tmp_path, free=["k2o"], ga="generations = 60",
                        extra="[stop]\npatience = 3")
    result = fit(cfg, progress=False)
    assert result.reason == "no improvement for 3 generations" and result.generations < 60
    assert result.converged is True
    line = ("converged: the best improved by less than 1e-06 (relative) for 3 generations")
    assert result.convergence == line and result.summary().splitlines()[1] == line
    with RunStore.open(tmp_path / "run.h5") as st:
        assert st.finished == f"no improvement for 3 generations; {line}"
        assert RunView(st).convergence == (True, line)


def test_a_fit_stopped_at_its_maximum_is_not_converged(tmp_path):
    cfg = write_problem(tmp_path, ga="generations = 2")
    result = fit(cfg, progress=False)
    assert result.reason == "maximum generations (2)" and result.converged is False
    assert result.convergence.startswith("not converged: maximum generations (2) reached")
    assert result.summary().splitlines()[1] == result.convergence
    with RunStore.open(tmp_path / "run.h5") as st:
        assert RunView(st).convergence == (False, result.convergence)
        assert st.finished == f"maximum generations (2); {result.convergence}"


def test_stagnation_stops_a_fit_by_default():
    from kingen.fitting.config import DEFAULT_PATIENCE, StopSettings

    assert StopSettings().patience == DEFAULT_PATIENCE == 20


@pytest.mark.parametrize("finished, expect", [
    ("no improvement for 15 generations", True),
    ("target error 0.01 reached", True),
    ("maximum generations (40)", False),
    ("wall-time limit 3600 s", False),
    ("maximum generations (40); every candidate failed", False),
    (None, None),
])
def test_run_files_from_before_still_read(finished, expect):
    ok, line = convergence_of(finished)
    assert ok is expect
    assert (line == "") == (finished is None)


def test_the_summary_line_says_how_much_the_best_still_improved():
    from kingen.fitting.config import StopSettings

    best = np.array([1.0] * 5 + [0.9, 0.8, 0.7])
    ok, line = verdict("wall-time limit 60 s", best, StopSettings(patience=2))
    assert not ok and line == ("not converged: wall-time limit 60 s reached while the best "
                               "still improved by 22 % over the last 2 generations")
    ok, line = verdict("maximum generations (7)", np.ones(8), StopSettings(patience=0))
    assert not ok and "stagnation rule is off" in line
    assert verdict("maximum generations (0)", np.ones(1), StopSettings())[0] is False


def test_an_old_run_file_reads_its_stop_reason(tmp_path: Path):
    from test_store import make_run

    make_run(tmp_path / "old.h5", finished="maximum generations (6)")
    with RunStore.open(tmp_path / "old.h5") as st:
        assert RunView(st).convergence == (False,
                                           "not converged: maximum generations (6)")
