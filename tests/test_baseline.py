"""The recording's baseline: compared as recorded by default, and why (a test with known truth).

Subtracting the mean of the few samples before the first pulse leaves an offset, constant
over the sweep, that no model can fit; a polish started from the true rates then moves the
slow, well-determined rates by several standard errors. Compared as recorded, the fit
started from the truth stays within its standard errors.
"""

from __future__ import annotations

import types
from dataclasses import replace

import numpy as np
import pytest
from test_fit_helpers import FOUR_STATE, standard_errors

from kingen.experiment.features import edge_half_width
from kingen.experiment.protocol import Protocol, standard_protocol
from kingen.experiment.recordings import Recording
from kingen.fitting.objective import Objective, ProtocolData
from kingen.fitting.params import ParameterMap
from kingen.fitting.polish import polish
from kingen.model.scheme import Scheme
from kingen.solve import simulate_exact
from kingen.solve.options import SolverOptions

SCHEME = Scheme.loads(FOUR_STATE, "four_state.toml")
NOISE = 0.02  # of the peak, Gaussian, white
SEEDS = range(4)
WELL_DETERMINED = 0.10  # relative standard error below which a rate counts as determined


def repeated(name: str, n: int) -> Protocol:
    """A standard protocol (0.2 ms exchange, 20 kHz) recorded ``n`` times."""
    p = standard_protocol(name, exchange=0.2, dt=0.05)
    return replace(p, sweeps=tuple(replace(p.sweeps[0], label=f"r{i}") for i in range(n)))


PROTOCOLS = [repeated("desensitization", 2), repeated("deactivation", 2)]


def noisy_recordings(seed: int, offset: float = 0.0) -> list[Recording]:
    """Synthetic recordings of the true rates with 2 % noise (and an optional DC offset)."""
    rng = np.random.default_rng(seed)
    out = []
    for p in PROTOCOLS:
        clean = [s.current for s in simulate_exact(SCHEME, p).sweeps]
        peak = max(float(np.abs(c).max()) for c in clean)
        out.append(Recording(p.name, [s.times() for s in p.sweeps],
                             [c + offset + rng.normal(0.0, NOISE * peak, c.size)
                              for c in clean], [s.label for s in p.sweeps]))
    return out


def polish_from_truth(baseline: str, recordings: list[Recording]
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The fit's own polish started at the true rates: (log10 rates moved, their standard
    errors), the errors from the Jacobian of the residuals at the end point
    (cov = s² (JᵀJ)⁻¹ in log10-rate space, s² = SSE / (n - p))."""
    objective = Objective(SCHEME, [ProtocolData(p, r, baseline=baseline)
                                   for p, r in zip(PROTOCOLS, recordings, strict=True)],
                          options=SolverOptions(backend="cpu"))
    pmap = ParameterMap(SCHEME)
    truth = pmap.to_genes(SCHEME.values[None, :])[0]
    at_truth = objective.evaluate(SCHEME.values[None, :])[0].fitness[0]
    genes, report = polish(objective, types.SimpleNamespace(pmap=pmap, precision="float64"),
                           truth, at_truth, 40)
    assert report["fitness_after"] <= at_truth
    return genes - truth, standard_errors(objective, pmap, genes)


@pytest.fixture(scope="module")
def moved() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per baseline setting: (K, P) log10 moves and standard errors over the noise seeds."""
    out = {}
    for baseline in ("none", "per-sweep"):
        runs = [polish_from_truth(baseline, noisy_recordings(seed)) for seed in SEEDS]
        out[baseline] = (np.array([m for m, _ in runs]), np.array([s for _, s in runs]))
    return out


def test_pre_pulse_offset_is_pooled_over_sweeps_and_a_clear_offset_is_reported():
    recs = noisy_recordings(11, offset=-5.0)  # a leak of 5 pA: about 12 % of the peak
    p = PROTOCOLS[0]
    onset = p.sweeps[0].pulses[0].start - edge_half_width(p.sweeps[0].pulses[0].rise)
    pre = np.concatenate([recs[0].sweep_current(k)[recs[0].sweep_time(k) < onset]
                          for k in range(p.n_sweeps)])
    pooled = Objective(SCHEME, [ProtocolData(p, recs[0], baseline="pre-pulse")],
                       options=SolverOptions(backend="cpu"))
    raw = np.asarray(recs[0].sweep_current(1))
    n = p.sweeps[1].n_samples
    np.testing.assert_allclose(pooled.data[n: 2 * n], raw - pre.mean(), atol=1e-12)
    assert pooled.warnings == []
    plain = Objective(SCHEME, [ProtocolData(p, recs[0], source="fit.toml")],
                      options=SolverOptions(backend="cpu"))
    np.testing.assert_array_equal(plain.data[n: 2 * n], raw)
    se = pre.std(ddof=1) / np.sqrt(pre.size)
    largest = max(float(np.abs(np.asarray(y) - pre.mean()).max()) for y in recs[0].current_pA)
    assert plain.warnings == [
        f"warning: fit.toml: protocols.desensitization.recording: the current before the "
        f"first pulse averages {pre.mean():.4g} pA ({abs(pre.mean()) / se:.3g} standard "
        f"errors from 0, {100 * abs(pre.mean()) / largest:.3g} % of the largest current), "
        f'which the model, starting from rest, cannot fit; set baseline = "pre-pulse" if it '
        f"is a DC offset"]
    # noise alone is not reported
    quiet = Objective(SCHEME, [ProtocolData(p, noisy_recordings(11)[0])],
                      options=SolverOptions(backend="cpu"))
    assert quiet.warnings == []


def test_fit_started_at_the_truth_keeps_well_determined_rates_within_their_se(moved):
    delta, se = moved["none"]
    relative_se = np.log(10.0) * se.mean(axis=0)
    determined = relative_se < WELL_DETERMINED
    names = [n for n, ok in zip(SCHEME.param_names, determined, strict=True) if ok]
    assert names == ["kon", "beta", "d", "r"]  # koff, alpha: SE 20-30 %
    z = (delta / se)[:, determined]
    # Noise alone moves a rate by about one SE (|z| ~ N(0, 1)); what must not happen is a
    # move of several. No single fit moves a determined rate by 3 SE, and over the seeds
    # the moves are as large as their SE says (rms of K N(0, 1) draws above 2: p = 0.003).
    assert np.all(np.abs(z) < 3.0), z
    assert np.all(np.sqrt((z ** 2).mean(axis=0)) < 2.0), z


def test_subtracting_the_pre_pulse_mean_moves_the_slow_rate_by_several_se(moved):
    delta, se = moved["per-sweep"]
    r = SCHEME.param_names.index("r")
    z = delta[:, r] / se[:, r]
    # the slow recovery is set by a steady state of about 2 % of the peak, which the
    # pre-pulse estimate's noise (31 samples per sweep) shifts by several SE
    assert np.sqrt((z ** 2).mean()) > 3.0, z
