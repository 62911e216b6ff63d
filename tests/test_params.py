"""Genes ↔ rate constants: bounds, scales, fixed, tied and derived parameters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fit_helpers import TRUTH_MODEL

import kingen.fitting.params as params_module
from kingen.errors import KingenError
from kingen.fitting.params import ParameterMap, apply_overrides, apply_ties, to_file_units
from kingen.model.scheme import Scheme

SCHEME = Scheme.load(TRUTH_MODEL)


def test_genes_are_log10_inside_bounds_and_round_trip():
    pmap = ParameterMap(SCHEME)
    names = pmap.gene_names
    assert "k42" not in names and "k54" not in names  # derived
    assert pmap.n_genes == SCHEME.n_params - 2
    i = names.index("k01")
    assert pmap.lower[i] == pytest.approx(np.log10(0.459))
    assert pmap.upper[i] == pytest.approx(np.log10(45.9))
    genes = pmap.start_genes()
    params = pmap.to_params(genes[None, :])[0]
    np.testing.assert_allclose(params, SCHEME.values, rtol=1e-12)
    np.testing.assert_allclose(pmap.to_genes(params)[0], genes, rtol=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2 ** 31 - 1))
def test_derived_rates_keep_every_cycle_exactly_reversible(seed):
    pmap = ParameterMap(SCHEME)
    rng = np.random.default_rng(seed)
    genes = rng.uniform(pmap.lower, pmap.upper, size=(4, pmap.n_genes))
    for p in pmap.to_params(genes):
        for fwd, bwd in SCHEME.cycle_products(p):
            assert fwd == pytest.approx(bwd, rel=1e-10)


def test_genes_to_rates_match_powers_of_ten_and_clip_on_request():
    s = apply_overrides(SCHEME, {"k2o": {"scale": "linear", "bounds": [1.0, 20.0]}})
    pmap = ParameterMap(s)
    rng = np.random.default_rng(3)
    genes = rng.uniform(pmap.lower - 1.0, pmap.upper + 1.0, (500, pmap.n_genes))
    clipped = pmap.clip(genes)
    expected = np.repeat(s.values[None, :], 500, axis=0)
    expected[:, pmap.free_index] = np.where(pmap.log, 10.0 ** clipped, clipped)
    expected = s.complete(expected)
    p = pmap.to_params(genes, clip=True)
    np.testing.assert_allclose(p, expected, rtol=1e-13)
    np.testing.assert_array_equal(p, pmap.to_params(clipped))
    j = pmap.gene_names.index("k2o")
    np.testing.assert_array_equal(p[:, pmap.free_index[j]], clipped[:, j])  # linear: as given
    assert not np.array_equal(pmap.to_params(genes), p)  # no clipping by default


def test_a_large_batch_on_threads_is_bit_for_bit_one_row_at_a_time_and_the_schemes_arithmetic(
        monkeypatch):
    s = apply_overrides(SCHEME, {"k2o": {"scale": "linear", "bounds": [1.0, 20.0]}})
    s = apply_ties(s, {"k12": ("k01", 2.0)})
    pmap = ParameterMap(s, {"k12": ("k01", 2.0)})
    rng = np.random.default_rng(5)
    genes = rng.uniform(pmap.lower - 1.0, pmap.upper + 1.0, (3001, pmap.n_genes))
    genes[::7, 0] = np.nan
    rule = s.derived_rules[0]
    read = [int(np.flatnonzero(pmap.free_index == j)[0]) for j in np.flatnonzero(rule.exponents)
            if j in pmap.free_index]
    genes[::11, read[0]] = -np.inf  # a rate of 0 that the rule reads: its rate NaN
    monkeypatch.setattr(params_module, "PARALLEL_FROM_ROWS", 1 << 40)
    one_thread = pmap.to_params(genes, clip=False)
    monkeypatch.setattr(params_module, "PARALLEL_FROM_ROWS", 0)
    for clip in (False, True):
        rows = np.vstack([pmap.to_params(g[None, :], clip=clip) for g in genes])
        np.testing.assert_array_equal(pmap.to_params(genes, clip=clip), rows)
        # the arithmetic of the scheme's own completion: the same operations in the same
        # order, but NumPy's exp and log are its own SIMD code on AVX-512 hosts and may round
        # differently from the C library's that the compiled rows call (by 1 ulp, which a
        # derived rate's exp of a sum of logs magnifies by at most the sum's size)
        values = np.where(pmap.log, np.exp((pmap.clip(genes) if clip else genes) * np.log(10.0)),
                          pmap.clip(genes) if clip else genes)
        expected = np.repeat(s.values[None, :], genes.shape[0], axis=0)
        expected[:, pmap.free_index] = values
        expected[:, s.param_names.index("k12")] = 2.0 * expected[:, s.param_names.index("k01")]
        # (NaN where the scheme's completion gives NaN, and only there)
        np.testing.assert_allclose(rows, s.complete(expected), rtol=1e-14, atol=0.0)
    np.testing.assert_array_equal(pmap.to_params(genes), one_thread)
    assert np.isnan(one_thread[::11, rule.param]).all()


def test_fixed_linear_and_tied_parameters():
    s = apply_overrides(SCHEME, {"k01": {"fixed": True, "value": 5.0},
                                 "k2o": {"scale": "linear", "bounds": [1.0, 20.0]}})
    s = apply_ties(s, {"k12": ("k01", 2.0)})
    pmap = ParameterMap(s, {"k12": ("k01", 2.0)})
    assert "k01" not in pmap.gene_names and "k12" not in pmap.gene_names
    j = pmap.gene_names.index("k2o")
    assert (pmap.lower[j], pmap.upper[j]) == (1.0, 20.0)  # linear scale: no log
    genes = np.tile(pmap.start_genes(), (3, 1))
    genes[:, j] = [1.0, 7.5, 20.0]
    p = pmap.to_params(genes)
    names = s.param_names
    np.testing.assert_allclose(p[:, names.index("k01")], 5.0)
    np.testing.assert_allclose(p[:, names.index("k12")], 10.0)
    np.testing.assert_allclose(p[:, names.index("k2o")], [1.0, 7.5, 20.0])
    assert to_file_units(s, p[0])["k01"] == pytest.approx(5.0)


def test_file_units_are_reported_in_the_files_units():
    text = TRUTH_MODEL.read_text().replace('unit = "ms^-1",       bounds = [0.426, 42.6]',
                                           'unit = "s^-1", bounds = [426, 42600]')
    text = text.replace("k10 = { value = 4.26,", "k10 = { value = 4260,")
    s = Scheme.loads(text)
    assert s.values[s.param_names.index("k10")] == pytest.approx(4.26)
    assert to_file_units(s, s.values)["k10"] == pytest.approx(4260.0)


@pytest.mark.parametrize("override, message", [
    ({"kx": {"fixed": True}}, "unknown parameter"),
    ({"k01": {"bounds": [10.0, 1.0]}}, "lower bound must be below"),
    ({"k01": {"bounds": [-1.0, 1.0]}}, "bounds must be > 0"),
    ({"k01": {"value": 100.0}}, "outside its bounds"),
    ({"k42": {"fixed": True}}, "derived"),
])
def test_bad_overrides_are_one_line_errors(override, message):
    with pytest.raises(KingenError) as info:
        apply_overrides(SCHEME, override, file="fit.toml")
    text = str(info.value)
    assert message in text and "\n" not in text and text.startswith("fit.toml: parameters.")



# A module compiled with numba's cache, in fresh processes sharing one empty cache folder:
# the first compiles and caches the serial twin, the second loads the parallel one.
_TWINS = """
import numba
from kingen.fitting.params import serial_and_parallel

def double(x, out):
    for i in numba.prange(x.size):
        out[i] = 2.0 * x[i]

serial, parallel = serial_and_parallel(double, cache=True)
"""
_CALL = """
import sys
import numba
import numpy as np
import twins
x = np.arange(4096.0)
out = np.empty_like(x)
getattr(twins, sys.argv[1])(x, out)
assert (out == 2.0 * x).all()
try:
    print("threads", numba.threading_layer())
except ValueError:  # no parallel loop ran in this process
    print("calling thread alone")
"""


def test_the_parallel_twin_is_not_loaded_from_numbas_cache_as_the_serial_one(tmp_path):
    import os
    import subprocess
    import sys

    import kingen

    (tmp_path / "twins.py").write_text(_TWINS)
    path = [str(tmp_path), str(Path(kingen.__file__).parents[1])]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_NUM_THREADS": "2",
           "PYTHONPATH": os.pathsep.join(path)}
    said = [subprocess.run([sys.executable, "-c", _CALL, which], capture_output=True,
                           text=True, env=env, check=True, cwd=tmp_path).stdout.strip()
            for which in ("serial", "parallel")]
    assert said == ["calling thread alone", "threads " + said[1].split()[-1]]


def test_the_gas_parallel_kernels_are_cached_apart_from_their_serial_twins():
    from kingen.fitting import operators, selection

    for serial, parallel in ((params_module._fill_serial, params_module._fill_parallel),
                             (operators._var_or_serial, operators._var_or_parallel),
                             (selection._choose_serial, selection._choose_parallel),
                             (selection._gather_serial, selection._gather_parallel),
                             (params_module._void_serial, params_module._void_parallel)):
        assert parallel.targetoptions.get("parallel") and not serial.targetoptions.get(
            "parallel")
        assert parallel.py_func.__qualname__ != serial.py_func.__qualname__


@pytest.mark.parametrize("rows", [50, params_module.PARALLEL_FROM_ROWS])  # serial; threads
def test_void_outside_sets_the_rows_with_a_value_out_of_bounds_or_nan_to_nan(rows):
    rng = np.random.default_rng(3)
    p = rng.uniform(-1.0, 3.0, (rows, 5))
    p[rng.random((rows, 5)) < 0.02] = np.nan
    columns, low, high = np.array([1, 3]), np.array([-0.9, 0.0]), np.array([2.9, 3.0])
    outside = ~((p[:, columns] >= low) & (p[:, columns] <= high)).all(axis=1)
    assert outside.any() and not outside.all()
    want = p.copy()
    want[outside] = np.nan
    kept = p.copy()
    got = params_module.void_outside(p, columns, low, high)
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))  # NaN bits too
    np.testing.assert_array_equal(p, kept)
    inside = p[~np.isnan(want[:, 0])]
    assert params_module.void_outside(inside, columns, low, high) is inside
    assert params_module.void_outside(p, columns, low, high, copy=False) is p
    np.testing.assert_array_equal(p.view(np.int64), want.view(np.int64))
