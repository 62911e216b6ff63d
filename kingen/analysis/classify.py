"""Classify a kernel as compute-, memory- or latency-bound, then advise within that class.

Rule (issue 6), thresholds configurable through :class:`Thresholds`:

- **compute-bound** when the instruction:byte ratio is above the device balance and the
  instruction issue rate, or the FP32/FP64 pipe, runs at >= 70 % of its peak;
- **memory-bound** when the ratio is below the balance of a memory level (DRAM, L2; L1 has no
  ratio here) and that level's bandwidth is >= 70 % of its peak;
- **latency-bound** otherwise: no unit is near its peak, so the kernel waits.

The verdict is cross-checked against Nsight Compute's speed-of-light breakdown (compute vs
memory throughput; latency when both are under ncu's own 60 % rule) and any disagreement is
reported with the numbers behind it. Diagnostics are chosen by the class and triggered by the
metric values: nothing is recommended that the numbers do not point to.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kingen.analysis.metrics import MetricSet

COMPUTE, MEMORY, LATENCY = "compute-bound", "memory-bound", "latency-bound"


@dataclass(frozen=True)
class Thresholds:
    """Percent-of-peak and diagnostic thresholds."""

    compute_pct: float = 70.0
    memory_pct: float = 70.0
    sol_pct: float = 60.0  # ncu's own "latency issues" rule for its SOL breakdown
    excess_traffic: float = 1.3  # DRAM bytes over the declared minimum
    sectors_per_request: float = 4.5  # 32 threads x 4 B = 4 sectors when coalesced
    fp64_fraction: float = 0.01  # float64 share of fp instructions in a float32 kernel
    occupancy_pct: float = 50.0
    branch_efficiency_pct: float = 90.0
    waves: float = 1.0
    min_flops_per_inst: float = 0.5  # thread flops per thread instruction


@dataclass
class Advice:
    """One triggered diagnostic: what was seen and what to do."""

    topic: str
    evidence: str
    action: str


@dataclass
class Verdict:
    """The class, the unit that sets it, the cross-check and the advice."""

    name: str
    kind: str
    unit: str
    reasons: list[str]
    ncu_kind: str | None = None
    agrees: bool | None = None
    disagreement: str = ""
    advice: list[Advice] = field(default_factory=list)

    @property
    def first_recommendation(self) -> str:
        return self.advice[0].action if self.advice else "-"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["first_recommendation"] = self.first_recommendation
        return d


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _fp_pct(m: MetricSet) -> tuple[float | None, str]:
    """The highest compute utilisation and which unit it is."""
    cands = [(m.pct_inst, "instruction issue"), (m.pct_fp32, "FP32 pipe"),
             (m.pct_fp64, "FP64 pipe")]
    cands = [(v, n) for v, n in cands if v is not None]
    if not cands:
        return None, "compute"
    return max(cands, key=lambda c: c[0])


def sol_kind(m: MetricSet, th: Thresholds) -> str | None:
    """Nsight Compute's own reading of its SOL breakdown, or None without it."""
    c, mem = m.sol_compute_pct, m.sol_memory_pct
    if c is None or mem is None:
        return None
    if max(c, mem) < th.sol_pct:
        return LATENCY
    return COMPUTE if c >= mem else MEMORY


def classify(m: MetricSet, thresholds: Thresholds | None = None) -> Verdict:
    """Classify one kernel and collect the diagnostics of its class.

    Parameters
    ----------
    m
        The kernel's metrics (:func:`kingen.analysis.metrics.compute`, or recorded values).
    thresholds
        Percent-of-peak and diagnostic thresholds; defaults to :class:`Thresholds()`.
    """
    th = thresholds or Thresholds()
    comp_pct, comp_unit = _fp_pct(m)
    above = m.intensity_dram > m.balance_dram
    reasons = [f"intensity {m.intensity_dram:.3g} vs DRAM balance {m.balance_dram:.3g} "
               f"({m.unit}): {'above' if above else 'below'}"]
    levels = [("DRAM", m.intensity_dram, m.balance_dram, m.pct_dram),
              ("L2", m.intensity_l2, m.balance_l2, m.pct_l2),
              ("L1/shared", None, None, m.pct_l1)]
    kind, unit = LATENCY, "none near peak"
    if above and comp_pct is not None and comp_pct >= th.compute_pct:
        kind, unit = COMPUTE, comp_unit
        reasons.append(f"{comp_unit} at {comp_pct:.0f} % of peak (>= {th.compute_pct:.0f} %)")
    else:
        for lvl, ratio, bal, pct in levels:
            below = ratio is None or bal is None or ratio < bal
            if pct is not None and pct >= th.memory_pct and below:
                kind, unit = MEMORY, lvl
                extra = "" if ratio is None or bal is None else (
                    f", intensity {ratio:.3g} < balance {bal:.3g}")
                reasons.append(f"{lvl} bandwidth at {pct:.0f} % of peak "
                               f"(>= {th.memory_pct:.0f} %){extra}")
                break
    if kind == LATENCY:
        parts = [f"{lvl} {pct:.0f} %" for lvl, _, _, pct in levels if pct is not None]
        if comp_pct is not None:
            parts.append(f"{comp_unit} {comp_pct:.0f} %")
        reasons.append("no unit at its threshold: " + ", ".join(parts))
    v = Verdict(name=m.name, kind=kind, unit=unit, reasons=reasons)
    _cross_check(v, m, th)
    v.advice = advise(m, v.kind, th)
    return v


def _cross_check(v: Verdict, m: MetricSet, th: Thresholds) -> None:
    v.ncu_kind = sol_kind(m, th)
    if v.ncu_kind is None:
        return
    v.agrees = v.ncu_kind == v.kind
    if v.agrees:
        return
    c, mem = m.sol_compute_pct, m.sol_memory_pct
    why = [f"ncu SOL says {v.ncu_kind} (compute {c:.0f} %, memory {mem:.0f} %)"]
    top = max(c, mem)
    if v.kind == LATENCY and th.sol_pct <= top < max(th.compute_pct, th.memory_pct):
        why.append(f"the top unit sits between ncu's {th.sol_pct:.0f} % rule and the "
                   f"framework's {max(th.compute_pct, th.memory_pct):.0f} % threshold")
    if v.ncu_kind == MEMORY and v.kind != MEMORY and (m.pct_l1 or 0) >= mem - 1:
        why.append("ncu's memory figure is the L1/shared-memory unit "
                   f"({_f(m.pct_l1)} %), which ncu counts as memory")
    if v.ncu_kind == COMPUTE and v.kind != COMPUTE:
        cp, cu = _fp_pct(m)
        why.append(f"ncu's compute figure is the busiest SM sub-unit, not only issue or FP "
                   f"pipes (framework's best compute unit: {cu} {_f(cp)} %)")
    if v.kind == COMPUTE and v.ncu_kind == MEMORY:
        why.append("a memory unit in ncu's breakdown is busier than the compute units")
    v.disagreement = "; ".join(why)


def advise(m: MetricSet, kind: str, th: Thresholds | None = None) -> list[Advice]:
    """Diagnostics that matter for ``kind``, each only when its metric triggers it.

    Ordered by expected gain: the first item is the table's "first recommendation".
    """
    th = th or Thresholds()
    out: list[Advice] = []
    excess = (m.dram_bytes / m.declared_bytes
              if m.dram_bytes and m.declared_bytes else None)
    spills = m.local_bytes is not None and m.local_bytes > 0
    if spills:
        out.append(Advice("spills / local memory", f"{m.local_bytes:.3g} B of local-memory "
                          f"traffic ({_f(m.registers_per_thread)} registers/thread)",
                          "remove local memory: index register arrays only with "
                          "compile-time constants, or shrink per-thread state"))
    if kind == MEMORY:
        if excess is not None and excess > th.excess_traffic:
            out.append(Advice("on-chip reuse", f"DRAM traffic {excess:.2f}x the minimum",
                              "reuse data on chip (shared-memory / register tiling, "
                              "fuse passes) so each byte crosses DRAM once"))
        if m.sectors_per_request is not None and m.sectors_per_request > th.sectors_per_request:
            out.append(Advice("coalescing", f"{m.sectors_per_request:.1f} sectors per global "
                              "load request (4 when coalesced)",
                              "make consecutive threads touch consecutive addresses "
                              "(structure-of-arrays layout, transpose through shared memory)"))
        lvl_pct = {"DRAM": m.pct_dram, "L2": m.pct_l2}
        if m.pct_l2 is not None and m.pct_l2 >= th.memory_pct and (m.pct_dram or 0) < (
                th.memory_pct):
            out.append(Advice("on-chip reuse", f"L2 at {m.pct_l2:.0f} %, DRAM at "
                              f"{_f(m.pct_dram)} %", "move the re-reads from L2 into shared "
                              "memory or registers (tile the working set)"))
        if (m.pct_l1 or 0) >= th.memory_pct and max(v or 0 for v in lvl_pct.values()) < (
                th.memory_pct):
            out.append(Advice("on-chip reuse", f"L1/shared at {m.pct_l1:.0f} %",
                              "keep operands in registers (register blocking) to cut "
                              "L1/shared-memory traffic per flop"))
        if not out and m.pct_dram is not None:
            out.append(Advice("near the DRAM roof", f"DRAM at {m.pct_dram:.0f} % of measured "
                              f"peak, traffic {_f(excess)}x the minimum",
                              "little left in this kernel: move fewer bytes (lower "
                              "precision, fuse with neighbouring kernels)"))
    elif kind == COMPUTE:
        if (m.precision == "float32" and m.fp64_fraction is not None
                and m.fp64_fraction > th.fp64_fraction):
            out.append(Advice("precision", f"{100 * m.fp64_fraction:.1f} % of floating-point "
                              "instructions are float64 in a float32 kernel",
                              "remove accidental float64: type literals and constants as "
                              "float32 (np.float32(...)), avoid float64 math calls"))
        if m.flops_per_inst is not None and m.flops_per_inst < th.min_flops_per_inst:
            out.append(Advice("instruction mix", f"{m.flops_per_inst:.2f} flops per "
                              "instruction: most issue slots do address, index or control "
                              "work", "cut non-FP instructions: unroll, hoist index "
                              "arithmetic, wider loads, fewer branches"))
        if m.group == "sgemm":
            lib = "cublas" in m.name
            out.append(Advice("library / tensor cores", f"{_f(m.gflops)} GFLOP/s on FP32 "
                              "FMA pipes", ("tensor cores (TF32/BF16) where the precision "
                                            "allows") if lib else "use cuBLAS, or tensor "
                              "cores (TF32/BF16) where the precision allows"))
        if not out:
            out.append(Advice("near the compute roof", "issue or FP pipe near peak",
                              "do fewer operations (algebra, precompute) or use a faster "
                              "unit (tensor cores, lower precision)"))
    else:  # latency
        if m.waves is not None and m.waves < th.waves:
            out.append(Advice("too little work", f"{m.waves:.2f} waves of blocks",
                              "launch more threads (smaller blocks or more work items in "
                              "one launch)"))
        occ = m.achieved_occupancy_pct
        if occ is not None and occ < th.occupancy_pct:
            lim = m.occupancy_limiter or "?"
            act = {"registers": "cap registers (launch bounds / max_registers) or shrink "
                                "per-thread state",
                   "shared_mem": "use less shared memory per block",
                   "blocks": "use larger blocks",
                   "warps": "raise ILP instead: occupancy is at the hardware limit"}.get(
                lim, "raise occupancy or ILP")
            out.append(Advice("registers vs occupancy", f"achieved occupancy {occ:.0f} % "
                              f"(theoretical {_f(m.theoretical_occupancy_pct)} %, limited by "
                              f"{lim}, {_f(m.registers_per_thread)} registers/thread)", act))
        if m.stalls:
            top, val = max(m.stalls.items(), key=lambda kv: kv[1])
            total = sum(m.stalls.values()) or 1.0
            share = 100 * val / total
            act = {"long_scoreboard": "more independent loads in flight per thread (ILP: "
                                      "unroll, prefetch the next tile) or more warps",
                   "barrier": "fewer __syncthreads per unit of work (bigger tiles, "
                              "double buffering)",
                   "short_scoreboard": "cut shared-memory latency: avoid bank conflicts, "
                                       "keep values in registers",
                   "mio_throttle": "fewer, wider shared-memory accesses",
                   "lg_throttle": "fewer, wider global accesses (vector loads)",
                   "wait": "more independent instructions between dependent ones (ILP)",
                   "math_pipe_throttle": "balance the instruction mix across pipes",
                   "not_selected": "enough warps: raise ILP instead of occupancy",
                   "selected": "issue-limited: fewer instructions",
                   "no_instruction": "instruction-cache misses or too few warps",
                   "branch_resolving": "fewer data-dependent branches",
                   "membar": "fewer memory fences",
                   "dispatch_stall": "check the instruction mix",
                   "drain": "fewer stores at kernel end",
                   "sleeping": "avoid nanosleep / spin loops",
                   "tex_throttle": "fewer texture/L1 requests",
                   "imc_miss": "keep constant-memory accesses uniform"}.get(
                top, "reduce that stall's cause")
            out.append(Advice("warp stalls", f"top stall '{top}' {share:.0f} % of stall "
                              f"cycles ({val:.3g} cycles per issued instruction)", act))
        if m.branch_efficiency_pct is not None and (
                m.branch_efficiency_pct < th.branch_efficiency_pct):
            out.append(Advice("divergence", f"branch efficiency {m.branch_efficiency_pct:.0f} %",
                              "make branches uniform across a warp (sort or bin work, "
                              "predicate small branches)"))
        if m.sectors_per_request is not None and m.sectors_per_request > th.sectors_per_request:
            out.append(Advice("coalescing", f"{m.sectors_per_request:.1f} sectors per request",
                              "coalesce accesses (structure-of-arrays)"))
        if not out:
            out.append(Advice("latency", "no counter points to one cause" if m.path == "ncu"
                              else "no counters on the event-timing path",
                              "profile with ncu (stall reasons, occupancy) to find the "
                              "latency source"))
    return out
