"""The exact reference: analytic cases, conservation, and agreement between its two methods."""

from pathlib import Path

import numpy as np
import pytest

from kingen.experiment.protocol import Protocol, Pulse, Sweep, standard_protocol
from kingen.model.scheme import Scheme
from kingen.solve import simulate_exact

MODELS = Path(__file__).resolve().parents[1] / "models"

TWO_STATE = """
[model]
name = "two-state"
channels = 50
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


def test_two_state_matches_analytic_solution_to_1e10():
    s = Scheme.loads(TWO_STATE)
    c, kon, koff = 0.3, 5.0, 0.8
    sweep = Sweep("x", duration=20.0, dt=0.01, pulses=(Pulse(1.0, 10.0, c),), holding=-70.0)
    tr = simulate_exact(s, Protocol("p", "custom", (sweep,))).sweeps[0]
    t = tr.time
    lam_on = kon * c + koff
    p_inf = kon * c / lam_on
    po = np.where(t < 1.0, 0.0, p_inf * (1 - np.exp(-lam_on * (t - 1.0))))
    off = t >= 11.0
    po_end = p_inf * (1 - np.exp(-lam_on * 10.0))
    po[off] = po_end * np.exp(-koff * (t[off] - 11.0))
    np.testing.assert_allclose(tr.occupancy[:, 1], po, atol=1e-10, rtol=0)
    # current: N * g * p_O * (V - E) in pA
    np.testing.assert_allclose(tr.current, 50 * 20 * po * (-70.0) * 1e-3, atol=1e-8)


@pytest.mark.parametrize("name", ["deactivation", "desensitization", "recovery",
                                  "dose_response"])
@pytest.mark.parametrize("exchange", [0.0, 0.2])
def test_probability_conserved_to_1e12(name, exchange):
    s = Scheme.load(MODELS / "jonas_1993.toml")
    tr = simulate_exact(s, standard_protocol(name, exchange=exchange))
    for sweep in tr.sweeps:
        assert np.abs(sweep.occupancy.sum(axis=1) - 1).max() < 1e-12
        assert sweep.occupancy.min() > -1e-12


def test_smooth_solver_agrees_with_expm_where_both_apply():
    """A pulse with an exchange time far below the sampling resolution ≈ ideal steps, and the
    LSODA path (smooth) must agree with the expm path (constant) to its tolerance."""
    s = Scheme.load(MODELS / "jonas_1993.toml")
    ideal = simulate_exact(s, standard_protocol("desensitization", exchange=0.0))
    smooth = simulate_exact(s, standard_protocol("desensitization", exchange=1e-4))
    a, b = ideal.sweeps[0].current, smooth.sweeps[0].current
    # the exchange shifts nothing (edges centred on the ideal step); tiny blur only
    assert np.abs(a - b).max() / np.abs(a).max() < 2e-3
    # on the plateau, far from the edges, they agree closely
    t = ideal.sweeps[0].time
    plateau = (t > 10) & (t < 100)
    assert np.abs(a - b)[plateau].max() / np.abs(a).max() < 1e-6


def test_synaptic_transient_matches_high_accuracy_ode():
    from scipy.integrate import solve_ivp

    from kingen.experiment.protocol import Transient

    s = Scheme.load(MODELS / "jonas_1993.toml")
    tr_def = Transient(start=1.0, peak=1.1, tau_decay=1.2, tau_rise=0.05)
    sweep = Sweep("syn", duration=15.0, dt=0.05, transients=(tr_def,))
    got = simulate_exact(s, Protocol("syn", "custom", (sweep,))).sweeps[0]
    p = s.values
    sol = solve_ivp(lambda t, y: y @ s.Q(float(sweep.concentration(t)), p), (0, 15.0),
                    s.rest_occupancy(), method="Radau", rtol=1e-12, atol=1e-14,
                    t_eval=sweep.times(), max_step=0.01)
    np.testing.assert_allclose(got.occupancy, sol.y.T, atol=1e-8)


def test_exchange_edges_match_a_whole_sweep_radau_solve():
    """The reference's edges (LSODA, segment by segment, with expm between) against Radau
    over the whole sweep at rtol 1e-13, as SciPy alone computes it."""
    from scipy.integrate import solve_ivp

    s = Scheme.load(MODELS / "raman_trussell_1992.toml")
    protocol = standard_protocol("deactivation", exchange=0.2)
    got = simulate_exact(s, protocol).sweeps[0]
    sweep, p = protocol.sweeps[0], s.values
    q0, dq = s.Q(0.0, p), s.Q(1.0, p) - s.Q(0.0, p)

    def q(t: float) -> np.ndarray:
        return q0 + float(sweep.concentration(t)) * dq

    sol = solve_ivp(lambda t, y: y @ q(t), (0.0, sweep.times()[-1]), s.rest_occupancy(p),
                    method="Radau", jac=lambda t, y: q(t).T, rtol=1e-13, atol=1e-16,
                    t_eval=sweep.times(), max_step=0.01)
    want = s.current(sol.y.T, sweep.driving_force, None)
    # 8e-12 of the peak; LSODA's own tolerance is rtol 1e-11
    assert np.abs(got.current - want).max() <= 1e-10 * np.abs(want).max()


FAST_PAIR = """
[model]
name = "fast pair"
channels = 1
[states]
C0 = { conductance = 0 }
C1 = { conductance = 0 }
O = { conductance = 10 }
D = { conductance = 0 }
[parameters]
kon = { value = 5, bounds = [1, 1e23] }
koff = { value = 1.0, bounds = [0.1, 1e23] }
b = { value = FAST, bounds = [0.1, 1e23] }
a = { value = FAST, bounds = [0.1, 1e23] }
d = { value = 0.5, bounds = [0.01, 1e23] }
r = { value = 0.01, bounds = [0.001, 1e23] }
[transitions]
"C0 -> C1" = "kon * glu"
"C1 -> C0" = "koff"
"C1 -> O" = "b"
"O -> C1" = "a"
"O -> D" = "d"
"D -> O" = "r"
"""

LUMPED = """
[model]
name = "lumped"
channels = 1
[states]
C0 = { conductance = 0 }
L = { conductance = 5 }
D = { conductance = 0 }
[parameters]
kon = { value = 5, bounds = [1, 10] }
koff = { value = 0.5, bounds = [0.1, 10] }
d = { value = 0.25, bounds = [0.01, 10] }
r = { value = 0.01, bounds = [0.001, 10] }
[transitions]
"C0 -> L" = "kon * glu"
"L -> C0" = "koff"
"L -> D" = "d"
"D -> L" = "r"
"""


@pytest.mark.parametrize(("fast", "tolerance"), [("1e9", 1e-7), ("1e10", 1e-8), ("1e12", 1e-6),
                                                 ("1e14", 1e-4)])
def test_rates_far_beyond_the_others_match_the_scheme_they_lump_into(fast, tolerance):
    # C1 and O exchange so fast that they are one state L, half open: the slow rates out of
    # it are halved (to within slow/fast: 1e-8 at 1e9). expm's rounding, about 3e-19 times
    # the fast rate, used to grow over the sweep's sample steps (a 1.2 % drift at 1e14,
    # 1e40 pA at 1e16).
    protocol = standard_protocol("desensitization")
    fast_trace = simulate_exact(Scheme.loads(FAST_PAIR.replace("FAST", fast)), protocol)
    lumped = simulate_exact(Scheme.loads(LUMPED), protocol)
    for got, want in zip(fast_trace.currents, lumped.currents):
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * scale)


def test_simulate_refuses_rates_the_exact_solver_cannot_resolve():
    from kingen.errors import KingenError
    from kingen.runs.simulate import simulate

    scheme = Scheme.loads(FAST_PAIR.replace("FAST", "1e11"))
    with pytest.raises(KingenError) as exc:
        simulate(scheme, "desensitization")
    assert str(exc.value).splitlines() == [
        "<scheme>: protocol desensitization: state C1 is left at 1e+11 /ms (at 0 mM; fastest "
        "C1 -> O, parameter b); the exact solver resolves rates up to 1e+10 /ms beside slow "
        "ones, and no channel's kinetics come near it: check the parameters' values and "
        "units (kingen.model.limits.MAX_EXACT_RATE), or set force = True to try anyway"]
    forced = simulate(scheme, "desensitization", force=True)
    lumped = simulate(Scheme.loads(LUMPED), "desensitization")
    np.testing.assert_allclose(forced.currents[0], lumped.currents[0], rtol=0,
                               atol=1e-6 * np.abs(lumped.currents[0]).max())
