"""The one benchmark driver: ``python -m benchmarks SUITE [options]``.

``python -m benchmarks`` lists the suites; ``python -m benchmarks SUITE --help`` shows one
suite's options. Each suite writes a JSON result with its provenance (exact command, git
commit, device, host, versions) into ``benchmarks/results/<device>/`` unless ``--out`` says
otherwise. See benchmarks/README.md.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Modules of this folder that are not suites
HELPERS = {"__init__", "__main__", "provenance", "make_fit_problem"}


def suites() -> dict[str, str]:
    """Every suite (a module ``benchmarks/<suite>.py`` with ``main(argv)``) and the first
    line of its docstring: a new module is a new suite, with nothing to register."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem in HELPERS:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        out[path.stem] = doc.strip().splitlines()[0] if doc.strip() else ""
    return out


SUITES = suites()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__.strip().splitlines()[0])
        print("\nsuites:")
        for name, what in SUITES.items():
            print(f"  {name:<16} {what}")
        print("\nhelper: python -m benchmarks.make_fit_problem (a SYNTHETIC fit problem)")
        return 0
    suite, rest = argv[0], argv[1:]
    if suite not in SUITES:
        print(f"benchmarks: unknown suite {suite!r} (suites: {', '.join(SUITES)})",
              file=sys.stderr)
        return 2
    module = importlib.import_module(f"benchmarks.{suite}")
    sys.argv[0] = f"python -m benchmarks {suite}"  # what argparse's usage line shows
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
