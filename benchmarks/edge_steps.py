"""RK4 steps on finite-exchange edges, and the solver's error against the exact reference.

    python -m benchmarks edge_steps --models robert_howe_2003,jonas_1993

(``benchmarks/results/<device>/edge_steps.json``; ``--out FILE`` to choose). For each
scheme, the standard protocols with ``--exchange`` ms edges: the schedule's RK4 steps per
candidate, the steps the edges' matrices take to build (with a key where it pays, as on the
CPU, and with one for every constant row, as on the GPU), the steps left in stage form,
and the largest error of the CPU solver's current (propagator form, the scheme's own
rates) against :func:`kingen.solve.simulate_exact`: max |I - I_exact| / max |I_exact| over
the sweeps. Run it at two commits to compare schedules.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402

STANDARD = ["deactivation", "desensitization", "recovery", "dose_response"]


def measure(model: str, exchange: float) -> dict:
    """Steps and error of one scheme on the standard set."""
    from kingen.experiment.protocol import standard_protocol
    from kingen.model.scheme import Scheme
    from kingen.solve import Simulator, simulate_exact
    from kingen.solve.cuda import LaunchConfig
    from kingen.solve.options import SolverOptions
    from kingen.solve.plan import plan_propagator

    scheme = Scheme.load(ROOT / "models" / f"{model}.toml")
    protocols = [standard_protocol(name, exchange=exchange) for name in STANDARD]
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    cpu = plan_propagator(scheme, sim.schedule)
    gpu = plan_propagator(scheme, sim.schedule, every_constant_row=True)
    got = sim.run(scheme.values[None], "traces", launch_config=LaunchConfig(form="propagator"))
    exact = [c for p in protocols for c in simulate_exact(scheme, p).currents]
    error = max(float(np.abs(got.sweep_trace(0, w) * scheme.channels - e).max()
                      / np.abs(e).max()) for w, e in enumerate(exact))
    return {"rk4_steps": sim.schedule.total_steps,
            "build_steps_cpu": int(sum(cpu.key_steps)), "stage_steps_cpu": cpu.stage_steps,
            "build_steps_gpu": int(sum(gpu.key_steps)), "stage_steps_gpu": gpu.stage_steps,
            "edge_samples": gpu.edge_samples, "max_error_of_peak": error}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="robert_howe_2003,jonas_1993,coombs_2017")
    ap.add_argument("--exchange", type=float, default=0.2, help="ms")
    add_output_options(ap, "edge_steps")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    rows = {}
    for model in args.models.split(","):
        rows[model] = row = measure(model, args.exchange)
        print(f"{model}: build {row['build_steps_cpu']} (GPU {row['build_steps_gpu']}), "
              f"stage {row['stage_steps_cpu']} RK4 steps; error {row['max_error_of_peak']:.2e}"
              " of the peak")
    out = {"provenance": provenance("edge_steps", argv), "exchange_ms": args.exchange,
           "models": rows}
    print(write(out, output_path(args, "edge_steps")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
