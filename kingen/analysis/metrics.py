"""Derived metrics: instruction:byte ratios against the device balance, % of each ceiling.

Convention (the instruction roofline of Ding & Williams): intensity is **warp instructions
per 32-byte transaction** at a memory level, and the balance is the device's peak warp
instruction rate (SMs x 4 x clock) over that level's bandwidth in transactions/s. On an H100
with about 3 TB/s of DRAM this balance is about 10.7; the issue's published values (0.65 vs
4.5, 823 vs 10.7, 4.87 vs 10.7) are in this unit.

Without counters (the event-timing path) instructions are unknown; the classic roofline is
used instead: declared flops per declared byte against peak FLOP/s over DRAM bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kingen.analysis.hardware import SECTOR, DeviceInfo
from kingen.analysis.profile import ProfileRecord

INSTR_UNIT = "warp instructions / 32-B transaction"
FLOP_UNIT = "flop / byte"
# The precisions' names in analyses written before they took SolverOptions' names.
OLD_PRECISION_NAMES = {"fp32": "float32", "fp64": "float64"}


@dataclass
class MetricSet:
    """Everything the classifier reads, for one kernel. Percentages are 0-100.

    Only ``intensity_dram``, ``balance_dram`` and the percentages are needed to classify;
    the rest feed the diagnostics and may be None.
    """

    name: str
    intensity_dram: float
    balance_dram: float
    pct_dram: float | None = None
    intensity_l2: float | None = None
    balance_l2: float | None = None
    pct_l2: float | None = None
    pct_l1: float | None = None
    pct_inst: float | None = None
    pct_fp32: float | None = None
    pct_fp64: float | None = None
    sol_compute_pct: float | None = None
    sol_memory_pct: float | None = None
    unit: str = INSTR_UNIT
    path: str = "ncu"
    group: str = ""
    precision: str = "float32"
    time_ms: float | None = None
    gflops: float | None = None
    gbs: float | None = None  # measured DRAM bytes (or declared) over event time
    declared_bytes: float | None = None
    dram_bytes: float | None = None
    local_bytes: float | None = None
    sectors_per_request: float | None = None
    branch_efficiency_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    occupancy_limiter: str | None = None
    registers_per_thread: float | None = None
    waves: float | None = None
    fp64_fraction: float | None = None  # fp64 share of floating-point thread instructions
    flops_per_inst: float | None = None  # thread flops per thread instruction executed
    stalls: dict[str, float] = field(default_factory=dict)
    headroom: float | None = None  # roofline bound over achieved rate (>= 1)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MetricSet:
        keys = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in d.items() if k in keys}
        # analyses written before the precisions took SolverOptions' names say fp32/fp64
        if "precision" in fields:
            fields["precision"] = OLD_PRECISION_NAMES.get(fields["precision"],
                                                          fields["precision"])
        return cls(**fields)


def _pct(x: float | None, peak: float) -> float | None:
    if x is None or not peak or not math.isfinite(peak):
        return None
    return 100.0 * x / peak


def compute(name: str, rec: ProfileRecord, dev: DeviceInfo, flops: float, nbytes: float,
            group: str = "", precision: str = "float32") -> MetricSet:
    """Metrics of one kernel from its profile record and the device's ceilings.

    Parameters
    ----------
    name, group, precision
        As in :class:`~kingen.analysis.kernels.base.KernelCase`.
    rec
        The profile (ncu counters or event timing); rates use ``rec.time_ms`` (CUDA events
        at the clocks the micro-benchmarks ran at), not ncu's clock-locked duration.
    flops, nbytes
        Declared flops and fewest DRAM bytes of one launch.
    """
    t = rec.time_ms * 1e-3
    gflops = flops / t / 1e9 if t > 0 else None
    dram_peak, l2_peak = dev.peak("dram_gbs"), dev.peak("l2_gbs")
    fp_peak = dev.peak("fp64_gflops" if precision == "float64" else "fp32_gflops")
    if rec.path == "ncu" and rec.inst_executed and rec.dram_bytes:
        dram_tx = rec.dram_bytes / SECTOR
        l2_tx = rec.l2_bytes / SECTOR if rec.l2_bytes else None
        inst_rate = rec.inst_executed / t
        # Issue rate against cycles, not event time: ncu locks clocks (base by default), so
        # counts over its own cycles give a clock-independent fraction of SMs x 4 per cycle.
        pct_inst = (100.0 * rec.inst_executed / (rec.cycles_elapsed * dev.sms * 4)
                    if rec.cycles_elapsed else _pct(inst_rate, dev.warp_inst_per_s))
        bw = rec.dram_bytes / t / 1e9
        fp32_total = rec.fp32_flops or 0.0
        fp64_total = rec.fp64_flops or 0.0
        fp_inst = rec.fp64_inst or 0.0
        ms = MetricSet(
            name=name, path="ncu", group=group, precision=precision, unit=INSTR_UNIT,
            intensity_dram=rec.inst_executed / dram_tx, balance_dram=dev.balance("dram"),
            intensity_l2=None if not l2_tx else rec.inst_executed / l2_tx,
            balance_l2=dev.balance("l2") if "l2_gbs" in dev.measured else None,
            pct_dram=_pct(bw, dram_peak),
            pct_l2=_pct(rec.l2_bytes / t / 1e9 if rec.l2_bytes else None, l2_peak),
            pct_l1=rec.sol_l1_pct,
            pct_inst=pct_inst,
            pct_fp32=rec.fp32_pipe_pct, pct_fp64=rec.fp64_pipe_pct,
            sol_compute_pct=rec.sol_compute_pct, sol_memory_pct=rec.sol_memory_pct,
            time_ms=rec.time_ms, gflops=gflops, gbs=bw, declared_bytes=nbytes,
            dram_bytes=rec.dram_bytes, local_bytes=rec.local_bytes,
            sectors_per_request=rec.sectors_per_request,
            branch_efficiency_pct=rec.branch_efficiency_pct,
            achieved_occupancy_pct=rec.achieved_occupancy_pct,
            theoretical_occupancy_pct=rec.theoretical_occupancy_pct,
            occupancy_limiter=rec.occupancy_limiter,
            registers_per_thread=rec.registers_per_thread, waves=rec.waves,
            fp64_fraction=(fp_inst / (fp_inst + (rec.fp32_inst or 0.0))
                           if fp_inst else (0.0 if rec.fp32_inst is not None else None)),
            flops_per_inst=((fp32_total + fp64_total) / (rec.inst_executed * 32)
                            if rec.inst_executed else None),
            stalls=dict(rec.stalls),
        )
        bound = min(dev.warp_inst_per_s, ms.intensity_dram * dram_peak * 1e9 / SECTOR)
        ms.headroom = bound / inst_rate if inst_rate else None
        return ms
    # Event-timing path: the classic flop roofline on declared counts.
    bw = nbytes / t / 1e9
    intensity = flops / nbytes if nbytes else math.inf
    ms = MetricSet(
        name=name, path="events", group=group, precision=precision, unit=FLOP_UNIT,
        intensity_dram=intensity, balance_dram=fp_peak / dram_peak,
        pct_dram=_pct(bw, dram_peak),
        pct_fp32=None if precision == "float64" else _pct(gflops, fp_peak),
        pct_fp64=_pct(gflops, fp_peak) if precision == "float64" else None,
        time_ms=rec.time_ms, gflops=gflops, gbs=bw, declared_bytes=nbytes,
        notes=[f"no counters ({rec.path_note or 'ncu not used'}): declared flops and bytes"],
    )
    bound = min(fp_peak, intensity * dram_peak)
    ms.headroom = bound / gflops if gflops else None
    return ms
