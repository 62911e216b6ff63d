"""``kingen tune``'s loop: critical points, rules, the loop on synthetic measurements, the
log writer, roofline placement, and the real checks under the CUDA simulator."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from kingen.analysis.classify import COMPUTE, LATENCY, MEMORY, Thresholds, classify
from kingen.analysis.metrics import MetricSet
from kingen.analysis.optimize import (
    RULES,
    Context,
    Measurement,
    OptimizationLog,
    RoofPoint,
    SMLimits,
    behaves_like,
    critical_points,
    markdown,
    occupancy_pct,
    optimize,
    proposals,
    references_from_analyze,
    resident_warps,
    write_log,
)
from kingen.solve.cuda import LaunchConfig

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "analysis" / "h100" / "analyze.json"


# ----------------------------------------------------------------------- critical points


def test_resident_warps_matches_the_occupancy_calculator():
    # sm_90, 128 threads per block: 255 registers -> 2 blocks, 168 -> 3, 128 -> 4, 64 -> 8
    assert resident_warps(255, 128) == 8
    assert resident_warps(168, 128) == 12
    assert resident_warps(176, 128) == 8
    assert resident_warps(128, 128) == 16
    assert resident_warps(64, 128) == 32
    assert resident_warps(32, 128) == 64  # the warp limit, not registers
    assert occupancy_pct(255, 128) == 12.5  # the H100 solver kernel's theoretical occupancy


def test_critical_points_are_where_the_warps_change():
    pts = critical_points(128)
    assert pts[:7] == [(255, 8), (168, 12), (128, 16), (96, 20), (80, 24), (72, 28), (64, 32)]
    # between two points, capping adds no warp: every count down to the next point gives
    # the same occupancy as the upper point
    for (r_hi, w_hi), (r_lo, _w_lo) in zip(pts, pts[1:]):
        assert all(resident_warps(r, 128) == w_hi for r in range(r_lo + 1, r_hi + 1))
        assert resident_warps(r_lo, 128) > w_hi
    # whole blocks: with 256 threads per block 168 registers is not a point
    pts256 = [r for r, _ in critical_points(256)]
    assert 168 not in pts256 and pts256[:4] == [255, 128, 80, 64]
    # a device with half the register file halves the warps
    half = SMLimits(regs_per_sm=32768)
    assert resident_warps(128, 128, half) == 8


# ------------------------------------------------------------------------------ rules


def meas(config=None, time_ms=100.0, ok=True, registers=None, **metrics):
    config = config or LaunchConfig()
    base = dict(name=config.name, intensity_dram=800.0, balance_dram=10.0, path="ncu",
                precision="float64")
    base.update(metrics)
    m = MetricSet(**base)
    m.time_ms = time_ms
    m.gflops = m.gflops or 1e4
    return Measurement(config, time_ms, 1e12, 1e6, m, classify(m), ok, 1e-9, 0.0, registers)


def ctx(m, n_states=16, propagator=True, ratio=0.3):
    return Context(m, n_states, propagator, ratio)


def names(props):
    return [c.name for c, _ in props]


def test_compute_bound_stage_form_is_answered_by_the_propagator():
    m = meas(pct_fp64=77.0, pct_inst=38.0)
    assert m.verdict.kind == COMPUTE
    props = proposals(ctx(m), set())
    assert names(props) == ["prop-l1-b128", "prop-l2-b128", "prop-l4-b128", "prop-l8-b128"]
    assert {r.name for _, r in props} == {"less-arithmetic"}
    # lanes never exceed the states; nothing to propose without the propagator form, or
    # when it would do more arithmetic than the stage form
    assert names(proposals(ctx(m, n_states=3), set())) == ["prop-l1-b128", "prop-l2-b128"]
    assert proposals(ctx(m, propagator=False), set()) == []
    assert proposals(ctx(m, ratio=1.4), set()) == []
    # what was tried is not proposed again
    assert "prop-l1-b128" not in names(proposals(ctx(m), {"prop-l1-b128"}))


def test_latency_bound_with_many_registers_gets_caps_at_critical_points_only():
    m = meas(intensity_dram=5.0, pct_fp64=30.0, pct_inst=20.0, registers_per_thread=255,
             achieved_occupancy_pct=6.0, waves=2.0)
    assert m.verdict.kind == LATENCY
    props = proposals(ctx(m, propagator=False), set())
    assert names(props) == ["b128r168", "b128r128"]
    assert {r.name for _, r in props} == {"register-cap"}
    # 200 registers: the next points below are 168 and 128 again; with 256 threads per
    # block they are 128 and 80 (168 gives no extra block there)
    m200 = meas(LaunchConfig(256), intensity_dram=5.0, pct_fp64=30.0, pct_inst=20.0,
                registers_per_thread=200, achieved_occupancy_pct=6.0, waves=2.0)
    assert names(proposals(ctx(m200, propagator=False), set())) == ["b256r128", "b256r80"]
    # without counters the registers come from the compiler and occupancy is computed
    ev = meas(intensity_dram=5.0, pct_fp64=30.0, path="events", registers=232)
    assert ev.verdict.kind == LATENCY
    got = names(proposals(ctx(ev, propagator=False), set()))
    assert got[:2] == ["b128r168", "b128r128"] and set(got[2:]) == {"b64", "b256"}
    # few registers: no cap proposed
    few = meas(intensity_dram=5.0, pct_fp64=30.0, registers_per_thread=96,
               achieved_occupancy_pct=30.0, waves=2.0)
    assert proposals(ctx(few, propagator=False), set()) == []


def test_spills_and_memory_verdicts_move_lanes_and_caps():
    capped = meas(LaunchConfig(128, 128), intensity_dram=5.0, pct_fp64=30.0,
                  registers_per_thread=128, local_bytes=1e9, achieved_occupancy_pct=20.0,
                  waves=2.0)
    assert names(proposals(ctx(capped, propagator=False), set())) == ["b128r168"]
    prop = LaunchConfig(128, None, "propagator", 2)
    spill = meas(prop, intensity_dram=5.0, pct_fp64=30.0, registers_per_thread=255,
                 local_bytes=1e8, waves=2.0)
    assert names(proposals(ctx(spill), set())) == ["prop-l4-b128"]
    l1 = meas(LaunchConfig(128, None, "propagator", 4), intensity_dram=5.0, pct_l1=85.0,
              pct_fp64=20.0)
    assert l1.verdict.kind == MEMORY and l1.verdict.unit == "L1/shared"
    assert names(proposals(ctx(l1), set())) == ["prop-l2-b128"]
    few = meas(LaunchConfig(128), intensity_dram=5.0, pct_fp64=20.0, waves=0.48,
               registers_per_thread=64, achieved_occupancy_pct=60.0)
    assert names(proposals(ctx(few), set())) == ["b64"]


def test_every_rule_is_documented():
    assert len({r.name for r in RULES}) == len(RULES)
    for r in RULES:
        assert r.when and r.advice and r.builds


# ------------------------------------------------------------------------------- loop


def synthetic(times, fail=(), latency=()):
    """An evaluate() over a table of times; variants in ``latency`` come back latency-bound
    with 200 registers and low occupancy, the rest compute-bound."""
    calls = []

    def evaluate(cfg):
        calls.append(cfg.name)
        t = times[cfg.name]
        if cfg.name in latency:
            m = meas(cfg, t, intensity_dram=5.0, pct_fp64=40.0, pct_inst=20.0,
                     registers_per_thread=200, achieved_occupancy_pct=10.0, waves=2.0)
        else:
            m = meas(cfg, t, pct_fp64=80.0, pct_inst=40.0)
        if cfg.name in fail:
            m.ok, m.note, m.exact_error = False, "exact error 3e-02 of peak", 3e-2
        return m

    return evaluate, calls


SLOW_SPANS = {"prop-l4-s8-b128": 33.0, "prop-l8-s16-b128": 34.0, "prop-l4-s4-b128": 36.0}


def test_spans_answer_a_latency_bound_propagator_and_are_kept_when_faster():
    class Times(dict):
        def __missing__(self, name):  # every other variant: slower
            return 400.0

    times = Times({"prop-l4-b128": 270.0, "prop-l4-s8-b128": 170.0,
                   "prop-l8-s16-b128": 94.0, "prop-l4-s4-b128": 117.0})
    evaluate, calls = synthetic(times, latency={"prop-l4-b128"})
    best, log = optimize(evaluate, LaunchConfig(128, None, "propagator", 4), n_states=16,
                         n_candidates=16384, propagator=True, echo=lambda *a: None)
    assert calls[:4] == ["prop-l4-b128", "prop-l4-s8-b128", "prop-l8-s16-b128",
                         "prop-l4-s4-b128"]
    assert best.config == LaunchConfig(128, None, "propagator", 8, 16)
    assert log.rows[1].variant == "prop-l8-s16-b128" and log.rows[1].rule == "sample-spans"
    # a spilling propagator is answered by more lanes first, not by spans
    spill = meas(LaunchConfig(128, None, "propagator", 2), intensity_dram=5.0,
                 pct_fp64=30.0, registers_per_thread=255, local_bytes=1e8, waves=2.0)
    assert "sample-spans" not in {r.name for _, r in proposals(ctx(spill), set())}


def test_loop_keeps_gaining_steps_and_stops_under_five_percent():
    times = {"b128": 170.0, "prop-l1-b128": 40.0, "prop-l2-b128": 30.0,
             "prop-l4-b128": 35.0, "prop-l8-b128": 20.0,
             "prop-l2-b128r168": 29.0, "prop-l2-b128r128": 31.0, **SLOW_SPANS}
    evaluate, calls = synthetic(times, fail={"prop-l8-b128"},
                                latency={"prop-l2-b128", "prop-l2-b128r168"})
    lines = []
    best, log = optimize(evaluate, LaunchConfig(), n_states=16, n_candidates=16384,
                         propagator=True, flops_ratio=0.2, echo=lines.append)
    # step 1: the propagator variants; the failing one (fastest!) is dropped
    # step 2: prop-l2 is latency-bound at 200 registers: spans, then caps at 168 and 128
    # (more lanes, prop-l4, was already tried in step 1 and is not tried again)
    assert calls[:5] == ["b128", "prop-l1-b128", "prop-l2-b128", "prop-l4-b128",
                         "prop-l8-b128"]
    assert calls[5:] == list(SLOW_SPANS) + ["prop-l2-b128r168", "prop-l2-b128r128"]
    assert best.config == LaunchConfig(128, None, "propagator", 2)
    assert [r.step for r in log.rows] == [0, 1, 2]
    assert [r.kept for r in log.rows] == [True, True, False]
    assert log.rows[1].variant == "prop-l2-b128" and log.rows[1].rule == "less-arithmetic"
    assert log.rows[1].speedup_vs_baseline == pytest.approx(170 / 30)
    assert log.rows[2].variant == "prop-l2-b128r168"
    assert log.rows[2].speedup_vs_previous == pytest.approx(30 / 29)
    assert log.rows[2].speedup_vs_baseline == pytest.approx(170 / 29)
    assert log.rows[1].candidates_per_s == pytest.approx(16384 / 0.030)
    assert "< 5 %" in log.stop_reason
    assert log.chosen["variant"] == "prop-l2-b128"
    failed = [t for t in log.measurements if not t["ok"]]
    assert [t["variant"] for t in failed] == ["prop-l8-b128"]
    assert any("FAILED" in ln for ln in lines) and any(ln.startswith("step 2") for ln in lines)


def test_loop_stops_when_nothing_answers_the_verdict():
    evaluate, calls = synthetic({"b128": 170.0})
    best, log = optimize(evaluate, LaunchConfig(), n_states=16, n_candidates=100,
                         propagator=False, echo=lambda *a: None)
    assert calls == ["b128"] and best.config == LaunchConfig()
    assert len(log.rows) == 1 and "no transformation answers" in log.stop_reason


def test_failing_baseline_is_an_error():
    from kingen.errors import KingenError

    evaluate, _ = synthetic({"b128": 1.0}, fail={"b128"})
    with pytest.raises(KingenError, match="fails its check"):
        optimize(evaluate, LaunchConfig(), n_states=4, n_candidates=1, propagator=False,
                 echo=lambda *a: None)


def test_log_files_have_one_row_per_step(tmp_path):
    times = {"b128": 170.0, "prop-l1-b128": 60.0, "prop-l2-b128": 50.0,
             "prop-l4-b128": 55.0, "prop-l8-b128": 58.0,
             **{k: 60.0 for k in SLOW_SPANS}}
    evaluate, _ = synthetic(times, fail={"prop-l8-b128"})
    refs = [RoofPoint("stencil_zreg", "stencil", 1.0, 2300.0, 4.0, MEMORY),
            RoofPoint("sgemm_cublas", "sgemm", 200.0, 51000.0, 90.0, COMPUTE)]

    def place(m):
        return RoofPoint(m.config.name, "rk4", 500.0, m.metrics.gflops, 70.0, m.verdict.kind)

    log = OptimizationLog("robert_howe_2003", "float64", "desensitization", 16384, "H100")
    best, log = optimize(evaluate, LaunchConfig(), n_states=16, n_candidates=16384,
                         propagator=True, references=refs, place=place, log=log,
                         echo=lambda *a: None)
    j, md = write_log(log, tmp_path)
    data = json.loads(j.read_text())
    assert [r["step"] for r in data["rows"]] == [0, 1, 2]  # step 2: spans, none faster
    assert [r["kept"] for r in data["rows"]] == [True, True, False]
    row = data["rows"][1]
    for key in ("variant", "time_ms", "candidates_per_s", "flops", "intensity", "balance",
                "pct_fp64", "pct_fp32", "pct_dram", "pct_l2", "verdict", "advice",
                "speedup_vs_baseline", "speedup_vs_previous", "behaves_like"):
        assert key in row
    assert row["behaves_like"]["nearest"] == "sgemm_cublas"
    assert {r["name"] for r in data["rules"]} == {r.name for r in RULES}
    text = md.read_text()
    table = [ln for ln in text.splitlines() if ln.startswith("| 0 ") or ln.startswith("| 1 ")]
    assert len(table) == 2 + 5  # two step rows, five "variant tried" rows
    assert "| 1 | prop-l2-b128 | yes | 50.000 |" in text
    assert "3.40 | 3.40 | sgemm_cublas |" in text  # 170/50 vs baseline and vs previous
    assert markdown(log) == text
    assert "| 1 | prop-l8-b128 | less-arithmetic | FAILED | 0.03 |" in text
    assert "exact error 3e-02 of peak |" in text
    assert not list(tmp_path.glob("*.tmp"))


# ------------------------------------------------------------------- roofline placement


def test_behaves_like_nearest_reference():
    refs = [RoofPoint("stencil_naive", "stencil", 1.0, 1700.0, 3.0, MEMORY),
            RoofPoint("sgemm_reg4x4", "sgemm", 40.0, 11000.0, 20.0, LATENCY),
            RoofPoint("sgemm_cublas", "sgemm", 200.0, 51000.0, 90.0, COMPUTE)]
    dense = behaves_like(RoofPoint("p", "rk4", 800.0, 21900.0, 72.0, COMPUTE), refs)
    assert dense["nearest"] == "sgemm_cublas" and dense["family"] == "sgemm"
    assert dense["same_verdict"] == ["sgemm"] and dense["space"] == "flop roofline"
    sparse = behaves_like(RoofPoint("q", "rk4", 2.0, 900.0, 2.5, MEMORY), refs)
    assert sparse["nearest"] == "stencil_naive" and sparse["same_verdict"] == ["stencil"]
    # with counters everywhere the instruction roofline decides
    inst = [RoofPoint("s", "stencil", 1.0, 1.0, 3.0, MEMORY, 6.2, 400.0),
            RoofPoint("g", "sgemm", 1.0, 1.0, 3.0, COMPUTE, 800.0, 900.0)]
    assert behaves_like(RoofPoint("r", "rk4", 1.0, 1.0, 3.0, COMPUTE, 700.0, 850.0),
                        inst)["nearest"] == "g"
    assert behaves_like(RoofPoint("r", "rk4", 1.0, 1.0, 3.0, COMPUTE), [])["nearest"] is None


def test_references_from_the_h100_analysis():
    refs = references_from_analyze(H100)
    by = {r.name: r for r in refs}
    assert {"stencil_naive", "stencil_zreg", "sgemm_naive", "sgemm_cublas"} <= set(by)
    assert not any(n.startswith("rk4") for n in by)
    z = by["stencil_zreg"]
    assert z.kind == MEMORY and z.flop_intensity < 2 and 1500 < z.gflops < 3000
    assert by["sgemm_cublas"].kind == COMPUTE and by["sgemm_cublas"].pct_peak > 70
    assert z.inst_intensity is not None and z.warp_gips is not None
    # the H100 solver kernel (float64, compute-bound) sits with cuBLAS, not the stencil
    data = json.loads(H100.read_text())
    rk4 = next(c for c in data["cases"] if c["name"].startswith("rk4") and
               c["metrics"]["precision"] == "fp64")  # written before the names were float64
    m = MetricSet.from_json(rk4["metrics"])
    assert m.precision == "float64"
    from kingen.analysis.optimize import roof_point

    p = roof_point("rk4", "rk4", m, rk4["flops"], rk4["bytes"], rk4["verdict"]["kind"],
                   data["device"]["measured"]["fp64_gflops"],
                   data["device"]["warp_inst_per_s"] / 1e9)
    assert behaves_like(p, refs)["family"] == "sgemm"


def test_bad_references_file_is_one_error(tmp_path):
    from kingen.errors import KingenError

    bad = tmp_path / "a.json"
    bad.write_text("{}")
    with pytest.raises(KingenError, match="no stencil or SGEMM"):
        references_from_analyze(bad)
    with pytest.raises(KingenError, match="cannot read"):
        references_from_analyze(tmp_path / "missing.json")


# -------------------------------------------------------- real checks under the simulator

sim = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                         reason="runs under the CUDA simulator")


@sim
def test_solver_variant_checks_under_the_simulator():
    from kingen.analysis.solver_cases import (
        EXACT_TOLERANCE,
        cpu_error,
        exact_error,
        flops_per_step,
        solver_problem,
        variant_case,
    )

    prob = solver_problem("jonas_1993", 2, "float64", "deactivation")
    cfg = LaunchConfig(block=32)
    assert exact_error(prob, cfg, candidates=2) <= EXACT_TOLERANCE["float64"]
    assert cpu_error(prob, cfg, rows=2) <= 1e-12
    case = variant_case(prob, cfg)
    assert case.name == "rk4_jonas_1993_float64_b32"
    # two candidates: every RK4 step and every recorded sample's current
    assert case.flops == 2 * prob.flop_count(cfg).total
    assert prob.flop_count(cfg).stage == flops_per_step(prob.scheme, "float64") * prob.total_steps
    assert case.worker_args[:4] == ["--target", "rk4", "--model", str(prob.path)]
    assert json.loads(case.worker_args[-1]) == {"block": 32, "max_registers": None,
                                                "form": "stage", "lanes": 1, "span": 1}
    # a wrong answer fails the exact check: perturb the reference the check compares with
    prob._ref["exact"][0][0] = prob._ref["exact"][0][0] * (1 + 1e-4)
    assert exact_error(prob, cfg, candidates=2) > EXACT_TOLERANCE["float64"]


def test_thresholds_are_shared_with_classify():
    # the rules read occupancy against the classifier's own threshold
    m = meas(intensity_dram=5.0, pct_fp64=30.0, registers_per_thread=200,
             achieved_occupancy_pct=45.0, waves=2.0)
    assert ctx(m).low_occupancy()
    c = Context(m, 16, False, None, thresholds=Thresholds(occupancy_pct=40.0))
    assert not c.low_occupancy()
    assert np.isclose(occupancy_pct(200, 128), 12.5)


@sim
def test_run_tune_end_to_end_under_the_simulator(tmp_path, monkeypatch):
    """The GPU glue of ``kingen tune`` (batch, exact and CPU checks, timing, classification,
    roofline placement against the H100 references, log, plot, recorded choice), with the
    simulator standing in for the GPU and wall-clock timing for CUDA events."""
    import time as _time

    from numba import cuda

    import kingen.analysis.gpu as gpu
    import kingen.analysis.hardware as hw
    import kingen.solve.backends as backends
    from kingen.analysis.optimize import run_tune
    from kingen.model.scheme import Scheme
    from kingen.model.shipped import resolve_model
    from kingen.solve.cuda import tuned_config

    def wall_ms(fn, repeats=10, warmup=2, batch=5):
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeats):
            t = _time.perf_counter()
            for _ in range(batch):
                fn()
            out.append((_time.perf_counter() - t) * 1e3 / batch)
        return out

    dev = hw.DeviceInfo(name="Fake GPU", compute_capability=(9, 0), sms=132, clock_mhz=1980,
                        mem_clock_mhz=2619, bus_width_bits=5120, l2_bytes=50 * 2**20,
                        total_mem_bytes=80 * 2**30,
                        datasheet=hw.datasheet_for("H100", (9, 0), 132, 1980, 2619, 5120),
                        measured={"dram_gbs": 2937.0, "l2_gbs": 5529.0,
                                  "fp32_gflops": 57000.0, "fp64_gflops": 30300.0})
    monkeypatch.setenv("KINGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gpu, "require_gpu", lambda: cuda)
    monkeypatch.setattr(hw, "require_gpu", lambda: cuda)
    monkeypatch.setattr(hw, "time_ms", wall_ms)
    monkeypatch.setattr(hw, "ceilings", lambda remeasure=False, quick=False: dev)
    monkeypatch.setattr(backends, "cuda_status",
                        lambda: backends.CudaStatus(True, False, "Fake GPU", ""))
    lines = []
    out = tmp_path / "out"
    log = run_tune("jonas_1993", out, n_candidates=2, protocols="deactivation",
                   use_ncu=False, references=H100, budget_s=0.01, max_steps=1,
                   start="b128", echo=lines.append)
    assert lines[0].startswith("device ceilings") and any("step 0" in ln for ln in lines)
    # --start b128: the loop starts from the stage form, not from the default launch
    assert log.rows[0].variant == "b128" and log.rows[0].exact_error < 1e-6
    assert log.rows[0].behaves_like["nearest"]
    assert len(log.rows) in (1, 2) and log.chosen["variant"]
    data = json.loads((out / "optimization_log.json").read_text())
    assert data["model"] == "jonas_1993" and data["device"] == "Fake GPU"
    assert len(data["references"]) == 8 and (out / "roofline.png").stat().st_size > 0
    assert "| 0 | b128 | yes |" in (out / "optimization_log.md").read_text()
    scheme = Scheme.load(resolve_model("jonas_1993"))
    chosen = LaunchConfig(**log.chosen["config"])
    assert tuned_config("Fake GPU", scheme, "float64") == chosen
    assert log.recorded_in.endswith("solver_tuning.json")


def test_merge_records_of_a_two_kernel_launch():
    from kingen.analysis.profile import ProfileRecord, merge_records

    build = ProfileRecord("build", "ncu", 1.0, duration_ms=1.0, cycles_elapsed=1e6,
                          inst_executed=1e8, dram_bytes=1e6, fp64_pipe_pct=90.0,
                          registers_per_thread=128, waves=0.5, stalls={"wait": 1.0})
    sample = ProfileRecord("sample", "ncu", 3.0, duration_ms=3.0, cycles_elapsed=3e6,
                           inst_executed=2e8, dram_bytes=3e6, fp64_pipe_pct=50.0,
                           registers_per_thread=200, waves=2.0, stalls={"wait": 3.0},
                           achieved_occupancy_pct=20.0)
    m = merge_records([build, sample], 4.2)
    assert m.time_ms == 4.2 and m.kernel == "build + sample" and m.path == "ncu"
    assert m.inst_executed == 3e8 and m.dram_bytes == 4e6 and m.cycles_elapsed == 4e6
    assert m.fp64_pipe_pct == pytest.approx((90 * 1 + 50 * 3) / 4)
    assert m.stalls["wait"] == pytest.approx(2.5)
    assert m.registers_per_thread == 200 and m.waves == 2.0  # the longer kernel's launch
    assert m.achieved_occupancy_pct == 20.0  # averaged over the kernels that report it
    assert merge_records([sample], 3.3).time_ms == 3.3


def test_counters_only_for_the_baseline_and_each_steps_best():
    times = {"b128": 170.0, "prop-l1-b128": 40.0, "prop-l2-b128": 30.0,
             "prop-l4-b128": 35.0, "prop-l8-b128": 31.0, **SLOW_SPANS}
    evaluate, _ = synthetic(times)
    refined, saved = [], []

    def refine(m):
        refined.append(m.config.name)
        m2 = meas(m.config, m.time_ms, registers=90, pct_fp64=85.0, pct_inst=50.0,
                  registers_per_thread=90)
        m2.metrics.path = "ncu"
        return m2

    best, log = optimize(evaluate, LaunchConfig(), n_states=16, n_candidates=10,
                         propagator=True, refine=refine,
                         on_step=lambda lg: saved.append(len(lg.rows)), echo=lambda *a: None)
    # step 2 (spans, none faster) is refined too: its best is a row of the log
    assert refined == ["b128", "prop-l2-b128", "prop-l4-s8-b128"]
    assert all(r.path == "ncu" for r in log.rows) and saved == [1, 2, 3]
    entry = next(t for t in log.measurements if t["variant"] == "prop-l2-b128")
    assert entry["registers"] == 90 and entry["metrics"]["path"] == "ncu"
    # a time limit stops the loop before any new variant, and says so
    evaluate, calls = synthetic(times)
    best, log = optimize(evaluate, LaunchConfig(), n_states=16, n_candidates=10,
                         propagator=True, time_limit_s=0.0, echo=lambda *a: None)
    assert calls == ["b128"] and "time limit" in log.stop_reason and len(log.rows) == 1


@sim
def test_a_variant_that_cannot_run_is_a_failed_variant(monkeypatch):
    import kingen.analysis.solver_cases as sc
    from kingen.analysis.optimize import gpu_evaluator

    prob = sc.solver_problem("jonas_1993", 2, "float64", "deactivation")

    def boom(*a, **k):
        raise RuntimeError("ptxas: too many resources requested for launch\nmore")

    monkeypatch.setattr(sc, "exact_error", boom)
    evaluate, refine = gpu_evaluator(prob, None, use_ncu=False, full=False,
                                     out_dir=Path("unused"), thresholds=Thresholds(),
                                     echo=lambda *a: None)
    m = evaluate(LaunchConfig(64, 32))
    assert refine is None and not m.ok
    assert m.note == "RuntimeError: ptxas: too many resources requested for launch"


def test_from_the_stage_form_the_standard_set_climbs_to_spans_of_16():
    """The climb on the standard set, with each variant's time its own flops (the bound
    model's count on Robert & Howe, ideal steps) and lanes hiding latency: from ``b128``
    the loop takes the propagator, then spans, and ends at the fits' default launch."""
    from kingen.analysis.bound import variant_flops
    from kingen.analysis.solver_cases import protocol_set
    from kingen.model.scheme import Scheme
    from kingen.model.shipped import resolve_model
    from kingen.solve.plan import plan_propagator
    from kingen.solve.schedule import build_schedule, protocol_sweeps

    scheme = Scheme.load(resolve_model("robert_howe_2003"))
    schedule = build_schedule(scheme, protocol_sweeps(protocol_set("standard"))[0])
    plan = plan_propagator(scheme, schedule, every_constant_row=True)

    def flops(cfg):
        return variant_flops(scheme, schedule, cfg,
                             plan=plan if cfg.form == "propagator" else None).total

    class Times(dict):
        def __missing__(self, name):
            cfg = LaunchConfig.parse(name)
            return flops(cfg) / 1e6 * (1 + 0.5 / cfg.lanes) * (1.2 if cfg.max_registers else 1)

    latency = type("Every", (), {"__contains__": lambda self, n: n.startswith("prop")})()
    evaluate, calls = synthetic(Times(), latency=latency)
    ratio = flops(LaunchConfig(form="propagator")) / flops(LaunchConfig())
    best, log = optimize(evaluate, LaunchConfig.parse("b128"), n_states=16,
                         n_candidates=16384, propagator=True, flops_ratio=ratio,
                         echo=lambda *a: None)
    assert ratio < 0.05
    assert [r.variant for r in log.rows if r.kept] == ["b128", "prop-l8-b128",
                                                       "prop-l8-s16-b128"]
    assert best.config.name == "prop-l8-s16-b128"

