"""SGEMM ``C = A @ B`` in float32: naive, shared-memory tiled, register-blocked; cuBLAS via CuPy.

For square n: ``2 n^3`` flops and at least ``3 * 4 n^2`` DRAM bytes (A and B read once, C
written once), so an intensity of n/6 flop/byte: compute-bound for any sensible n once the
kernel reuses data on chip. The naive kernel re-reads A and B through L1/L2 for every FMA and
is limited there; tiling moves the reuse to shared memory, register blocking to registers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kingen.analysis.gpu import cuda_module, simulator_enabled
from kingen.analysis.kernels.base import KernelCase, rel_error

# (M, N, K); tiny is non-square and not a multiple of any tile so the guards are tested.
SIZES = {"default": (4096, 4096, 4096), "small": (1024, 1024, 1024), "tiny": (20, 24, 18)}
# Per size: naive block edge, shared tile edge, (threads per block edge, k-step) for the
# register-blocked kernels.
NAIVE = {"default": 16, "small": 16, "tiny": 4}
TILE = {"default": 32, "small": 32, "tiny": 4}
REG = {"default": (16, 8), "small": (16, 8), "tiny": (4, 4)}
PAD = 4  # shared-row padding: the transposed A-tile store hits 32 distinct banks with BK=8

_cache: dict[Any, Any] = {}
cuda: Any = None  # numba.cuda, bound on first kernel build (kept lazy for GPU-less imports)


def _bind_cuda() -> None:
    # A module global, not a closure variable: the CUDA simulator swaps the global ``cuda``
    # of a kernel's module for its fake one, and only then do cuda.grid & co. exist there.
    global cuda
    cuda = cuda_module()


def _naive_kernel() -> Any:
    if "naive" not in _cache:
        _bind_cuda()
        from numba import float32

        @cuda.jit(fastmath=True)
        def sgemm_naive(a, b, c):
            col, row = cuda.grid(2)
            m, k = a.shape
            n = b.shape[1]
            if row < m and col < n:
                acc = float32(0.0)
                for i in range(k):
                    acc += a[row, i] * b[i, col]
                c[row, col] = acc

        _cache["naive"] = sgemm_naive
    return _cache["naive"]


def _tiled_kernel(t: int) -> Any:
    key = ("tiled", t)
    if key not in _cache:
        _bind_cuda()
        from numba import float32

        @cuda.jit(fastmath=True)
        def sgemm_tiled(a, b, c):
            sa = cuda.shared.array((t, t), float32)
            sb = cuda.shared.array((t, t), float32)
            tx = cuda.threadIdx.x
            ty = cuda.threadIdx.y
            row = cuda.blockIdx.y * t + ty
            col = cuda.blockIdx.x * t + tx
            m, k = a.shape
            n = b.shape[1]
            acc = float32(0.0)
            for k0 in range(0, k, t):
                sa[ty, tx] = a[row, k0 + tx] if row < m and k0 + tx < k else float32(0.0)
                sb[ty, tx] = b[k0 + ty, col] if col < n and k0 + ty < k else float32(0.0)
                cuda.syncthreads()
                for i in range(t):
                    acc += sa[ty, i] * sb[i, tx]
                cuda.syncthreads()
            if row < m and col < n:
                c[row, col] = acc

        _cache[key] = sgemm_tiled
    return _cache[key]


def _regblock_kernel(t: int, bk: int, tm: int, tn: int) -> Any:
    key = ("reg", t, bk, tm, tn)
    if key not in _cache:
        _bind_cuda()
        from numba import float32

        bm, bn, nt = t * tm, t * tn, t * t
        sa_cols = bm + PAD
        tmn = tm * tn
        la, lb = -(-bm * bk // nt), -(-bk * bn // nt)

        # Each thread accumulates tm x tn outputs in registers (the loops have constant trip
        # counts, so they unroll and the local arrays become registers); a thread owns rows
        # ty + i*t and columns tx + j*t, so a warp reads consecutive shared words (no bank
        # conflicts) and writes C coalesced.
        @cuda.jit(fastmath=True)
        def sgemm_regblock(a, b, c):
            sa = cuda.shared.array((bk, sa_cols), float32)
            sb = cuda.shared.array((bk, bn), float32)
            acc = cuda.local.array(tmn, float32)
            ar = cuda.local.array(tm, float32)
            br = cuda.local.array(tn, float32)
            tx = cuda.threadIdx.x
            ty = cuda.threadIdx.y
            tid = ty * t + tx
            m0 = cuda.blockIdx.y * bm
            n0 = cuda.blockIdx.x * bn
            m, k = a.shape
            n = b.shape[1]
            for i in range(tmn):
                acc[i] = float32(0.0)
            for k0 in range(0, k, bk):
                for q in range(la):
                    idx = tid + q * nt
                    if idx < bm * bk:
                        r = idx // bk
                        cc = idx % bk
                        v = float32(0.0)
                        if m0 + r < m and k0 + cc < k:
                            v = a[m0 + r, k0 + cc]
                        sa[cc, r] = v
                for q in range(lb):
                    idx = tid + q * nt
                    if idx < bk * bn:
                        r = idx // bn
                        cc = idx % bn
                        v = float32(0.0)
                        if k0 + r < k and n0 + cc < n:
                            v = b[k0 + r, n0 + cc]
                        sb[r, cc] = v
                cuda.syncthreads()
                for kk in range(bk):
                    for i in range(tm):
                        ar[i] = sa[kk, ty + i * t]
                    for j in range(tn):
                        br[j] = sb[kk, tx + j * t]
                    for i in range(tm):
                        for j in range(tn):
                            acc[i * tn + j] += ar[i] * br[j]
                cuda.syncthreads()
            for i in range(tm):
                r = m0 + ty + i * t
                if r < m:
                    for j in range(tn):
                        cc = n0 + tx + j * t
                        if cc < n:
                            c[r, cc] = acc[i * tn + j]

        _cache[key] = sgemm_regblock
    return _cache[key]


class SgemmProblem:
    """Device buffers shared by the SGEMM variants (allocated on first use)."""

    def __init__(self, mnk: tuple[int, int, int], seed: int = 1) -> None:
        self.m, self.n, self.k = mnk
        self.rng = np.random.default_rng(seed)
        self._dev: tuple[Any, Any, Any] | None = None
        self.host: tuple[np.ndarray, np.ndarray] | None = None

    def _random(self) -> tuple[np.ndarray, np.ndarray]:
        a = self.rng.uniform(-1, 1, (self.m, self.k)).astype(np.float32)
        b = self.rng.uniform(-1, 1, (self.k, self.n)).astype(np.float32)
        return a, b

    def buffers(self) -> tuple[Any, Any, Any]:
        if self._dev is None:
            _bind_cuda()
            self.host = self._random()
            a, b = self.host
            self._dev = (cuda.to_device(a), cuda.to_device(b),
                         cuda.device_array((self.m, self.n), np.float32))
        return self._dev

    def fresh_input(self) -> tuple[np.ndarray, np.ndarray]:
        d_a, d_b, d_c = self.buffers()
        self.host = self._random()
        d_a.copy_to_device(self.host[0])
        d_b.copy_to_device(self.host[1])
        d_c.copy_to_device(np.full((self.m, self.n), np.nan, dtype=np.float32))
        return self.host


def _cupy() -> Any:
    if simulator_enabled():
        return None
    try:
        import cupy
    except Exception:  # CuPy is optional; any import failure means "no library reference"
        return None
    return cupy


def cases(size: str = "default") -> list[KernelCase]:
    """The SGEMM variants (plus cuBLAS when CuPy imports) on one shared problem."""
    m, n, k = SIZES[size]
    prob = SgemmProblem((m, n, k))
    flops = 2.0 * m * n * k
    nbytes = 4.0 * (m * k + k * n + m * n)
    nb, tt = NAIVE[size], TILE[size]
    t, bk = REG[size]

    def grid(bm: int, bn: int) -> tuple[int, int]:
        return (-(-n // bn), -(-m // bm))

    def launch_naive() -> None:
        a, b, c = prob.buffers()
        _naive_kernel()[grid(nb, nb), (nb, nb)](a, b, c)

    def launch_tiled() -> None:
        a, b, c = prob.buffers()
        _tiled_kernel(tt)[grid(tt, tt), (tt, tt)](a, b, c)

    def launch_reg(tm: int, tn: int) -> Any:
        def launch() -> None:
            a, b, c = prob.buffers()
            _regblock_kernel(t, bk, tm, tn)[grid(t * tm, t * tn), (t, t)](a, b, c)

        return launch

    def checker(launch: Any, result: Any) -> Any:
        def check() -> float:
            a, b = prob.fresh_input()
            launch()
            out = result()
            return rel_error(out, a.astype(np.float64) @ b.astype(np.float64))

        return check

    def numba_out() -> np.ndarray:
        return prob.buffers()[2].copy_to_host()

    common = dict(flops=flops, bytes=nbytes, group="sgemm", precision="float32", tolerance=1e-4)
    out = [
        KernelCase(name="sgemm_naive", launch=launch_naive,
                   check=checker(launch_naive, numba_out), kernel_regex="sgemm_naive",
                   note=f"one output per thread, {nb}x{nb} block, operands through L1/L2",
                   extra={"mnk": (m, n, k)}, **common),
        KernelCase(name="sgemm_tiled", launch=launch_tiled,
                   check=checker(launch_tiled, numba_out), kernel_regex="sgemm_tiled",
                   note=f"{tt}x{tt} tiles of A and B in shared memory",
                   extra={"mnk": (m, n, k)}, **common),
    ]
    for tm in (4, 8):
        launch = launch_reg(tm, tm)
        out.append(KernelCase(
            name=f"sgemm_reg{tm}x{tm}", launch=launch, check=checker(launch, numba_out),
            kernel_regex="sgemm_regblock",
            note=f"{t * tm}x{t * tm}x{bk} block tile, {tm}x{tm} outputs per thread in registers",
            extra={"mnk": (m, n, k)}, **common))
    cp = _cupy()
    if cp is not None:
        state: dict[str, Any] = {}

        def cbuf() -> dict[str, Any]:
            if not state:
                a, b = prob.host if prob.host is not None else prob._random()
                state.update(a=cp.asarray(a), b=cp.asarray(b), c=cp.empty((m, n), cp.float32))
            return state

        def launch_cublas() -> None:
            s = cbuf()
            cp.matmul(s["a"], s["b"], out=s["c"])

        def check_cublas() -> float:
            s = cbuf()
            a, b = prob._random()
            s["a"].set(a)
            s["b"].set(b)
            s["c"].fill(cp.nan)
            launch_cublas()
            return rel_error(cp.asnumpy(s["c"]), a.astype(np.float64) @ b.astype(np.float64))

        out.append(KernelCase(
            name="sgemm_cublas", launch=launch_cublas, check=check_cublas,
            kernel_regex="gemm|cutlass|xmma", note="cuBLAS through cupy.matmul (library reference)",
            extra={"mnk": (m, n, k)}, **common))
    return out
