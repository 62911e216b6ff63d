"""The one benchmark driver: ``python -m benchmarks SUITE [options]``.

``python -m benchmarks`` lists the suites; ``python -m benchmarks SUITE --help`` shows one
suite's options. Each suite writes a JSON result with its provenance (exact command, git
commit, device, host, versions) into ``benchmarks/results/<device>/`` unless ``--out`` says
otherwise. See benchmarks/README.md.
"""

from __future__ import annotations

import importlib
import sys

# suite -> what it measures (its module is benchmarks/<suite>.py)
SUITES = {
    "solver": "batched RK4 solver throughput per scheme, backend and precision, with the "
              "SciPy, exact-reference and JAX baselines",
    "propagator": "GPU kernel variants (stage and propagator forms) end to end and kernels "
                  "only, checked against the stage form",
    "cupy_propagator": "the CuPy batched-matmul baseline of the propagator form",
    "rest_state": "the batched rest-state (equilibrium) solve against numpy's",
    "fit_gpu": "a whole fit: time per generation inside and outside the solver",
    "ga_step": "the GA's own cost per generation (variation, hall of fame, selection), "
               "without the solver",
    "fit_recovery": "parameter recovery from SYNTHETIC Jonas 1993 recordings (accuracy, "
                    "and the fit's time)",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__.strip().splitlines()[0])
        print("\nsuites:")
        for name, what in SUITES.items():
            print(f"  {name:<16} {what}")
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
