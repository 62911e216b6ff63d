"""The rules of ``kingen tune``: which transformations a kernel's verdict calls for
(:data:`RULES`), proposed at the register counts where the resident warps change (Ang Li's
critical points, :func:`critical_points`), and what each rule sees of a measured variant
(:class:`Measurement`, :class:`Context`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kingen.analysis.classify import COMPUTE, LATENCY, MEMORY, Thresholds, Verdict
from kingen.analysis.metrics import MetricSet
from kingen.solve.cuda import LaunchConfig

LANES = (1, 2, 4, 8)


SPANS = ((4, 8), (8, 16), (4, 4))  # (lanes, samples per product) tried first


BLOCKS = (64, 128, 256)


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
