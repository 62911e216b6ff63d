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
