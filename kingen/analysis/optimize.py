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

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kingen.analysis.classify import COMPUTE, LATENCY, MEMORY, Thresholds, Verdict, classify
from kingen.analysis.metrics import MetricSet
from kingen.errors import KingenError
from kingen.solve.cuda import LaunchConfig

GAIN = 1.05  # a step is kept when it is at least this much faster than the current variant
LANES = (1, 2, 4, 8)
SPANS = ((4, 8), (8, 16), (4, 4))  # (lanes, samples per product) tried first
BLOCKS = (64, 128, 256)


def say(*parts: Any) -> None:
    """One progress line, flushed at once."""
    print(*parts, flush=True)


# ------------------------------------------------------------- occupancy critical points


@dataclass(frozen=True)
class SMLimits:
    """Per-SM limits that set occupancy (defaults: compute capability 7.0-9.0)."""

    regs_per_sm: int = 65536
    max_warps: int = 64
    max_blocks: int = 32
    reg_alloc_unit: int = 256  # registers are allocated per warp in units of this many
    max_regs_per_thread: int = 255
    warp_size: int = 32


def sm_limits() -> SMLimits:
    """The current device's limits, or the defaults when they cannot be read."""
    try:
        from numba import cuda

        dev = cuda.get_current_device()
        return SMLimits(regs_per_sm=int(dev.MAX_REGISTERS_PER_MULTIPROCESSOR),
                        max_warps=int(dev.MAX_THREADS_PER_MULTI_PROCESSOR) // 32,
                        max_blocks=int(getattr(dev, "MAX_BLOCKS_PER_MULTIPROCESSOR", 32)))
    except Exception:  # any trouble reading attributes: the common limits
        return SMLimits()


def resident_warps(registers: int, block: int, lim: SMLimits | None = None) -> int:
    """Warps resident on one SM for ``registers`` per thread and ``block`` threads per block.

    Registers are allocated per warp, rounded up to the allocation unit; whole blocks are
    resident or none; warps and blocks per SM are capped.
    """
    lim = lim or SMLimits()
    if registers < 1 or block < 1:
        raise ValueError("registers and block must be >= 1")
    wpb = -(-block // lim.warp_size)
    per_warp = -(-registers * lim.warp_size // lim.reg_alloc_unit) * lim.reg_alloc_unit
    blocks = min((lim.regs_per_sm // per_warp) // wpb, lim.max_blocks, lim.max_warps // wpb)
    return blocks * wpb


def critical_points(block: int, lim: SMLimits | None = None) -> list[tuple[int, int]]:
    """Ang Li's register critical points for one block size: ``(registers, warps)`` pairs,
    the largest per-thread register count that still gives each occupancy level, from the
    most registers (fewest warps) down. A cap between two points adds spills and no warp.
    """
    lim = lim or SMLimits()
    best: dict[int, int] = {}
    for r in range(lim.max_regs_per_thread, 0, -1):
        w = resident_warps(r, block, lim)
        if w > 0 and w not in best:
            best[w] = r
    return sorted(((r, w) for w, r in best.items()), reverse=True)


def occupancy_pct(registers: int, block: int, lim: SMLimits | None = None) -> float:
    """Theoretical occupancy (resident warps over the SM's maximum), percent."""
    lim = lim or SMLimits()
    return 100.0 * resident_warps(registers, block, lim) / lim.max_warps


# ------------------------------------------------------------------------- measurements


@dataclass
class Measurement:
    """One variant, checked, timed and classified."""

    config: LaunchConfig
    time_ms: float
    flops: float
    bytes: float
    metrics: MetricSet
    verdict: Verdict
    ok: bool = True
    exact_error: float | None = None
    cpu_error: float | None = None
    registers: int | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.config.name, "config": asdict(self.config),
                "time_ms": self.time_ms, "flops": self.flops, "bytes": self.bytes,
                "ok": self.ok, "exact_error": self.exact_error, "cpu_error": self.cpu_error,
                "registers": self.registers, "note": self.note,
                "metrics": self.metrics.to_json(), "verdict": self.verdict.to_json()}


@dataclass
class Context:
    """What the rules read about the current variant."""

    current: Measurement
    n_states: int
    propagator: bool  # the solver has the propagator form
    flops_ratio: float | None  # propagator flops / stage flops for this batch
    limits: SMLimits = field(default_factory=SMLimits)
    thresholds: Thresholds = field(default_factory=Thresholds)

    @property
    def config(self) -> LaunchConfig:
        return self.current.config

    @property
    def kind(self) -> str:
        return self.current.verdict.kind

    @property
    def m(self) -> MetricSet:
        return self.current.metrics

    @property
    def registers(self) -> int | None:
        r = self.current.registers or self.m.registers_per_thread
        return int(r) if r else None

    @property
    def spills(self) -> bool:
        return bool(self.m.local_bytes)

    @property
    def topics(self) -> set[str]:
        return {a.topic for a in self.current.verdict.advice}

    def low_occupancy(self) -> bool:
        occ = self.m.achieved_occupancy_pct or self.m.theoretical_occupancy_pct
        if occ is None and self.registers:
            occ = occupancy_pct(self.registers, self.config.block, self.limits)
        return occ is not None and occ < self.thresholds.occupancy_pct

    def issue_limited(self) -> bool:
        return (self.m.pct_inst or 0.0) >= 60.0 or "instruction mix" in self.topics


# -------------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Rule:
    """A verdict (plus diagnostics) and the launch transformations that answer it."""

    name: str
    when: str  # the trigger, in words
    advice: str  # the framework's advice it follows
    builds: str  # the variants it proposes, in words
    applies: Callable[[Context], bool]
    propose: Callable[[Context], list[LaunchConfig]]


def _propagator_variants(c: Context) -> list[LaunchConfig]:
    return [LaunchConfig(c.config.block, None, "propagator", k) for k in LANES
            if k <= max(c.n_states, 1)]


def _caps_below(c: Context) -> list[LaunchConfig]:
    regs = c.registers or c.limits.max_regs_per_thread
    points = [r for r, _ in critical_points(c.config.block, c.limits) if r < regs and r >= 32]
    return [replace(c.config, max_registers=r) for r in points[:2]]


def _cap_above(c: Context) -> list[LaunchConfig]:
    cap = c.config.max_registers
    if cap is None:
        return []
    above = [r for r, _ in critical_points(c.config.block, c.limits) if r > cap]
    return [replace(c.config, max_registers=min(above) if above else None)]


def _lanes(c: Context, factor: float) -> list[LaunchConfig]:
    k = int(c.config.lanes * factor)
    if c.config.form != "propagator" or k not in LANES or k > c.n_states:
        return []
    if c.config.span > 1 and (k < 2 or c.config.span % k):
        return []  # a span is shared out evenly over at least two lanes
    return [replace(c.config, lanes=k)]


def _span_variants(c: Context) -> list[LaunchConfig]:
    return [replace(c.config, lanes=lanes, span=span) for lanes, span in SPANS
            if lanes <= c.n_states]


def _smaller_block(c: Context) -> list[LaunchConfig]:
    out = [replace(c.config, block=c.config.block // 2)] if c.config.block >= 64 else []
    return out + _lanes(c, 2)


def _other_blocks(c: Context) -> list[LaunchConfig]:
    return [replace(c.config, block=b) for b in BLOCKS if b != c.config.block]


RULES: tuple[Rule, ...] = (
    Rule("less-arithmetic",
         "compute-bound (or issue-limited latency-bound) in stage form, and the propagator "
         "form does fewer flops on this batch",
         "near the compute roof: do fewer operations (algebra, precompute)",
         "form=propagator, lanes 1/2/4/8",
         lambda c: (c.kind == COMPUTE or (c.kind == LATENCY and c.issue_limited()))
         and c.config.form == "stage" and c.propagator
         and (c.flops_ratio is None or c.flops_ratio < 1.0),
         _propagator_variants),
    Rule("sample-spans",
         "propagator form with one product per sample, compute- or latency-bound, no spills "
         "(each sample is a serial load-product-exchange step, and every lane repeats the "
         "sample's bookkeeping)",
         "near the roof or latency-bound: do fewer operations per result (regroup the "
         "algebra: B currents from precomputed Mʲg, the state by one product with M^B)",
         "span 8 with 4 lanes, span 16 with 8 lanes, span 4 with 4 lanes",
         lambda c: c.config.form == "propagator" and c.config.span == 1
         and c.kind in (COMPUTE, LATENCY) and not c.spills,
         _span_variants),
    Rule("uncap-spills",
         "spills to local memory under a register cap",
         "spills / local memory: shrink per-thread state or give it registers",
         "the next register critical point above the cap (or no cap)",
         lambda c: c.spills and c.config.max_registers is not None,
         _cap_above),
    Rule("more-lanes",
         "propagator form spilling, or latency-bound with > 128 registers and low occupancy",
         "spills / registers vs occupancy: fewer columns of D per thread",
         "lanes x 2",
         lambda c: c.config.form == "propagator" and (
             c.spills or (c.kind == LATENCY and (c.registers or 0) > 128
                          and c.low_occupancy())),
         lambda c: _lanes(c, 2)),
    Rule("register-cap",
         "latency-bound, low occupancy, > 128 registers per thread, no spills",
         "registers vs occupancy: cap registers (Ang Li's critical points)",
         "max_registers at the next two critical points below the current count",
         lambda c: c.kind == LATENCY and (c.registers or 0) > 128 and c.low_occupancy()
         and not c.spills,
         _caps_below),
    Rule("fewer-lanes",
         "memory-bound on L1/shared or L2 in propagator form",
         "on-chip reuse: keep D in registers (fewer lanes, less p exchanged)",
         "lanes / 2",
         lambda c: c.kind == MEMORY and c.current.verdict.unit in ("L1/shared", "L2")
         and c.config.form == "propagator" and c.config.lanes > 1,
         lambda c: _lanes(c, 0.5)),
    Rule("more-threads",
         "latency-bound with less than one wave of blocks",
         "too little work: launch more threads",
         "block / 2; in propagator form also lanes x 2",
         lambda c: c.kind == LATENCY and c.m.waves is not None and c.m.waves < 1.0,
         _smaller_block),
    Rule("launch-shape",
         "latency-bound and no counter names a cause (event-timing path)",
         "latency: no single cause; try the launch shape",
         "threads per block 64/128/256",
         lambda c: c.kind == LATENCY and c.m.path != "ncu",
         _other_blocks),
)


def proposals(ctx: Context, tried: set[str], rules: tuple[Rule, ...] = RULES,
              limit: int = 8) -> list[tuple[LaunchConfig, Rule]]:
    """The untried variants the rules propose for the current one, first rule first."""
    out: list[tuple[LaunchConfig, Rule]] = []
    seen = set(tried)
    for rule in rules:
        if not rule.applies(ctx):
            continue
        for cfg in rule.propose(ctx):
            if cfg.name not in seen:
                seen.add(cfg.name)
                out.append((cfg, rule))
    return out[:limit]


def unanswered_advice(v: Verdict) -> list[str]:
    """The verdict's advice that no launch transformation answers (reported, not followed)."""
    answered = {"near the compute roof", "instruction mix", "spills / local memory",
                "registers vs occupancy", "too little work", "on-chip reuse", "latency"}
    return [f"{a.topic}: {a.action}" for a in v.advice if a.topic not in answered]


# ------------------------------------------------------------------ roofline placement


@dataclass
class RoofPoint:
    """A kernel on the flop roofline (and the instruction roofline where ncu ran)."""

    name: str
    group: str
    flop_intensity: float  # flop per DRAM byte (measured bytes where ncu ran)
    gflops: float
    pct_peak: float  # of the FP peak of its precision
    kind: str
    inst_intensity: float | None = None
    warp_gips: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def roof_point(name: str, group: str, m: MetricSet, flops: float, nbytes: float, kind: str,
               fp_peak_gflops: float, warp_gips_peak: float | None = None) -> RoofPoint:
    """Place one measured kernel."""
    b = m.dram_bytes or nbytes
    gf = m.gflops or 0.0
    gips = (m.pct_inst * warp_gips_peak / 100.0
            if m.pct_inst is not None and warp_gips_peak else None)
    return RoofPoint(name, group, flops / b if b else math.inf, gf,
                     100.0 * gf / fp_peak_gflops if fp_peak_gflops else float("nan"), kind,
                     m.intensity_dram if m.path == "ncu" else None, gips)


def references_from_analyze(path: Path, fp_peaks: dict[str, float] | None = None,
                            warp_gips_peak: float | None = None) -> list[RoofPoint]:
    """The stencil and SGEMM points of an ``analyze.json`` (``kingen analyze all``)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise KingenError(f"cannot read the reference analysis ({exc})", field="references",
                          value=str(path)) from exc
    dev = data.get("device", {})
    measured = dev.get("measured", {})
    sheet = dev.get("datasheet", {})
    peaks = fp_peaks or {k: measured.get(k, sheet.get(k, float("nan")))
                         for k in ("fp32_gflops", "fp64_gflops")}
    gips = warp_gips_peak or (dev.get("warp_inst_per_s", 0.0) / 1e9 or None)
    out = []
    for rec in data.get("cases", []):
        if rec.get("group") not in ("stencil", "sgemm") or "metrics" not in rec:
            continue
        m = MetricSet.from_json(rec["metrics"])
        peak = peaks["fp64_gflops" if m.precision == "fp64" else "fp32_gflops"]
        out.append(roof_point(rec["name"], rec["group"], m, rec["flops"], rec["bytes"],
                              rec.get("verdict", {}).get("kind", ""), peak, gips))
    if not out:
        raise KingenError("no stencil or SGEMM kernel in the reference analysis",
                          field="references", value=str(path))
    return out


def behaves_like(p: RoofPoint, refs: list[RoofPoint]) -> dict[str, Any]:
    """The reference nearest to ``p`` in (log intensity, log % of peak), on the instruction
    roofline where every point has counters, else on the flop roofline; and the references
    with the same verdict."""
    if not refs:
        return {"nearest": None, "family": None, "same_verdict": [], "space": None}
    inst = p.inst_intensity is not None and p.warp_gips and all(
        r.inst_intensity is not None and r.warp_gips for r in refs)

    def coords(q: RoofPoint) -> tuple[float, float]:
        if inst:
            return math.log10(q.inst_intensity), math.log10(q.warp_gips)
        return (math.log10(max(q.flop_intensity, 1e-12)),
                math.log10(max(q.pct_peak, 1e-6)))

    x, y = coords(p)
    best = min(refs, key=lambda r: math.dist((x, y), coords(r)))
    return {"nearest": best.name, "family": best.group,
            "distance": round(math.dist((x, y), coords(best)), 3),
            "same_verdict": sorted({r.group for r in refs if r.kind == p.kind}),
            "space": "instruction roofline" if inst else "flop roofline"}


# ------------------------------------------------------------------------------- the log


@dataclass
class StepRow:
    """One row of the optimization log."""

    step: int
    variant: str
    config: dict[str, Any]
    kept: bool
    time_ms: float
    candidates_per_s: float
    flops: float
    gflops: float | None
    intensity: float
    balance: float
    intensity_unit: str
    pct_fp64: float | None
    pct_fp32: float | None
    pct_dram: float | None
    pct_l2: float | None
    pct_inst: float | None
    verdict: str
    advice: str
    rule: str
    speedup_vs_baseline: float
    speedup_vs_previous: float
    exact_error: float | None
    path: str
    behaves_like: dict[str, Any] = field(default_factory=dict)
    tried: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class OptimizationLog:
    """The whole run: what was tuned, the rows, every variant tried, and the choice."""

    model: str
    precision: str
    protocols: str
    candidates: int
    device: str
    rows: list[StepRow] = field(default_factory=list)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    references: list[dict[str, Any]] = field(default_factory=list)
    chosen: dict[str, Any] = field(default_factory=dict)
    stop_reason: str = ""
    unanswered_advice: list[str] = field(default_factory=list)
    recorded_in: str = ""
    command: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["rules"] = [{"name": r.name, "when": r.when, "advice": r.advice, "builds": r.builds}
                      for r in RULES]
        return d


def make_row(step: int, m: Measurement, n_candidates: int, baseline_ms: float,
             previous_ms: float, rule: Rule | None, kept: bool,
             like: dict[str, Any] | None = None) -> StepRow:
    """A log row from one measurement."""
    ms_ = m.metrics
    v = m.verdict
    return StepRow(
        step=step, variant=m.config.name, config=asdict(m.config), kept=kept,
        time_ms=m.time_ms, candidates_per_s=n_candidates / (m.time_ms * 1e-3),
        flops=m.flops, gflops=ms_.gflops, intensity=ms_.intensity_dram,
        balance=ms_.balance_dram, intensity_unit=ms_.unit, pct_fp64=ms_.pct_fp64,
        pct_fp32=ms_.pct_fp32, pct_dram=ms_.pct_dram, pct_l2=ms_.pct_l2,
        pct_inst=ms_.pct_inst, verdict=f"{v.kind} ({v.unit})",
        advice=rule.advice if rule else "baseline: the solver kernel as it stands",
        rule=rule.name if rule else "-",
        speedup_vs_baseline=baseline_ms / m.time_ms, speedup_vs_previous=previous_ms / m.time_ms,
        exact_error=m.exact_error, path=ms_.path, behaves_like=like or {})


def _f(x: float | None, spec: str = ".0f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def markdown(log: OptimizationLog) -> str:
    """The log as Markdown: header, one row per step, the variants tried, the choice."""
    lines = [f"# Optimization log: {log.model}, {log.precision}, {log.device}", "",
             f"{log.candidates:,} candidates, protocols: {log.protocols}; "
             f"a step is kept when it gains >= {100 * (GAIN - 1):.0f} %.", ""]
    if log.command:
        lines += [f"Command: `{log.command}` ({log.seconds:.0f} s)", ""]
    lines += ["| step | variant | kept | time ms | candidates/s | GFLOP/s | intensity vs balance"
              " | % FP64 | % FP32 | % DRAM | % L2 | % issue | verdict | advice followed | "
              "x baseline | x previous | behaves like |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in log.rows:
        rel = "above" if r.intensity > r.balance else "below"
        like = r.behaves_like.get("nearest") or "-"
        lines.append(
            f"| {r.step} | {r.variant} | {'yes' if r.kept else 'no'} | {r.time_ms:.3f} | "
            f"{r.candidates_per_s:,.0f} | {_f(r.gflops)} | {r.intensity:.3g} vs "
            f"{r.balance:.3g} ({rel}) | {_f(r.pct_fp64)} | {_f(r.pct_fp32)} | "
            f"{_f(r.pct_dram)} | {_f(r.pct_l2)} | {_f(r.pct_inst)} | {r.verdict} | {r.advice} | "
            f"{r.speedup_vs_baseline:.2f} | {r.speedup_vs_previous:.2f} | {like} |")
    if log.rows:
        lines += ["", f"Intensity unit: {log.rows[0].intensity_unit} "
                      f"(path: {log.rows[0].path})."]
    lines += ["", "## Every variant tried", "",
              "| step | variant | rule | check | exact error (of peak) | time ms | verdict |",
              "|---|---|---|---|---|---|---|"]
    for t in log.measurements:
        verdict = t["verdict"]["kind"] if t["ok"] else t.get("note") or "-"
        lines.append(f"| {t.get('step', '-')} | {t['variant']} | {t.get('rule', '-')} | "
                     f"{'ok' if t['ok'] else 'FAILED'} | {_f(t['exact_error'], '.2g')} | "
                     f"{_f(t['time_ms'], '.3f')} | {verdict} |")
    if log.references:
        lines += ["", "## References on the same roofline", "",
                  "| kernel | flop/byte | GFLOP/s | % FP peak | verdict |", "|---|---|---|---|---|"]
        for p in log.references:
            lines.append(f"| {p['name']} | {p['flop_intensity']:.3g} | {_f(p['gflops'])} | "
                         f"{_f(p['pct_peak'])} | {p['kind']} |")
    lines += ["", f"Stopped: {log.stop_reason}.", "",
              f"Chosen: **{log.chosen.get('variant', '-')}**"
              + (f", recorded in `{log.recorded_in}`" if log.recorded_in else "") + "."]
    if log.unanswered_advice:
        lines += ["", "Advice no launch transformation answers (reported, not followed):"]
        lines += [f"- {a}" for a in log.unanswered_advice]
    return "\n".join(lines) + "\n"


def _plain(x: Any) -> Any:
    """``x`` with every non-finite float replaced by None (strict JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def write_log(log: OptimizationLog, out_dir: Path) -> tuple[Path, Path]:
    """Write ``optimization_log.json`` and ``optimization_log.md`` (atomically each)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in (("optimization_log.json",
                        json.dumps(_plain(log.to_json()), indent=1, default=str,
                                   allow_nan=False)),
                       ("optimization_log.md", markdown(log))):
        tmp = out_dir / (name + ".tmp")
        tmp.write_text(text)
        tmp.replace(out_dir / name)
        paths.append(out_dir / name)
    return paths[0], paths[1]


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
             n_candidates: int = 16384, protocols: str = "desensitization",
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
    from kingen.analysis._gpu import require_gpu
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
