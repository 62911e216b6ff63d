"""The committed picture of the package tree (docs/import_graph.svg) is the code's: the same
modules, each in its size band, and the same imports as arrows. Its bytes may differ from one
matplotlib to the next, so the names its SVG ids carry are compared, not the file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "import_graph.py"

spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
assert spec is not None and spec.loader is not None
graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(graph)

REDRAW = "the picture is out of date: run python docs/import_graph.py and commit the SVG"


def test_the_picture_shows_every_module_in_its_size_band() -> None:
    nodes, _ = graph.svg_ids()
    assert nodes == graph.node_ids(), REDRAW


def test_the_picture_shows_every_import_as_an_arrow() -> None:
    _, arrows = graph.svg_ids()
    assert arrows == graph.edges(), REDRAW


def test_the_arrows_are_the_imports_the_layer_test_checks() -> None:
    from test_layers import MODULES, imports_of

    assert graph.edges() == sorted((m, i) for m in MODULES for i in imports_of(m))


def test_no_arrow_runs_down_the_layers() -> None:
    layers = graph.read_layers(graph.ARCHITECTURE.read_text(encoding="utf-8"))
    down = [(a, b) for a, b in graph.edges()
            if graph.layer_of(b, layers) > graph.layer_of(a, layers)]
    assert not down


def test_the_architecture_page_shows_the_picture() -> None:
    assert "](import_graph.svg)" in graph.ARCHITECTURE.read_text(encoding="utf-8")
