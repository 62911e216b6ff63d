"""The docs' page of the run file (docs/reference/run_file.md) is generated from
kingen.store.layout, never edited by hand: its directive renders ``layout.markdown()``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kingen.store import LAYOUT_DOC, LAYOUT_VERSION, layout

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "run_file.md"


def test_the_docs_page_renders_exactly_the_generated_layout() -> None:
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        from kingen_docs import run_file_layout_text
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    text = PAGE.read_text(encoding="utf-8")
    # the page holds the directive and no hand-written copy of any row of the table
    assert "```{kingen-run-file-layout}\n```" in text, (
        "docs/reference/run_file.md must render the layout with {kingen-run-file-layout}")
    assert "\n| `/" not in text, "a hand-written row of the layout table"
    assert layout.TITLE + "\n" + run_file_layout_text() == layout.markdown()
    assert all(e.path in run_file_layout_text() for e in layout.ENTRIES)


def test_every_run_file_carries_the_same_text() -> None:
    assert LAYOUT_DOC == layout.markdown()
    assert f"`layout_version` ({LAYOUT_VERSION})" in layout.table()


def test_the_table_has_one_row_per_entry_and_names_every_required_group() -> None:
    rows = layout.table().splitlines()[2:]
    assert len(rows) == len(layout.ENTRIES)
    paths = " ".join(e.path for e in layout.ENTRIES)
    for group in layout.REQUIRED_GROUPS:
        assert f"`/{group}" in paths, group


def test_the_module_prints_the_section() -> None:
    out = subprocess.run([sys.executable, "-m", "kingen.store.layout"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    assert out == layout.markdown()
