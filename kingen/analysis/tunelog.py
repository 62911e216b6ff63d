"""What ``kingen tune`` writes: each variant placed on the roofline beside the stencil and
SGEMM references (:func:`behaves_like`), and the optimization log, one row per step, as
markdown and JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kingen.analysis.metrics import MetricSet
from kingen.analysis.rules import RULES, Measurement, Rule
from kingen.errors import KingenError

GAIN = 1.05  # a step is kept when it is at least this much faster than the current variant


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
        peak = peaks["fp64_gflops" if m.precision == "float64" else "fp32_gflops"]
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
