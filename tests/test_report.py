"""The report: one self-contained HTML page and its markdown twin, from a small run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from test_store import make_run, small_protocols

from kingen.outputs.report import write_report


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("run") / "run.h5"
    return path, make_run(path, protocols=small_protocols(("deactivation", "recovery")))


def test_report_of_a_finished_run(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    html_path, md_path = write_report(run[0], tmp_path / "rep")
    html = html_path.read_text(encoding="utf-8")
    md = md_path.read_text(encoding="utf-8")
    # Self-contained: figures embedded, nothing linked.
    assert len(re.findall(r"src='data:image/png;base64,", html)) == 4
    assert "<img" in html and "src='http" not in html and 'src="' not in html
    for text in (html, md):
        assert "Jonas, Major &amp; Sakmann 1993" in text or "Jonas, Major & Sakmann 1993" in text
        assert "max_generations" in text
        assert "k01" in text and "mM^-1 ms^-1" in text and "45.9" in text  # value, unit, bound
        assert "tau_rec_ms" in text and "tau_deact_ms" in text
        assert "error_after" in text  # polish
        assert "population = 12" in text  # the configuration
        assert "h5py" in text  # the environment
        assert "dose_response not drawn: no dose-response protocol in this run" in text
    rows = [line for line in md.splitlines() if line.startswith("| k01 |")]
    assert len(rows) == 1 and "| free |" in rows[0]
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", md):
        assert (md_path.parent / link).is_file()
    assert (tmp_path / "rep" / "convergence.pdf").is_file()


def test_report_of_a_run_that_has_just_started(tmp_path: Path) -> None:
    path = tmp_path / "young.h5"
    make_run(path, protocols=small_protocols(("deactivation",)), generations=0, best=False,
             finished=None)
    html_path, md_path = write_report(path)
    assert html_path.parent == tmp_path / "young_report"
    md = md_path.read_text(encoding="utf-8")
    assert "| Generations completed | 0 |" in md
    assert "still running" in md and "no candidate yet" in md
    assert "convergence not drawn: no completed generation yet" in md


def test_a_likelihood_fit_reports_its_refinement_noise_and_updates() -> None:
    from kingen.outputs.report import _refinement_tables

    record = {"objective": "chi2", "starts": 4, "chi2_before": 46211.66,
              "chi2_after": 42688.03, "iterations": 8, "evaluations": 912,
              "stopped": "gradient below tolerance", "converged": True,
              "noise": {"names": ["deactivation", "recovery"], "sigma_pA": [1.5, None],
                        "source": ["baseline", "residuals"], "n_eff": [310.0, 120.5]},
              "updates": [{"what": "kingen profile found a better point",
                           "when": "2026-11-28T07:00:00+00:00",
                           "old_fitness": 42688.03, "new_fitness": 42687.5}]}
    tables = {t.title: t for t in _refinement_tables(record)}
    assert list(tables) == ["Refinement", "Noise model", "Updates of the best"]
    values = dict((r[0], r[1]) for r in tables["Refinement"].rows)
    assert values["χ² after the refinement"] == "42688.03"
    assert values["why the descent stopped"] == "gradient below tolerance"
    assert tables["Noise model"].rows == [["deactivation", "1.5", "baseline", "310"],
                                          ["recovery", "—", "residuals", "120.5"]]
    (line,) = (r[1] for r in tables["Updates of the best"].rows)
    assert line.startswith("2026-11-28T07:00:00+00:00: kingen profile found a better point")
    assert "42688.03 → 42687.5" in line
