"""The objective: closed-form amplitude, relative errors, window targets, failures."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from test_fit_helpers import TRUTH_MODEL, synthetic_recording

from kingen.errors import KingenError
from kingen.experiment.features import edge_half_width, peak, protocol_features, steady_state
from kingen.experiment.protocol import standard_protocol
from kingen.experiment.recordings import Recording, Target, Targets
from kingen.fitting.objective import Objective, ProtocolData, fit_hill_batch, fit_recovery_batch
from kingen.fitting.params import ParameterMap
from kingen.model.scheme import Scheme
from kingen.solve import simulate_exact
from kingen.solve.options import SolverOptions

SCHEME = Scheme.load(TRUTH_MODEL)
DEACT = standard_protocol("deactivation", exchange=0.2, dt=0.02)
DESENS = standard_protocol("desensitization", exchange=0.2, dt=0.02)


def clean_recording(protocol, scale=1.0):
    tr = simulate_exact(SCHEME, protocol)
    return Recording(protocol.name, [s.times() for s in protocol.sweeps],
                     [s.current * scale for s in tr.sweeps], [s.label for s in protocol.sweeps])


def test_noise_free_data_give_zero_error_and_the_true_amplitude():
    obj = Objective(SCHEME, [ProtocolData(DEACT, clean_recording(DEACT)),
                             ProtocolData(DESENS, clean_recording(DESENS, 3.0))],
                             options=SolverOptions(backend="cpu"))
    ev, _ = obj.evaluate(SCHEME.values[None, :])
    assert ev.fail[0] == 0
    assert ev.errors[0] == pytest.approx([0.0, 0.0], abs=1e-9)
    # amplitude = channels: 100 in the file, 300 for the scaled recording
    assert ev.amplitudes[0] == pytest.approx([100.0, 300.0], rel=1e-6)


@pytest.mark.parametrize("baseline", ["none", "pre-pulse", "per-sweep"])
def test_relative_error_is_independent_of_size_and_matches_a_direct_computation(baseline):
    rng = np.random.default_rng(1)
    rec, clean = synthetic_recording(SCHEME, DEACT, 0.02, rng)
    obj = Objective(SCHEME, [ProtocolData(DEACT, rec, baseline=baseline)],
                    options=SolverOptions(backend="cpu"))
    p = SCHEME.values.copy()
    p[SCHEME.param_names.index("k2o")] *= 1.3
    ev, _ = obj.evaluate(p[None, :])
    # direct: least-squares amplitude, SSE / sum d^2 (data as recorded, or less the mean
    # before the pulse: one sweep, so the same for both kinds of subtraction)
    g = simulate_exact(SCHEME, DEACT, params=p).sweeps[0].current / SCHEME.channels
    d = rec.sweep_current(0)
    if baseline != "none":
        d = d - d[DEACT.sweeps[0].times() < 2.0 - edge_half_width(0.2)].mean()
    a = (g @ d) / (g @ g)
    assert ev.amplitudes[0, 0] == pytest.approx(a, rel=1e-5)
    assert ev.errors[0, 0] == pytest.approx(((a * g - d) ** 2).sum() / (d @ d), rel=1e-4)
    big = Recording(rec.protocol, rec.time_ms, rec.current_pA * 10.0, rec.sweep_labels)
    ev10, _ = Objective(SCHEME, [ProtocolData(DEACT, big, baseline=baseline)],
                        options=SolverOptions(backend="cpu")).evaluate(p[None, :])
    assert ev10.errors[0, 0] == pytest.approx(ev.errors[0, 0], rel=1e-9)


def test_failed_candidates_get_worst_fitness_without_disturbing_others():
    rng = np.random.default_rng(2)
    rec, _ = synthetic_recording(SCHEME, DEACT, 0.02, rng)
    obj = Objective(SCHEME, [ProtocolData(DEACT, rec)], options=SolverOptions(backend="cpu"))
    good = np.vstack([SCHEME.values, SCHEME.values * 1.2])
    alone, _ = obj.evaluate(good)
    bad = SCHEME.values.copy()
    bad[0] = -1.0
    mixed, _ = obj.evaluate(np.vstack([good[0], bad, good[1]]))
    assert mixed.fail.tolist() == [0, 4, 0]
    assert np.isinf(mixed.fitness[1]) and np.all(np.isinf(mixed.errors[1]))
    np.testing.assert_array_equal(mixed.fitness[[0, 2]], alone.fitness)


def test_guard_fails_rows_whose_derived_rates_leave_their_bounds():
    obj = Objective(SCHEME, [ProtocolData(DEACT, clean_recording(DEACT))],
                    options=SolverOptions(backend="cpu"))
    pmap = ParameterMap(SCHEME)
    rng = np.random.default_rng(5)
    params = pmap.to_params(rng.uniform(pmap.lower, pmap.upper, (400, pmap.n_genes)))
    kept = params.copy()
    derived = [p.derived for p in SCHEME.parameters]
    d = params[:, derived]
    inside = np.all((d >= SCHEME.lower[derived] * (1 - 1e-9))
                    & (d <= SCHEME.upper[derived] * (1 + 1e-9)), axis=1)
    assert 0 < inside.sum() < len(inside)  # both kinds of row
    stale = params.copy()
    stale[:, derived] = 1.0  # guard recomputes derived rates by default
    recomputed, checked = obj.guard(stale), obj.guard(params, complete=False)
    for p in (recomputed, checked):
        assert np.isnan(p[~inside]).all()
    np.testing.assert_array_equal(checked[inside], params[inside])
    # recomputed with NumPy's exp and log, which on AVX-512 hosts may round differently in
    # the last place from the C library's that to_params calls
    np.testing.assert_allclose(recomputed[inside], params[inside], rtol=1e-14, atol=0.0)
    np.testing.assert_array_equal(params, kept)  # the caller's array is left as it was
    ev, _ = obj.evaluate(params[~inside][:3], complete=False)
    assert ev.fail.tolist() == [4, 4, 4]


def test_kernel_windows_and_residuals_agree_with_the_host_reduction():
    targets = Targets({"peak_pA": Target(-40.0), "tau_des_ms": Target(18.0),
                       "ss_to_peak": Target(0.03)})
    rng = np.random.default_rng(3)
    rec, _ = synthetic_recording(SCHEME, DEACT, 0.02, rng)
    obj = Objective(SCHEME, [ProtocolData(DEACT, rec, weight=2.0),
                             ProtocolData(DESENS, None, targets)],
                             options=SolverOptions(backend="cpu"))
    p = np.vstack([SCHEME.values, SCHEME.values * 0.8])
    ev, _ = obj.evaluate(p)
    ev_host = obj.evaluate_traces(p)
    np.testing.assert_allclose(ev.errors, ev_host.errors, rtol=1e-9)
    r = obj.residuals(p)
    np.testing.assert_allclose((r * r).sum(axis=1), ev.fitness, rtol=1e-9)



def test_the_kernel_carries_only_the_windows_a_target_reads():
    # a recording alone reads no window: the kernel reduces none, and writes two values per
    # pair; summary targets keep theirs, with the values the host reduction gives
    rng = np.random.default_rng(4)
    rec, _ = synthetic_recording(SCHEME, DEACT, 0.02, rng)
    only_data = Objective(SCHEME, [ProtocolData(DEACT, rec)], options=SolverOptions(backend="cpu"))
    assert only_data.simulator._n_windows("objective") == 0
    p = np.vstack([SCHEME.values, SCHEME.values * 0.8])
    res = only_data.simulator.run(only_data.guard(p), "objective")
    assert res.windows.shape == (2, 1, 4, 2) and (res.windows[..., 1] == -1).all()
    ev, _ = only_data.evaluate(p)
    np.testing.assert_allclose(ev.errors, only_data.evaluate_traces(p).errors, rtol=1e-9)
    targets = Targets({"peak_pA": Target(-40.0), "ss_to_peak": Target(0.03)})
    with_targets = Objective(SCHEME, [ProtocolData(DEACT, rec),
                                      ProtocolData(DESENS, None, targets)],
                                      options=SolverOptions(backend="cpu"))
    assert with_targets.simulator._n_windows("objective") > 0
    res = with_targets.simulator.run(with_targets.guard(p), "objective")
    assert (res.windows[:, 0, :, 1] == -1).all()  # the deactivation sweep reads none
    assert (res.windows[:, 1, 0, 1] >= 0).all()  # the desensitization peak was found
    ev, _ = with_targets.evaluate(p)
    np.testing.assert_allclose(ev.errors, with_targets.evaluate_traces(p).errors, rtol=1e-9)

def test_window_targets_match_the_features_of_the_simulated_currents():
    """Targets measured by kingen.experiment.features on the model's own currents are met at
    the truth."""
    recov = standard_protocol("recovery", exchange=0.2, dt=0.05)
    items = []
    for proto in (DEACT, DESENS, recov):
        tr = simulate_exact(SCHEME, proto)
        f = protocol_features(proto, None, tr.currents)
        if proto.kind == "desensitization":
            # not a steady state after 100 ms (features say "not determined"), but the
            # window's mean is what the objective compares
            assert "ss_to_peak" in f["not_determined"]
            sweep, pulse = proto.sweeps[0], proto.sweeps[0].pulses[0]
            p, _ = peak(sweep.times(), tr.currents[0],
                        start_ms=pulse.start - edge_half_width(pulse.rise), end_ms=pulse.end)
            f["ss_to_peak"] = steady_state(sweep.times(), tr.currents[0], pulse) / p
            assert f["end_to_peak"] == pytest.approx(f["ss_to_peak"], rel=1e-12)
        keys = {"deactivation": ("peak_pA", "tau_deact_ms", "time_to_peak_ms"),
                "desensitization": ("ss_to_peak", "end_to_peak", "tau_des_ms"),
                "recovery": ("tau_rec_ms",)}[proto.kind]
        t = Targets({k: Target(f[k]) for k in keys})
        if proto.kind == "recovery":
            from kingen.experiment.recordings import RecoveryTable

            rows = np.array(f["recovery"])
            t.recovery = RecoveryTable(rows[:, 0], rows[:, 1])
        items.append(ProtocolData(proto, None, t))
    obj = Objective(SCHEME, items, options=SolverOptions(backend="cpu"))
    ev, _ = obj.evaluate(SCHEME.values[None, :])
    # integral tau vs fitted tau and the grid fit of tau_rec agree to a few per cent
    assert np.all(ev.errors[0] < 0.03 ** 2), ev.errors
    assert ev.amplitudes[0, 0] == pytest.approx(100.0, rel=1e-3)
    # a 30 % slower opening is clearly worse
    p = SCHEME.values.copy()
    p[SCHEME.param_names.index("k2o")] *= 0.7
    worse, _ = obj.evaluate(p[None, :])
    assert worse.fitness[0] > 10 * ev.fitness[0]


def test_vectorised_recovery_and_hill_fits():
    x = np.array([5.0, 10, 20, 50, 100, 200, 500])
    r = 1 - 0.9 * np.exp(-x / 60.0)
    np.testing.assert_allclose(fit_recovery_batch(x, r[None, :]), [60.0], rtol=0.01)
    c = np.array([0.01, 0.03, 0.1, 0.3, 1, 3, 10])
    y = -50 / (1 + (0.4 / c) ** 1.5)
    ec50, n = fit_hill_batch(c, y[None, :])
    assert ec50[0] == pytest.approx(0.4, rel=0.02) and n[0] == pytest.approx(1.5, rel=0.05)


def test_recording_that_does_not_match_the_protocol_is_an_error():
    rec = clean_recording(DEACT)
    recov = standard_protocol("recovery")
    with pytest.raises(KingenError, match="recorded sweeps for a protocol of 9"):
        Objective(SCHEME, [ProtocolData(recov, rec)], options=SolverOptions(backend="cpu"))
    early = Recording("deactivation", rec.time_ms - 1000.0, rec.current_pA, rec.sweep_labels)
    with pytest.raises(KingenError, match="no recorded sample"):
        Objective(SCHEME, [ProtocolData(DEACT, early)], options=SolverOptions(backend="cpu"))
    late = Recording("deactivation", rec.time_ms + 1000.0, rec.current_pA, rec.sweep_labels)
    with pytest.raises(KingenError, match="no recorded sample"):
        Objective(SCHEME, [ProtocolData(DEACT, late)], options=SolverOptions(backend="cpu"))
    with pytest.raises(KingenError, match="not available for a deactivation"):
        Objective(SCHEME, [ProtocolData(DEACT, None, Targets({"ec50_peak_mM": Target(1)}))],
                  options=SolverOptions(backend="cpu"))


def test_a_recording_that_starts_after_the_protocol_is_listed_unless_masked():
    """Time 0 of a recording is the protocol's start: one that starts at 3 ms had its
    first 3 ms of protocol samples left out of the fit without a word. The objective lists
    it (a new fit refuses it: tests/test_odd_inputs.py)."""
    rec = clean_recording(DEACT)
    late = Recording("deactivation", rec.time_ms[150:], rec.current_pA[:, 150:],
                     rec.sweep_labels, source="late.csv")
    assert late.time_ms[0] == pytest.approx(3.0)
    obj = Objective(SCHEME, [ProtocolData(DEACT, late)], options=SolverOptions(backend="cpu"))
    assert len(obj.late_starts) == 1
    text = str(obj.late_starts[0])
    assert "\n" not in text
    assert text.startswith("late.csv: protocols.deactivation.recording.sweep = '1ms': the "
                           "recorded time starts at 3 ms, not at 0 ms (the protocol's start): "
                           "the protocol's samples from 0 to 2.98 ms have no recorded data")
    assert text.endswith("add mask = [[0, 3]] to the protocol's entry if the recording "
                         "begins late")
    # masked, the gap is the user's choice, and only the masked samples are left out
    obj = Objective(SCHEME, [ProtocolData(DEACT, late, mask=[(0.0, 3.0)])],
                    options=SolverOptions(backend="cpu"))
    assert obj.late_starts == []
    assert obj.weight.sum() == DEACT.sweeps[0].n_samples - 151
    # a first sample one interval after 0, as some rigs export, is no gap
    one_step = Recording("deactivation", rec.time_ms[1:], rec.current_pA[:, 1:],
                         rec.sweep_labels)
    obj = Objective(SCHEME, [ProtocolData(DEACT, one_step)], options=SolverOptions(backend="cpu"))
    assert obj.weight.sum() == DEACT.sweeps[0].n_samples - 1
    # samples before 0 (a pre-trigger) lie outside the protocol, as before
    early = Recording("deactivation", np.concatenate([[-1.0], rec.time_ms]),
                      np.concatenate([[[0.0]], rec.current_pA], axis=1), rec.sweep_labels)
    obj = Objective(SCHEME, [ProtocolData(DEACT, early)], options=SolverOptions(backend="cpu"))
    assert obj.weight.sum() == DEACT.sweeps[0].n_samples


def test_a_repeated_label_does_not_give_one_recorded_sweep_to_two_protocol_sweeps():
    from dataclasses import replace

    dose = standard_protocol("dose_response", dt=0.2)
    sweeps = list(dose.sweeps[:3])
    sweeps[2] = replace(sweeps[2], label=sweeps[0].label)  # built in Python: not checked
    protocol = replace(dose, sweeps=tuple(sweeps))
    rec = clean_recording(protocol)
    obj = Objective(SCHEME, [ProtocolData(protocol, rec)], options=SolverOptions(backend="cpu"))
    third = slice(int(obj.sample_start[2]), int(obj.sample_start[3]))
    np.testing.assert_array_equal(obj.data[third], rec.sweep_current(2))
    assert not np.array_equal(rec.sweep_current(2), rec.sweep_current(0))
    # labels in another order are still matched by label
    first3 = replace(dose, sweeps=dose.sweeps[:3])
    rec = clean_recording(first3)
    shuffled = Recording(dose.name, rec.time_ms, rec.current_pA[::-1], rec.sweep_labels[::-1])
    obj = Objective(SCHEME, [ProtocolData(first3, shuffled)], options=SolverOptions(backend="cpu"))
    np.testing.assert_array_equal(obj.data[int(obj.sample_start[0]):int(obj.sample_start[1])],
                                  rec.sweep_current(0))


def _reduce_by_arrays(obj, sgg, sgd, windows, fail, sg):
    """Objective.reduce as numpy array code, as it was before its rows were compiled."""
    from kingen.codegen import FAIL_NONFINITE

    n = sgg.shape[0]
    errors = np.zeros((n, obj.n_protocols))
    amps = np.full((n, obj.n_protocols), np.nan)
    recorded = np.array([item.recording is not None for item in obj.items])
    plain = np.array([obj._plain(p) for p in range(obj.n_protocols)])
    with np.errstate(all="ignore"):
        for p, (a, b) in enumerate(obj.spans):
            if not (recorded[p] and plain[p]):
                continue
            s_gg, s_gd = sgg[:, a:b].sum(axis=1), sgd[:, a:b].sum(axis=1)
            fixed = obj.items[p].amplitude
            amp = (np.full(n, float(fixed)) if fixed is not None else
                   np.maximum(np.where(s_gg > 0, s_gd / np.where(s_gg > 0, s_gg, 1.0), 0.0),
                              0.0))
            sse = obj.dd[p] - 2.0 * amp * s_gd + amp * amp * s_gg
            errors[:, p] += np.where(np.isnan(sse), sse, np.maximum(sse, 0.0)) / obj.dd[p]
            amps[:, p] = amp
    trace_sse = errors * obj.dd[None, :] if obj.noise is not None else None
    for p, (a, b) in enumerate(obj.spans):
        if recorded[p] and not plain[p]:
            sse, amp, _ = obj._scales(p, sgg[:, a:b], sgd[:, a:b], sg[:, a:b])
            errors[:, p] += sse / obj.dd[p]
            if trace_sse is not None:
                trace_sse[:, p] = sse
            amps[:, p] = obj._protocol_amplitude(p, amp)
    chi2_p = None if trace_sse is None else np.where(
        recorded[None, :], trace_sse * obj._trace_coef[None, :], 0.0)
    with np.errstate(all="ignore"):
        for p, (item, plan) in enumerate(zip(obj.items, obj.plans, strict=True)):
            if plan.targets:
                amp = amps[:, p] if item.recording is not None else None
                r, tw, amp = obj._target_rows(plan, windows, amp)
                errors[:, p] += (tw * r * r).sum(axis=1) / tw.sum()
                if chi2_p is not None:
                    chi2_p[:, p] += (obj._target_factor[p] * tw * r * r).sum(axis=1)
                if amp is not None:
                    amps[:, p] = amp
        terms = errors if chi2_p is None else chi2_p
        fitness = np.zeros(n)
        for p, w in enumerate(obj.proto_weight):
            fitness += w * terms[:, p]
        chi2 = None if chi2_p is None else chi2_p.sum(axis=1)
    nonzero = fail != 0
    fcode = np.where(nonzero.any(axis=1), fail[np.arange(n), np.argmax(nonzero, axis=1)], 0)
    fcode = fcode.astype(np.int64)
    fcode[~np.isfinite(fitness) & (fcode == 0)] = FAIL_NONFINITE
    failed = fcode != 0
    fitness[failed] = np.inf
    errors[failed] = np.inf
    if chi2 is not None:
        chi2[failed | ~np.isfinite(chi2)] = np.inf
    return fitness, errors, fcode, amps, chi2


def _objectives():
    """Objectives that take each of reduce's paths: plain recordings (one pass), a chain
    with amplitudes per sweep and an offset, a fixed amplitude, targets alone and with a
    recording (two passes)."""
    rng = np.random.default_rng(11)
    rec = {p.name: synthetic_recording(SCHEME, p, 0.02, rng)[0] for p in (DEACT, DESENS)}
    recovery = standard_protocol("recovery", exchange=0.2, dt=0.05)
    rec_recovery = synthetic_recording(SCHEME, recovery, 0.02, rng)[0]
    targets = Targets({"peak_pA": Target(-40.0), "ss_to_peak": Target(0.03)})
    from kingen.experiment.chain import Chain

    yield [ProtocolData(DEACT, rec["deactivation"], weight=2.0),
           ProtocolData(DESENS, rec["desensitization"]),
           ProtocolData(recovery, rec_recovery, weight=0.5)]
    yield [ProtocolData(DEACT, rec["deactivation"], amplitude=80.0),
           ProtocolData(recovery, rec_recovery,
                        chain=Chain(offset="per-protocol", amplitude="per-sweep"))]
    yield [ProtocolData(DEACT, rec["deactivation"]), ProtocolData(DESENS, None, targets)]
    yield [ProtocolData(DESENS, rec["desensitization"], targets, weight=3.0)]


@cache
def _objective_sums() -> list:
    """Each of :func:`_objectives` with its kernel's sums for 16 candidates: the four cases
    below score the same sums, solved once."""
    cases = []
    for k, items in enumerate(_objectives()):
        obj = Objective(SCHEME, items, options=SolverOptions(backend="cpu"))
        rng = np.random.default_rng(k)
        p = SCHEME.values * np.exp(rng.normal(0.0, 0.3, (16, SCHEME.values.size)))
        cases.append((items, obj.simulator.run(obj.guard(p), "objective", complete=False)))
    return cases


@pytest.mark.parametrize("noise", [False, True])
@pytest.mark.parametrize("n", [300, 9000])  # the calling thread; numba's threads
def test_compiled_scoring_equals_the_array_code_with_failures_and_nans(noise, n):
    from kingen.fitting.params import PARALLEL_FROM_ROWS
    from kingen.fitting.scores import NoiseWeights

    assert (n >= PARALLEL_FROM_ROWS) == (n == 9000)
    for k, (items, res) in enumerate(_objective_sums()):
        obj = Objective(SCHEME, items, options=SolverOptions(backend="cpu"))
        if noise:
            obj.set_noise([NoiseWeights(trace=0.7 + p, targets=(1.5,) * len(plan.targets))
                           for p, plan in enumerate(obj.plans)])
        rng = np.random.default_rng(100 + k)
        rows = rng.integers(0, 16, n)
        sgg, sgd, windows = res.sgg[rows], res.sgd[rows], res.windows[rows]
        sg = res.sg[rows] if res.sg is not None else np.zeros_like(sgg)
        fail = np.zeros(sgg.shape, dtype=np.int32)
        hit = rng.random(sgg.shape) < 0.01  # failures in some sweeps: the first one counts
        fail[hit] = rng.integers(1, 6, int(hit.sum()))
        sgg[rng.random(sgg.shape) < 0.01] = np.nan
        sgd[rng.random(sgd.shape) < 0.005] = np.inf
        sgg[rng.random(sgg.shape) < 0.01] = 0.0  # no current: amplitude 0
        windows[rng.random(windows.shape) < 0.002] = np.nan
        ev = obj.reduce(sgg, sgd, windows, fail, sg if res.sg is not None else None)
        want = _reduce_by_arrays(obj, sgg, sgd, windows, fail, sg)
        got = (ev.fitness, ev.errors, ev.fail, ev.amplitudes, ev.chi2)
        assert (ev.chi2 is None) == (not noise)
        assert ev.fail.dtype == np.int64 and (ev.fail != 0).any() and (ev.fail == 0).any()
        assert not np.isfinite(ev.fitness).all() and np.isfinite(ev.fitness).any()
        for g, w in zip(got[:4] + (got[4] if noise else np.zeros(1),),
                        want[:4] + (want[4] if noise else np.zeros(1),), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=0)
