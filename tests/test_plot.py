"""Figures from a small run: every figure written, of the expected pixel size, not blank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pytest
from test_store import make_run, small_protocols

from kingen.outputs.plot import DPI, FIGURE_SIZES, plot_run, plot_run_detailed, plot_traces
from kingen.store import RunStore

FIGURES = ["fit_deactivation", "fit_desensitization", "fit_recovery", "fit_dose_response",
           "fits_overview", "dose_response", "recovery", "convergence", "parameters"]


def check_png(path: Path, kind: str) -> None:
    img = mpimg.imread(path)
    w, h = FIGURE_SIZES[kind]
    assert img.shape[:2] == (round(h * DPI), round(w * DPI))
    assert float(img[..., :3].std()) > 0.01  # something is drawn


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("run") / "run.h5"
    return path, make_run(path)


def test_every_figure_of_a_run(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    written, skipped = plot_run_detailed(run[0], tmp_path / "figs")
    # every figure but those of the uncertainty: this run file was written by the store
    # alone, without a fit's local uncertainty or kingen profile's profiles
    assert list(skipped) == ["correlations", "profiles"]
    assert all("kingen profile" in why for why in skipped.values())
    assert list(written) == FIGURES
    for stem, paths in written.items():
        assert [p.suffix for p in paths] == [".png", ".pdf"]
        check_png(paths[0], "fit" if stem.startswith("fit_") else stem)
        assert paths[1].read_bytes()[:5] == b"%PDF-" and paths[1].stat().st_size > 5000
    assert not list((tmp_path / "figs").glob(".*"))  # no temporary files left


def test_the_correlation_figure_needs_the_fisher_matrix(run: tuple[Path, dict[str, Any]],
                                                        tmp_path: Path) -> None:
    # Correlations among the hall of fame's near-identical candidates misled (0 where the
    # Fisher correlation is 0.95): the figure is drawn from the Fisher matrix a fit stores
    # (tests/test_identify.py draws it), never from the population.
    written, skipped = plot_run_detailed(run[0], tmp_path / "figs", formats=("png",))
    assert "correlations" not in written and "local uncertainty" in skipped["correlations"]


def test_missing_data_skips_figures_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "early.h5"
    make_run(path, protocols=small_protocols(("deactivation",)), generations=2, best=False,
             finished=None)
    told: list[str] = []
    paths = plot_run(path, tmp_path / "figs", formats=("png",), on_skip=told.append)
    assert sorted(p.stem for p in paths) == ["convergence", "parameters"]
    text = "\n".join(told)
    assert "skipped fit_deactivation: no best candidate in the run file yet" in text
    assert "skipped dose_response: no dose-response protocol in this run" in text
    assert "skipped recovery: no recovery (paired-pulse) protocol in this run" in text
    check_png(tmp_path / "figs" / "convergence.png", "convergence")


def test_plots_from_a_store_still_open_for_writing(tmp_path: Path) -> None:
    path = tmp_path / "open.h5"
    make_run(path, protocols=small_protocols(("deactivation",)), generations=3, best=False,
             finished=None)
    with RunStore.open(path, "a") as st:
        paths = plot_run(st, tmp_path / "figs", formats=("png",))
        assert {p.stem for p in paths} == {"convergence", "parameters"}
        assert st._f.id.valid  # the caller's store stays open


def test_plot_traces_for_simulate(tmp_path: Path) -> None:
    t = np.arange(0, 30, 0.05)
    conc = [np.where((t > 2) & (t < 3), c, 0.0) for c in (1.0, 10.0)]
    cur = [-c.cumsum() * 0.1 for c in conc]
    out = plot_traces([t, t], cur, ["1mM", "10mM"], "simulated", tmp_path / "sim",
                      concentration_mM=conc)
    assert out == tmp_path / "sim.png"
    check_png(out, "traces")
    pdf = plot_traces([t], cur[:1], ["a"], "one sweep", tmp_path / "one.pdf")
    assert pdf.read_bytes()[:5] == b"%PDF-"
