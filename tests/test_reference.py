"""The exact reference: analytic cases, conservation, and agreement between its two methods."""

from pathlib import Path

import numpy as np
import pytest

from kingen.protocol import Protocol, Pulse, Sweep, standard_protocol
from kingen.scheme import Scheme
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
    BDF path (smooth) must agree with the expm path (constant) to its tolerance."""
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

    from kingen.protocol import Transient

    s = Scheme.load(MODELS / "jonas_1993.toml")
    tr_def = Transient(start=1.0, peak=1.1, tau_decay=1.2, tau_rise=0.05)
    sweep = Sweep("syn", duration=15.0, dt=0.05, transients=(tr_def,))
    got = simulate_exact(s, Protocol("syn", "custom", (sweep,))).sweeps[0]
    p = s.values
    sol = solve_ivp(lambda t, y: y @ s.Q(float(sweep.concentration(t)), p), (0, 15.0),
                    s.rest_occupancy(), method="Radau", rtol=1e-12, atol=1e-14,
                    t_eval=sweep.times(), max_step=0.01)
    np.testing.assert_allclose(got.occupancy, sol.y.T, atol=1e-8)
