"""The resting occupancies solved on all CPU cores equal the scheme's own (NumPy) solve."""

from pathlib import Path

import numpy as np
import pytest
from test_fit_helpers import FOUR_STATE

import kingen.solve.rest as rest_module
from kingen.errors import KingenError
from kingen.model.scheme import Scheme
from kingen.solve.rest import rest_occupancy_batch, resting_class

MODELS = Path(__file__).resolve().parents[1] / "models"
# D has no agonist-free exit either: two places to rest
TWO_RESTS = FOUR_STATE.replace('"D -> O" = "r"', '"D -> O" = "r * glu"').replace(
    'r = { value = 0.01, unit = "ms^-1"', 'r = { value = 0.01, unit = "mM^-1 ms^-1"')


@pytest.mark.parametrize("model", ["robert_howe_2003", "coombs_2017"])
def test_parallel_rest_state_equals_numpy_and_flags_unsolvable_rows(model):
    scheme = Scheme.load(MODELS / f"{model}.toml")
    rng = np.random.default_rng(0)
    lo, hi = np.log(scheme.lower), np.log(scheme.upper)
    params = scheme.complete(np.exp(rng.uniform(lo, hi, (300, scheme.n_params))))
    free = next(t for t in scheme.transitions if not t.agonist)
    params[7, free.param] = np.nan  # a rate that acts with no agonist
    got = rest_occupancy_batch(scheme, params)
    want = scheme.rest_occupancy(params)
    ok = np.isfinite(want).all(axis=1)
    assert ok.sum() == 299 and not np.isfinite(got[7]).any()
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got[ok].sum(axis=1), 1.0, atol=1e-12)
    # p·Q(0) = 0: it is the equilibrium, not merely NumPy's answer
    flux = np.einsum("ni,nij->nj", got[ok], scheme.Q(0.0, params[ok]))
    assert np.abs(flux).max() < 1e-9
    # the states outside the resting class hold nothing at rest, exactly
    outside = np.setdiff1d(np.arange(scheme.n_states), resting_class(scheme))
    assert outside.size and (got[ok][:, outside] == 0).all()
    assert got.T.flags.c_contiguous  # the layout the solvers take, with no copy


def test_one_thread_and_all_threads_give_the_same_bits(monkeypatch):
    scheme = Scheme.load(MODELS / "robert_howe_2003.toml")
    rng = np.random.default_rng(1)
    lo, hi = np.log(scheme.lower), np.log(scheme.upper)
    params = scheme.complete(np.exp(rng.uniform(lo, hi, (700, scheme.n_params))))
    results = []
    for work in (0, 1 << 60):  # all threads from no work on; one thread up to any work
        monkeypatch.setattr(rest_module, "PARALLEL_FROM_WORK", work)
        results.append(rest_occupancy_batch(scheme, params))
    np.testing.assert_array_equal(results[0], results[1])
    assert np.isfinite(results[0]).all()
    # two functions, so that numba's cache (keyed by a function's name and code, not by
    # its options) keeps the parallel build and the serial one apart
    parallel, serial = rest_module._stationary_parallel, rest_module._stationary_serial
    assert parallel.py_func.__code__ is not serial.py_func.__code__
    assert parallel.targetoptions.get("parallel") and not serial.targetoptions.get("parallel")


def test_the_resting_class_is_the_closed_class_of_the_agonist_free_transitions():
    scheme = Scheme.load(MODELS / "robert_howe_2003.toml")
    assert [scheme.states[i] for i in resting_class(scheme)] == ["C0", "D0"]
    with pytest.raises(KingenError, match="resting state is not unique"):
        Scheme.loads(TWO_RESTS, "two_rests.toml")  # C0 and D: two places to rest
