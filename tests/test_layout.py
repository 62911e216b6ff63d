"""The README's section "The run file" is generated from kingen.store.layout, never edited
by hand: regenerate it with ``python -m kingen.store.layout``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kingen.store import LAYOUT_DOC, LAYOUT_VERSION, layout

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(layout.TITLE + "\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end + 1]


def test_the_readme_holds_exactly_the_generated_section() -> None:
    assert readme_section().rstrip("\n") + "\n" == layout.markdown(), (
        "README.md's section 'The run file' differs from kingen.store.layout.markdown(): "
        "edit kingen/store/layout.py, then paste `python -m kingen.store.layout` into README")


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
                         text=True, check=True, cwd=README.parent).stdout
    assert out == layout.markdown()
