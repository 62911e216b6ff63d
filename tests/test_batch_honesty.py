"""A batch's summary is honest about its fits: fits that did not converge are marked, the
Akaike ranking takes only converged fits (the others listed with their reason), and the
spread over seeds is shown."""

from __future__ import annotations

import math

import pytest
from test_fit_helpers import write_problem

from kingen.runs.fit import fit
from kingen.scaleout.batch import result_row
from kingen.scaleout.summary import csv_text, html_text, left_out, ranking, ranking_lines
from kingen.store import RunStore


def _row(tmp, name: str, scheme: str, seed: int, extra: str) -> dict:
    folder = tmp / name
    folder.mkdir()
    cfg = write_problem(folder, extra=extra)
    cfg.write_text(cfg.read_text().replace("seed = 3\n", f"seed = {seed}\n"))
    fit(cfg, progress=False)
    with RunStore.open(folder / "run.h5") as store:
        row = result_row(store)
    row.update(id=f"cell/{scheme}/seed{seed}", cell="cell", scheme=scheme, seed=seed,
               status="ok")
    return row


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch")
    # refined to its optimum: converged; two seeds of the same scheme
    good = [_row(tmp, f"good{s}", "refined", s, "polish = true")
            for s in (1, 2)]
    # stopped by its generations with no refinement: not converged, and its AIC lower
    # than it would be at its optimum is no reason to rank it
    short = _row(tmp, "short", "unrefined", 1, "")
    return good + [short]


def test_unconverged_fits_are_marked_and_left_out_of_the_ranking(rows):
    good, short = rows[:2], rows[2]
    assert all(r["converged"] is True for r in good)
    assert short["converged"] is False
    assert short["convergence"].startswith("not converged: maximum generations")
    ranked = ranking(rows)
    assert [r["scheme"] for r in ranked["cell"]] == ["refined"]
    assert ranked["cell"][0]["weight"] == 1.0
    skipped = left_out(rows)["cell"]
    assert [(r["scheme"], r["seed"]) for r in skipped] == [("unrefined", 1)]
    assert skipped[0]["reason"] == short["convergence"]
    lines = ranking_lines(rows)
    assert lines[0].startswith("cell: refined (ΔAIC 0")
    assert lines[1] == f"  not ranked: unrefined seed 1: {short['convergence']}"
    page = html_text(rows, "t")
    assert "Not ranked (did not converge)" in page and "2 of 3 finished fits converged" in page
    header = csv_text(rows).splitlines()[0].split(",")
    assert header[6:8] == ["converged", "convergence"]


def test_the_spread_over_seeds_is_shown(rows):
    lines = ranking_lines(rows)
    spread = [ln for ln in lines if ln.startswith("cell/refined: 2 seeds (2 converged)")]
    assert len(spread) == 1 and "decades" in spread[0]
    page = html_text(rows, "t")
    assert "Spread over seeds" in page and "k2o (ms^-1): decades" in page


def test_a_chi2_fit_with_known_noise_takes_aic_from_chi2(rows):
    good = rows[0]
    assert good["aic"] == pytest.approx(good["fitness"] + 2 * good["n_free"])
    assert good["bic"] == pytest.approx(good["fitness"]
                                        + good["n_free"] * math.log(good["n_samples"]))
