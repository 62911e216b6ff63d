"""What a scheme's CPU solver kernels cost to compile: the first call on an empty cache.

    python -m benchmarks compile_time --model robert_howe_2003 --precision float64

(``benchmarks/results/<device>/compile_time.json``; ``--out FILE`` to choose). Each mode's
kernel (``traces``, as the full-size checks run it; ``objective``, as a fit runs it, with
spans) is built for the standard protocols with 0.2 ms exchange in a fresh kingen cache
folder and timed on its first call (compile and one candidate) and its second (the
candidate alone). The generated lines of each kernel module are counted too: Numba's
compile time grows with them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402

STANDARD = ["deactivation", "desensitization", "recovery", "dose_response"]


def _objective_inputs(sim):
    """Data, weights and one window per sweep, as a fit to recordings gives its kernel."""
    from kingen.codegen import N_WINDOWS
    from kingen.solve import ObjectiveInputs

    n = sim.schedule.n_samples
    windows = np.full((sim.n_sweeps, N_WINDOWS, 3), -1, dtype=np.int64)
    for w in range(sim.n_sweeps):
        m = int(sim.schedule.sample_start[w + 1] - sim.schedule.sample_start[w])
        windows[w, 0] = (0, m - 1, 0)
    return ObjectiveInputs(np.zeros(n), np.ones(n), windows)


def time_mode(scheme, mode: str, precision: str, exchange: float) -> dict:
    """First and second call of one mode's kernel, and its generated lines."""
    from kingen.experiment.protocol import standard_protocol
    from kingen.solve import Simulator
    from kingen.solve.compiled import cache_dir
    from kingen.solve.options import SolverOptions

    protocols = [standard_protocol(n, exchange=exchange) for n in STANDARD]
    options = SolverOptions(backend="cpu", precision=precision)
    sim = Simulator(scheme, protocols, options=options)
    if mode == "objective":
        sim = Simulator(scheme, protocols, options=options, objective=_objective_inputs(sim))
    before = set(cache_dir().joinpath("solvers").glob("*.py"))
    params = scheme.values[None, :]
    t0 = time.perf_counter()
    sim.run(params, mode)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    sim.run(params, mode)
    second = time.perf_counter() - t0
    new = sorted(set(cache_dir().joinpath("solvers").glob("*.py")) - before)
    return {"first_call_s": first, "second_call_s": second,
            "modules": {p.name: len(p.read_text().splitlines()) for p in new}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="robert_howe_2003")
    ap.add_argument("--precision", default="float64", choices=["float64", "float32"])
    ap.add_argument("--modes", default="traces,objective")
    ap.add_argument("--exchange", type=float, default=0.2, help="ms, 0 for ideal steps")
    add_output_options(ap, "compile_time")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    # an empty cache folder: every kernel compiles (kingen reads it at each load)
    os.environ["KINGEN_CACHE"] = tempfile.mkdtemp(prefix="kingen-compile-time-")
    from kingen.model.scheme import Scheme

    scheme = Scheme.load(ROOT / "models" / f"{args.model}.toml")
    modes = {}
    for mode in args.modes.split(","):
        modes[mode] = time_mode(scheme, mode, args.precision, args.exchange)
        print(f"{args.model} {args.precision} {mode}: first call "
              f"{modes[mode]['first_call_s']:.1f} s, then {modes[mode]['second_call_s']:.3f} s;"
              f" generated lines {sum(modes[mode]['modules'].values())}")
    out = {"provenance": provenance("compile_time", argv), "model": args.model,
           "precision": args.precision, "exchange_ms": args.exchange,
           "cpus": os.cpu_count(), "modes": modes}
    print(write(out, output_path(args, "compile_time")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
