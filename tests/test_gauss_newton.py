"""JᵀJ, Jᵀr and χ² of Levenberg–Marquardt groups summed where the traces are made equal
those of the full residual vectors (the reference), on the CPU and, under Numba's CUDA
simulator, with the GPU kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import kingen
from kingen.experiment.chain import Chain
from kingen.identify.fisher import normal_equations
from kingen.identify.gauss_newton import Groups
from kingen.identify.likelihood import Likelihood
from kingen.identify.noise import estimate_noise

ROOT = Path(__file__).resolve().parents[1]
RTOL = 1e-9


def _likelihood(chains=None, tau=None):
    cfg = kingen.load_config(kingen.demo_config())
    items = cfg.protocols
    if chains:
        items = [replace(it, chain=chains[i]) if i in chains else it
                 for i, it in enumerate(items)]
    obj = kingen.Objective(cfg.scheme, items, cfg.solver.replace(backend="cpu"))
    x = cfg.pmap.to_genes(cfg.scheme.values[None, :])[0]
    noise = estimate_noise(obj, cfg.pmap.to_params(x[None, :]))
    if tau is not None:
        noise.tau[:] = tau
    return Likelihood(obj, cfg.pmap, noise, x), cfg.pmap, x


def _compare(lik, pmap, x, fail_row: int | None = None):
    """Three groups (all genes free; one held; a candidate alone) against the reference."""
    rng = np.random.default_rng(1)
    frees = [np.ones(pmap.n_genes, bool), np.ones(pmap.n_genes, bool)]
    frees[1][2] = False
    batch = Groups()
    ys = [np.clip(x + 0.05 * rng.normal(size=x.size), pmap.lower, pmap.upper)
          for _ in frees]
    for y, free in zip(ys, frees, strict=True):
        batch.add_lm(y, np.asarray(pmap.upper), 1e-5, free)
    batch.add_points([x.copy()])
    if fail_row is not None:
        batch.rows[fail_row] = np.full(x.size, np.nan)  # a candidate the solver fails
    chi2, jtj, jtr = batch.evaluate(lik)
    r, c = lik.residuals(np.array(batch.rows))
    for i, free in enumerate(frees + [None]):
        lo = batch.first[i]
        np.testing.assert_allclose(chi2[i], c[lo], rtol=RTOL)
        if free is None:
            continue
        m = int(free.sum())
        a, g = normal_equations(r[lo], r[lo + 1: lo + 1 + m], batch.steps[i], free)
        cols = np.flatnonzero(free)
        a, g = a[np.ix_(cols, cols)], g[cols]
        assert np.abs(jtj[i, :m, :m] - a).max() <= RTOL * np.abs(a).max()
        assert np.abs(jtr[i, :m] - g).max() <= RTOL * np.abs(g).max()
        assert not jtj[i, m:].any() and not jtr[i, m:].any()


def test_demo_sums_equal_the_residual_vectors():
    lik, pmap, x = _likelihood()
    _compare(lik, pmap, x)


def test_offsets_amplitudes_per_sweep_and_correlated_noise():
    lik, pmap, x = _likelihood(
        {0: Chain(offset="per-sweep", amplitude="per-sweep"),
         1: Chain(offset="per-protocol", amplitude="rundown"),
         2: Chain(offset="per-protocol")}, tau=3.5)
    assert not any(lik.objective._plain(q) for q in range(3))
    _compare(lik, pmap, x)


def test_a_failed_perturbation_counts_as_residuals_of_zero():
    lik, pmap, x = _likelihood()
    _compare(lik, pmap, x, fail_row=3)


def _tiny_inputs():
    rng = np.random.default_rng(3)
    n, t = 8, 50  # groups of 3, 0 and 2 perturbations
    traces = rng.normal(size=(n, t))
    traces[1:4] = traces[0] + 1e-3 * rng.normal(size=(3, t))
    traces[6:8] = traces[5] + 1e-3 * rng.normal(size=(2, t))
    samples = np.concatenate([np.arange(2, 20), np.arange(25, 48)]).astype(np.int64)
    sblock = (samples >= 25).astype(np.int64)
    bstart = np.array([0, 18, samples.size], dtype=np.int64)
    w, d = rng.uniform(0.5, 1, samples.size), rng.normal(size=samples.size)
    first, count = np.array([0, 4, 5], np.int64), np.array([3, 0, 2], np.int64)
    use = np.ones((3, 4), bool)
    use[2, 1] = False
    coef = [rng.normal(size=(3, 2)) for _ in range(2)] + [
        rng.normal(size=(3, 2, 3)) for _ in range(3)]
    return traces, samples, sblock, bstart, w, d, first, count, use, coef


def _chunk_inputs():
    """Blocks of 30, 3, 0 and 28 compared samples; groups of 3, 0, 2 and 1 perturbations,
    the third's first perturbation failed and the fourth's base."""
    rng = np.random.default_rng(5)
    count = np.array([3, 0, 2, 1], np.int64)
    first = np.concatenate([[0], np.cumsum(count + 1)[:-1]]).astype(np.int64)
    traces = rng.normal(size=(int((count + 1).sum()), 100))
    for f, m in zip(first, count, strict=True):
        traces[f + 1:f + 1 + m] = traces[f] + 1e-3 * rng.normal(size=(m, 100))
    sizes = np.array([30, 3, 0, 28])
    bstart = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    samples = np.sort(rng.choice(np.arange(2, 98), bstart[-1], replace=False)).astype(np.int64)
    sblock = np.repeat(np.arange(sizes.size), sizes).astype(np.int64)
    w, d = rng.uniform(0.5, 1, samples.size), rng.normal(size=samples.size)
    use = np.ones((count.size, 4), bool)
    use[2, 1] = use[3, 0] = False
    coef = [rng.normal(size=(count.size, sizes.size)) for _ in range(2)] + [
        rng.normal(size=(count.size, sizes.size, 3)) for _ in range(3)]
    return traces, samples, sblock, bstart, w, d, first, count, use, coef


def test_the_chunks_cover_each_block_once_and_fill_the_gpu():
    from kingen.solve.gnsums import GN_BLOCKS, GN_MIN_CHUNK, block_chunks, gn_chunk

    rng = np.random.default_rng(6)
    for chunk in (1, 3, 7, 4096):
        sizes = rng.integers(0, 30, size=12)
        sizes[3] = 0
        bstart = np.concatenate([[0], np.cumsum(sizes)])
        table, cstart = block_chunks(bstart, chunk)
        assert cstart[0] == 0 and cstart[-1] == table.shape[0]
        for b in range(sizes.size):
            rows = table[cstart[b]:cstart[b + 1]]
            assert (rows[:, 0] == b).all()
            lengths = rows[:, 2] - rows[:, 1]
            assert (lengths > 0).all() and (lengths <= chunk).all()
            assert (lengths[:-1] == chunk).all()  # only the last is short
            covered = np.concatenate([np.arange(lo, hi) for _, lo, hi in rows] + [[]])
            np.testing.assert_array_equal(covered, np.arange(bstart[b], bstart[b + 1]))
    for g in (1, 2, 35, 400, 10_000):
        for n in (0, 100, 5_000, 357_170, 10**8):
            size = gn_chunk(g, n)
            chunks = -(-n // size)
            assert size >= GN_MIN_CHUNK and chunks <= 65535
            assert g * chunks >= GN_BLOCKS or size == GN_MIN_CHUNK


def test_the_cpu_reduction_equals_numpy():
    from kingen.solve.gnsums import gn_sums, scale_sums, unpack

    traces, samples, sblock, bstart, w, d, first, count, use, coef = _tiny_inputs()
    s1 = scale_sums(traces, samples, bstart, w, d, first, count)
    for gi, (f, m) in enumerate(zip(first, count, strict=True)):
        for blk in range(2):
            s = samples[bstart[blk]:bstart[blk + 1]]
            g0 = traces[f, s]
            ws, ds = w[bstart[blk]:bstart[blk + 1]], d[bstart[blk]:bstart[blk + 1]]
            for k in range(m + 1):
                g = traces[f + k, s]
                want = [ws @ (g * g), ws @ (g * ds), ws @ g]
                if k:
                    want = [a - b for a, b in zip(want, [ws @ (g0 * g0), ws @ (g0 * ds),
                                                         ws @ g0], strict=True)]
                np.testing.assert_allclose(s1[gi, blk, :, k], want, rtol=1e-9, atol=1e-12)
    a0, c0, ak, dak, dck = coef
    chi2, jtr, jtj = unpack(gn_sums(traces, samples, sblock, w, d, first, count, use, a0, c0,
                                    ak, dak, dck), count)
    for gi, (f, m) in enumerate(zip(first, count, strict=True)):
        b = sblock
        r0 = a0[gi, b] * traces[f, samples] + c0[gi, b] - d
        e = np.array([(ak[gi, b, k] * (traces[f + 1 + k, samples] - traces[f, samples])
                       + dak[gi, b, k] * traces[f, samples] + dck[gi, b, k]) * use[gi, k + 1]
                      for k in range(m)]).reshape(m, samples.size)
        np.testing.assert_allclose(chi2[gi], (w * r0) @ r0, rtol=1e-12)
        np.testing.assert_allclose(jtr[gi, :m], e @ (w * r0), rtol=1e-12)
        np.testing.assert_allclose(jtj[gi, :m, :m], (e * w) @ e.T, rtol=1e-12, atol=1e-15)


def test_window_values_equal_the_host_windows():
    from kingen.fitting.targets import host_windows
    from kingen.solve.gnsums import window_values

    rng = np.random.default_rng(4)
    traces = rng.normal(size=(3, 40))
    traces[1, 5] = np.nan
    start = np.array([0, 20, 40], dtype=np.int64)
    windows = np.array([[[0, 9, 0], [3, 15, 1], [0, 0, -1], [0, 0, -1]],
                        [[2, 19, 1], [0, 19, 0], [0, 0, -1], [4, 6, 0]]], dtype=np.int64)
    want = host_windows(np.where(np.isfinite(traces), traces, 0.0), start, windows)
    np.testing.assert_allclose(window_values(traces, start, windows), want, rtol=1e-12)


CUDASIM = """
import sys
import numpy as np
from numba import cuda
import test_gauss_newton as t
from kingen.solve import gnsums
from kingen.solve.gnsums import gn_sums, scale_sums, window_values
gnsums.THREADS = int(sys.argv[1])  # before the first kernel is built
if gnsums.THREADS == 128:  # the module's own: one chunk per block and group, then pass 2 in 6
    traces, samples, sblock, bstart, w, d, first, count, use, coef = t._tiny_inputs()
    dev = cuda.to_device(traces)
    np.testing.assert_allclose(scale_sums(dev, samples, bstart, w, d, first, count),
                               scale_sums(traces, samples, bstart, w, d, first, count),
                               rtol=1e-12)
    args = (samples, sblock, w, d, first, count, use, *coef)
    for chunk in (None, 7):
        np.testing.assert_allclose(gn_sums(dev, *args, chunk=chunk), gn_sums(traces, *args),
                                   rtol=1e-12, atol=1e-15)
    start = np.array([0, 25, 50], dtype=np.int64)
    windows = np.array([[[0, 9, 0], [3, 15, 1], [0, 0, -1], [0, 0, -1]]] * 2, dtype=np.int64)
    np.testing.assert_allclose(window_values(dev, start, windows),
                               window_values(traces, start, windows), rtol=1e-12)
else:  # a few threads (the simulator runs each as a Python thread), so many chunks are cheap
    traces, samples, sblock, bstart, w, d, first, count, use, coef = t._chunk_inputs()
    dev = cuda.to_device(traces)
    want = scale_sums(traces, samples, bstart, w, d, first, count)
    for chunk in (7, 16):  # 30 = 4 x 7 + 2, 3 < 7, 28 = 4 x 7; 30 = 16 + 14, 28 = 16 + 12
        np.testing.assert_allclose(scale_sums(dev, samples, bstart, w, d, first, count,
                                              chunk=chunk), want, rtol=1e-12)
    args = (samples, sblock, w, d, first, count, use, *coef)
    want = gn_sums(traces, *args)
    assert want[2].any() and not want[3].any()
    for chunk in (7, 20):  # 61 = 8 x 7 + 5 (under a tile); 3 x 20 + 1 (tiles 8, 8, 4)
        np.testing.assert_allclose(gn_sums(dev, *args, chunk=chunk), want, rtol=1e-12)
print("same")
"""


def _simulate(threads: int) -> None:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    out = subprocess.run([sys.executable, "-c", CUDASIM, str(threads)], env=env,
                         capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "same" in out.stdout


def test_the_gpu_kernels_equal_the_cpu_under_the_simulator():
    _simulate(128)


def test_the_gpu_chunks_add_up_to_the_cpu_sums_under_the_simulator():
    """Pass 1 in several chunks per block, the last short, a block shorter than a chunk and an
    empty one; pass 2 in several chunks per group, under and over a tile; groups of different
    m, a failed perturbation and a failed base. Eight threads per CUDA block: pass 2's
    threads then hold two pairs each (15 pairs of 4 columns)."""
    _simulate(8)


CACHED = """
from kingen.solve import gnsums
for kernel in (*gnsums._kernels(), gnsums._gn_kernel(4), gnsums._gn_kernel(12)):
    assert kernel.stats.cache_path, kernel  # Numba's disk cache, not a NullCache
    cells = kernel.py_func.__closure__ or ()
    assert all(type(c.cell_contents) is int for c in cells), kernel  # hashable as the key
print("cached")
"""


def test_the_gpu_kernels_compile_into_numbas_disk_cache():
    """Built (not compiled: that needs a GPU) outside the simulator, each kernel has Numba's
    disk cache, and pass 2's closure holds ints only, which numba-cuda hashes into a cached
    closure's key."""
    pytest.importorskip("numba_cuda")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = subprocess.run([sys.executable, "-c", CACHED], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "cached" in out.stdout


def test_the_layout_goes_to_the_gpu_once_and_a_new_array_gets_its_own_copy():
    # the layout's arrays are megabytes that every LM step read; a copy is kept per array
    # while it lives, and an array made later (perhaps at a freed one's address) is sent anew
    from kingen.solve import staging

    a = np.arange(5.0)
    first = staging.resident(a)
    assert staging.resident(a) is first
    b = a.copy()
    assert staging.resident(b) is not first
    np.testing.assert_array_equal(staging.resident(b).copy_to_host(), a)
    key = id(a)
    del a  # its device copy goes with it
    assert key not in staging._copies
    c = np.zeros(5)
    np.testing.assert_array_equal(staging.resident(c).copy_to_host(), np.zeros(5))
