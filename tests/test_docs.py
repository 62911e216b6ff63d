"""The documentation's own checks: a tutorial whose code fails breaks the docs build, and
the API pages document every public module.

The full build (``python -m sphinx -W --keep-going -b html docs docs/_build/html``) runs in
``.ci/run`` after the tests; here a one-page copy of the docs' configuration is built.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _public_modules() -> set[str]:
    """The keys of ``PUBLIC_MODULES`` in tests/test_doctests.py, read as data."""
    tree = ast.parse((Path(__file__).parent / "test_doctests.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and "PUBLIC_MODULES" in ast.unparse(
                node.targets[0] if isinstance(node, ast.Assign) else node.target):
            return set(ast.literal_eval(node.value))
    raise AssertionError("tests/test_doctests.py has no PUBLIC_MODULES")

PAGE = """\
---
file_format: mystnb
kernelspec:
  name: python3
  display_name: Python 3
---

# A tutorial

```{{code-cell}} ipython3
import kingen
print(kingen.standard_protocol("deactivation").n_sweeps)
{line}
```
"""


def _build(tmp_path: Path, line: str) -> subprocess.CompletedProcess[str]:
    """Build one tutorial page with the docs' own configuration (``-c docs``), as CI does."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "index.md").write_text(PAGE.format(line=line), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "dummy",
         "-c", str(DOCS), str(src), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("line, fails", [("print('fine')", False),
                                          ("kingen.Scheme.load('no_such_scheme')", True)])
def test_a_failing_tutorial_cell_fails_the_docs_build(tmp_path: Path, line: str,
                                                      fails: bool) -> None:
    pytest.importorskip("myst_nb")
    pytest.importorskip("ipykernel")
    result = _build(tmp_path, line)
    output = result.stdout + result.stderr
    if fails:
        assert result.returncode != 0, output
        assert "no_such_scheme" in output, output
    else:
        assert result.returncode == 0, output


def test_the_api_pages_document_every_public_module() -> None:
    documented = set()
    for page in (DOCS / "api").glob("*.md"):
        documented |= set(re.findall(r"^\.\. automodule:: (\S+)$",
                                     page.read_text(encoding="utf-8"), re.M))
    missing = sorted(_public_modules() - documented)
    assert not missing, textwrap.fill(
        f"add these modules of tests/test_doctests.py to a page of docs/api/: {missing}")
