"""Sphinx configuration of kingen's documentation.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (warnings are
errors; the tutorials run as the pages are built).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # the kingen of this checkout, not an installed one
sys.path.insert(0, str(DOCS / "_ext"))
# The tutorials' kernels, and the `kingen` commands they run, see the same kingen and the
# `kingen` script of this Python, whichever environment is active.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(DOCS.parent), os.environ.get("PYTHONPATH", "")) if p)
os.environ["PATH"] = os.pathsep.join((str(Path(sys.executable).parent),
                                      os.environ.get("PATH", "")))

from kingen import __version__  # noqa: E402

project = "kingen"
author = "the kingen authors"
copyright = "the kingen authors"
version = release = __version__

extensions = [
    "myst_nb",  # MyST markdown pages, and the tutorials as notebooks executed at build time
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "kingen_docs",  # the CLI and the run-file layout, generated from kingen
]
source_suffix = {".md": "myst-nb", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]

# The tutorials run on every build, each in a fresh temporary folder. A failing cell is a
# warning that shows its traceback, and -W makes it an error that fails the build
# (tests/test_docs.py checks this); raising instead would hide the cell's own error.
nb_execution_mode = "force"
nb_execution_in_temp = True
nb_execution_timeout = 300
nb_execution_raise_on_error = False
nb_execution_show_tb = True
nb_merge_streams = True

myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

autodoc_default_options = {"show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports: list[str] = []
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False

html_theme = "pydata_sphinx_theme"
html_title = f"kingen {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
