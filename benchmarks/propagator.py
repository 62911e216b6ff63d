"""Candidates per second of the solver's forms and launches, checked against the stage form.

For one scheme on the standard protocol set, objective mode (the GA's path), with each
exchange time of ``--exchange`` (0: ideal steps; ``0,0.2`` gives rows for both), every
requested variant (``stage-b128``, ``prop-l4-b128``, ...) is:

1. compiled (time recorded) and checked against the CPU stage form on 64 candidates:
   relative error of Σw·g² and Σw·g·d;
2. timed end to end through ``Simulator.run`` (upload, matrix build, sample kernel,
   download: what a generation pays), median of ``--repeats``, with the process's
   allocator set up as ``kingen fit`` sets it (:mod:`kingen.base.allocator`: freed memory
   reused, not faulted in afresh each call); each run records the host's share (the
   solver's ``prepare_s``, ``finish_s``);
3. timed kernel-only with CUDA events around the prepared launch (GPU only).

Figures: candidates/s (the headline), seconds per generation at that population,
model-steps/s (stage-form RK4 steps × candidates / s, for comparison with earlier tables),
and the share of the variant's FP64 (or FP32) arithmetic bound at the device's measured peak:
its own flops per candidate, term by term (RK4 steps, products, currents, matrix and span
builds; :mod:`kingen.analysis.bound`), so that spans of 16 count 65 flops a sample for
Robert & Howe, not the 534 of one product per sample. Each row records the terms.

    python -m benchmarks propagator --model robert_howe_2003 \\
        --variants stage-b128,prop-l4-b128 --populations 16384,65536 --name rh03

Each row records its exchange time and the propagator plan's counts per candidate (keys,
propagated samples, edge samples, RK4 steps left in stage form). Ideal steps against 0.2 ms
exchange, Robert & Howe, both precisions, at 16,384 candidates:

    python -m benchmarks propagator --exchange 0,0.2 --variants prop-l8-s16-b128,prop-l2-s8-b128 \\
        --name rh03_exchange

(``--filter bessel:8:5`` adds an 8-pole recording filter in the kernel to every protocol;
``--measured 0.2`` rows with a measured exchange waveform read from a file, edges of 0.2 ms;
``--protocols dose_response`` a subset of the standard set)
writes ``benchmarks/results/<device>/propagator/rh03.json`` (``--out FILE`` to choose;
``python benchmarks/propagator.py`` is the same command).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from benchmarks.solver import WINDOWS, candidates, objective_inputs  # noqa: E402
from kingen.analysis.bound import variant_flops  # noqa: E402
from kingen.base.allocator import keep_freed_memory  # noqa: E402
from kingen.experiment.chain import parse_filter  # noqa: E402
from kingen.experiment.exchange import ExchangeSpec, apply_exchange  # noqa: E402
from kingen.experiment.protocol import standard_protocol  # noqa: E402
from kingen.model.scheme import Scheme  # noqa: E402
from kingen.solve import Simulator  # noqa: E402
from kingen.solve.cuda import LaunchConfig  # noqa: E402
from kingen.solve.options import SolverOptions  # noqa: E402
from kingen.solve.schedule import candidate_steps, coarse_steps  # noqa: E402

STANDARD = ("deactivation", "desensitization", "recovery", "dose_response")


def kernel_info(sim: Simulator, config: LaunchConfig) -> dict:
    """Registers and local memory per thread of the compiled kernels (GPU only)."""
    if sim.backend != "cuda":
        return {}
    module = sim._module("objective", config, False)
    info = {}
    for name in ("launch", "build"):
        kern = getattr(module, name, None)
        if kern is None:
            continue
        try:
            info[f"{name}_registers"] = int(next(iter(kern.get_regs_per_thread().values())))
            info[f"{name}_local_bytes"] = int(next(iter(
                kern.get_local_mem_per_thread().values())))
        except Exception as exc:  # older numba-cuda: leave it out, say why
            info[f"{name}_info_error"] = str(exc)
    return info


def event_ms(call, repeats: int) -> float:
    """Median milliseconds of ``call`` between CUDA events."""
    from numba import cuda

    call()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = cuda.event(), cuda.event()
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end))
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="robert_howe_2003")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--precisions", default="float64,float32")
    ap.add_argument("--variants", default="stage-b128,prop-l1-b128,prop-l4-b128")
    ap.add_argument("--populations", default="16384")
    ap.add_argument("--exchange", default="0",
                    help="10-90 %% exchange times, ms, comma-separated: rows for each "
                         "(0: ideal steps)")
    ap.add_argument("--measured", default="",
                    help="10-90 %% times, ms, comma-separated, of measured exchange rows: a "
                         "synthetic open-tip junction current with edges of that time (0.5 "
                         "%% noise) is written as CSV and read as a template of every edge")
    ap.add_argument("--filter", default=None,
                    help="recording filter on every protocol, as kingen simulate --filter "
                         "takes it (bessel:8:5: kind, poles, cutoff in kHz)")
    ap.add_argument("--windows", default="sweep", choices=WINDOWS,
                    help="the objective's feature windows: one peak window over each sweep "
                         "(default), none (a fit to recordings), or those of a fit with "
                         "summary targets")
    ap.add_argument("--protocols", default=",".join(STANDARD),
                    help="the standard protocols to run, comma-separated (default: all "
                         "four; a subset measures what each one's rows cost)")
    ap.add_argument("--spread", type=float, default=0.2,
                    help="the timed candidates are log-uniform in this middle share of each "
                         "parameter's log range: 0.2 (default) gathered as a converging "
                         "fit's, 1 the whole bounds, as a first generation (each candidate's "
                         "own steps on the edges depend on its rates)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", type=int, default=64, help="candidates checked against CPU")
    ap.add_argument("--peak-fp64", type=float, default=30.3e12, help="flop/s (measured H100)")
    ap.add_argument("--peak-fp32", type=float, default=57.0e12)
    add_output_options(ap, "propagator")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    out = output_path(args, "propagator")
    keep_freed_memory()  # as kingen fit: a generation's arrays reuse the last one's pages

    def log(msg: str) -> None:
        print(msg, flush=True)

    scheme = Scheme.load(ROOT / "models" / f"{args.model}.toml")
    exchanges = [float(x) for x in args.exchange.split(",") if x]
    measured = [float(x) for x in args.measured.split(",") if x]
    try:
        names = protocol_names(args.protocols)
    except ValueError as exc:
        ap.error(str(exc))
    result = {"provenance": provenance("propagator", argv), "model": args.model,
              "exchange_ms": exchanges, "measured_ms": measured, "filter": args.filter,
              "windows": args.windows, "protocols": names, "rows": []}
    cases = [(x, [standard_protocol(n, exchange=x) for n in names]) for x in exchanges]
    for x in measured:
        with tempfile.TemporaryDirectory() as folder:
            spec = ExchangeSpec(open_tip(Path(folder) / "tip.csv", x))
            cases.append((f"measured {x:g}",
                          [apply_exchange(standard_protocol(n), spec) for n in names]))
    for exchange, protocols in cases:
        for prec in args.precisions.split(","):
            measure(args, scheme, protocols, exchange, prec, result, out, log)
    return 0


def protocol_names(text: str) -> list[str]:
    """The standard protocols ``--protocols`` names, in the standard set's order.

    >>> protocol_names("dose_response,deactivation")
    ['deactivation', 'dose_response']
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(STANDARD))
    if unknown or not names:
        raise ValueError(f"--protocols takes some of {', '.join(STANDARD)}, got {text!r}")
    return [n for n in STANDARD if n in names]


def open_tip(path: Path, ten_ninety: float) -> Path:
    """A synthetic open-tip junction current: one 5 ms pulse with tanh edges of the given
    10-90 % time, sampled every 2 µs, 0.5 % noise, as a CSV file."""
    t = np.arange(0.0, 9.0, 0.002)
    tau = ten_ninety / (2.0 * np.arctanh(0.8))

    def edge(s):
        return 0.5 * (1.0 + np.tanh(s / tau))

    y = -200.0 * edge(t - 2.0) * (1.0 - edge(t - 7.0))
    y += np.random.default_rng(0).normal(0.0, 1.0, t.size)
    path.write_text("time_ms,junction_pA\n" + "".join(f"{a:.4f},{b:.5f}\n"
                                                        for a, b in zip(t, y)))
    return path


def plan_counts(plan, n_states: int) -> dict:
    """The propagator plan's counts per candidate, over all sweeps (``build_steps``: the RK4
    steps of building every key's matrix, S unit rows each)."""
    return {"keys": plan.n_keys, "prop_samples": plan.prop_samples,
            "edge_samples": plan.edge_samples, "stage_steps": plan.stage_steps,
            "build_steps": n_states * sum(plan.key_steps), "stage_rows": plan.stage_rows}


def measure(args, scheme: Scheme, protocols: list, exchange, prec: str, result: dict,
            out: Path, log) -> None:
    """The rows of one exchange time and precision: every variant, every population."""
    obj = objective_inputs(scheme, protocols, args.windows)
    S = scheme.n_states
    filters = [parse_filter(args.filter)] * len(protocols) if args.filter else None
    sim = Simulator(scheme, protocols, SolverOptions(backend=args.backend, precision=prec),
                    objective=obj, filters=filters)
    cpu = Simulator(scheme, protocols, SolverOptions(backend="cpu", precision=prec),
                    objective=obj, filters=filters)
    result["device"] = sim.device
    plan = sim.propagator_plan()
    steps = sim.schedule.total_steps
    check = candidates(scheme, args.check, seed=7, spread=args.spread)
    ref = cpu.run(check, "objective", launch_config=LaunchConfig())
    peak = args.peak_fp64 if prec == "float64" else args.peak_fp32
    built = S * sum(plan.key_steps)
    log(f"== {args.model} {prec}, exchange {exchange} ms: {S} states, {steps} RK4 "
        f"steps and {sim.schedule.n_samples} samples per candidate; {plan.n_keys} keys, "
        f"{plan.prop_samples} propagated samples ({plan.edge_samples} on edges), "
        f"{built} RK4 steps to build them, {plan.stage_steps} stage steps left")
    for text in args.variants.split(","):
        config = LaunchConfig.parse(text)
        # the variant's own arithmetic: spans, builds and stage rows each as they are
        flops = variant_flops(scheme, sim.schedule, config, prec,
                              plan if config.form == "propagator" else None)
        bound = flops.bound(peak, args.peak_fp64)  # the builds run in float64
        log(f"  {config.name}: {flops.total:.3e} flops per candidate, arithmetic bound "
            f"{bound:.0f} candidates/s")
        row = {"precision": prec, "exchange_ms": exchange, "filter": args.filter,
               "variant": config.name, "spread": args.spread,
               "config": config.__dict__, "bound_candidates_per_s": bound,
               "peak_flops": peak, "flops_per_candidate": flops.to_json(),
               "plan": plan_counts(plan, S)}
        t0 = time.perf_counter()
        got = sim.run(check, "objective", launch_config=config)
        row["compile_and_check_s"] = time.perf_counter() - t0
        ok = ~(ref.fail.any(1) | got.fail.any(1))
        row["check_rel_error_sgg"] = float(np.abs(got.sgg[ok] - ref.sgg[ok]).max()
                                           / np.abs(ref.sgg[ok]).max())
        row["check_rel_error_sgd"] = float(np.abs(got.sgd[ok] - ref.sgd[ok]).max()
                                           / np.abs(ref.sgd[ok]).max())
        row["check_fail_mismatch"] = int((ref.fail.any(1) != got.fail.any(1)).sum())
        row.update(kernel_info(sim, config))
        log(f"  {config.name:18s} compile+check {row['compile_and_check_s']:6.1f} s, "
            f"rel. error {row['check_rel_error_sgg']:.1e}, "
            f"regs {row.get('launch_registers', '-')}, "
            f"local {row.get('launch_local_bytes', '-')} B")
        row["runs"] = []
        for n in map(int, args.populations.split(",")):
            params = candidates(scheme, n, seed=n, spread=args.spread)
            timings = []
            for _ in range(args.repeats):  # one result alive at a time, as in a fit
                res = sim.run(params, "objective", launch_config=config)
                timings.append(res.timings)
            total = float(np.median([t["total_s"] for t in timings]))
            taken = candidate_steps(sim.schedule, coarse_steps(scheme, sim.schedule, params))
            run = {"population": n, "run_s": total, "candidates_per_s": n / total,
                   "model_steps_per_s": n * steps / total,
                   # the schedule's steps, less those each candidate takes as one on edges
                   "rk4_steps_taken_mean": float(taken.mean()),
                   "failed": int((res.fail != 0).any(1).sum()),
                   "share_of_bound": n / total / bound,
                   "host_ms": {k: 1e3 * float(np.median([t[f"{k}_s"] for t in timings]))
                               for k in ("prepare", "finish")}}
            if args.backend == "cuda":
                call = sim.prepare_launch(params, config)
                ms = event_ms(call, args.repeats)
                run["kernel_ms"] = ms
                run["kernel_candidates_per_s"] = n / (ms * 1e-3)
                run["stage_ms"] = {name: event_ms(stage, args.repeats)
                                   for name, stage in call.stages}
            log(f"    N={n:6d} {total:7.3f} s/generation {n / total:10.0f} candidates/s "
                f"({n * steps / total:.2e} model-steps/s, {100 * n / total / bound:.1f} % "
                f"of bound)" + (f"; kernels {run['kernel_ms']:.1f} ms (" + ", ".join(
                    f"{k} {v:.1f}" for k, v in run["stage_ms"].items()) + ")"
                    if 'kernel_ms' in run else ""))
            row["runs"].append(run)
        result["rows"].append(row)
        write(result, out)  # after every variant: a run cut short keeps what it measured


if __name__ == "__main__":
    raise SystemExit(main())
