"""The resting occupancies solved on all CPU cores equal the scheme's own (NumPy) solve."""

from pathlib import Path

import numpy as np
import pytest

from kingen.scheme import Scheme
from kingen.solve.rest import rest_occupancy_batch

MODELS = Path(__file__).resolve().parents[1] / "models"


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
