"""The common ground of kingen's figures: sizes, colours and style, file names made from
protocol names, and saving (every figure at :data:`DPI`, written through a temporary file,
so that a crash never leaves half an image).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from kingen._version import __version__
from kingen.base.files import atomic_write, check_replaceable

log = logging.getLogger("kingen.outputs.plot")


DPI = 100


FIGURE_SIZES: dict[str, tuple[float, float]] = {
    "fit": (8.0, 5.0),
    "fits_overview": (12.0, 8.0),
    "dose_response": (6.5, 4.8),
    "recovery": (6.5, 4.8),
    "convergence": (11.0, 4.5),
    "parameters": (10.0, 5.5),
    "correlations": (7.0, 6.0),
    "traces": (8.0, 5.0),
}


PROTOCOL_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
                   "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f")


DATA_COLOR = "0.55"


# A current before the recording's filter, drawn behind the filtered one
UNFILTERED = 0.35


FORMATS = ("png", "pdf")


STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": DPI,
    "savefig.dpi": DPI, "pdf.fonttype": 42,  # editable text in Illustrator/Inkscape
}


def protocol_color(index: int) -> str:
    """The colour of the run's ``index``-th protocol."""
    return PROTOCOL_COLORS[index % len(PROTOCOL_COLORS)]


def safe_name(name: str) -> str:
    """A protocol name made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "protocol"


def safe_names(names: Sequence[str]) -> dict[str, str]:
    """Each protocol name made safe for a file name, and distinct: names that clean to the
    same text (``deact α``, ``deact β``) would write over each other's files.

    >>> safe_names(["deact α", "deact β", "recovery"])
    {'deact α': 'deact', 'deact β': 'deact_2', 'recovery': 'recovery'}
    """
    out: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        base = candidate = safe_name(name)
        n = 1
        while candidate.lower() in taken:  # case too: some filesystems ignore it
            n += 1
            candidate = f"{base}_{n}"
        taken.add(candidate.lower())
        out[name] = candidate
    return out


def new_figure(kind: str, **kwargs: Any) -> Figure:
    """A figure of ``kind``'s size (:data:`FIGURE_SIZES`) at :data:`DPI`, laid out by
    matplotlib's constrained layout; no pyplot state is touched."""
    return Figure(figsize=FIGURE_SIZES[kind], dpi=DPI, layout="constrained", **kwargs)


def save_figure(fig: Figure, path: Path) -> Path:
    """Save atomically (temporary file, then rename); the format comes from the suffix.

    The file names kingen as its maker (PNG ``Software``, PDF and SVG ``Creator``): that is
    how a later figure knows it may replace it (:func:`kingen.base.files.check_replaceable`).
    """
    fmt = path.suffix.lstrip(".").lower() or "png"
    check_replaceable(path, "-o", kind="figure")
    maker = {"png": "Software", "pdf": "Creator", "svg": "Creator"}.get(fmt)
    metadata = {maker: f"kingen {__version__}"} if maker else None

    def write(tmp: Path) -> None:
        with matplotlib.rc_context(STYLE):
            fig.savefig(tmp, format=fmt, dpi=DPI, metadata=metadata)

    atomic_write(path, write)
    return path


def save_all(fig: Figure, out_dir: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    """Save ``fig`` as ``out_dir/stem.FORMAT`` in each format; the paths written."""
    return [save_figure(fig, out_dir / f"{stem}.{fmt}") for fmt in formats]
