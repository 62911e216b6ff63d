"""Reference kernels under the CUDA simulator (tiny grids), checked against numpy."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kingen.analysis.kernels import cases_for
from kingen.analysis.kernels.base import rel_error
from kingen.analysis.kernels.stencil import StencilProblem, reference

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                                reason="runs under the CUDA simulator")


@pytest.mark.parametrize("target,names", [
    ("stencil", {"stencil_naive", "stencil_zreg", "stencil_tiled"}),
    ("sgemm", {"sgemm_naive", "sgemm_tiled", "sgemm_reg4x4", "sgemm_reg8x8"}),
])
def test_variants_match_numpy(target, names):
    cases = cases_for(target, "tiny")
    assert {c.name for c in cases} == names
    for c in cases:
        ok, err = c.verify()
        assert ok, (c.name, err)
        assert err < 1e-6


def test_declared_counts():
    st = {c.name: c for c in cases_for("stencil", "tiny")}["stencil_naive"]
    assert st.flops == 8 * 6 * 7 * 9 and st.bytes == 8 * 8 * 9 * 11
    sg = cases_for("sgemm", "tiny")[0]
    assert sg.flops == 2 * 20 * 24 * 18 and sg.bytes == 4 * (20 * 18 + 18 * 24 + 20 * 24)


def test_stencil_regex_names_the_kernel_function():
    # ncu -k matches the kernel's function name ("stencil_zreg[abi:...]"), not the case name:
    # each case's regex must match its own function and no other.
    import re

    from kingen.analysis.kernels import stencil

    cases = cases_for("stencil", "tiny")
    for c in cases:
        c.launch()
    fnames = {getattr(k, "py_func", getattr(k, "fn", None)).__name__
              for k in stencil._cache.values()}
    assert len(fnames) == len(cases)
    for c in cases:
        hits = [f for f in fnames if re.search(c.kernel_regex, f + "[abi:v1,cw51cXTLSUwv1]")]
        assert hits == [c.name], (c.name, c.kernel_regex, sorted(fnames))


def test_poisoned_output_fails_the_check():
    prob = StencilProblem((5, 6, 7))
    u = prob.fresh_input()  # nothing launched: the output is still the NaN poison
    out = prob.buffers()[1].copy_to_host()
    assert rel_error(out, reference(u, 0.4, 0.1)) == float("inf")
    assert rel_error(np.ones(3), np.ones(3)) == 0.0


def test_reference_stencil():
    u = np.random.default_rng(0).random((5, 5, 5)).astype(np.float32)
    r = reference(u, 0.4, 0.1)
    assert r[2, 2, 2] == pytest.approx(0.4 * u[2, 2, 2] + 0.1 * (
        u[2, 2, 1] + u[2, 2, 3] + u[2, 1, 2] + u[2, 3, 2] + u[1, 2, 2] + u[3, 2, 2]), rel=1e-6)
    assert r[0, 1, 1] == pytest.approx(u[0, 1, 1])


def test_rk4_without_solver_is_one_line(monkeypatch):
    from kingen.errors import KingenError
    from kingen.solve.batch import Simulator

    # An install whose solver cannot launch its kernel on its own (a partial or older
    # build) must get one line, not an AttributeError.
    monkeypatch.delattr(Simulator, "prepare_launch")
    with pytest.raises(KingenError, match="solver kernel is not available"):
        cases_for("rk4", "tiny")
