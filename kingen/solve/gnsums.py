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

On the GPU both passes are parallel over the samples as well as the groups, each in two
kernels. Pass 1 cuts every block's samples into chunks of at most :data:`SCALE_CHUNK`
(:func:`block_chunks`: a chunk never crosses a block's end); one CUDA block of
:data:`THREADS` threads per chunk, group and column sums its chunk, consecutive threads on
consecutive samples (the reads of a trace's row coalesce), and adds its threads' sums as a
tree in shared memory. Pass 2 cuts the compared samples into chunks of :func:`gn_chunk`
samples, enough that groups × chunks fill the GPU; one CUDA block per group and chunk. Then
a small kernel adds the chunks' partial sums, of each block (pass 1) or group (pass 2), in
chunk order: no atomics, so a result is the same bits from run to run. The chunk sizes are
constants of this module, not read from the device, so they do not change with the GPU.

The kernels compile at first use into Numba's disk cache (``cache=True``), and later
processes load them from there. They are module-level functions, bar pass 2's: a closure
per multiple of 4 columns that captures integer sizes only (numba-cuda keys a cached
closure by a hash of its cells' values).

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
from kingen.solve import staging

THREADS = 128  # GPU threads per CUDA block of every kernel (a power of 2: pass 1's tree)
SCALE_CHUNK = 4096  # pass 1: samples per chunk (32 per thread: the tree's cost is amortised)
# pass 2: CUDA blocks to reach at least, 16 per SM of an H100/H200 (a wave at ~15 KB of
# shared memory each): 4 per SM left a profile step's 32 groups 6.0 ms of chains of tiles
GN_BLOCKS = 16 * 132
GN_MIN_CHUNK = 1024  # pass 2: fewest samples per chunk (8 tiles: the partials stay few)
MAX_GRID_Y = 65535  # CUDA's limit on a grid's y extent, where the chunks go
OP_NONE, OP_PEAK = -1, 0
cuda = None  # numba.cuda, imported with the first GPU kernel (a global: see _numba_cuda)
_windows_row_gpu = None  # _windows_row as a CUDA device function (set by _kernels)
_scale_terms_gpu = None  # _scale_terms as a CUDA device function (set by _kernels)


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
               data: np.ndarray, first: np.ndarray, count: np.ndarray, *,
               chunk: int = SCALE_CHUNK) -> np.ndarray:
    """(G, B, 3, M + 1) sums per group and block: column 0 the base's Σw·g₀², Σw·g₀·d,
    Σw·g₀, column k the changes Σw·δ_k(2g₀ + δ_k), Σw·δ_k·d, Σw·δ_k (0 beyond the group's
    m). ``samples`` are sample indices sorted by block, block b holding
    ``samples[bstart[b]:bstart[b + 1]]``; ``weight`` and ``data`` are per entry of
    ``samples``. ``chunk`` is the GPU's samples per chunk (:func:`block_chunks`; ignored
    on the CPU)."""
    g, b, m = first.size, bstart.size - 1, int(count.max(initial=0))
    if is_device_array(traces):
        return _scale_sums_gpu(traces, samples, bstart, weight, data, first, count, chunk)
    out = np.zeros((g, b, 3, m + 1))
    _scale_sums_cpu(traces, samples, bstart, weight, data, first, count, out)
    return out


def block_chunks(bstart: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Pass 1's chunks: a (C, 3) table of block, first and past-the-end entry of
    ``samples``, at most ``chunk`` entries each, in sample order, none across a block's end
    (only a block's last chunk is shorter); and the (B + 1,) offsets of each block's chunks
    in it (an empty block has none). ``chunk`` grows if C would pass :data:`MAX_GRID_Y`.

    >>> table, cstart = block_chunks(np.array([0, 5, 7, 7]), 3)
    >>> table.tolist(), cstart.tolist()
    ([[0, 0, 3], [0, 3, 5], [1, 5, 7]], [0, 2, 3, 3])
    """
    bstart = np.asarray(bstart, dtype=np.int64)
    size = np.diff(bstart)
    room = max(MAX_GRID_Y - size.size, 1)  # each block adds at most one short chunk
    chunk = max(int(chunk), 1, -(-int(size.sum()) // room))
    per = -(-size // chunk)
    cstart = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
    blk = np.repeat(np.arange(size.size, dtype=np.int64), per)
    lo = bstart[blk] + (np.arange(blk.size, dtype=np.int64) - cstart[blk]) * chunk
    hi = np.minimum(lo + chunk, bstart[blk + 1])
    return np.stack([blk, lo, hi], axis=1), cstart


def _scale_sums_gpu(traces, samples, bstart, weight, data, first, count, chunk):
    """:func:`scale_sums` on the device's traces: per chunk, group and column its three
    sums (:func:`_scale_chunk_kernel`), then each block's chunks added in order."""
    g, b, mc = first.size, bstart.size - 1, int(count.max(initial=0)) + 1
    table, cstart = block_chunks(bstart, chunk)
    width = g * 3 * mc
    if not (table.shape[0] and width):
        return np.zeros((g, b, 3, mc))
    scale_kernel, sum_kernel, _ = _kernels()
    with staging.LOCK:  # the call's small inputs in one upload, its scratch kept
        d_first, d_count, d_table, d_cstart = staging.upload(
            "scale_sums", *(np.asarray(x, np.int64) for x in (first, count, table, cstart)))
        part = staging.scratch("scale_sums.part", (table.shape[0], width))
        scale_kernel[(g * mc, table.shape[0]), THREADS](
            traces, *map(staging.resident, (samples, weight, data)), d_first, d_count,
            d_table, part)
        out = staging.scratch("scale_sums.out", (b, width))
        sum_kernel[-(-b * width // THREADS), THREADS](part, d_cstart, out)
        host = out.copy_to_host()
    return np.ascontiguousarray(host.reshape(b, g, 3, mc).transpose(1, 0, 2, 3))


@numba.njit(parallel=True, cache=True)
def _scale_sums_cpu(tr, samples, bstart, weight, data, first, count, out):  # pragma: no cover
    for gi in numba.prange(first.size):
        for blk in range(bstart.size - 1):
            for k in range(count[gi] + 1):
                _block_scale_sums(tr, samples, bstart, weight, data, first[gi], blk, k, out[gi])


@numba.njit(cache=True)
def _scale_terms(tr, samples, weight, data, r0, k, s):  # pragma: no cover
    """Entry ``s``'s three terms of pass 1 for column ``k`` of the group at row ``r0``: the
    base's w·g₀², w·g₀·d, w·g₀ (k = 0), else their changes w·δ(2g₀ + δ), w·δ·d, w·δ. One
    source for both backends (the GPU compiles its ``py_func`` as a device function)."""
    t = samples[s]
    w, g0 = weight[s], tr[r0, t]
    if k == 0:
        return w * g0 * g0, w * g0 * data[s], w * g0
    dl = tr[r0 + k, t] - g0
    return w * dl * (2.0 * g0 + dl), w * dl * data[s], w * dl


@numba.njit(cache=True)
def _block_scale_sums(tr, samples, bstart, weight, data, r0, blk, k, out):  # pragma: no cover
    """Pass 1's three sums of block ``blk`` for column ``k`` of the group at row ``r0``, into
    ``out[blk, :, k]``: the base's (k = 0), else their change by perturbation k
    (:func:`_scale_terms`, which :func:`_scale_chunk_kernel` sums a chunk at a time)."""
    sgg = sgd = sg = 0.0
    for s in range(bstart[blk], bstart[blk + 1]):
        a, b, c = _scale_terms(tr, samples, weight, data, r0, k, s)
        sgg += a
        sgd += b
        sg += c
    out[blk, 0, k] = sgg
    out[blk, 1, k] = sgd
    out[blk, 2, k] = sg


# ---------------------------------------------------------------------- pass 2: GN sums
def gn_sums(traces, samples: np.ndarray, sblock: np.ndarray, cw: np.ndarray,
            data: np.ndarray, first: np.ndarray, count: np.ndarray, use: np.ndarray,
            a0: np.ndarray, c0: np.ndarray, ak: np.ndarray, dak: np.ndarray,
            dck: np.ndarray, *, chunk: int | None = None) -> np.ndarray:
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
    chunk
        The GPU's samples per chunk; None: :func:`gn_chunk`'s. Ignored on the CPU.
    """
    g, m = first.size, max(ak.shape[2], 0)
    p = n_pairs(m)
    if is_device_array(traces):
        return _gn_sums_gpu(traces, samples, sblock, cw, data, first, count, use, a0, c0,
                            ak, dak, dck, chunk)[:, :p]
    out = np.zeros((g, p))
    _gn_sums_cpu(traces, samples, sblock, cw, data, first, count, use, a0, c0, ak, dak, dck,
                 out)
    return out


def gn_chunk(n_groups: int, n_samples: int) -> int:
    """Pass 2's samples per chunk on the GPU: enough chunks that groups × chunks reach
    :data:`GN_BLOCKS` CUDA blocks, none under :data:`GN_MIN_CHUNK` samples, at most
    :data:`MAX_GRID_Y` chunks. (A chunk needs no whole tiles: its last is masked.)

    >>> gn_chunk(35, 357_170), gn_chunk(1, 5_000), gn_chunk(600, 357_170)
    (5856, 1024, 89293)
    """
    want = -(-GN_BLOCKS // max(n_groups, 1))
    return max(GN_MIN_CHUNK, -(-n_samples // want), -(-n_samples // MAX_GRID_Y))


def _gn_sums_gpu(traces, samples, sblock, cw, data, first, count, use, a0, c0, ak, dak, dck,
                 chunk):
    """:func:`gn_sums` on the device's traces, (G, P') for P' ≥ P: per group and chunk the
    packed pairs (:func:`_gn_kernel`), then each group's chunks added in order."""
    g, m, n_s = first.size, max(ak.shape[2], 0), samples.size
    mmax = max(4, -(-m // 4) * 4)  # one kernel per multiple of 4 columns
    pp = n_pairs(mmax)
    size = max(int(chunk or gn_chunk(g, n_s)), 1, -(-n_s // MAX_GRID_Y))
    nc = -(-n_s // size)
    if not (g and nc):
        return np.zeros((g, pp))
    ints = [np.asarray(x, np.int64) for x in (first, count, use, [0, nc])]
    pad = [np.zeros(x.shape[:2] + (mmax,)) for x in (ak, dak, dck)]
    for full, x in zip(pad, (ak, dak, dck), strict=True):
        full[:, :, :m] = x
    with staging.LOCK:  # the call's small inputs in one upload per dtype, its scratch kept
        *args, d_cstart, d_a0, d_c0, d_ak, d_dak, d_dck = staging.upload(
            "gn_sums", *ints, *(np.asarray(x, np.float64) for x in (a0, c0, *pad)))
        part = staging.scratch("gn_sums.part", (nc, g * pp))
        _gn_kernel(mmax)[(g, nc), THREADS](
            traces, *map(staging.resident, (samples, sblock, cw, data)), *args, d_a0, d_c0, d_ak,
            d_dak, d_dck, size, part)
        out = staging.scratch("gn_sums.out", (1, g * pp))
        _kernels()[1][-(-g * pp // THREADS), THREADS](part, d_cstart, out)
        return out.copy_to_host().reshape(g, pp)


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
            _kernels()[2][-(-n * k // THREADS), THREADS](
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
# Plain module-level functions, compiled by _kernels and _gn_kernel with cache=True: Numba
# then keys each by its source file's stamp, its bytecode and (a closure) its cells' values.
# They name ``cuda`` and the device function as module globals, which the simulator swaps.
@functools.cache
def _kernels():
    """The kernels without compile-time sizes: pass 1's per chunk (:func:`_scale_chunk_kernel`),
    the chunks' sum (:func:`_chunk_sum_kernel`) and the window values'."""
    global _windows_row_gpu, _scale_terms_gpu
    cuda = _numba_cuda()
    _windows_row_gpu = cuda.jit(device=True)(_windows_row.py_func)
    _scale_terms_gpu = cuda.jit(device=True)(_scale_terms.py_func)
    jit = cuda.jit(cache=True)
    return jit(_scale_chunk_kernel), jit(_chunk_sum_kernel), jit(_window_kernel)


def _scale_chunk_kernel(tr, samples, weight, data, first, count, table, part):  # pragma: no cover
    """Pass 1 on the GPU: CUDA block (x, y) sums column k = x mod (M + 1) of group x // (M + 1)
    over chunk y of ``table`` (:func:`block_chunks`), the terms of :func:`_scale_terms`,
    into ``part[y, (group · 3 + sum) · (M + 1) + k]`` (0 where k > the group's m)."""
    th, mc = cuda.threadIdx.x, part.shape[1] // (3 * first.size)  # mc = M + 1
    gi, k, c = cuda.blockIdx.x // mc, cuda.blockIdx.x % mc, cuda.blockIdx.y
    red = cuda.shared.array((3, THREADS), numba.float64)
    sgg = sgd = sg = 0.0
    if k <= count[gi]:
        r0 = first[gi]
        for s in range(table[c, 1] + th, table[c, 2], THREADS):  # coalesced: th → s
            a, b, d = _scale_terms_gpu(tr, samples, weight, data, r0, k, s)
            sgg += a
            sgd += b
            sg += d
    red[0, th] = sgg
    red[1, th] = sgd
    red[2, th] = sg
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:  # a fixed tree: the same additions, in the same order, every run
        if th < half:
            for q in range(3):
                red[q, th] += red[q, th + half]
        cuda.syncthreads()
        half //= 2
    if th < 3:
        part[c, (gi * 3 + th) * mc + k] = red[th, 0]


def _chunk_sum_kernel(part, cstart, out):  # pragma: no cover
    """``out[b, r]`` = Σ ``part[c, r]`` over the chunks c of ``cstart[b]`` ≤ c <
    ``cstart[b + 1]``, in chunk order (deterministic, unlike atomics); one thread per entry,
    consecutive threads on consecutive r (coalesced)."""
    idx = cuda.grid(1)
    width = part.shape[1]
    if idx >= out.shape[0] * width:
        return
    b, r = idx // width, idx % width
    acc = 0.0
    for c in range(cstart[b], cstart[b + 1]):
        acc += part[c, r]
    out[b, r] = acc


def _window_kernel(tr, sample_start, windows, out):  # pragma: no cover
    """Window values on the GPU: one thread per candidate and sweep."""
    idx = cuda.grid(1)
    k_all = windows.shape[0]
    if idx >= tr.shape[0] * k_all:
        return
    _windows_row_gpu(tr, idx // k_all, idx % k_all, sample_start, windows, out)


@functools.cache
def _gn_kernel(mmax: int):
    """Pass 2 on the GPU for groups of at most ``mmax`` perturbations: one CUDA block of
    :data:`THREADS` threads per group (x) and chunk (y) of ``size`` samples. The threads form
    (r₀, e₁ … e_m) of a tile of consecutive samples in shared memory (coalesced reads of the
    traces), then each accumulates its own pairs over the tile in registers; the chunk's
    pairs go to ``part[y, group · P + pair]``. The closure captures ints only, which
    numba-cuda's cache hashes into the kernel's key (a captured dispatcher or type would be
    pickled by value there)."""
    _numba_cuda()
    rows = mmax + 1
    stride = THREADS + 1  # a shared array's shape must be constants: captured, not formed
    pairs = n_pairs(mmax)
    per_thread = -(-pairs // THREADS)

    def gn_chunk_kernel(tr, samples, sblock, cw, data, first, count, use, a0, c0, ak, dak, dck,
                        size, part):  # pragma: no cover
        gi, c, th = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        # a row's stride of THREADS + 1 words: the threads of a warp read one sample of
        # different rows, which then lie in different banks
        ev = cuda.shared.array((rows, stride), numba.float64)
        wv = cuda.shared.array(THREADS, numba.float64)
        acc = cuda.local.array(per_thread, numba.float64)
        pi = cuda.local.array(per_thread, numba.int64)
        for q in range(per_thread):  # this thread's pairs (i, j), j ≤ i
            p = th + q * THREADS
            i = 0
            while (i + 1) * (i + 2) // 2 <= p:
                i += 1
            pi[q] = i
            acc[q] = 0.0
        lo = c * size
        hi = min(lo + size, samples.size)
        if use[gi, 0] != 0:  # the same for the whole block: every barrier is met by all
            r0, m = first[gi], count[gi]
            for tile in range(lo, hi, THREADS):
                s = tile + th
                if s < hi:
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
                        i = pi[q]
                        j = p - i * (i + 1) // 2
                        a = 0.0
                        for u in range(THREADS):
                            a += wv[u] * ev[i, u] * ev[j, u]
                        acc[q] += a
                cuda.syncthreads()
        for q in range(per_thread):
            p = th + q * THREADS
            if p < pairs:
                part[c, gi * pairs + p] = acc[q]

    return cuda.jit(cache=True)(gn_chunk_kernel)
