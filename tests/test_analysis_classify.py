"""Classifier on recorded metric sets, including the published ones of issue 6."""

from __future__ import annotations

import pytest

from kingen.analysis.classify import COMPUTE, LATENCY, MEMORY, Thresholds, advise, classify
from kingen.analysis.metrics import MetricSet


def ms(**kw) -> MetricSet:
    base = dict(name="k", intensity_dram=1.0, balance_dram=10.0)
    base.update(kw)
    return MetricSet(**base)


def test_published_rk4_memory_bound():
    v = classify(ms(name="rk4", intensity_dram=0.65, balance_dram=4.5, pct_dram=88.0,
                    pct_inst=20.0))
    assert v.kind == MEMORY and v.unit == "DRAM"


def test_published_rk4_compute_bound_fp64():
    v = classify(ms(name="rk4", intensity_dram=823.0, balance_dram=10.7, pct_dram=1.0,
                    pct_fp64=92.0, pct_inst=45.0, precision="float64"))
    assert v.kind == COMPUTE and v.unit == "FP64 pipe"


def test_published_stencil_memory_bound():
    v = classify(ms(name="stencil", intensity_dram=4.87, balance_dram=10.7, pct_dram=78.0,
                    pct_inst=30.0))
    assert v.kind == MEMORY


def test_all_below_70_is_latency_bound():
    v = classify(ms(intensity_dram=4.87, balance_dram=10.7, pct_dram=40.0, pct_l2=55.0,
                    pct_l1=50.0, pct_inst=60.0, pct_fp32=30.0))
    assert v.kind == LATENCY
    assert "no unit at its threshold" in v.reasons[-1]


def test_high_throughput_on_wrong_side_of_balance_is_not_that_class():
    # above the balance but only DRAM busy: not memory-bound by the ratio rule, not compute
    v = classify(ms(intensity_dram=50.0, balance_dram=10.0, pct_dram=90.0, pct_inst=20.0))
    assert v.kind == LATENCY


def test_thresholds_are_configurable():
    m = ms(intensity_dram=4.87, balance_dram=10.7, pct_dram=65.0)
    assert classify(m).kind == LATENCY
    assert classify(m, Thresholds(memory_pct=60.0)).kind == MEMORY
    c = ms(intensity_dram=30.0, balance_dram=10.0, pct_inst=75.0)
    assert classify(c).kind == COMPUTE
    assert classify(c, Thresholds(compute_pct=80.0)).kind == LATENCY


def test_l2_level_memory_bound():
    v = classify(ms(intensity_dram=20.0, balance_dram=10.0, intensity_l2=2.0, balance_l2=6.0,
                    pct_dram=20.0, pct_l2=85.0, pct_inst=40.0))
    assert v.kind == MEMORY and v.unit == "L2"


def test_agreement_and_disagreement_with_ncu():
    agree = classify(ms(intensity_dram=0.65, balance_dram=4.5, pct_dram=88.0,
                        sol_compute_pct=20.0, sol_memory_pct=90.0))
    assert agree.agrees is True and agree.ncu_kind == MEMORY and agree.disagreement == ""
    # measured on the H200 (analysis/h200): stencil_tiled, issue 63 %, ncu compute 63 %
    dis = classify(ms(intensity_dram=9.87, balance_dram=8.4, pct_dram=38.0, pct_l2=52.0,
                      pct_l1=55.0, pct_inst=63.0, sol_compute_pct=63.0, sol_memory_pct=54.0))
    assert dis.kind == LATENCY and dis.ncu_kind == COMPUTE and dis.agrees is False
    assert "between ncu's 60 % rule" in dis.disagreement
    none = classify(ms(pct_dram=90.0))
    assert none.ncu_kind is None and none.agrees is None


def test_advice_triggered_by_values_not_a_fixed_list():
    clean = advise(ms(pct_dram=90.0, dram_bytes=1.0e9, declared_bytes=1.0e9,
                      sectors_per_request=4.0, local_bytes=0.0), MEMORY)
    assert [a.topic for a in clean] == ["near the DRAM roof"]
    bad = advise(ms(pct_dram=90.0, dram_bytes=3.0e9, declared_bytes=1.0e9,
                    sectors_per_request=16.0, local_bytes=1e6), MEMORY)
    topics = [a.topic for a in bad]
    assert topics[:3] == ["spills / local memory", "on-chip reuse", "coalescing"]
    f64 = advise(ms(precision="float32", fp64_fraction=0.2, flops_per_inst=0.1), COMPUTE)
    assert [a.topic for a in f64][:2] == ["precision", "instruction mix"]
    assert advise(ms(precision="float32", fp64_fraction=0.0, flops_per_inst=1.5),
                  COMPUTE)[0].topic == "near the compute roof"


@pytest.mark.parametrize("limiter,word", [("registers", "cap registers"),
                                          ("shared_mem", "shared memory")])
def test_latency_advice_names_occupancy_limiter(limiter, word):
    adv = advise(ms(achieved_occupancy_pct=20.0, theoretical_occupancy_pct=25.0,
                    occupancy_limiter=limiter, registers_per_thread=149,
                    stalls={"long_scoreboard": 5.0, "barrier": 1.0}), LATENCY)
    assert adv[0].topic == "registers vs occupancy" and word in adv[0].action
    assert adv[1].topic == "warp stalls" and "long_scoreboard" in adv[1].evidence
