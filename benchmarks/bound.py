"""The share of each variant's arithmetic bound, recomputed for committed propagator results.

Results of ``python -m benchmarks propagator`` written before the bound followed the variant
counted one product per sample whatever the span. This suite reads such files, rebuilds
each row's schedule and propagator plan on the CPU (the GPU's plan: every constant row has a
key), counts the row variant's flops per candidate term by term
(:func:`kingen.analysis.bound.variant_flops`) and divides the measured candidates/s by the
bound at the peaks the run used (its ``--peak-fp64`` / ``--peak-fp32``, else their defaults;
the builds, in float64, at the FP64 peak)::

    python -m benchmarks bound benchmarks/results/h100/propagator/2026-11-28_dd05691_rh03_chain.json

Rows with a recording filter are left out (the filter's arithmetic is not in the model).
Writes ``benchmarks/results/<device>/bound/<name>.json`` (``--out FILE`` to choose).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.propagator import STANDARD, open_tip  # noqa: E402
from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from kingen.analysis.bound import variant_flops  # noqa: E402
from kingen.experiment.exchange import ExchangeSpec, apply_exchange  # noqa: E402
from kingen.experiment.protocol import standard_protocol  # noqa: E402
from kingen.model.scheme import Scheme  # noqa: E402
from kingen.solve.cuda import LaunchConfig  # noqa: E402
from kingen.solve.plan import plan_propagator  # noqa: E402
from kingen.solve.schedule import build_schedule, protocol_sweeps  # noqa: E402

PEAKS = {"float64": ("--peak-fp64", 30.3e12), "float32": ("--peak-fp32", 57.0e12)}


def run_peak(argv: list[str], precision: str) -> float:
    """The peak flop/s a propagator run used for ``precision``."""
    flag, default = PEAKS[precision]
    return float(argv[argv.index(flag) + 1]) if flag in argv else default


def protocols_of(exchange) -> list:
    """The standard set of one row: ideal steps, an exchange time, or ``measured X``."""
    if isinstance(exchange, str) and exchange.startswith("measured "):
        with tempfile.TemporaryDirectory() as folder:
            spec = ExchangeSpec(open_tip(Path(folder) / "tip.csv",
                                         float(exchange.split()[1])))
            return [apply_exchange(standard_protocol(n), spec) for n in STANDARD]
    return [standard_protocol(n, exchange=float(exchange or 0.0)) for n in STANDARD]


def rebound(path: Path) -> list[dict]:
    """One entry per (row, population) of a propagator result file."""
    data = json.loads(Path(path).read_text())
    argv = shlex.split(data["provenance"].get("command", ""))
    scheme = Scheme.load(ROOT / "models" / f"{data['model']}.toml")
    out = []
    for row in data["rows"]:
        if row.get("filter") or data.get("filter"):
            continue
        exchange = row.get("exchange_ms", (data.get("exchange_ms") or [0.0])[0])
        schedule = build_schedule(scheme, protocol_sweeps(protocols_of(exchange))[0])
        plan = plan_propagator(scheme, schedule, every_constant_row=True)
        config = LaunchConfig.parse(row["variant"])
        flops = variant_flops(scheme, schedule, config, row["precision"],
                              plan if config.form == "propagator" else None)
        peak, peak64 = run_peak(argv, row["precision"]), run_peak(argv, "float64")
        for run in row["runs"]:
            rate = run["candidates_per_s"]
            out.append({"file": Path(path).name, "precision": row["precision"],
                        "exchange_ms": exchange, "variant": row["variant"],
                        "population": run["population"], "candidates_per_s": rate,
                        "peak_flops": peak, "fp64_peak_flops": peak64,
                        "flops_per_candidate": flops.to_json(),
                        "bound_candidates_per_s": flops.bound(peak, peak64),
                        "share_of_bound": flops.share(rate, peak, peak64),
                        "recorded_share_of_bound": run.get("share_of_bound")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="propagator result files (JSON)")
    add_output_options(ap, "bound")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    rows = [r for f in args.files for r in rebound(f)]
    for r in rows:
        f = r["flops_per_candidate"]
        print(f"{r['file']}: {r['precision']} exchange {r['exchange_ms']} {r['variant']} "
              f"N={r['population']}: {r['candidates_per_s']:,.0f} candidates/s; "
              f"{f['total']:.3e} flops per candidate (builds {f['matrix_builds']:.2e} + "
              f"{f['span_builds']:.2e}); bound {r['bound_candidates_per_s']:,.0f}; "
              f"{100 * r['share_of_bound']:.1f} % of bound (recorded "
              f"{100 * (r['recorded_share_of_bound'] or 0):.1f} %)")
    result = {"provenance": provenance("bound", argv), "rows": rows}
    write(result, output_path(args, "bound"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
