"""``kingen tune``: classify the solver kernel, apply the transformations its verdict calls
for, keep each step that gains at least 5 %, and write the optimization log.

The loop (issue 11, part 2):

1. measure the solver kernel as it stands (check, time, profile, classify: the same
   framework as ``kingen analyze``);
2. map the verdict and its diagnostics to the transformations that answer it
   (:data:`RULES`); register caps are proposed only at the register counts where the number
   of resident warps changes (Ang Li's critical points, :func:`critical_points`);
3. build each proposed variant, check it against the exact reference, time it and
   classify it again; keep the fastest if it gains >= 5 % over the current one, else stop;
4. place every variant on the roofline with the stencil and SGEMM references and say which
   one it behaves like (:func:`behaves_like`);
5. record the choice per device, scheme and precision (:func:`kingen.solve.cuda.record_tuning`),
   which fits then use, and write ``optimization_log.md`` / ``optimization_log.json``.

The loop itself (:func:`optimize`) takes the measuring function as an argument: on a GPU it
is :func:`gpu_evaluator`; tests pass synthetic measurements.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from kingen.analysis.classify import Thresholds, classify
from kingen.analysis.metrics import MetricSet

# the rules and the log are importable from here too, as before their own modules
from kingen.analysis.rules import (
    BLOCKS,
    LANES,
    RULES,
    SPANS,
    Context,
    Measurement,
    Rule,
    SMLimits,
    critical_points,
    occupancy_pct,
    proposals,
    resident_warps,
    sm_limits,
    unanswered_advice,
)
from kingen.analysis.tunelog import (
    GAIN,
    OptimizationLog,
    RoofPoint,
    StepRow,
    behaves_like,
    make_row,
    markdown,
    references_from_analyze,
    roof_point,
    write_log,
)
from kingen.errors import KingenError
from kingen.solve.cuda import LaunchConfig

__all__ = [
    "GAIN", "LANES", "SPANS", "BLOCKS", "say", "SMLimits", "sm_limits", "resident_warps",
    "critical_points", "occupancy_pct", "Measurement", "Context", "Rule", "RULES", "proposals",
    "unanswered_advice", "RoofPoint", "roof_point", "references_from_analyze", "behaves_like",
    "StepRow", "OptimizationLog", "make_row", "markdown", "write_log", "optimize",
    "registers_of", "gpu_evaluator", "measure_references", "roofline_plot", "run_tune",
]


def say(*parts: Any) -> None:
    """One progress line, flushed at once."""
    print(*parts, flush=True)


# ------------------------------------------------------------------------------ the loop


def optimize(evaluate: Callable[[LaunchConfig], Measurement], start: LaunchConfig, *,
             n_states: int, n_candidates: int, propagator: bool,
             flops_ratio: float | None = None, references: list[RoofPoint] | None = None,
             place: Callable[[Measurement], RoofPoint] | None = None,
             limits: SMLimits | None = None, thresholds: Thresholds | None = None,
             rules: tuple[Rule, ...] = RULES, max_steps: int = 6, gain: float = GAIN,
             max_variants: int = 8, log: OptimizationLog | None = None,
             refine: Callable[[Measurement], Measurement] | None = None,
             on_step: Callable[[OptimizationLog], Any] | None = None,
             time_limit_s: float | None = None,
             echo: Callable[..., Any] = say) -> tuple[Measurement, OptimizationLog]:
    """Run the loop from ``start``; return the chosen variant's measurement and the log.

    Parameters
    ----------
    evaluate
        Checks, times and classifies one variant (:func:`gpu_evaluator` on a GPU).
    start
        The variant the solver uses now.
    n_states, n_candidates
        Of the batch (lanes are capped at the state count; candidates/s in the log).
    propagator
        Whether the solver has the propagator form.
    flops_ratio
        Declared propagator flops over stage flops on this batch (None: unknown).
    references, place
        Reference points and how to place a measurement on their roofline.
    max_steps, gain, max_variants
        At most this many steps, each kept only at ``gain`` x or better, each trying at
        most this many variants.
    refine
        Re-classifies one measurement with hardware counters (ncu), keeping its time: run
        on the baseline and on each step's best only, the variants the log's rows show and
        the next step's rules read (the others are compared on event time).
    on_step
        Called with the log after every step (``kingen tune`` writes it: a run cut short
        keeps the steps it finished).
    time_limit_s
        No new variant is started after this many seconds; the loop stops and says so.

    Raises
    ------
    KingenError
        When the starting variant fails its check.
    """
    log = log or OptimizationLog("?", "?", "?", n_candidates, "?")
    refs = references or []
    limits = limits or SMLimits()
    thresholds = thresholds or Thresholds()

    def like(m: Measurement) -> dict[str, Any]:
        return behaves_like(place(m), refs) if place and refs else {}

    def record(m: Measurement, step: int, rule: Rule | None) -> None:
        placed = m.ok and place is not None
        log.measurements.append({**m.to_json(), "step": step,
                                 "rule": rule.name if rule else "baseline",
                                 "roof": asdict(place(m)) if placed else None,
                                 "behaves_like": like(m) if m.ok else {}})

    t0 = time.perf_counter()

    def out_of_time() -> bool:
        return time_limit_s is not None and time.perf_counter() - t0 > time_limit_s

    def counters(m: Measurement) -> Measurement:
        if refine is None or not m.ok:
            return m
        echo(f"  {m.config.name}: profiling with ncu to re-classify it")
        return refine(m)

    def add_row(row: StepRow) -> None:  # and hand the log to on_step (kingen tune writes it)
        log.rows.append(row)
        if on_step:
            on_step(log)

    def stop(step: int, reason: str, then: str = "stopping") -> None:
        log.stop_reason = reason
        echo(f"step {step}: {reason}; {then}")

    echo(f"step 0: {start.name} (the solver kernel as it stands): check, time, classify")
    base = evaluate(start)
    if not base.ok:
        record(base, 0, None)
        raise KingenError(f"the starting variant fails its check ({base.note})",
                          field="tune", value=start.name)
    base = counters(base)
    record(base, 0, None)
    echo(f"step 0: {start.name}: {base.time_ms:.3f} ms, {base.verdict.kind} "
         f"({base.verdict.unit})")
    add_row(make_row(0, base, n_candidates, base.time_ms, base.time_ms, None, True,
                     like(base)))
    current = base
    tried = {start.name}
    log.stop_reason = f"reached the step limit ({max_steps})"
    for step in range(1, max_steps + 1):
        ctx = Context(current, n_states, propagator, flops_ratio, limits, thresholds)
        todo = proposals(ctx, tried, rules, max_variants)
        if not todo:
            stop(step, f"no transformation answers the verdict of {current.config.name} "
                       f"({current.verdict.kind}, {current.verdict.unit})")
            break
        echo(f"step {step}: {current.config.name} is {current.verdict.kind}; trying "
             + ", ".join(f"{c.name} ({r.name})" for c, r in todo))
        results: list[tuple[Measurement, Rule]] = []
        for cfg, rule in todo:
            if out_of_time():
                echo(f"step {step}: time limit ({time_limit_s:.0f} s) reached; "
                     f"{cfg.name} and later variants not tried")
                break
            tried.add(cfg.name)
            m = evaluate(cfg)
            record(m, step, rule)
            if m.ok:
                echo(f"step {step}: {cfg.name}: {m.time_ms:.3f} ms "
                     f"({current.time_ms / m.time_ms:.2f}x), {m.verdict.kind} "
                     f"({m.verdict.unit})")
                results.append((m, rule))
            else:
                echo(f"step {step}: {cfg.name}: FAILED its check ({m.note}); dropped")
        if not results:
            stop(step, f"time limit ({time_limit_s:.0f} s) reached" if out_of_time()
                 else f"no variant of step {step} passed its check")
            break
        best, rule = min(results, key=lambda mr: mr[0].time_ms)
        speedup = current.time_ms / best.time_ms
        kept = speedup >= gain
        best = counters(best)  # every row of the log on the same (counter) footing
        if refine is not None:
            for t in log.measurements:
                if t["variant"] == best.config.name and t["step"] == step:
                    t.update({**best.to_json(), "step": step, "rule": rule.name,
                              "roof": asdict(place(best)) if place else None,
                              "behaves_like": like(best)})
        row = make_row(step, best, n_candidates, base.time_ms, current.time_ms, rule, kept,
                       like(best))
        row.tried = [{"variant": m.config.name, "rule": r.name, "time_ms": m.time_ms}
                     for m, r in results]
        add_row(row)
        if not kept:
            stop(step, f"step {step}'s best, {best.config.name}, gains "
                       f"{100 * (speedup - 1):+.1f} % (< {100 * (gain - 1):.0f} %)",
                 f"stopping with {current.config.name}")
            break
        echo(f"step {step}: kept {best.config.name} ({speedup:.2f}x over "
             f"{current.config.name}, {base.time_ms / best.time_ms:.2f}x over the baseline)")
        current = best
        if out_of_time():
            stop(step, f"time limit ({time_limit_s:.0f} s) reached")
            break
    log.chosen = {"variant": current.config.name, "config": asdict(current.config),
                  "time_ms": current.time_ms,
                  "speedup_vs_baseline": base.time_ms / current.time_ms}
    log.unanswered_advice = unanswered_advice(current.verdict)
    return current, log


# ------------------------------------------------------------------------ on a real GPU


def registers_of(problem: Any, config: LaunchConfig) -> int | None:
    """Registers per thread of the compiled stage-form objective kernel (numba's count), or
    None when it cannot be read (propagator form, simulator, older numba-cuda)."""
    if config.form != "stage":
        return None
    try:
        from kingen.solve.compiled import solver_module

        sim = problem.simulator("cuda")
        if sim.simulator:
            return None  # the simulator has no registers
        kern = solver_module(problem.scheme, "objective", problem.precision, "cuda",
                             max_registers=config.max_registers,
                             n_windows=sim._n_windows("objective")).launch
        regs = kern.get_regs_per_thread()
        if isinstance(regs, dict):
            regs = max(regs.values()) if regs else None
        return int(regs) if regs else None
    except Exception:  # a count we cannot read is left to ncu
        return None


def gpu_evaluator(problem: Any, dev: Any, *, use_ncu: bool, full: bool, out_dir: Path,
                  thresholds: Thresholds, budget_s: float = 2.0, check_rows: int = 16,
                  echo: Callable[..., Any] = say
                  ) -> tuple[Callable[[LaunchConfig], Measurement],
                             Callable[[Measurement], Measurement] | None]:
    """The measuring functions of the loop on the current GPU.

    ``evaluate``: exact check (traces mode), CPU check of the timed objective kernel, event
    timing, classification on declared counts. ``refine`` (None without ncu): one ncu
    profile of a measured variant and its classification on the counters, at its event time.
    """
    from kingen.analysis.metrics import compute
    from kingen.analysis.report import ncu_profile, profile_case
    from kingen.analysis.solver_cases import (
        CPU_TOLERANCE,
        EXACT_TOLERANCE,
        cpu_error,
        exact_error,
        variant_case,
    )

    prec = problem.precision

    def evaluate(cfg: LaunchConfig) -> Measurement:
        # a variant that cannot be built or run (compile error, launch failure) is a failed
        # variant in the log, not the end of the run
        try:
            return _evaluate(cfg)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            why = f"{type(exc).__name__}: {first}"
            nan = MetricSet(name=cfg.name, intensity_dram=math.nan, balance_dram=math.nan)
            return Measurement(cfg, math.nan, math.nan, math.nan, nan,
                               classify(nan, thresholds), False, None, None, None, why)

    def _evaluate(cfg: LaunchConfig) -> Measurement:
        t0 = time.perf_counter()
        case = variant_case(problem, cfg, check_rows)
        echo(f"  {cfg.name}: compiling and checking against the exact reference")
        try:
            exact = exact_error(problem, cfg)
            cpu = cpu_error(problem, cfg, check_rows) if exact <= EXACT_TOLERANCE[prec] else None
        except KingenError as exc:  # e.g. the solver refuses this configuration
            exact, cpu, why = math.inf, None, str(exc)
        else:
            why = ""
        ok = exact <= EXACT_TOLERANCE[prec] and cpu is not None and cpu <= CPU_TOLERANCE[prec]
        if not ok:
            why = why or (f"exact error {exact:.2g} of peak (limit {EXACT_TOLERANCE[prec]:g})"
                          if not exact <= EXACT_TOLERANCE[prec] else
                          f"objective vs CPU {cpu:.2g} (limit {CPU_TOLERANCE[prec]:g})")
            nan = MetricSet(name=case.name, intensity_dram=math.nan, balance_dram=math.nan)
            return Measurement(cfg, math.nan, case.flops, case.bytes, nan,
                               classify(nan, thresholds), False, exact, cpu, None, why)
        echo(f"  {cfg.name}: check ok (exact {exact:.2g} of peak, CPU {cpu:.2g}); timing")
        rec, _times = profile_case(case, "default", False, repeats=10, budget_s=budget_s)
        m = compute(case.name, rec, dev, case.flops, case.bytes, "rk4", case.precision)
        v = classify(m, thresholds)
        note = f"event timing ({time.perf_counter() - t0:.0f} s)"
        return Measurement(cfg, rec.time_ms, case.flops, case.bytes, m, v, True, exact, cpu,
                           registers_of(problem, cfg), note)

    def refine(meas: Measurement) -> Measurement:
        t0 = time.perf_counter()
        case = variant_case(problem, meas.config, check_rows)
        rec = ncu_profile(case, "default", meas.time_ms, out_dir / "ncu", full)
        m = compute(case.name, rec, dev, case.flops, case.bytes, "rk4", case.precision)
        regs = int(rec.registers_per_thread) if rec.registers_per_thread else meas.registers
        note = (f"ncu ({time.perf_counter() - t0:.0f} s)" if rec.path == "ncu" else
                f"ncu not used: {rec.path_note}")
        echo(f"  {meas.config.name}: {note}")
        return replace(meas, metrics=m, verdict=classify(m, thresholds), registers=regs,
                       note=f"{meas.note}; {note}")

    return evaluate, (refine if use_ncu else None)


def measure_references(dev: Any, *, use_ncu: bool, out_dir: Path, thresholds: Thresholds,
                       echo: Callable[..., Any] = say) -> list[RoofPoint]:
    """Measure the stencil and SGEMM references (size "small") for the roofline."""
    from kingen.analysis.kernels.base import cases_for
    from kingen.analysis.metrics import compute
    from kingen.analysis.report import profile_case

    pts = []
    for case in cases_for("stencil", "small") + cases_for("sgemm", "small"):
        echo(f"  reference {case.name}: check, time" + (", ncu" if use_ncu else ""))
        ok, err = case.verify()
        if not ok:
            echo(f"  reference {case.name}: FAILED its check ({err:.2g}); left out")
            continue
        rec, _ = profile_case(case, "small", use_ncu, 10, out_dir / "ncu", budget_s=1.0)
        m = compute(case.name, rec, dev, case.flops, case.bytes, case.group, case.precision)
        pts.append(roof_point(case.name, case.group, m, case.flops, case.bytes,
                              classify(m, thresholds).kind, dev.peak("fp32_gflops"),
                              dev.warp_inst_per_s / 1e9))
    return pts


def roofline_plot(dev: Any, log: OptimizationLog, out_dir: Path) -> Path:
    """``roofline.png``: the variants of the log (filled, numbered by step) and the
    references (hollow) on one flop roofline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from kingen.analysis.report import flop_roofline_axes, save_figure

    fig, ax = plt.subplots(figsize=(8, 5.5))
    flop_roofline_axes(ax, dev, np.logspace(-2, 5, 200))
    for i, p in enumerate(log.references):
        ax.plot(p["flop_intensity"], p["gflops"], "s", mfc="none", color=f"C{i % 10}",
                label=f"{p['name']} ({p['kind']})")
    for t in log.measurements:
        roof = t.get("roof")
        if not t["ok"] or not roof or not roof["gflops"]:
            continue
        ax.plot(roof["flop_intensity"], roof["gflops"], "o", color="k", ms=4)
        ax.annotate(f"{t['step']}:{t['variant']}", (roof["flop_intensity"], roof["gflops"]),
                    fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_title(f"kingen tune: {log.model} {log.precision} on {dev.name}")
    ax.legend(fontsize=6, loc="lower right")
    return save_figure(fig, Path(out_dir) / "roofline.png")


def run_tune(model: str | None, out_dir: Path, *, precision: str = "float64",
             n_candidates: int = 16384, protocols: str = "standard",
             use_ncu: bool = True, full: bool = False, references: Path | None = None,
             max_steps: int = 6, gain: float = GAIN, record: bool = True,
             budget_s: float = 2.0, thresholds: Thresholds | None = None,
             time_limit_s: float | None = 480.0, start: str | None = None,
             echo: Callable[..., Any] = say) -> OptimizationLog:
    """``kingen tune`` on the current GPU (see the module docstring); returns the log.

    Raises
    ------
    KingenError
        No usable GPU, unknown model or protocol set, the starting variant fails its check.
    """
    from kingen.analysis.gpu import require_gpu
    from kingen.analysis.hardware import ceilings
    from kingen.analysis.solver_cases import propagator_available, solver_problem
    from kingen.solve.backends import cuda_status
    from kingen.solve.cuda import record_tuning

    t0 = time.perf_counter()
    require_gpu()
    th = thresholds or Thresholds()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    echo("device ceilings: from the cache, or measured now (about a minute, once per device)")
    dev = ceilings()
    echo(f"device: {dev.name}; FP64 {dev.peak('fp64_gflops'):.0f}, FP32 "
         f"{dev.peak('fp32_gflops'):.0f} GFLOP/s, DRAM {dev.peak('dram_gbs'):.0f} GB/s")
    echo(f"building the batch: {model or 'robert_howe_2003'}, {precision}, "
         f"{n_candidates} candidates, protocols {protocols}")
    problem = solver_problem(model, n_candidates, precision, protocols)
    sim = problem.simulator("cuda")
    has_prop = propagator_available(sim)
    ratio = None
    if has_prop:
        try:
            stage = problem.flops(LaunchConfig())
            ratio = problem.flops(LaunchConfig(form="propagator")) / stage if stage else None
        except Exception as exc:  # a solver whose plan cannot be read: stage form only
            has_prop = False
            echo(f"propagator plan unreadable ({type(exc).__name__}: {exc}); "
                 "stage-form variants only")
        else:
            echo(f"propagator form available: {ratio:.3f}x the stage form's flops on this "
                 "batch" if ratio is not None else "propagator form available")
    else:
        echo("propagator form not in this solver: stage-form variants only")
    if references is not None:
        refs = references_from_analyze(references, {k: dev.peak(k) for k in (
            "fp32_gflops", "fp64_gflops")}, dev.warp_inst_per_s / 1e9)
        echo(f"references: {len(refs)} kernels from {references}")
    else:
        echo("measuring the stencil and SGEMM references (size small) for the roofline")
        refs = measure_references(dev, use_ncu=use_ncu, out_dir=out_dir, thresholds=th,
                                  echo=echo)
    fp_peak = dev.peak("fp64_gflops" if precision == "float64" else "fp32_gflops")

    def place(m: Measurement) -> RoofPoint:
        return roof_point(m.config.name, "rk4", m.metrics, m.flops, m.bytes, m.verdict.kind,
                          fp_peak, dev.warp_inst_per_s / 1e9)

    status = cuda_status()
    log = OptimizationLog(problem.model, precision, protocols, n_candidates, status.device,
                          command=" ".join(["kingen", *sys.argv[1:]]))
    log.references = [r.to_json() for r in refs]
    evaluate, refine = gpu_evaluator(problem, dev, use_ncu=use_ncu, full=full,
                                     out_dir=out_dir, thresholds=th, budget_s=budget_s,
                                     echo=echo)
    # by default the loop starts from the kernel the solver would launch now; ``start``
    # names another (``b128``: the stage form, as kingen shipped before the propagator)
    start_config = sim.launch_config() if start is None else LaunchConfig.parse(start)

    def save(partial: OptimizationLog) -> None:
        partial.seconds = time.perf_counter() - t0
        write_log(partial, out_dir)

    left = None if time_limit_s is None else max(time_limit_s - (time.perf_counter() - t0), 0)
    best, log = optimize(evaluate, start_config, n_states=problem.scheme.n_states,
                         n_candidates=n_candidates, propagator=has_prop, flops_ratio=ratio,
                         references=refs, place=place, limits=sm_limits(), thresholds=th,
                         max_steps=max_steps, gain=gain, log=log, refine=refine,
                         on_step=save, time_limit_s=left, echo=echo)
    if record:
        path = record_tuning(status.device, problem.scheme, precision, best.config,
                             {"log": str(out_dir / "optimization_log.json"),
                              "time_ms": best.time_ms, "baseline_ms": log.rows[0].time_ms,
                              "candidates": n_candidates, "protocols": protocols})
        log.recorded_in = str(path)
    log.seconds = time.perf_counter() - t0
    j, md = write_log(log, out_dir)
    try:
        echo(f"wrote {roofline_plot(dev, log, out_dir)}")
    except Exception as exc:  # the plot is a convenience; the log is what matters
        echo(f"roofline plot not written: {exc}")
    echo(f"chosen: {best.config.name}, {log.chosen['speedup_vs_baseline']:.2f}x the baseline "
         f"({log.stop_reason})" + (f"; recorded in {log.recorded_in}" if log.recorded_in else
                                   "; not recorded (--no-record)"))
    echo(f"wrote {md} and {j} ({log.seconds:.0f} s)")
    return log
