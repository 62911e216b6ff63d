"""The arithmetic bound of each solver variant, against a hand count."""

from types import SimpleNamespace

import numpy as np
import pytest

from kingen.analysis.bound import TERMS, variant_flops
from kingen.errors import KingenError
from kingen.model.scheme import Scheme
from kingen.model.shipped import resolve_model
from kingen.solve.cuda import LaunchConfig

RH = Scheme.load(resolve_model("robert_howe_2003"))
# rows: [RK4 steps per repetition, repetitions, recorded, smooth]
SCHEDULE = SimpleNamespace(rows_i=np.array([
    [1, 40, 1, 0],  # a constant row with key 0: 2 spans of 16 and a tail of 8
    [2, 1, 0, 0],   # a constant partial step (not recorded), key 1: a tail of 1
    [1, 5, 1, 1],   # an exchange edge with key 2: one product per sample, never spans
    [3, 10, 1, 1],  # an edge left in stage form
]))
PLAN = SimpleNamespace(row_key=np.array([0, 1, 2, -1]), key_steps=[1, 2, 1],
                       keys_conc=np.array([-1, -1, 7]))
# Robert & Howe: S = 16 states, 42 transitions, 3 conducting states
S, STEP, PRODUCT, CURRENT = 16, 4 * (16 + 2 * 42) + 13 * 16, 2 * 16 * 16 + 16, 2 * 3


def count(variant, precision="float64"):
    cfg = LaunchConfig.parse(variant)
    return variant_flops(RH, SCHEDULE, cfg, precision,
                         PLAN if cfg.form == "propagator" else None)


def test_stage_form_is_its_rk4_steps_and_currents():
    f = count("b128")
    assert (f.stage, f.products, f.builds) == ((40 + 2 + 5 + 30) * STEP, 0, 0)
    assert f.currents == (40 + 5 + 10) * CURRENT
    assert count("b128", "float32").stage == 77 * (STEP + 3 * S)


def test_propagator_without_spans_is_one_product_per_sample():
    f = count("prop-l4-b128")
    assert f.stage == 30 * STEP
    assert f.products == (40 + 1 + 5) * PRODUCT
    assert f.currents == (40 + 5 + 10) * CURRENT
    assert f.matrix_builds == S * (1 + 2 + 1) * STEP and f.span_builds == 0


def test_spans_count_their_products_tails_dense_currents_and_builds():
    f = count("prop-l8-s16-b128")
    assert f.stage == 30 * STEP
    # 40 samples: 2 products with M^16 - I and 8 single ones; the partial step 1; edge 5
    assert f.products == (2 + 8 + 1 + 5) * PRODUCT
    # span samples read dense columns M^j g (2S); the edge and stage rows the state
    assert f.currents == 40 * 2 * S + (5 + 10) * CURRENT
    assert f.matrix_builds == S * 4 * STEP
    # on the GPU the two constant keys build their currents by 16 products of a vector
    # and M^16 - I by 4 squarings E <- 2E + E·E
    assert f.span_builds == 2 * (2 * S * S * 16 + 4 * S * S * (2 * S + 2)) == 86_016
    assert f.total == sum(getattr(f, t) for t in TERMS)
    # on the CPU (one lane) S rows x 16 products, each with its current
    assert count("prop-l1-s16-b128").span_builds == 2 * S * 16 * (PRODUCT + 2 * S) == 286_720


def test_lanes_leave_the_count_unchanged():
    assert count("prop-l2-s16-b128").total == count("prop-l8-s16-b128").total
    assert count("prop-l1-b128").total == count("prop-l8-b128").total


def test_bound_and_share():
    f = count("prop-l8-s16-b128")
    assert f.bound(1e12) == pytest.approx(1e12 / f.total)
    assert f.share(0.5 * f.bound(1e12), 1e12) == pytest.approx(0.5)


def test_the_standard_set_per_sample():
    """Robert & Howe on the standard set, ideal steps: spans of 16 cost 65 flops a sample
    where one product per sample costs 534 (the share of bound the benchmarks report)."""
    from kingen.experiment.protocol import standard_set
    from kingen.solve.plan import plan_propagator
    from kingen.solve.schedule import build_schedule, protocol_sweeps

    schedule = build_schedule(RH, protocol_sweeps(standard_set())[0])
    plan = plan_propagator(RH, schedule, every_constant_row=True)
    plain = variant_flops(RH, schedule, LaunchConfig.parse("prop-l4-b128"), plan=plan)
    spans = variant_flops(RH, schedule, LaunchConfig.parse("prop-l8-s16-b128"), plan=plan)
    samples = plan.prop_samples
    assert plain.products == samples * PRODUCT
    per_sample = (spans.products + spans.currents) / samples
    assert 65 <= per_sample < 67  # 65 in full spans, a little more for the tails
    assert spans.total < plain.total / 5


def test_propagator_needs_its_plan():
    with pytest.raises(KingenError, match="propagator plan"):
        variant_flops(RH, SCHEDULE, LaunchConfig.parse("prop-l4-b128"))


def test_builds_run_in_float64_at_its_peak():
    f = count("prop-l8-s16-b128", "float32")
    assert f.matrix_builds == count("prop-l8-s16-b128").matrix_builds
    rest = f.total - f.builds
    assert f.bound(2e12, 1e12) == pytest.approx(1 / (rest / 2e12 + f.builds / 1e12))
    assert f.bound(2e12) == pytest.approx(2e12 / f.total)
