"""ncu raw-page parsing on output saved from real runs (H200, ncu 2025.3.1), metrics on top."""

from __future__ import annotations

from pathlib import Path

import pytest

from kingen.analysis.classify import COMPUTE, classify
from kingen.analysis.hardware import DeviceInfo
from kingen.analysis.metrics import compute
from kingen.analysis.profile import ProfileRecord, parse_ncu_csv, record_from_ncu

FIX = Path(__file__).parent / "fixtures" / "analysis"


def load(name: str, time_ms: float = 1.0) -> ProfileRecord:
    rows = parse_ncu_csv((FIX / name).read_text())
    assert len(rows) == 1
    return record_from_ncu(rows[0], time_ms, "base")


def h200() -> DeviceInfo:
    # the ceilings measured on the same machine (analysis/h200/ceilings.json)
    return DeviceInfo(name="NVIDIA H200", compute_capability=(9, 0), sms=132, clock_mhz=1980.0,
                      mem_clock_mhz=3201.0, bus_width_bits=6016, l2_bytes=62914560,
                      total_mem_bytes=150109880320,
                      measured={"dram_gbs": 3982.0, "l2_gbs": 5739.0, "fp32_gflops": 56910.0,
                                "fp64_gflops": 30445.0})


def test_parse_stencil_naive():
    r = load("stencil_naive.ncu.csv", 0.657)
    assert r.kernel.startswith("stencil_naive[")
    assert r.path == "ncu"
    assert r.inst_executed == 415815576
    assert r.dram_bytes == pytest.approx(1058224384)  # read + write, 512^3 x 8 B = 1.074e9
    assert r.l2_bytes == pytest.approx(3295794848)
    assert r.duration_ms == pytest.approx(0.689408)  # "ns" unit, thousands separators
    assert r.cycles_elapsed == 1032468
    assert r.registers_per_thread == 20
    assert r.achieved_occupancy_pct == pytest.approx(78.57)
    assert r.theoretical_occupancy_pct == pytest.approx(100.0)
    assert r.local_bytes == 0
    assert r.sectors_per_request == pytest.approx(4.21, abs=0.01)
    assert r.branch_efficiency_pct == pytest.approx(87.6)
    assert r.fp64_inst == 0 and r.fp64_pipe_pct == 0
    assert r.sol_compute_pct == pytest.approx(76.4)
    assert r.sol_memory_pct == pytest.approx(42.87)
    assert len(r.stalls) >= 15 and max(r.stalls, key=r.stalls.get) == "long_scoreboard"


def test_parse_cublas():
    r = load("sgemm_cublas.ncu.csv", 2.724)
    assert "gemm" in r.kernel
    assert r.registers_per_thread == 254 and r.occupancy_limiter == "registers"
    assert r.fp32_pipe_pct == pytest.approx(80.28)
    # 2 * 4096^3 flops counted from SASS FFMA/FADD/FMUL thread instructions
    assert r.fp32_flops == pytest.approx(2 * 4096**3, rel=1e-3)


def test_metrics_and_verdict_from_real_profile():
    r = load("stencil_naive.ncu.csv", 0.657)
    m = compute("stencil_naive", r, h200(), flops=8.0 * 510**3, nbytes=8.0 * 512**3,
                group="stencil")
    # 415.8M warp instructions over 1.058e9/32 DRAM sectors
    assert m.intensity_dram == pytest.approx(415815576 / (1058224384 / 32))
    assert m.balance_dram == pytest.approx(132 * 4 * 1.98e9 / (3982e9 / 32))
    assert m.pct_inst == pytest.approx(100 * 415815576 / (1032468 * 132 * 4))
    assert m.pct_dram == pytest.approx(100 * 1058224384 / 0.657e-3 / 3982e9)
    v = classify(m)
    # numba's 64-bit indexing: ~99 thread instructions per point, issue-bound, as ncu says
    assert v.kind == COMPUTE and v.agrees is True


def test_no_table_raises():
    with pytest.raises(ValueError):
        parse_ncu_csv((FIX / "no_kernel_profiled.ncu.txt").read_text())


def test_event_path_uses_declared_counts():
    rec = ProfileRecord(kernel="x", path="events", time_ms=1.0, path_note="ncu not found")
    m = compute("x", rec, h200(), flops=1e9, nbytes=4e9)
    assert m.path == "events" and m.intensity_dram == pytest.approx(0.25)
    assert m.pct_dram == pytest.approx(100 * 4e12 / 3982e9)
    assert "ncu not found" in m.notes[0]
    assert classify(m).kind == "memory-bound"
