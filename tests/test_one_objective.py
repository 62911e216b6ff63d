"""One objective from the fit to the interval: the fit minimises the likelihood that
``kingen profile`` and the Fisher information use, ends at its optimum by a batched
Levenberg–Marquardt refinement, and ``kingen profile`` agrees with it (and updates the
run's best when it finds a better point)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from test_fit_helpers import write_problem

from kingen.fitting.objective import NoiseWeights
from kingen.identify.refine import stored_noise
from kingen.runs.fit import fit
from kingen.runs.profile import profile_run, run_likelihood
from kingen.store import RunStore, RunView

TRUTH = {"k2o": 4.24, "ko2": 0.9}  # the rates the data were made with (the model file's)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A finished fit on the likelihood: two rates of the Jonas scheme, deactivation and
    desensitization recordings made by the exact reference (not by the GA)."""
    tmp = tmp_path_factory.mktemp("one_objective")
    cfg = write_problem(tmp, protocols=("deactivation", "desensitization"),
                        extra="polish = true\npolish_evaluations = 40\npolish_starts = 3")
    result = fit(cfg, progress=False)
    return tmp / "run.h5", result


def test_the_fit_scores_the_likelihood_kingen_profile_computes(fitted):
    run, result = fitted
    with RunStore.open(run) as store:
        lik, problem = run_likelihood(store, "cpu")
        best = store.best()
    genes = problem.best_genes[None, :]
    _, chi2 = lik.residuals(genes)
    assert best["polish"]["objective"] == "chi2"
    # the run's best fitness IS the profile's χ² at the same parameters
    assert best["fitness"] == pytest.approx(chi2[0], rel=1e-9)
    assert result.fitness == pytest.approx(chi2[0], rel=1e-9)
    # ... and the search's batched kernel scores it the same, once given the stored noise
    objective = problem.objective
    assert objective.fitness_kind == "relative"  # a bare objective: the old relative error
    from kingen.identify.likelihood import noise_weights

    objective.set_noise(noise_weights(lik))
    ev, _ = objective.evaluate(problem.pmap.to_params(genes))
    assert ev.fitness[0] == pytest.approx(chi2[0], rel=1e-9)
    assert ev.chi2[0] == pytest.approx(chi2[0], rel=1e-9)


def test_the_fit_ends_at_its_optimum_and_says_why(fitted):
    run, result = fitted
    rec = result.polish
    assert rec["starts"] == 3 and rec["chi2_after"] <= rec["chi2_before"]
    assert result.converged is True
    assert result.convergence.startswith("converged: the Levenberg-Marquardt refinement")
    assert rec["stopped"] in result.convergence
    with RunStore.open(run) as store:
        hof = store.hall_of_fame()
    # the hall of fame is ordered by the likelihood, the refined best first
    assert hof[1][0] == pytest.approx(result.fitness) and np.all(np.diff(hof[1]) >= 0)


def test_the_fit_and_the_profile_agree_and_cover_the_truth(fitted, tmp_path):
    run, result = fitted
    copy = tmp_path / "run.h5"
    shutil.copy(run, copy)
    prof = profile_run(copy, points=7, backend="cpu", progress=False)
    assert prof.extra["finished"]
    for row in prof.rows:
        assert row["identifiable"], row
        fitted_value = result.values[row["name"]]
        # the fit's best and the profile's best: within 0.01 decades
        assert abs(math.log10(row["best"] / fitted_value)) < 0.01, row
        assert row["lower"] < TRUTH[row["name"]] < row["upper"], row
    # no better point than the fit's: the run's best stays as the fit wrote it
    with RunStore.open(copy) as store:
        assert store.best()["polish"]["updates"] == []


def test_the_profile_makes_a_better_point_the_runs_best(fitted, tmp_path):
    run, _ = fitted
    copy = tmp_path / "run.h5"
    shutil.copy(run, copy)
    with RunStore.open(copy) as store:
        truth = store.best()
        hof = store.hall_of_fame()
    # a run whose best is a worse member of its hall of fame: the profile finds better
    from kingen.store.best import write_best

    with RunStore.open(copy) as store:
        lik, problem = run_likelihood(store, "cpu")
    worse = problem.pmap.to_genes(hof[0][-1][None, :])[0]
    chi2 = float(lik.residuals(worse[None, :])[1][0])
    assert chi2 > truth["fitness"] + 1.0
    with RunStore.open(copy, "a") as store:
        write_best(store, problem.objective, problem.pmap, worse, chi2, truth["polish"])
        store.mark_finished("test")
    prof = profile_run(copy, points=7, backend="cpu", progress=False)
    assert any("run's best is now that point" in w for w in prof.warnings)
    with RunView.open(copy) as view:
        best = view.best
        note = best["polish"]["updates"][-1]
        assert note["what"].startswith("kingen profile") and note["when"]
        assert note["old_fitness"] == pytest.approx(chi2)
        assert note["new_fitness"] == pytest.approx(best["fitness"])
        assert best["fitness"] < chi2 - 1.0
        assert best["fitness"] == pytest.approx(prof.results["chi2_min"], rel=1e-12)
        # what the report, the plots and the exports read is the new best
        params, where = view.fitted_params()
        assert where == "best candidate"
        np.testing.assert_allclose(params, list(note["new_params"].values()), rtol=1e-12)


def test_an_old_run_reads_as_the_relative_objective():
    assert stored_noise({"polish": {"fitness_before": 1.0, "fitness_after": 0.5}}) is None
    assert stored_noise(None) is None


def test_noise_weights_must_match_the_protocols():
    import kingen

    cfg = kingen.load_config(kingen.demo_config())
    objective = kingen.Objective(cfg.scheme, cfg.protocols, cfg.solver.replace(backend="cpu"))
    with pytest.raises(ValueError):
        objective.set_noise([NoiseWeights(trace=1.0)])
