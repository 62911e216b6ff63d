"""Gauss–Newton sums of groups of candidates, reduced where their traces are made.

A Levenberg–Marquardt step evaluates, per sub-problem, a *group*: a base candidate (row
``first``) and its m forward-difference perturbations (the m rows after it). What the step
needs of the group's traces is small: JᵀJ (m × m), Jᵀr (m) and the base's χ². This module
reduces a batch's traces to those numbers where the traces are: on the GPU, by kernels that
read the traces the solver left on the device (:meth:`kingen.solve.batch.Simulator.run`
with ``on_device``); on the CPU, by Numba loops parallel over groups. No trace leaves the
device, and no (candidates × samples) temporary is made.

Two passes, both over the compared samples only (``samples``, grouped by block: a block is a
sweep of a recorded protocol):

1. :func:`scale_sums` gives, per group and block, the sums the amplitudes and offsets are
   solved from: Σw·g₀², Σw·g₀·d, Σw·g₀ of the base, and for each perturbation k the same
   sums' *changes*, Σw·δ(2g₀ + δ), Σw·δ·d, Σw·δ with δ(t) = g_k(t) − g₀(t) formed sample
   by sample. The caller solves every candidate's scales from them (the fit's own closed
   form); a scale's change from the base's then carries no cancellation of large sums.
2. :func:`gn_sums` forms per sample r₀ = a₀g₀ + c₀ − d and e_k = a_k·δ_k + Δa_k·g₀ + Δc_k
   (the change of the residual, r_k − r₀, in the same per-sample differences), and
   accumulates, with the per-sample weight ``cw`` (the noise model's 1/(σ²τ) times the fit
   weight), Σ cw·r₀², Σ cw·e_k·r₀ and Σ cw·e_k·e_l. JᵀJ and Jᵀr are these over the steps:
   products of differences, never differences of accumulated sums.

Both return per group a packed triangle of the pairs of (r₀, e₁ … e_m): pair (i, j), j ≤ i,
at i(i + 1)/2 + j; (0, 0) is χ², (k, 0) is Σ cw·e_k·r₀, (k, l) Σ cw·e_k·e_l (see
:func:`unpack`). A column whose candidate failed (``use`` False) reads 0 there.

Examples
--------
One group of a base and one perturbation, one block, a = 1, no offset:

>>> import numpy as np
>>> tr = np.array([[1.0, 2.0], [1.5, 2.0]])
>>> one = np.ones(1, np.int64)
>>> pairs = gn_sums(tr, np.arange(2), np.zeros(2, np.int64), np.ones(2), np.zeros(2),
...                 np.zeros(1, np.int64), one, np.ones((1, 2), bool), np.ones((1, 1)),
...                 np.zeros((1, 1)), np.ones((1, 1, 1)), np.zeros((1, 1, 1)),
...                 np.zeros((1, 1, 1)))
>>> chi2, jtr, jtj = unpack(pairs, one)
>>> float(chi2[0]), jtr[0].tolist(), jtj[0].tolist()
(5.0, [0.5], [[0.25]])
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from kingen.codegen import N_WINDOWS

THREADS = 128  # GPU threads per group (pass 2) and per block of the other kernels
OP_NONE, OP_PEAK = -1, 0
cuda = None  # numba.cuda, imported with the first GPU kernel (a global: see _numba_cuda)


def _numba_cuda():
    """numba.cuda, as this module's global ``cuda`` that the kernels name (Numba's CUDA
    simulator swaps a kernel's globals, not its closure's)."""
    global cuda
    if cuda is None:
        from numba import cuda as module

        cuda = module
    return cuda


def n_pairs(m: int) -> int:
    """Packed pairs of (r₀, e₁ … e_m)."""
    return (m + 1) * (m + 2) // 2


def is_device_array(x) -> bool:
    """True for a CUDA device array (the traces :meth:`Simulator.run` left there)."""
    return hasattr(x, "copy_to_host")


# ---------------------------------------------------------------------- pass 1: scale sums
def scale_sums(traces, samples: np.ndarray, bstart: np.ndarray, weight: np.ndarray,
               data: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """(G, B, 3, M + 1) sums per group and block: column 0 the base's Σw·g₀², Σw·g₀·d,
    Σw·g₀, column k the changes Σw·δ_k(2g₀ + δ_k), Σw·δ_k·d, Σw·δ_k (0 beyond the group's
    m). ``samples`` are sample indices sorted by block, block b holding
    ``samples[bstart[b]:bstart[b + 1]]``; ``weight`` and ``data`` are per entry of
    ``samples``."""
    g, b, m = first.size, bstart.size - 1, int(count.max(initial=0))
    if is_device_array(traces):
        cuda = _numba_cuda()
        out = cuda.to_device(np.zeros((g, b, 3, m + 1)))
        total = g * b * (m + 1)
        if total:
            _cuda_kernels()[0][(total + THREADS - 1) // THREADS, THREADS](
                traces, *(cuda.to_device(np.ascontiguousarray(x)) for x in (
                    samples, bstart, weight, data, first, count)), out)
        return out.copy_to_host()
    out = np.zeros((g, b, 3, m + 1))
    _scale_sums_cpu(traces, samples, bstart, weight, data, first, count, out)
    return out


@numba.njit(parallel=True, cache=True)
def _scale_sums_cpu(tr, samples, bstart, weight, data, first, count, out):  # pragma: no cover
    for gi in numba.prange(first.size):
        for blk in range(bstart.size - 1):
            for k in range(count[gi] + 1):
                _block_scale_sums(tr, samples, bstart, weight, data, first[gi], blk, k, out[gi])


@numba.njit(cache=True)
def _block_scale_sums(tr, samples, bstart, weight, data, r0, blk, k, out):  # pragma: no cover
    """Pass 1's three sums of block ``blk`` for column ``k`` of the group at row ``r0``, into
    ``out[blk, :, k]``: the base's (k = 0), else their change by perturbation k. One source
    for both backends (the GPU kernel compiles its ``py_func`` as a device function)."""
    sgg = sgd = sg = 0.0
    for s in range(bstart[blk], bstart[blk + 1]):
        t = samples[s]
        w, g0 = weight[s], tr[r0, t]
        if k == 0:
            sgg += w * g0 * g0
            sgd += w * g0 * data[s]
            sg += w * g0
        else:
            dl = tr[r0 + k, t] - g0
            sgg += w * dl * (2.0 * g0 + dl)
            sgd += w * dl * data[s]
            sg += w * dl
    out[blk, 0, k] = sgg
    out[blk, 1, k] = sgd
    out[blk, 2, k] = sg


# ---------------------------------------------------------------------- pass 2: GN sums
def gn_sums(traces, samples: np.ndarray, sblock: np.ndarray, cw: np.ndarray,
            data: np.ndarray, first: np.ndarray, count: np.ndarray, use: np.ndarray,
            a0: np.ndarray, c0: np.ndarray, ak: np.ndarray, dak: np.ndarray,
            dck: np.ndarray) -> np.ndarray:
    """(G, P) packed pairs of (r₀, e₁ … e_M) per group (module docstring), P =
    :func:`n_pairs` (M), M the largest group's m.

    Parameters
    ----------
    traces
        (N, T) currents, host or device.
    samples, sblock, cw, data
        (S,) compared sample indices, their block, weight 1/(σ²τ)·w, and data.
    first, count
        (G,) each group's base row and its number of perturbations m.
    use
        (G, M + 1) bool: the base (column 0) and each perturbation simulated; a group whose
        base failed is left 0, a failed perturbation's column reads 0.
    a0, c0
        (G, B) the base's amplitude and offset per block.
    ak, dak, dck
        (G, B, M) each perturbation's amplitude, and its amplitude's and offset's change
        from the base's.
    """
    g, m = first.size, max(ak.shape[2], 0)
    p = n_pairs(m)
    if is_device_array(traces):
        cuda = _numba_cuda()
        mmax = max(4, -(-m // 4) * 4)  # one kernel per multiple of 4 columns
        out = cuda.to_device(np.zeros((g, n_pairs(mmax))))
        if g:
            args = [np.ascontiguousarray(x) for x in (samples, sblock, cw, data, first,
                                                       count, use.astype(np.uint8))]
            pad = [np.zeros(x.shape[:2] + (mmax,)) for x in (ak, dak, dck)]
            for full, x in zip(pad, (ak, dak, dck), strict=True):
                full[:, :, :m] = x
            _gn_kernel(mmax)[g, THREADS](traces, *(cuda.to_device(x) for x in (
                *args, np.ascontiguousarray(a0), np.ascontiguousarray(c0), *pad)), out)
        return out.copy_to_host()[:, :p]
    out = np.zeros((g, p))
    _gn_sums_cpu(traces, samples, sblock, cw, data, first, count, use, a0, c0, ak, dak, dck,
                 out)
    return out


@numba.njit(parallel=True, cache=True)
def _gn_sums_cpu(tr, samples, sblock, cw, data, first, count, use, a0, c0, ak, dak, dck,
                 out):  # pragma: no cover
    for gi in numba.prange(first.size):
        if not use[gi, 0]:
            continue
        r0, m = first[gi], count[gi]
        e = np.zeros(m + 1)
        acc = np.zeros(n_pairs_jit(m))
        for s in range(samples.size):
            t, b = samples[s], sblock[s]
            g0 = tr[r0, t]
            e[0] = a0[gi, b] * g0 + c0[gi, b] - data[s]
            for k in range(m):
                if use[gi, k + 1]:
                    e[k + 1] = (ak[gi, b, k] * (tr[r0 + 1 + k, t] - g0) + dak[gi, b, k] * g0
                                + dck[gi, b, k])
                else:
                    e[k + 1] = 0.0
            w = cw[s]
            p = 0
            for i in range(m + 1):
                wi = w * e[i]
                for j in range(i + 1):
                    acc[p] += wi * e[j]
                    p += 1
        for p in range(acc.size):
            out[gi, p] = acc[p]


@numba.njit(cache=True)
def n_pairs_jit(m):  # pragma: no cover
    return (m + 1) * (m + 2) // 2


def unpack(pairs: np.ndarray, count: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """χ² (G,), Σ cw·e_k·r₀ (G, M) and Σ cw·e_k·e_l (G, M, M) from packed pairs (zeros
    beyond each group's m)."""
    g = pairs.shape[0]
    m = int(count.max(initial=0))
    i, j = np.tril_indices(m + 1)
    full = np.zeros((g, m + 1, m + 1))
    full[:, i, j] = pairs[:, : i.size]
    full[:, j, i] = pairs[:, : i.size]
    return full[:, 0, 0].copy(), full[:, 1:, 0].copy(), full[:, 1:, 1:].copy()


# ---------------------------------------------------------------------- window values
def window_values(traces, sample_start: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """(N, n_sweeps, 4, 2) window values as :func:`kingen.fitting.targets.host_windows`
    computes them (non-finite currents read 0), on the traces where they are."""
    n, k = traces.shape[0], windows.shape[0]
    if is_device_array(traces):
        cuda = _numba_cuda()
        out = cuda.to_device(np.zeros((n, k, N_WINDOWS, 2)))
        if n * k:
            _cuda_kernels()[1][(n * k + THREADS - 1) // THREADS, THREADS](
                traces, cuda.to_device(np.ascontiguousarray(sample_start)),
                cuda.to_device(np.ascontiguousarray(windows)), out)
        return out.copy_to_host()
    out = np.zeros((n, k, N_WINDOWS, 2))
    _windows_cpu(traces, sample_start, windows, out)
    return out


@numba.njit(parallel=True, cache=True)
def _windows_cpu(tr, sample_start, windows, out):  # pragma: no cover
    for i in numba.prange(tr.shape[0]):
        for k in range(windows.shape[0]):
            _windows_row(tr, i, k, sample_start, windows, out)


@numba.njit(cache=True)
def _windows_row(tr, i, k, sample_start, windows, out):  # pragma: no cover
    base = sample_start[k]
    for q in range(windows.shape[1]):
        a, b, op = windows[k, q, 0], windows[k, q, 1], windows[k, q, 2]
        out[i, k, q, 1] = -1.0
        if op == OP_NONE:
            continue
        best, at, total = -1.0, 0, 0.0
        for t in range(a, b + 1):
            v = tr[i, base + t]
            if not math.isfinite(v):
                v = 0.0
            total += v
            if abs(v) > best:
                best, at = abs(v), t
        if op == OP_PEAK:
            v = tr[i, base + at]
            out[i, k, q, 0] = v if math.isfinite(v) else 0.0
            out[i, k, q, 1] = at
        else:
            out[i, k, q, 0] = total


# ---------------------------------------------------------------------- GPU kernels
@functools.cache
def _cuda_kernels():
    """The GPU's pass 1 (one thread per group, block and column) and window kernels (one
    thread per candidate and sweep)."""
    _numba_cuda()
    scale_row = cuda.jit(device=True)(_windows_row.py_func)
    block_sums = cuda.jit(device=True)(_block_scale_sums.py_func)

    @cuda.jit
    def scale_kernel(tr, samples, bstart, weight, data, first, count, out):
        nb, mc = out.shape[1], out.shape[3]
        idx = cuda.grid(1)
        if idx >= first.size * nb * mc:
            return
        gi = idx // (nb * mc)
        blk = (idx // mc) % nb
        k = idx % mc
        if k > count[gi]:
            return
        block_sums(tr, samples, bstart, weight, data, first[gi], blk, k, out[gi])

    @cuda.jit
    def window_kernel(tr, sample_start, windows, out):
        idx = cuda.grid(1)
        k_all = windows.shape[0]
        if idx >= tr.shape[0] * k_all:
            return
        scale_row(tr, idx // k_all, idx % k_all, sample_start, windows, out)

    return scale_kernel, window_kernel


@functools.cache
def _gn_kernel(mmax: int):
    """Pass 2 on the GPU for groups of at most ``mmax`` perturbations: one block of
    :data:`THREADS` threads per group. The threads form (r₀, e₁ … e_m) of a tile of
    consecutive samples in shared memory (coalesced reads of the traces), then each
    accumulates its own pairs over the tile in registers."""
    _numba_cuda()
    float64 = numba.float64
    rows = mmax + 1
    pairs = n_pairs(mmax)
    per_thread = -(-pairs // THREADS)

    @cuda.jit
    def kernel(tr, samples, sblock, cw, data, first, count, use, a0, c0, ak, dak, dck, out):
        gi = cuda.blockIdx.x
        th = cuda.threadIdx.x
        ev = cuda.shared.array((rows, THREADS), float64)
        wv = cuda.shared.array(THREADS, float64)
        acc = cuda.local.array(per_thread, float64)
        for q in range(per_thread):
            acc[q] = 0.0
        if use[gi, 0] == 0:
            return  # the whole block leaves together: no barrier is left waiting
        r0, m = first[gi], count[gi]
        n_s = samples.size
        for tile in range(0, n_s, THREADS):
            s = tile + th
            if s < n_s:
                t, b = samples[s], sblock[s]
                g0 = tr[r0, t]
                ev[0, th] = a0[gi, b] * g0 + c0[gi, b] - data[s]
                for k in range(mmax):
                    v = 0.0
                    if k < m and use[gi, k + 1] != 0:
                        v = (ak[gi, b, k] * (tr[r0 + 1 + k, t] - g0) + dak[gi, b, k] * g0
                             + dck[gi, b, k])
                    ev[k + 1, th] = v
                wv[th] = cw[s]
            else:
                for k in range(rows):
                    ev[k, th] = 0.0
                wv[th] = 0.0
            cuda.syncthreads()
            for q in range(per_thread):
                p = th + q * THREADS
                if p < pairs:
                    i = int((math.sqrt(8.0 * p + 1.0) - 1.0) / 2.0)
                    while i * (i + 1) // 2 > p:
                        i -= 1
                    while (i + 1) * (i + 2) // 2 <= p:
                        i += 1
                    j = p - i * (i + 1) // 2
                    a = 0.0
                    for u in range(THREADS):
                        a += wv[u] * ev[i, u] * ev[j, u]
                    acc[q] += a
            cuda.syncthreads()
        for q in range(per_thread):
            p = th + q * THREADS
            if p < pairs:
                out[gi, p] = acc[q]

    return kernel
