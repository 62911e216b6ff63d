"""The exact reference's smooth-segment solver: its error and time, LSODA against BDF.

    python -m benchmarks reference_solver --model raman_trussell_1992

(``benchmarks/results/<device>/reference_solver.json``; ``--out FILE`` to choose). The
standard protocols with ``--exchange`` ms edges are simulated by
:func:`kingen.solve.simulate_exact` with each ``--methods`` entry for its smooth segments
(at the reference's own rtol and atol), and once more with Radau at rtol 1e-13, atol 1e-16
as the yardstick. Each method's error is the largest over the sweeps of
max |I - I_Radau| / max |I_Radau|, and its time the wall time of the whole set.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402

STANDARD = ["deactivation", "desensitization", "recovery", "dose_response"]


def currents(scheme, exchange: float, method: str, rtol: float | None = None,
             atol: float | None = None) -> tuple[list[np.ndarray], float]:
    """Every sweep's current of the standard protocols with ``method`` on the smooth
    segments, and the seconds it took."""
    import kingen.solve.reference as reference
    from kingen.experiment.protocol import standard_protocol

    saved = reference.SMOOTH_METHOD, reference.RTOL, reference.ATOL
    reference.SMOOTH_METHOD = method
    reference.RTOL = saved[1] if rtol is None else rtol
    reference.ATOL = saved[2] if atol is None else atol
    try:
        t0 = time.perf_counter()
        out = [c for name in STANDARD for c in reference.simulate_exact(
            scheme, standard_protocol(name, exchange=exchange)).currents]
        return out, time.perf_counter() - t0
    finally:
        reference.SMOOTH_METHOD, reference.RTOL, reference.ATOL = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="raman_trussell_1992")
    ap.add_argument("--exchange", type=float, default=0.2, help="ms")
    ap.add_argument("--methods", default="LSODA,BDF", help="solve_ivp methods, comma-separated")
    add_output_options(ap, "reference_solver")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    from kingen.model.scheme import Scheme

    scheme = Scheme.load(ROOT / "models" / f"{args.model}.toml")
    truth, truth_s = currents(scheme, args.exchange, "Radau", rtol=1e-13, atol=1e-16)
    methods = {}
    for method in args.methods.split(","):
        got, seconds = currents(scheme, args.exchange, method)
        error = max(float(np.abs(g - t).max() / np.abs(t).max())
                    for g, t in zip(got, truth, strict=True))
        methods[method] = {"seconds": seconds, "max_error_of_peak": error}
        print(f"{args.model} {method}: {seconds:.1f} s, error {error:.2e} of the peak")
    out = {"provenance": provenance("reference_solver", argv), "model": args.model,
           "exchange_ms": args.exchange, "yardstick": {"method": "Radau", "rtol": 1e-13,
                                                        "atol": 1e-16, "seconds": truth_s},
           "methods": methods}
    print(write(out, output_path(args, "reference_solver")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
