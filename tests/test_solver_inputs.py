"""The batch's rates in the solvers' layout: one compiled pass gives NumPy's transpose and
its check of the rates, in both precisions."""

import numpy as np
import pytest

from kingen.errors import KingenError
from kingen.model.scheme import Scheme
from kingen.solve.inputs import checked_transpose, solver_inputs
from kingen.solve.rest import rest_occupancy_batch


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_pass_is_numpys_transpose_and_check(dtype):
    rng = np.random.default_rng(4)
    p = np.exp(rng.uniform(-20, 20, (1000, 11)))
    p[3, 2], p[10, 0], p[11, 10], p[12, 5], p[13, 7] = np.nan, 0.0, -2.0, np.inf, -np.inf
    p[14, 4] = 1e-300  # positive, and 0 once cast to float32: the check reads float64
    out, bad = checked_transpose(p, dtype)
    assert out.dtype == dtype and out.flags.c_contiguous and out.shape == (11, 1000)
    np.testing.assert_array_equal(out, np.ascontiguousarray(p.T, dtype=dtype))
    np.testing.assert_array_equal(bad, ~np.all(np.isfinite(p) & (p > 0), axis=1))
    assert np.flatnonzero(bad).tolist() == [3, 10, 11, 12, 13]


def test_a_strided_batch_and_an_empty_one():
    p = np.arange(1.0, 41.0).reshape(10, 4)[::2, ::-1]  # neither C- nor F-ordered
    out, bad = checked_transpose(p)
    np.testing.assert_array_equal(out, p.T)
    assert not bad.any()
    out, bad = checked_transpose(np.zeros((0, 3)))
    assert out.shape == (3, 0) and bad.shape == (0,)
    with pytest.raises(ValueError, match="2-D"):
        checked_transpose(np.ones(3))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_resting_occupancies_solved_before_are_those_solved_here(dtype):
    """Several GPUs' blocks take slices of one solve: a failed row's occupancies (solved from
    its own rates, or NaN) must become the scheme's, as when solved here."""
    s = Scheme.load("models/robert_howe_2003.toml")
    rng = np.random.default_rng(3)
    p = s.complete(s.values * np.exp(rng.normal(0.0, 0.5, (100, s.n_params))))
    p[5, 0] = -1.0  # fails: its own rates would give other occupancies
    p[7, :] = np.nan
    rest = rest_occupancy_batch(s, p)
    assert np.isfinite(rest[5]).all() and not np.isfinite(rest[7]).all()
    here = solver_inputs(s, p, dtype, complete=False)
    given = solver_inputs(s, p, dtype, complete=False, rest=rest[:])
    for a, b in zip(here, given, strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.flatnonzero(here[2]).tolist() == [5, 7]
    np.testing.assert_array_equal(here[1][:, 5], s.rest_occupancy(s.values).astype(dtype))
    assert np.isfinite(rest[7]).sum() < s.n_states  # the caller's array is not written into


def test_resting_occupancies_of_the_wrong_shape_are_refused():
    s = Scheme.load("models/robert_howe_2003.toml")
    p = np.vstack([s.values] * 3)
    with pytest.raises(KingenError, match=r"rest = 'shape \(2, 16\)'"):
        solver_inputs(s, p, rest=rest_occupancy_batch(s, p)[:2])
    with pytest.raises(KingenError, match="params must have"):
        solver_inputs(s, p[:, 1:])
