"""The layers of docs/architecture.md hold: no module of ``kingen`` imports from a layer below
its own.

The architecture document's table lists the layers top to bottom, each with its packages; a
module may import from its own layer and the layers above it. Every import counts, at module
level or inside a function. A module that no layer claims fails the test, and so does a
package the table names that does not exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kingen"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def read_layers(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(layer, packages) rows of the table between the ``layers: begin/end`` markers."""
    block = text.split("<!-- layers: begin", 1)[1].split("<!-- layers: end", 1)[0]
    rows = []
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        rows.append((cells[0], tuple(re.findall(r"`([A-Za-z0-9_.]+)`", cells[1]))))
    return rows


# Top to bottom; each module (or package: every module under it) by its dotted name.
LAYERS: list[tuple[str, tuple[str, ...]]] = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))

# Known imports against the order, each with its reason: (importer, imported).
ALLOWED: dict[tuple[str, str], str] = {}


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """Index of the layer whose longest matching prefix claims ``module``."""
    best, length = None, -1
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            if (module == m or module.startswith(m + ".")) and len(m) > length:
                best, length = i, len(m)
    return best


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The kingen modules an ``from ... import ...`` statement imports."""
    target = _from_target(module, is_package, node)
    if target != "kingen" and not target.startswith("kingen."):
        return []
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        # `from kingen import units` imports a module; `from kingen import __version__` a name
        out.append(sub if sub in MODULES else target)
    return out


def imports_of(module: str) -> set[str]:
    """Every kingen module ``module`` imports, anywhere in its code."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names
                      if a.name == "kingen" or a.name.startswith("kingen.")}
        elif isinstance(node, ast.ImportFrom):
            found |= set(_resolve(module, path.name == "__init__.py", node))
    found.discard(module)
    return found


def test_every_module_has_a_layer() -> None:
    missing = [m for m in MODULES if layer_of(m) is None]
    assert not missing, f"modules no layer claims (add them to LAYERS): {missing}"


def violations() -> list[tuple[str, str]]:
    out = []
    for module in MODULES:
        own = layer_of(module)
        for imported in sorted(imports_of(module)):
            theirs = layer_of(imported)
            if own is not None and theirs is not None and theirs > own:
                out.append((module, imported))
    return out


def test_no_module_imports_from_a_layer_below_its_own() -> None:
    found = [v for v in violations() if v not in ALLOWED]
    lines = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {i} ({LAYERS[layer_of(i)][0]})"
             for m, i in found]
    assert not lines, "imports against the layer order:\n" + "\n".join(lines)


def test_the_allow_list_holds_only_live_violations() -> None:
    stale = set(ALLOWED) - set(violations())
    assert not stale, f"allowed violations that no longer occur (remove them): {stale}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES
                                          if m == "kingen.solve" or m.startswith("kingen.solve.")))
def test_the_solver_never_imports_the_analysis(module: str) -> None:
    assert not [i for i in imports_of(module) if i.startswith("kingen.analysis")]


def test_the_walker_sees_imports_inside_functions() -> None:
    # runs/fit.py imports the local uncertainty inside a function only: the walk must see it
    assert "kingen.identify.local" in imports_of("kingen.runs.fit")


def test_the_architecture_table_names_only_packages_that_exist() -> None:
    named = [m for _, members in LAYERS for m in members]
    assert len(LAYERS) >= 10 and "kingen.model" in named
    assert not [m for m in named if m not in MODULES], "the table names missing packages"


def test_no_module_sits_flat_in_the_package_but_the_base_and_interface() -> None:
    flat = sorted(m for m, p in MODULES.items()
                  if p.parent == PACKAGE and p.name != "__init__.py")
    assert flat == ["kingen.__main__", "kingen._version", "kingen.errors"]


# ------------------------------------------------------------------ private names stay home

# Known imports of another module's private name, each with its reason: (importer, name).
ALLOWED_PRIVATE: dict[tuple[str, str], str] = {}


def private_imports(module: str) -> list[str]:
    """``kingen.x._name`` for every private name ``module`` takes from another kingen
    module: ``from kingen.x import _name``, or ``x._name`` on a module it imported."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> the kingen module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("kingen."):
                    aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(module, path.name == "__init__.py", node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:
                    aliases[alias.asname or alias.name] = sub
                if _private(alias.name) and target != module:
                    found.append(sub)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in aliases
                and aliases[node.value.id] != module):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def _from_target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` statement names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def test_no_module_imports_a_private_name_of_another() -> None:
    found = [f"{m} imports {name}" for m in MODULES for name in private_imports(m)
             if (m, name) not in ALLOWED_PRIVATE]
    assert not found, ("private names used outside their module (make them public, with a "
                       "docstring, or move them to the one module that uses them):\n"
                       + "\n".join(found))


def test_the_private_import_walker_sees_both_spellings(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from kingen.store.datasets import _GZIP\n"
                     "import kingen.store.datasets as d\n"
                     "from kingen.store import datasets\n"
                     "def f():\n    return d._damaged, datasets._json_default, d.load\n",
                     encoding="utf-8")
    monkeypatch.setitem(MODULES, "kingen.store.probe", probe)
    assert sorted(private_imports("kingen.store.probe")) == [
        "kingen.store.datasets._GZIP", "kingen.store.datasets._damaged",
        "kingen.store.datasets._json_default"]


# ------------------------------------------------------------------ one job, 600 lines

MAX_LINES = 600

# Modules still over MAX_LINES, each with its reason; an entry that no longer applies fails.
OVERSIZED: dict[str, str] = {
}


def lines_of(module: str) -> int:
    return len(MODULES[module].read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_600_lines() -> None:
    long = {m: lines_of(m) for m in MODULES if lines_of(m) > MAX_LINES}
    found = [f"{m}: {n} lines" for m, n in sorted(long.items()) if m not in OVERSIZED]
    assert not found, (f"modules over {MAX_LINES} lines (split them, one job per module):\n"
                       + "\n".join(found))
    stale = sorted(set(OVERSIZED) - set(long))
    assert not stale, f"modules no longer over {MAX_LINES} lines (remove them): {stale}"
