"""Write a SYNTHETIC fit problem on the standard protocol set, for timing fit generations.

For a shipped scheme, the four standard protocols (ideal steps or ``--exchange`` ms, 50 kHz) are
simulated at the file's rates with the batched solver, Gaussian noise of 2 % of the largest
current is added (seeded), and one CSV per protocol is written with a fit configuration
that names them. The ``fit_gpu`` suite with ``--config DIR/fit.toml`` then times the fit's
generations on this problem (the issue's "one fit generation of 16,384 R&H candidates on
the standard set, GA included"). A helper, not a suite::

    python -m benchmarks.make_fit_problem --model robert_howe_2003 --out /tmp/rh03
    python -m benchmarks.make_fit_problem --model robert_howe_2003 --exchange 0.2 --out /tmp/rh03x
    python -m benchmarks fit_gpu --config /tmp/rh03/fit.toml --population 16384 \\
        --generations 5 --name rh03_16384
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kingen.experiment.protocol import standard_protocol  # noqa: E402
from kingen.experiment.recordings import Recording, write_csv  # noqa: E402
from kingen.model.scheme import Scheme  # noqa: E402
from kingen.solve import Simulator  # noqa: E402
from kingen.solve.options import SolverOptions  # noqa: E402

STANDARD = ("deactivation", "desensitization", "recovery", "dose_response")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="robert_howe_2003", help="a shipped scheme's name")
    ap.add_argument("--out", type=Path, required=True, help="folder to write")
    ap.add_argument("--noise", type=float, default=0.02, help="SD as a fraction of the peak")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--exchange", type=float, default=0.0,
                    help="10-90 %% solution exchange time, ms (0: ideal steps)")
    args = ap.parse_args(argv)

    model = ROOT / "models" / f"{args.model}.toml"
    scheme = Scheme.load(model)
    protocols = [standard_protocol(n, exchange=args.exchange) for n in STANDARD]
    sim = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    traces = sim.run(scheme.values[None], "traces").traces[0] * scheme.channels
    sd = args.noise * float(np.abs(traces).max())
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [f"# SYNTHETIC standard-set fit problem for {args.model}, written by "
             "benchmarks/make_fit_problem.py", f'model = "{model}"', 'output = "fit.h5"',
             f"seed = {args.seed}", ""]
    sweep = 0
    for name, prot in zip(STANDARD, protocols):
        currents, times, labels = [], [], []
        for s in prot.sweeps:
            a, b = sim.schedule.sample_start[sweep], sim.schedule.sample_start[sweep + 1]
            currents.append(np.round(traces[a:b] + rng.normal(0.0, sd, b - a), 4))
            times.append(s.times())
            labels.append(s.label)
            sweep += 1
        write_csv(Recording(name, times, currents, labels, holding_mV=-60.0,
                            meta={"synthetic": True, "noise_sd_pA": round(sd, 6),
                                  "seed": args.seed,
                                  "comments": [f"SYNTHETIC {args.model} currents"]}),
                  args.out / f"{name}.csv")
        lines += ["[[protocols]]", f'protocol = "{name}"', f'recording = "{name}.csv"']
        lines += [f"exchange = {args.exchange}", ""] if args.exchange else [""]
    (args.out / "fit.toml").write_text("\n".join(lines))
    print(f"wrote {args.out / 'fit.toml'} and {len(STANDARD)} recordings (noise SD {sd:.3g} pA)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
