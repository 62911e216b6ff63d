"""Features on analytic traces: known time constants, Hill curves and recovery curves."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kingen.errors import KingenError
from kingen.experiment import features as F
from kingen.experiment.protocol import Protocol, Pulse, Sweep, standard_protocol

RNG_SEED = 20240601


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# --------------------------------------------------------------------------- analytic traces

def desensitizing_trace(sweep: Sweep, amp: float = -400.0, ss: float = 0.05,
                        fast=(0.7, 3.0), slow=(0.3, 12.0), tau_off: float = 2.0) -> np.ndarray:
    """Step onset at the pulse start, bi-exponential desensitization, exponential offset."""
    t = sweep.times()
    p = sweep.pulses[0]
    on = (t >= p.start) & (t < p.end)
    s = t - p.start
    during = amp * (ss + (1 - ss) * (fast[0] * np.exp(-s / fast[1])
                                     + slow[0] * np.exp(-s / slow[1])))
    y = np.where(on, during, 0.0)
    s_end = p.duration
    at_end = amp * (ss + (1 - ss) * (fast[0] * math.exp(-s_end / fast[1])
                                     + slow[0] * math.exp(-s_end / slow[1])))
    return np.where(t >= p.end, at_end * np.exp(-(t - p.end) / tau_off), y)


def deactivation_trace(sweep: Sweep, amp: float = -300.0, tau_on: float = 0.2,
                       comps=((0.8, 1.5), (0.2, 6.0))) -> np.ndarray:
    t = sweep.times()
    p = sweep.pulses[0]
    rise = amp * (1 - np.exp(-(t - p.start) / tau_on))
    at_end = amp * (1 - math.exp(-p.duration / tau_on))
    tail = at_end * sum(a * np.exp(-(t - p.end) / tau) for a, tau in comps)
    return np.where(t < p.start, 0.0, np.where(t < p.end, rise, tail))


# --------------------------------------------------------------------------- fit_decay

def test_two_exponentials_recovered_exactly() -> None:
    t = np.arange(0, 200, 0.02)
    y = -(300 * np.exp(-t / 2.5) + 100 * np.exp(-t / 25.0)) - 20.0
    fit = F.fit_decay(t, y)
    assert fit.n_exp == 2
    assert rel(fit.taus_ms[0], 2.5) < 1e-6 and rel(fit.taus_ms[1], 25.0) < 1e-6
    assert rel(fit.tau_ms, (300 * 2.5 + 100 * 25.0) / 400) < 1e-6
    assert rel(fit.offset, -20.0) < 1e-6


def test_one_exponential_is_not_split_in_two() -> None:
    t = np.arange(0, 50, 0.05)
    fit = F.fit_decay(t, 80 * np.exp(-t / 3.3))
    assert fit.n_exp == 1 and rel(fit.tau_ms, 3.3) < 1e-6


def test_forced_number_of_exponentials() -> None:
    t = np.arange(0, 100, 0.05)
    y = 5 * np.exp(-t / 1.0) + 5 * np.exp(-t / 10.0)
    assert F.fit_decay(t, y, n_exp=1).n_exp == 1
    two = F.fit_decay(t, y, n_exp=2, offset=False)
    assert two.n_exp == 2 and rel(two.tau_ms, 5.5) < 1e-6
    with pytest.raises(ValueError):
        F.fit_decay(t, y, n_exp=3)


def test_decay_with_two_percent_noise() -> None:
    rng = np.random.default_rng(RNG_SEED)
    t = np.arange(0, 200, 0.02)
    y = -(300 * np.exp(-t / 2.5) + 100 * np.exp(-t / 25.0)) - 20.0
    noisy = y + rng.normal(0, 0.02 * 420, y.size)
    assert rel(F.fit_decay(t, noisy).tau_ms, 8.125) < 0.03


@pytest.mark.parametrize("y", [np.zeros(100), np.full(100, -7.0), np.arange(3.0)])
def test_degenerate_decays_give_nan(y: np.ndarray) -> None:
    fit = F.fit_decay(np.arange(y.size) * 0.1, y)
    assert math.isnan(fit.tau_ms) and not fit.ok


def test_decay_ignores_nan_samples_and_survives_bad_time() -> None:
    t = np.arange(0, 20, 0.1)
    y = np.exp(-t / 2.0)
    y[5] = np.nan
    assert rel(F.fit_decay(t, y, offset=False).tau_ms, 2.0) < 1e-6
    assert math.isnan(F.fit_decay(t[::-1], y[::-1]).tau_ms)  # time not increasing


# --------------------------------------------------------------------------- recovery, Hill

def test_recovery_fit_exact_and_classical_form() -> None:
    iv = np.array([5, 10, 20, 50, 100, 200, 500, 1000, 2000.0])
    fit = F.fit_recovery(iv, F.recovery_model(iv, 37.0, 0.1))
    assert rel(fit.tau_ms, 37.0) < 1e-6 and abs(fit.r0 - 0.1) < 1e-6
    fixed = F.fit_recovery(iv, F.recovery_model(iv, 80.0), r0=0.0)
    assert rel(fixed.tau_ms, 80.0) < 1e-6 and fixed.r0 == 0.0


def test_recovery_fit_noise_and_degenerate() -> None:
    rng = np.random.default_rng(RNG_SEED)
    iv = np.array([5, 10, 20, 50, 100, 200, 500, 1000, 2000.0])
    r = F.recovery_model(iv, 37.0, 0.1) + rng.normal(0, 0.02, iv.size)
    assert rel(F.fit_recovery(iv, r).tau_ms, 37.0) < 0.15
    assert math.isnan(F.fit_recovery(iv[:2], r[:2]).tau_ms)
    assert math.isnan(F.fit_recovery(iv, np.ones(iv.size)).tau_ms)
    assert math.isnan(F.fit_recovery(iv, np.full(iv.size, np.nan)).tau_ms)


@pytest.mark.parametrize("ec50,n", [(0.45, 1.3), (0.02, 0.8), (2.0, 2.5)])
def test_hill_fit_exact(ec50: float, n: float) -> None:
    c = np.array([0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100.0])
    fit = F.fit_hill(c, -250.0 * F.hill_model(c, ec50, n))  # inward peaks
    assert rel(fit.ec50_mM, ec50) < 1e-6 and rel(fit.hill, n) < 1e-6


def test_hill_fit_unsaturated_top_is_fitted() -> None:
    c = np.array([0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10.0])
    fit = F.fit_hill(c, F.hill_model(c, 3.0, 1.0))  # only 77 % at the top dose
    assert rel(fit.ec50_mM, 3.0) < 1e-6 and fit.top > 1.2


def test_hill_fit_noise_and_degenerate() -> None:
    rng = np.random.default_rng(RNG_SEED)
    c = np.array([0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30.0])
    y = F.hill_model(c, 0.45, 1.3) + rng.normal(0, 0.02, c.size)
    fit = F.fit_hill(c, y)
    assert rel(fit.ec50_mM, 0.45) < 0.1 and rel(fit.hill, 1.3) < 0.15
    assert math.isnan(F.fit_hill(c, np.zeros(c.size)).ec50_mM)
    assert math.isnan(F.fit_hill(c[:2], y[:2]).ec50_mM)
    assert math.isnan(F.fit_hill(-c, y).ec50_mM)  # no positive concentration


# --------------------------------------------------------------------------- peaks and signs

def test_peak_sign_and_baseline() -> None:
    t = np.arange(0, 10, 0.1)
    y = np.where(t > 2, -100 * np.exp(-(t - 2) / 3), 0.0) + 5.0
    p, tp = F.peak(t, y, start_ms=2, baseline_pA=5.0)
    assert p == pytest.approx(-100 * np.exp(-0.1 / 3)) and tp == pytest.approx(2.1)
    assert F.response_sign(y, 5.0) == -1.0 and F.response_sign(-y, -5.0) == 1.0
    assert math.isnan(F.peak(t, y, start_ms=20)[0])
    assert F.baseline(t, y, 2.0) == pytest.approx(5.0)
    assert F.baseline(t, y, 0.0) == 0.0  # no pre-pulse samples


# --------------------------------------------------------------------------- protocol_features

def test_desensitization_features_exact() -> None:
    proto = standard_protocol("desensitization")
    y = desensitizing_trace(proto.sweeps[0])
    out = F.protocol_features(proto, proto.sweeps[0].times(), y[None, :])
    assert out["peak_pA"] == pytest.approx(-400.0, rel=1e-12)
    assert out["time_to_peak_ms"] == pytest.approx(0.0, abs=1e-12)
    t = proto.sweeps[0].times()
    window = (t >= 97.0) & (t <= 102.0)  # the last 5 % of the pulse
    assert out["ss_to_peak"] == pytest.approx(np.mean(y[window]) / -400.0, rel=1e-12)
    assert out["ss_to_peak"] == pytest.approx(0.05, rel=2e-3)  # slow phase not quite over
    assert rel(out["tau_des_ms"], 0.7 * 3.0 + 0.3 * 12.0) < 1e-6
    assert set(out) == {"peak_pA", "time_to_peak_ms", "rise_10_90_ms", "ss_to_peak",
                        "end_to_peak", "tau_des_ms", "tau_des_single_ms"}
    assert out["end_to_peak"] == out["ss_to_peak"]
    json.dumps(out)


def test_inward_and_outward_give_the_same_features() -> None:
    proto = standard_protocol("desensitization")
    y = desensitizing_trace(proto.sweeps[0]) + 3.0  # offset baseline: only pre-pulse counts
    inward = F.protocol_features(proto, None, [y])
    outward = F.protocol_features(proto, None, [-y])
    assert inward["peak_pA"] == pytest.approx(-outward["peak_pA"])
    assert inward["peak_pA"] == pytest.approx(-400.0)
    for key in ("time_to_peak_ms", "ss_to_peak", "tau_des_ms"):
        assert inward[key] == pytest.approx(outward[key], rel=1e-9)
    assert inward["ss_to_peak"] > 0


def test_deactivation_features_exact() -> None:
    proto = standard_protocol("deactivation")
    sweep = proto.sweeps[0]
    y = deactivation_trace(sweep)
    out = F.protocol_features(proto, sweep.times(), y)
    t0 = sweep.times()[sweep.times() >= sweep.pulses[0].end][0]
    d = t0 - sweep.pulses[0].end
    a = [0.8 * math.exp(-d / 1.5), 0.2 * math.exp(-d / 6.0)]
    expected = (a[0] * 1.5 + a[1] * 6.0) / sum(a)
    assert rel(out["tau_deact_ms"], expected) < 1e-6
    assert out["peak_pA"] == pytest.approx(y.min())
    assert out["time_to_peak_ms"] == pytest.approx(1.0, abs=0.021)
    assert set(out) == {"peak_pA", "time_to_peak_ms", "rise_10_90_ms", "tau_deact_ms",
                        "tau_deact_single_ms"}
    # one exponential through a two-exponential decay: between the two, and not the
    # weighted value
    assert 1.5 < out["tau_deact_single_ms"] < 6.0
    assert rel(out["tau_deact_single_ms"], expected) > 1e-3


def test_desensitization_features_with_noise() -> None:
    rng = np.random.default_rng(RNG_SEED)
    proto = standard_protocol("desensitization")
    clean = F.protocol_features(proto, None, [desensitizing_trace(proto.sweeps[0])])
    y = desensitizing_trace(proto.sweeps[0], ss=0.2)
    noisy = y + rng.normal(0, 0.02 * 400, y.size)
    out = F.protocol_features(proto, None, [noisy])
    # The peak of noisy data is an extremum of noise too: biased by a few sd at most.
    assert rel(out["peak_pA"], -400.0) < 0.08
    assert rel(out["ss_to_peak"], 0.2 * 400 / abs(out["peak_pA"])) < 0.05
    assert rel(out["tau_des_ms"], clean["tau_des_ms"]) < 0.1


def paired_trace(sweep: Sweep, r: float, amp: float = -200.0, tau_des: float = 3.0
                 ) -> np.ndarray:
    """Fully desensitizing responses: the second scaled by the recovery ratio r."""
    t = sweep.times()
    y = np.zeros_like(t)
    for k, (p, scale) in enumerate(zip(sweep.pulses, (1.0, r), strict=True)):
        on = (t >= p.start) & (t < p.end)
        y = y + np.where(on, amp * scale * np.exp(-(t - p.start) / tau_des), 0.0)
        assert k < 2
    return y


def test_recovery_features_exact() -> None:
    proto = standard_protocol("recovery", dt=0.05)
    ratios = F.recovery_model(proto.x_values(), 25.0, 0.05)
    currents = [paired_trace(s, r) for s, r in zip(proto.sweeps, ratios, strict=True)]
    out = F.protocol_features(proto, None, currents)
    got = np.array(out["recovery"])
    np.testing.assert_allclose(got[:, 0], proto.x_values())
    np.testing.assert_allclose(got[:, 1], ratios, rtol=1e-9)
    assert rel(out["tau_rec_ms"], 25.0) < 1e-6
    assert out["peak_pA"] == pytest.approx(-200.0)
    json.dumps(out)


def test_recovery_second_pulse_measured_from_the_current_before_it() -> None:
    sweep = Sweep("a", 60.0, 0.01, (Pulse(2, 10, 1), Pulse(17, 10, 1)), x=5.0)
    t = sweep.times()
    y = np.where(t >= 2, -100.0 * np.exp(-(t - 2) / 20.0), 0.0)  # slow, undecayed tail
    y = y + np.where(t >= 17, -50.0, 0.0)
    ratio, i1, i2 = F.recovery_ratios(t, y, *sweep.pulses)
    assert i1 == pytest.approx(-100.0) and i2 == pytest.approx(-50.0, rel=2e-3)
    assert ratio == pytest.approx(0.5, rel=2e-3)


def test_dose_response_features_exact() -> None:
    proto = standard_protocol("dose_response")
    currents = []
    for s in proto.sweeps:
        c = s.x
        pk = -500.0 * F.hill_model(c, 0.5, 1.4)
        ss = -500.0 * 0.1 * F.hill_model(c, 1.0, 1.1)  # ss below peak at every dose
        t = s.times() - s.pulses[0].start
        on = (t >= 0) & (t < s.pulses[0].duration)
        currents.append(np.where(on, ss + (pk - ss) * np.exp(-t / 3.0), 0.0))
    out = F.protocol_features(proto, None, np.array(currents))
    assert rel(out["ec50_peak_mM"], 0.5) < 1e-6 and rel(out["hill_peak"], 1.4) < 1e-6
    assert rel(out["ec50_ss_mM"], 1.0) < 1e-6 and rel(out["hill_ss"], 1.1) < 1e-6
    assert out["peak_pA"] == pytest.approx(-500.0 * F.hill_model(10.0, 0.5, 1.4))
    assert len(out["dose_response"]) == proto.n_sweeps
    json.dumps(out)


def test_train_and_custom_give_per_sweep_lists() -> None:
    pulses = tuple(Pulse(2 + 20 * k, 1.0, 10.0) for k in range(3))
    proto = Protocol("t", "train", (Sweep("train", 80.0, 0.02, pulses),
                                    Sweep("b", 40.0, 0.02, pulses[:1])))
    t0 = proto.sweeps[0].times()
    y0 = np.where(t0 >= 22, -80.0 * np.exp(-(t0 - 22) / 2), 0.0)
    t1 = proto.sweeps[1].times()
    y1 = np.where(t1 >= 2.5, 30.0 * np.exp(-(t1 - 2.5) / 2), 0.0)
    out = F.protocol_features(proto, None, [y0, y1])
    assert out["peak_pA"] == pytest.approx([-80.0, 30.0])
    assert out["time_to_peak_ms"] == pytest.approx([20.0, 0.5])


@pytest.mark.parametrize("name", ["deactivation", "desensitization", "recovery",
                                  "dose_response"])
@pytest.mark.parametrize("fill", [0.0, -3.0, np.nan])
def test_flat_or_empty_currents_give_nan_not_errors(name: str, fill: float) -> None:
    proto = standard_protocol(name, dt=0.5)
    currents = [np.full(s.n_samples, fill) for s in proto.sweeps]
    out = F.protocol_features(proto, None, currents)
    json.dumps(out)
    for key in ("tau_des_ms", "tau_deact_ms", "tau_rec_ms", "ss_to_peak", "ec50_peak_mM",
                "hill_ss"):
        if key in out:
            assert math.isnan(out[key]), key


def test_sweep_count_mismatch_is_a_kingen_error() -> None:
    proto = standard_protocol("recovery")
    with pytest.raises(KingenError, match="currents"):
        F.protocol_features(proto, None, [np.zeros(10)])


def test_shared_time_axis_cut_to_each_sweep() -> None:
    proto = standard_protocol("recovery", dt=0.05)
    longest = max(proto.sweeps, key=lambda s: s.n_samples).times()
    ratios = F.recovery_model(proto.x_values(), 25.0, 0.05)
    currents = [paired_trace(s, r) for s, r in zip(proto.sweeps, ratios, strict=True)]
    out = F.protocol_features(proto, longest, currents)
    assert rel(out["tau_rec_ms"], 25.0) < 1e-6


# --------------------------------------------------------------------------- issue #12

def test_rise_time_10_90_of_an_exponential_rise() -> None:
    t = np.arange(0.0, 20.0, 0.001)
    y = -100.0 * (1.0 - np.exp(-t / 2.0))  # 10-90 %: tau * ln 9
    assert F.rise_time(t, y, 0.0, 20.0, y[-1]) == pytest.approx(
        2.0 * math.log((1 - 0.1 * (1 - math.exp(-10))) / (1 - 0.9 * (1 - math.exp(-10)))),
        abs=2e-3)


def test_steady_state_not_reached_is_flagged_and_noise_is_not() -> None:
    proto = standard_protocol("desensitization")
    sweep = proto.sweeps[0]
    t = sweep.times()
    on = t >= sweep.pulses[0].start
    slow = np.where(on, -400.0 * np.exp(-(t - 2.0) / 3.0) - 20.0 * np.exp(-(t - 2.0) / 200.0)
                    - 5.0, 0.0)
    out = F.protocol_features(proto, t, slow)
    assert math.isnan(out["ss_to_peak"])
    # the ratio at the pulse's end is still given, under its own name
    window = (t >= 97.0) & (t <= 102.0)
    peak_pA = out["peak_pA"]
    assert out["end_to_peak"] == pytest.approx(np.mean(slow[window]) / peak_pA, rel=1e-12)
    assert out["not_determined"] == {"ss_to_peak": F.not_reached(
        F.steady_state_drift(t, slow, sweep.pulses[0]))}
    assert out["not_determined"]["ss_to_peak"].startswith(
        "not determined: the current still changes by ")
    flat = np.where(on, -400.0 * np.exp(-(t - 2.0) / 3.0) - 20.0, 0.0)
    noisy = flat + np.random.default_rng(0).normal(0.0, 8.0, t.size)
    assert F.steady_state_drift(t, noisy, sweep.pulses[0]) is None
    assert "not_determined" not in F.protocol_features(proto, t, noisy)


def test_hill_bootstrap_interval_and_not_determined() -> None:
    c = np.array([0.03, 0.1, 0.3, 1.0, 3.0, 10.0])
    clean = F.hill_model(c, 0.5, 1.3, 100.0)
    rng = np.random.default_rng(3)
    y = clean + rng.normal(0.0, 2.0, c.size)
    fit = F.fit_hill(c, y)
    (lo, hi), (n_lo, n_hi), why = F.hill_interval(c, y, fit)
    assert why is None and lo < fit.ec50_mM < hi and n_lo < fit.hill < n_hi
    assert lo < 0.5 < hi and hi / lo < 3.0
    # steady states at the noise level below the top dose: nothing to measure
    flat = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 5.0]) + rng.normal(0.0, 2.0, c.size)
    fit = F.fit_hill(c, flat)
    _, _, why = F.hill_interval(c, flat, fit)
    assert why is not None and why.startswith("not determined: its 95 % bootstrap interval")


@pytest.mark.parametrize("noise_pA", [0.0, 0.003])
def test_a_residual_offset_is_not_taken_for_a_slow_decay(noise_pA: float) -> None:
    # a deactivation decay that does not quite reach the baseline by the sweep's end (what an
    # amplifier's filter and a slow tail leave): the weighted tau is the decay's, not a tau of
    # hours that a second, flat component would give it
    from kingen.experiment.curvefits import fit_decay

    t = np.arange(0, 26.5, 0.05)
    y = (-41.66 * np.exp(-t / 2.55) - 0.0102
         + noise_pA * np.random.default_rng(3).standard_normal(t.size))
    fit = fit_decay(t, y, offset=False)
    assert fit.n_exp == 1 and fit.tau_ms == pytest.approx(2.55, rel=0.01)
