"""Draw kingen's modules and their imports, grouped by layer: ``docs/import_graph.svg``.

Each layer of the table in ``docs/architecture.md`` is a band, top to bottom in the table's
order; each module is a box in its layer's band, shaded by its length (a module over 600
lines is red); each import is an arrow from the importing module to the imported one, at
module level or inside a function, as ``tests/test_layers.py`` counts them. Arrows run up
the page or stay in a band: none runs down.

Run it from anywhere after changing the package tree (``tests/test_import_graph.py`` fails
while the committed picture's modules or arrows differ from the code's)::

    python docs/import_graph.py

Every module and arrow carries its name as its SVG id (``module:kingen.store.runstore``,
``import:kingen.store.runstore->kingen.store.datasets``), which the test reads back.
"""

from __future__ import annotations

import ast
import html
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kingen"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
OUTPUT = ROOT / "docs" / "import_graph.svg"
MAX_LINES = 600
PER_ROW = 9  # modules per row of a band


def read_layers(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(layer, packages) rows of the architecture table, top to bottom.

    >>> read_layers("<!-- layers: begin -->\\n| layer | packages | owns |\\n|---|---|---|\\n"
    ...             "| base | `kingen.errors`, `kingen.base` | x |\\n<!-- layers: end -->")
    [('base', ('kingen.errors', 'kingen.base'))]
    """
    block = text.split("<!-- layers: begin", 1)[1].split("<!-- layers: end", 1)[0]
    rows = []
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        rows.append((cells[0], tuple(re.findall(r"`([A-Za-z0-9_.]+)`", cells[1]))))
    return rows


def module_name(path: Path) -> str:
    """``kingen/store/runstore.py`` -> ``kingen.store.runstore`` (a package by its folder)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, known: dict[str, Path]) -> set[str]:
    """The kingen modules ``module`` imports anywhere in its code."""
    path = known[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "kingen"}
        elif isinstance(node, ast.ImportFrom):
            target = _target(module, path.name == "__init__.py", node)
            if target.split(".")[0] != "kingen":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    found.discard(module)
    return {m for m in found if m in known}


def edges(known: dict[str, Path] | None = None) -> list[tuple[str, str]]:
    """(importer, imported) for every import between two kingen modules, sorted."""
    known = modules() if known is None else known
    return sorted((m, i) for m in known for i in imports_of(m, known))


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]]) -> int:
    """Index of the layer whose longest matching package claims ``module``."""
    best, length = -1, -1
    for k, (_, members) in enumerate(layers):
        for m in members:
            if (module == m or module.startswith(m + ".")) and len(m) > length:
                best, length = k, len(m)
    if best < 0:
        sys.exit(f"{module}: no layer of docs/architecture.md claims it")
    return best


def size_band(lines: int) -> str:
    """``short`` (up to 300 lines), ``medium`` (up to 600) or ``long``."""
    return "short" if lines <= 300 else "medium" if lines <= MAX_LINES else "long"


def node_ids(known: dict[str, Path] | None = None) -> list[str]:
    """The SVG ids of the module boxes: ``module:NAME:BAND``, sorted."""
    known = modules() if known is None else known
    return sorted(f"module:{m}:{size_band(len(p.read_text(encoding='utf-8').splitlines()))}"
                  for m, p in known.items())


def draw(out: Path = OUTPUT) -> Path:
    """Write the picture to ``out`` (SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    matplotlib.rcParams["svg.hashsalt"] = "kingen"  # the same ids from one run to the next
    layers = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    known = modules()
    bands: dict[int, list[str]] = {k: [] for k in range(len(layers))}
    for m in known:
        bands[layer_of(m, layers)].append(m)
    shade = {"short": "#dbe9f6", "medium": "#9ecae1", "long": "#f4a3a3"}
    box_w, box_h, gap_x, gap_y = 2.3, 0.42, 0.25, 0.22
    width = PER_ROW * (box_w + gap_x) + 1.6
    rows = {k: max(1, -(-len(v) // PER_ROW)) for k, v in bands.items()}
    height = sum(r * (box_h + gap_y) + 0.45 for r in rows.values()) + 0.3
    fig = Figure(figsize=(width * 0.95, height * 0.95))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    where: dict[str, tuple[float, float]] = {}
    y = height - 0.2
    for k, (name, _) in enumerate(layers):
        top = y
        y -= 0.4
        for n, m in enumerate(sorted(bands[k])):
            row, col = divmod(n, PER_ROW)
            x0 = 1.5 + col * (box_w + gap_x)
            y0 = y - (row + 1) * (box_h + gap_y) + gap_y
            lines = len(known[m].read_text(encoding="utf-8").splitlines())
            box = FancyBboxPatch((x0, y0), box_w, box_h, boxstyle="round,pad=0.02",
                                 fc=shade[size_band(lines)], ec="0.4", lw=0.6, zorder=3)
            box.set_gid(f"module:{m}:{size_band(lines)}")
            ax.add_patch(box)
            label = m.removeprefix("kingen.") if m != "kingen" else "kingen"
            ax.text(x0 + box_w / 2, y0 + box_h / 2, label, ha="center", va="center",
                    fontsize=6.5 if len(label) < 30 else 5.5, zorder=4)
            where[m] = (x0 + box_w / 2, y0 + box_h / 2)
        y -= rows[k] * (box_h + gap_y) + 0.05
        ax.add_patch(FancyBboxPatch((0.1, y), width - 0.2, top - y, boxstyle="square,pad=0",
                                    fc="0.97" if k % 2 else "white", ec="0.85", lw=0.5,
                                    zorder=0))
        ax.text(0.2, top - 0.22, name, fontsize=9, fontweight="bold", va="center")
    for a, b in edges(known):
        (xa, ya), (xb, yb) = where[a], where[b]
        same = abs(ya - yb) < 1e-9
        arrow = FancyArrowPatch((xa, ya + box_h / 2 * (0 if same else 1)),
                                (xb, yb - box_h / 2 * (0 if same else 1)),
                                arrowstyle="-|>", mutation_scale=6, lw=0.4,
                                color="#08306b", alpha=0.28, zorder=2,
                                connectionstyle="arc3,rad=0.35" if same else "arc3,rad=0.05")
        arrow.set_gid(f"import:{a}->{b}")
        ax.add_patch(arrow)
    ax.text(width - 0.2, 0.12, f"boxes: modules (blue up to 300 lines, darker up to "
            f"{MAX_LINES}, red beyond); arrows: imports, importer -> imported",
            ha="right", fontsize=7, color="0.3")
    if out.suffix == ".svg":
        fig.savefig(out, format="svg", metadata={"Date": None})
    else:  # a raster preview
        fig.savefig(out, dpi=80)
    return out


def svg_ids(path: Path = OUTPUT) -> tuple[list[str], list[tuple[str, str]]]:
    """(module ids, imports) a drawn picture holds, read back from its SVG ids."""
    text = path.read_text(encoding="utf-8")
    ids = [html.unescape(x) for x in re.findall(r'id="((?:module|import):[^"]+)"', text)]
    nodes = sorted({x for x in ids if x.startswith("module:")})
    arrows = sorted({(a, b) for a, _, b in (x.removeprefix("import:").partition("->")
                                            for x in ids if x.startswith("import:"))})
    return nodes, arrows


if __name__ == "__main__":
    print(draw())
