"""Identifiability: the noise model, the likelihood, profiles against the truth and against
an analytic likelihood, resuming, and bad input (issue #15). CPU, small problems."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from test_fit_helpers import write_problem

from kingen.cli import main
from kingen.errors import KingenError
from kingen.experiment.recordings import Recording, write_csv
from kingen.identify.noise import integrated_time
from kingen.runs.fit import fit
from kingen.runs.profile import profile_run
from kingen.store import RunStore, RunView

TWO_STATE = """
[model]
name = "two-state"
channels = 1
[states]
C = { conductance = 0 }
O = { conductance = 20 }
[parameters]
kon = { value = 5.0, bounds = [0.5, 50] }
koff = { value = 0.8, bounds = [0.08, 8] }
[transitions]
"C -> O" = "kon * glu"
"O -> C" = "koff"
"""
PROTOCOL = """
[protocol]
name = "step"
kind = "custom"
dt = 0.05
holding = -70
reversal = 0
[[sweeps]]
label = "a"
duration = 14
pulses = [{ start = 2, duration = 4, concentration = 0.3 }]
"""
C, T0, DUR, DT, N_CH, SIGMA = 0.3, 2.0, 4.0, 0.05, 40.0, 0.4


def _two_state_po(t: np.ndarray, kon: float, koff: float) -> np.ndarray:
    lam = kon * C + koff
    p_inf = kon * C / lam
    po = np.where(t < T0, 0.0, p_inf * (1 - np.exp(-lam * (t - T0))))
    off = t >= T0 + DUR
    po[off] = p_inf * (1 - np.exp(-lam * DUR)) * np.exp(-koff * (t[off] - T0 - DUR))
    return po


def _unit_current(t: np.ndarray, kon: float, koff: float) -> np.ndarray:
    return 20.0 * _two_state_po(t, kon, koff) * (-70.0) * 1e-3  # one channel, pA


def _two_state_problem(tmp: Path, seed: int) -> Path:
    """A fitted two-state run of noisy data from kon = 5 /mM/ms, koff = 0.8 /ms."""
    (tmp / "model.toml").write_text(TWO_STATE)
    (tmp / "step.toml").write_text(PROTOCOL)
    t = np.arange(int(round(14 / DT)) + 1) * DT
    rng = np.random.default_rng(seed)
    data = N_CH * _unit_current(t, 5.0, 0.8) + rng.normal(0.0, SIGMA, t.size)
    write_csv(Recording("step", [t], [data], ["a"], holding_mV=-70.0), tmp / "step.csv")
    (tmp / "fit.toml").write_text(
        f'model = "model.toml"\noutput = "run.h5"\nseed = {seed}\nbackend = "cpu"\n'
        'polish = true\n[[protocols]]\nprotocol = "step.toml"\nrecording = "step.csv"\n'
        '[parameters]\nfree = ["kon", "koff"]\n[ga]\npopulation = 12\ngenerations = 4\n')
    fit(tmp / "fit.toml", progress=False)
    return tmp / "run.h5"


@pytest.fixture(scope="module")
def two_state_run(tmp_path_factory) -> Path:
    return _two_state_problem(tmp_path_factory.mktemp("two_state"), 11)


@pytest.fixture(scope="module")
def jonas_fit(tmp_path_factory):
    """Deactivation of the Jonas scheme with 2 % noise; k2o and ko2 free."""
    tmp = tmp_path_factory.mktemp("jonas")
    return fit(write_problem(tmp, ga="generations = 6", extra="polish = true"), progress=False)


@pytest.fixture(scope="module")
def jonas_run(jonas_fit) -> Path:
    return Path(jonas_fit.path)


def test_integrated_time_white_and_filtered():
    rng = np.random.default_rng(1)
    assert integrated_time([rng.normal(size=5000)]) < 1.2
    # a 9-sample moving average: τ = 9 in theory
    smooth = np.convolve(rng.normal(size=20000), np.ones(9) / 9, mode="valid")
    assert 7.0 < integrated_time([smooth]) < 11.0


def test_two_state_profile_equals_the_analytic_profile(two_state_run):
    result = profile_run(two_state_run, points=9, progress=False)
    assert result.extra["finished"]
    sigma = result.noise["sigma_pA"][0]
    assert result.noise["source"] == ["baseline"]
    assert abs(sigma - SIGMA) < 0.25 * SIGMA
    with RunStore.open(two_state_run) as store:
        rec = store.recordings()["step"]
    t, d = np.asarray(rec.sweep_time(0)), np.asarray(rec.sweep_current(0))
    tau = result.noise["tau_samples"][0]

    def chi2(log_kon: float, log_koff: float) -> float:
        g = _unit_current(t, 10 ** log_kon, 10 ** log_koff)
        a = max(float(g @ d) / float(g @ g), 0.0)
        r = a * g - d
        return float(r @ r) / (sigma ** 2 * tau)

    def profile(j: int, v: float) -> float:
        other = (lambda u: chi2(v, u)) if j == 0 else (lambda u: chi2(u, v))
        lo, hi = (math.log10(0.08), math.log10(8)) if j == 0 else (math.log10(0.5),
                                                                  math.log10(50))
        return minimize_scalar(other, bounds=(lo, hi), method="bounded",
                               options={"xatol": 1e-7}).fun

    prof = result.results["profiles"]
    chi2_min = min(profile(0, v) for v in prof["kon"]["grid"])
    for j, name in enumerate(("kon", "koff")):
        exact = np.array([profile(j, v) for v in prof[name]["grid"]]) - chi2_min
        got = np.array(prof[name]["delta_chi2"], dtype=float)
        assert exact.max() > result.threshold  # the grid crosses the threshold
        np.testing.assert_allclose(got, exact, atol=0.03, rtol=0.01)
    rows = {r["name"]: r for r in result.rows}
    for name, truth in (("kon", 5.0), ("koff", 0.8)):
        assert rows[name]["identifiable"]
        assert rows[name]["lower"] < truth < rows[name]["upper"]


def test_profiles_of_identifiable_rates_contain_the_truth_and_resume(jonas_run, tmp_path):
    copy = tmp_path / "copy.h5"
    shutil.copy(jonas_run, copy)
    whole = profile_run(jonas_run, points=9, progress=False)
    rows = {r["name"]: r for r in whole.rows}
    for name, truth in (("k2o", 4.24), ("ko2", 0.90)):
        assert rows[name]["identifiable"] and not rows[name]["flat"]
        assert rows[name]["lower"] < truth < rows[name]["upper"]
        # the quadratic approximation agrees with the profile here
        assert rows[name]["fisher_lower"] == pytest.approx(rows[name]["lower"], rel=0.02)
    # interrupted after 4 steps, then continued: the same intervals
    part = profile_run(copy, points=9, progress=False, max_steps=4)
    assert not part.extra["finished"] and part.rows == []
    with RunStore.open(copy) as store:
        assert store.profiles()["engine"]["steps"] == 4
    rest = profile_run(copy, points=9, progress=False)
    assert rest.resumed and rest.steps == whole.steps
    assert rest.rows == whole.rows
    with RunStore.open(copy) as store:
        local = store.local_uncertainty()
        assert local["names"] == ["k2o", "ko2"] and len(local["se_log10"]) == 2
        assert store.finished  # profiling leaves the fit's record as it was


def test_the_state_is_committed_at_most_so_often_and_where_a_profile_stops(jonas_run, tmp_path,
                                                                         monkeypatch):
    # a commit after every step cost a GPU profile a third of its time; throttled, the run
    # file still holds the state where the profile stopped, the same as with every commit
    from kingen.runs import profile as run_profile
    from kingen.store import profiles

    commit, counts, stored = profiles.commit_state, [], []
    monkeypatch.setattr(profiles, "commit_state",
                        lambda f, state: counts.append(1) or commit(f, state))
    for every in (0.0, 1e9):
        copy = tmp_path / f"every_{every:g}.h5"
        shutil.copy(jonas_run, copy)
        monkeypatch.setattr(run_profile, "COMMIT_EVERY_S", every)
        counts.clear()
        profile_run(copy, points=9, progress=False, max_steps=3, restart=True)
        with RunStore.open(copy) as store:
            stored.append((len(counts), store.profiles()["engine"]))
    (each, first), (once, second) = stored
    assert (each, once) == (3, 1)
    assert first["steps"] == second["steps"] == 3 and first == second


@pytest.mark.parametrize("args, message", [
    (["--parameters", "k99"], "--parameters = 'k99': not a free parameter of this fit"),
    (["--parameters", "k13"], "--parameters = 'k13': not a free parameter of this fit"),
    (["--points", "2"], "--points = 2: must be an integer from 5"),
    (["--level", "1.5"], "--level = 1.5: must be a probability"),
])
def test_bad_settings_give_one_line(jonas_run, capsys, args, message):
    capsys.readouterr()
    assert main(["profile", str(jonas_run), *args]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err and str(jonas_run) in err


def test_run_without_a_finished_fit_is_refused(jonas_run, tmp_path, capsys):
    unfinished = tmp_path / "unfinished.h5"
    shutil.copy(jonas_run, unfinished)
    with h5py.File(unfinished, "r+") as f:
        f["best/valid"][0] = 0
        f["run/finished"][0] = b""
    with pytest.raises(KingenError, match="holds no finished fit"):
        profile_run(unfinished, progress=False)
    assert main(["profile", str(tmp_path / "missing.h5")]) != 0
    assert "run file not found" in capsys.readouterr().err


def test_a_file_without_the_profiles_group_gains_it(jonas_run, tmp_path):
    old = tmp_path / "old.h5"
    shutil.copy(jonas_run, old)
    with h5py.File(old, "r+") as f:
        del f["profiles"]
    with RunStore.open(old) as store:
        assert store.profiles() is None and store.local_uncertainty() is None
    result = profile_run(old, parameters=["ko2"], points=5, progress=False)
    assert [r["name"] for r in result.rows] == ["ko2"]
    with RunStore.open(old) as store:
        assert store.profiles()["results"]["profiles"].keys() == {"ko2"}


def test_desensitization_rates_from_deactivation_alone_are_flagged(tmp_path):
    """The Jonas scheme's open-to-desensitized rates, fitted to a deactivation (1 ms pulse)
    alone: the data do not bound them, and the profiles say so."""
    fit(write_problem(tmp_path, ga="generations = 6", extra="polish = true",
                      free=["k2o", "ko2", "ko5", "k5o"]), progress=False)
    result = profile_run(tmp_path / "run.h5", parameters=["ko5", "k5o"], points=5,
                         progress=False)
    rows = {r["name"]: r for r in result.rows}
    for name in ("ko5", "k5o"):
        assert not rows[name]["identifiable"]
        assert rows[name]["lower"] is None or rows[name]["upper"] is None
    assert rows["k5o"]["flat"]
    assert "k5o" in " ".join(result.summary().splitlines()[3:])


def test_plot_has_one_profile_panel_per_parameter(jonas_run, tmp_path):
    from kingen.outputs.plot import plot_run_detailed, profile_figure

    fresh = tmp_path / "fresh.h5"
    shutil.copy(jonas_run, fresh)
    with h5py.File(fresh, "r+") as f:
        f["profiles/commit"][...] = np.array([0, 0, 0])
    _, skipped = plot_run_detailed(fresh, tmp_path / "none", formats=("png",))
    assert "kingen profile" in skipped["profiles"]
    profile_run(jonas_run, points=9, progress=False)
    with RunView.open(jonas_run) as view:
        fig = profile_figure(view)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_xlabel() for ax in panels] == ["k2o (ms^-1)", "ko2 (ms^-1)"]
    written, _ = plot_run_detailed(jonas_run, tmp_path / "figs", formats=("png",))
    assert written["profiles"][0].stat().st_size > 0
    assert "correlations" in written  # the fit stored its Fisher matrix


def test_intervals_cover_the_truth_over_noise_replicates(tmp_path, two_state_run):
    """A small version of benchmarks/profile_coverage.py: six noise replicates of the
    two-state data; the 95 % intervals of kon and koff hold the truth in 10 of 12 or more
    (the benchmark: 40 replicates of the Jonas scheme)."""
    covered = []
    for seed in range(100, 106):
        folder = tmp_path / str(seed)
        folder.mkdir()
        result = profile_run(_two_state_problem(folder, seed), points=5, progress=False)
        for row in result.rows:
            truth = {"kon": 5.0, "koff": 0.8}[row["name"]]
            covered.append(row["lower"] is not None and row["upper"] is not None
                           and row["lower"] <= truth <= row["upper"])
    assert len(covered) == 12 and sum(covered) >= 10


def test_a_fit_ends_with_its_local_uncertainty_and_the_outputs_show_it(jonas_fit, tmp_path):
    from kingen.outputs.export import fitted_scheme_text
    from kingen.outputs.report import _uncertainty_tables, write_report

    local = jonas_fit.uncertainty
    assert local["names"] == ["k2o", "ko2"]
    assert all(0 < se < 0.05 for se in local["se_log10"])
    assert local["noise"]["source"] == ["baseline"]
    rows = {r["name"]: r for r in local["table"]}
    assert rows["k2o"]["lower"] < 4.24 < rows["k2o"]["upper"]
    summary = jonas_fit.summary()
    assert "95 % local (Fisher) interval" in summary and "kingen profile" in summary
    run = tmp_path / "run.h5"
    shutil.copy(jonas_fit.path, run)
    with h5py.File(run, "r+") as f:  # as if never profiled
        f["profiles/commit"][...] = np.array([0, 0, 0])
    with RunView.open(run) as view:  # the report's table, without drawing its figures
        tables = _uncertainty_tables(view)
    assert tables[0].title == "Identifiability" and "local (Fisher)" in tables[0].note
    assert "local (Fisher) intervals" in fitted_scheme_text(run)
    profile_run(run, points=7, progress=False)
    _, md = write_report(run, tmp_path / "after")
    text = md.read_text()
    assert "95 % profile-likelihood intervals" in text and "profiles.png" in text
    exported = fitted_scheme_text(run)
    assert "profile-likelihood intervals" in exported
    assert exported.count("identifiable: yes") == 2
    # the NEURON and Myokit exports carry the same intervals beside each rate
    from kingen.outputs.export import export_foreign

    with RunView.open(run) as view:
        rows = {r["name"]: r for r in view.uncertainty()[0]}
        unit_factor = {p.name: p.value / rows[p.name]["file_value"]
                       for p in view.scheme.parameters if p.name in rows}
    mod = export_foreign(run, "neuron", tmp_path / "fit.mod").read_text()
    for name, row in rows.items():
        lo, hi = row["lower"] * unit_factor[name], row["upper"] * unit_factor[name]
        assert f"profile interval [{lo:.6g}, {hi:.6g}]" in mod


def test_a_damaged_or_malformed_profile_state_is_one_line(jonas_run, tmp_path, capsys):
    import json
    import zlib

    profile_run(jonas_run, points=9, progress=False)
    damaged = tmp_path / "damaged.h5"
    shutil.copy(jonas_run, damaged)
    with h5py.File(damaged, "r+") as f:
        slot = int(f["profiles/commit"][1])
        ds = f[f"profiles/slot_{slot}"]
        raw = ds[...]
        raw[10] ^= 0x01  # a flipped bit in the text
        ds[...] = raw
    capsys.readouterr()
    assert main(["profile", str(damaged), "--points", "9"]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "fails its CRC-32" in err
    malformed = tmp_path / "malformed.h5"
    shutil.copy(jonas_run, malformed)
    with h5py.File(malformed, "r+") as f:  # valid checksum, wrong contents
        slot = int(f["profiles/commit"][1])
        ds = f[f"profiles/slot_{slot}"]
        state = json.loads(bytes(ds[...]).rstrip(b"\0"))
        state["engine"]["x"] = [[1.0]]
        raw = np.frombuffer(json.dumps(state).encode(), dtype=np.uint8)
        ds.resize((max(raw.size, ds.shape[0]),))
        ds[...] = np.concatenate([raw, np.zeros(ds.shape[0] - raw.size, np.uint8)])
        f["profiles/commit"][2] = zlib.crc32(raw.tobytes())
    with pytest.raises(KingenError, match="malformed profile state.*--restart"):
        profile_run(malformed, points=9, progress=False)
    result = profile_run(malformed, points=9, progress=False, restart=True)
    assert result.extra["finished"]


def test_summary_targets_enter_the_likelihood(tmp_path):
    """A fit to summary targets alone: those with an sd are Gaussian observations, the
    others are scaled from the best fit (5 % of each when it meets them exactly)."""
    from kingen.experiment.recordings import load_targets

    (tmp_path / "model.toml").write_text(
        (Path(__file__).resolve().parents[1] / "data" / "jonas_1993_reversible.toml")
        .read_text())
    (tmp_path / "deact.csv").write_text("feature,value,unit,weight,sd\n"
                                        "peak,-45,pA,1,2\ntau_deact_ms,2.55,,,0.1\n")
    (tmp_path / "des.csv").write_text("feature,value,unit,weight,sd\ntau_des,19.8,ms,1,\n")
    (tmp_path / "fit.toml").write_text(
        'model = "model.toml"\noutput = "run.h5"\nbackend = "cpu"\nseed = 1\n'
        '[[protocols]]\nprotocol = "deactivation"\ntargets = "deact.csv"\n'
        '[[protocols]]\nprotocol = "desensitization"\ntargets = "des.csv"\n'
        '[parameters]\nfree = ["k2o", "ko2"]\nk2o = { bounds = [1, 20] }\n'
        'ko2 = { bounds = [0.2, 4] }\n[ga]\npopulation = 12\ngenerations = 4\n')
    assert load_targets(tmp_path / "des.csv").features["tau_des_ms"].sd is None
    result = fit(tmp_path / "fit.toml", progress=False)
    noise = result.uncertainty["noise"]
    assert noise["source"] == ["", ""] and noise["target_scale"][0] == 1.0
    prof = profile_run(tmp_path / "run.h5", points=5, progress=False)
    assert prof.extra["finished"] and [r["name"] for r in prof.rows] == ["k2o", "ko2"]


def test_one_batched_solver_call_per_step(jonas_run, tmp_path, monkeypatch):
    import kingen.solve.batch as batch

    run = tmp_path / "run.h5"
    shutil.copy(jonas_run, run)
    calls: list[tuple[str, int]] = []
    original = batch.Simulator.run

    def counting(self, params, mode="objective", **kw):
        calls.append((mode, np.atleast_2d(params).shape[0]))
        return original(self, params, mode, **kw)

    monkeypatch.setattr(batch.Simulator, "run", counting)
    result = profile_run(run, points=9, progress=False, restart=True)
    # the noise model is the one the fit stored with its best: one call per step, each
    # holding every sub-problem still at work (the Jacobian columns of all grid points)
    assert len(calls) == result.steps == result.solver_calls
    assert {mode for mode, _ in calls} == {"traces"}
    assert sum(n for _, n in calls) == result.candidates
    assert max(n for _, n in calls) >= 2 * 8 * 2  # 2 parameters x 8 points x (1 + 1 column)


LATE_PROTOCOL = PROTOCOL.replace('name = "step"', 'name = "late"').replace(
    "duration = 14", "duration = 24").replace("start = 2,", "start = 12,")


def _noise_problem(tmp: Path, protocols: list[str]):
    """An objective of analytic two-state data (white noise) for the given protocols."""
    from kingen import Objective
    from kingen.fitting.config import load_config

    (tmp / "model.toml").write_text(TWO_STATE)
    entries = ""
    rng = np.random.default_rng(5)
    for text in protocols:
        name = "late" if 'name = "late"' in text else "step"
        (tmp / f"{name}.toml").write_text(text)
        start = 12.0 if name == "late" else T0
        dur = 24.0 if name == "late" else 14.0
        t = np.arange(int(round(dur / DT)) + 1) * DT
        data = N_CH * _unit_current(t - (start - T0), 5.0, 0.8) * (t >= start - T0)
        data = data + rng.normal(0.0, SIGMA, t.size)
        write_csv(Recording(name, [t], [data], ["a"], holding_mV=-70.0), tmp / f"{name}.csv")
        entries += f'[[protocols]]\nprotocol = "{name}.toml"\nrecording = "{name}.csv"\n'
    (tmp / "fit.toml").write_text('model = "model.toml"\nbackend = "cpu"\n' + entries
                                  + '[parameters]\nfree = ["kon", "koff"]\n')
    cfg = load_config(tmp / "fit.toml")
    return cfg, Objective(cfg.scheme, cfg.protocols, cfg.solver)


def test_a_misfit_does_not_lend_its_correlated_residuals_to_the_noise(tmp_path):
    # a short baseline (40 samples) cannot give τ; the residuals of a wrong candidate are
    # correlated by its misfit, and a τ from them would discount the data it fails
    from kingen.identify.noise import estimate_noise

    cfg, objective = _noise_problem(tmp_path, [PROTOCOL])
    truth = cfg.scheme.values[None, :]
    good = estimate_noise(objective, truth)
    assert good.tau_source == ["residuals"] and good.tau[0] < 1.5
    wrong = truth.copy()
    wrong[0, cfg.scheme.param_names.index("kon")] = 0.5
    wrong[0, cfg.scheme.param_names.index("koff")] = 8.0
    bad = estimate_noise(objective, wrong)
    assert bad.residual_rms[0] > 2 * bad.sigma[0]
    assert bad.tau_source == ["assumed"] and bad.tau[0] == 1.0
    assert any("τ not measured" in note for note in bad.notes)
    assert bad.sigma[0] == pytest.approx(good.sigma[0])  # σ is the baseline's either way


def test_a_short_baseline_takes_tau_from_the_baselines_sampled_alike(tmp_path):
    from kingen.identify.noise import estimate_noise

    cfg, objective = _noise_problem(tmp_path, [PROTOCOL, LATE_PROTOCOL])
    wrong = cfg.scheme.values[None, :].copy()
    wrong[0, cfg.scheme.param_names.index("kon")] = 0.5
    noise = estimate_noise(objective, wrong)
    # "late" has 240 baseline samples of its own; "step" (40) borrows them: same dt
    assert noise.tau_source == ["baselines", "baseline"]
    assert (noise.tau < 1.5).all()  # white noise, measured on baselines, not the misfit
    restored = type(noise).from_dict(noise.to_dict())
    assert restored.tau_source == noise.tau_source
