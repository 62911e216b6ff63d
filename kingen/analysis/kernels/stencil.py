"""7-point 3-D heat-equation stencil: naive, and z-marching with on-chip reuse.

One explicit step ``out = c0*u + c1*(sum of the 6 neighbours)`` on the interior of an
``nz x ny x nx`` float32 grid (x fastest); boundary points are copied. Per interior point:
5 adds for the neighbours, 1 multiply, 1 FMA = 8 flops. The fewest DRAM bytes are one read of
``u`` and one write of ``out``: 8 bytes per point, so the kernel is memory-bound on any GPU
(about 1 flop per byte against a balance of tens) -- provided the index arithmetic stays small.

Numba types every array index as a signed 64-bit integer (with a negative-index wrap-around
test) and multiplies runtime strides for ``u[z, y, x]``: written that way, a one-point-per-
thread kernel is ~100 SASS instructions per point and issue-bound (measured, analysis/README).
Here every kernel is compiled for its grid shape (the shape and tile are closure constants),
indexes flat arrays with unsigned 32-bit arithmetic widened once (``uint64(uint32(...))``) and
reaches the neighbours by constant offsets from one address, which ptxas folds into the load
instructions' immediate offsets.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kingen.analysis.gpu import cuda_module
from kingen.analysis.kernels.base import KernelCase, rel_error

ALPHA = 0.1  # explicit step dt*D/h^2; < 1/6 keeps the scheme stable
SIZES = {"default": (512, 512, 512), "small": (256, 256, 256), "tiny": (8, 9, 11)}
# Threads per block (x, y, z) of the one-point-per-thread kernel.
# 32 x 4 x 4: x and y and z neighbours of most points are loaded by other warps of the same
# block, so more of the re-reads hit L1 instead of L2.
NAIVE_BLOCK = {"default": (32, 4, 4), "small": (32, 4, 4), "tiny": (4, 4, 2)}
# Tiles of the z-marching kernels: (threads in x, threads in y, planes per block along z).
# Tiny tiles make the simulator tests cross block edges in all three directions.
ZREG_TILE = {"default": (32, 8, 128), "small": (32, 8, 64), "tiny": (4, 4, 3)}
TILED_TILE = {"default": (32, 8, 128), "small": (32, 8, 64), "tiny": (4, 4, 3)}

_cache: dict[Any, Any] = {}
cuda: Any = None  # numba.cuda, bound on first kernel build (kept lazy for GPU-less imports)


def _bind_cuda() -> None:
    # A module global, not a closure variable: the CUDA simulator swaps the global ``cuda``
    # of a kernel's module for its fake one, and only then do cuda.grid & co. exist there.
    global cuda
    cuda = cuda_module()


def reference(u: np.ndarray, c0: float, c1: float) -> np.ndarray:
    """One stencil step in float64 with numpy."""
    u = u.astype(np.float64)
    ref = u.copy()
    c = u[1:-1, 1:-1, 1:-1]
    nb = (
        u[1:-1, 1:-1, :-2] + u[1:-1, 1:-1, 2:] + u[1:-1, :-2, 1:-1]
        + u[1:-1, 2:, 1:-1] + u[:-2, 1:-1, 1:-1] + u[2:, 1:-1, 1:-1]
    )
    ref[1:-1, 1:-1, 1:-1] = c0 * c + c1 * nb
    return ref


def _geometry(shape: tuple[int, int, int]) -> tuple[int, int, int, int]:
    nz, ny, nx = shape
    return nx, ny, nz, nx * ny


def _naive_kernel(shape: tuple[int, int, int], block: tuple[int, int, int]) -> Any:
    key = ("naive", shape, block)
    if key not in _cache:
        _bind_cuda()
        from numba import float32, uint32, uint64

        NX, NY, NZ, PL = _geometry(shape)
        BX, BY, BZ = block

        # One thread per point, every neighbour a global load (the caches do the reuse).
        # Grid shape and block are compile-time constants and all index arithmetic is in
        # unsigned 32 bits, widened once: the seven loads share one address register with
        # constant offsets (ptxas, sm_90: 45 SASS instructions, 8 of them memory, against 103
        # for signed 64-bit indices with runtime strides; H200: 49 executed per point).
        @cuda.jit(fastmath=True)
        def stencil_naive(u, out, c0, c1):
            x = uint32(uint32(cuda.blockIdx.x) * uint32(BX) + uint32(cuda.threadIdx.x))
            y = uint32(uint32(cuda.blockIdx.y) * uint32(BY) + uint32(cuda.threadIdx.y))
            z = uint32(uint32(cuda.blockIdx.z) * uint32(BZ) + uint32(cuda.threadIdx.z))
            if x < uint32(NX) and y < uint32(NY) and z < uint32(NZ):
                p = uint64(uint32(uint32(z * uint32(NY) + y) * uint32(NX) + x))
                v = u[p]
                if (x >= uint32(1) and x < uint32(NX - 1) and y >= uint32(1)
                        and y < uint32(NY - 1) and z >= uint32(1) and z < uint32(NZ - 1)):
                    s = (u[p - uint64(1)] + u[p + uint64(1)]) + (
                        u[p - uint64(NX)] + u[p + uint64(NX)])
                    s += u[p - uint64(PL)] + u[p + uint64(PL)]
                    v = c0 * v + c1 * s
                out[p] = float32(v)

        _cache[key] = stencil_naive
    return _cache[key]


def _zreg_kernel(shape: tuple[int, int, int], tile: tuple[int, int, int]) -> Any:
    key = ("zreg", shape, tile)
    if key not in _cache:
        _bind_cuda()
        from numba import float32, uint32, uint64

        NX, NY, NZ, PL = _geometry(shape)
        BX, BY, ZC = tile

        # 2.5-D blocking without shared memory or barriers: each thread owns one (x, y)
        # column and marches ZC planes along z. The z-1, z, z+1 values stay in registers and
        # plane z+3 is loaded two steps before it is needed (three loads in flight per
        # thread, to cover DRAM latency). The four x/y neighbours are global loads of lines
        # the neighbouring warps of the block have just brought in: L1 hits, so DRAM sees
        # each point about once. Index arithmetic as in stencil_naive.
        @cuda.jit(fastmath=True)
        def stencil_zreg(u, out, c0, c1):
            x = uint32(uint32(cuda.blockIdx.x) * uint32(BX) + uint32(cuda.threadIdx.x))
            y = uint32(uint32(cuda.blockIdx.y) * uint32(BY) + uint32(cuda.threadIdx.y))
            z = uint32(uint32(cuda.blockIdx.z) * uint32(ZC))
            if x < uint32(NX) and y < uint32(NY):
                ze = min(uint32(z + uint32(ZC)), uint32(NZ))
                ixy = (x >= uint32(1) and x < uint32(NX - 1) and y >= uint32(1)
                       and y < uint32(NY - 1))
                p = uint64(uint32(uint32(z * uint32(NY) + y) * uint32(NX) + x))
                b = float32(0.0)
                if z > uint32(0):
                    b = u[p - uint64(PL)]
                c = u[p]
                a1 = float32(0.0)
                a2 = float32(0.0)
                if uint32(z + uint32(1)) < uint32(NZ):
                    a1 = u[p + uint64(PL)]
                if uint32(z + uint32(2)) < uint32(NZ):
                    a2 = u[p + uint64(2 * PL)]
                while z < ze:
                    a3 = float32(0.0)
                    if uint32(z + uint32(3)) < uint32(NZ):
                        a3 = u[p + uint64(3 * PL)]
                    v = c
                    if ixy and z >= uint32(1) and z < uint32(NZ - 1):
                        s = (u[p - uint64(1)] + u[p + uint64(1)]) + (
                            u[p - uint64(NX)] + u[p + uint64(NX)])
                        v = c0 * c + c1 * (s + (b + a1))
                    out[p] = float32(v)
                    b = c
                    c = a1
                    a1 = a2
                    a2 = a3
                    p += uint64(PL)
                    z = uint32(z + uint32(1))

        _cache[key] = stencil_zreg
    return _cache[key]


def _tiled_kernel(shape: tuple[int, int, int], tile: tuple[int, int, int]) -> Any:
    key = ("tiled", shape, tile)
    if key not in _cache:
        _bind_cuda()
        from numba import float32, uint32, uint64

        NX, NY, NZ, PL = _geometry(shape)
        BX, BY, ZC = tile
        SX = BX + 2
        SZ = (BY + 2) * SX  # one x-y plane of the tile with its one-point halo
        NS = 2 * SZ

        # The classic 2.5-D scheme: the x-y plane with its halo in shared memory (two
        # buffers, so one barrier per plane suffices), z-1/z/z+1 in registers. Plane z+2,
        # halo included, is loaded a step ahead so the loads are in flight across the
        # barrier. Edge threads also load one halo point in x and/or one in y.
        @cuda.jit(fastmath=True)
        def stencil_tiled(u, out, c0, c1):
            tile = cuda.shared.array(NS, float32)
            tx = uint32(cuda.threadIdx.x)
            ty = uint32(cuda.threadIdx.y)
            x = uint32(uint32(cuda.blockIdx.x) * uint32(BX) + tx)
            y = uint32(uint32(cuda.blockIdx.y) * uint32(BY) + ty)
            z = uint32(uint32(cuda.blockIdx.z) * uint32(ZC))
            ze = min(uint32(z + uint32(ZC)), uint32(NZ))
            inside = x < uint32(NX) and y < uint32(NY)
            ixy = x >= uint32(1) and x < uint32(NX - 1) and y >= uint32(1) and y < uint32(NY - 1)
            s = uint32(uint32(ty + uint32(1)) * uint32(SX) + tx + uint32(1))
            p = uint64(0)
            if inside:
                p = uint64(uint32(uint32(z * uint32(NY) + y) * uint32(NX) + x))
            # halo roles: x-halo (left or right of the tile), y-halo (below or above)
            hl = inside and tx == uint32(0) and x > uint32(0)
            hr = inside and tx == uint32(BX - 1) and uint32(x + uint32(1)) < uint32(NX)
            hd = inside and ty == uint32(0) and y > uint32(0)
            hu = inside and ty == uint32(BY - 1) and uint32(y + uint32(1)) < uint32(NY)
            hx = hl or hr
            hy = hd or hu
            qx = p
            sx = s
            if hl:
                qx = p - uint64(1)
                sx = uint32(s - uint32(1))
            if hr:
                qx = p + uint64(1)
                sx = uint32(s + uint32(1))
            qy = p
            sy = s
            if hd:
                qy = p - uint64(NX)
                sy = uint32(s - uint32(SX))
            if hu:
                qy = p + uint64(NX)
                sy = uint32(s + uint32(SX))
            b = float32(0.0)
            c = float32(0.0)
            a1 = float32(0.0)
            xc = float32(0.0)
            x1 = float32(0.0)
            yc = float32(0.0)
            y1 = float32(0.0)
            if inside:
                c = u[p]
                if z > uint32(0):
                    b = u[p - uint64(PL)]
                if uint32(z + uint32(1)) < uint32(NZ):
                    a1 = u[p + uint64(PL)]
                if hx:
                    xc = u[qx]
                    if uint32(z + uint32(1)) < uint32(NZ):
                        x1 = u[qx + uint64(PL)]
                if hy:
                    yc = u[qy]
                    if uint32(z + uint32(1)) < uint32(NZ):
                        y1 = u[qy + uint64(PL)]
            o = uint32(0)  # which of the two plane buffers
            while z < ze:
                a2 = float32(0.0)
                x2 = float32(0.0)
                y2 = float32(0.0)
                if inside and uint32(z + uint32(2)) < uint32(NZ):
                    a2 = u[p + uint64(2 * PL)]
                    if hx:
                        x2 = u[qx + uint64(2 * PL)]
                    if hy:
                        y2 = u[qy + uint64(2 * PL)]
                tile[uint32(o + s)] = c
                if hx:
                    tile[uint32(o + sx)] = xc
                if hy:
                    tile[uint32(o + sy)] = yc
                cuda.syncthreads()
                if inside:
                    v = c
                    if ixy and z >= uint32(1) and z < uint32(NZ - 1):
                        t = (tile[uint32(o + s - uint32(1))] + tile[uint32(o + s + uint32(1))]) + (
                            tile[uint32(o + s - uint32(SX))] + tile[uint32(o + s + uint32(SX))])
                        v = c0 * c + c1 * (t + (b + a1))
                    out[p] = float32(v)
                b = c
                c = a1
                a1 = a2
                xc = x1
                x1 = x2
                yc = y1
                y1 = y2
                p += uint64(PL)
                qx += uint64(PL)
                qy += uint64(PL)
                o = uint32(uint32(SZ) - o)
                z = uint32(z + uint32(1))

        _cache[key] = stencil_tiled
    return _cache[key]


class StencilProblem:
    """Device buffers shared by the stencil variants (allocated on first use)."""

    def __init__(self, shape: tuple[int, int, int], seed: int = 0) -> None:
        self.shape = shape
        self.rng = np.random.default_rng(seed)
        self.c0 = np.float32(1.0 - 6.0 * ALPHA)
        self.c1 = np.float32(ALPHA)
        self._dev: tuple[Any, Any] | None = None
        self.host_u: np.ndarray | None = None

    def buffers(self) -> tuple[Any, Any]:
        if self._dev is None:
            _bind_cuda()
            self.host_u = self.rng.random(self.shape, dtype=np.float32)
            self._dev = (cuda.to_device(self.host_u), cuda.device_array(self.shape, np.float32))
        return self._dev

    def fresh_input(self) -> np.ndarray:
        """New random input on the device and a poisoned output; returns the host input."""
        d_u, d_out = self.buffers()
        self.host_u = self.rng.random(self.shape, dtype=np.float32)
        d_u.copy_to_device(self.host_u)
        d_out.copy_to_device(np.full(self.shape, np.nan, dtype=np.float32))
        return self.host_u


def cases(size: str = "default") -> list[KernelCase]:
    """The stencil variants on one shared problem of the given size."""
    shape = SIZES[size]
    prob = StencilProblem(shape)
    nz, ny, nx = shape
    interior = max(nz - 2, 0) * max(ny - 2, 0) * max(nx - 2, 0)
    flops = 8.0 * interior
    nbytes = 2.0 * 4 * nz * ny * nx  # read u once, write out once

    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    nb = NAIVE_BLOCK[size]
    naive_grid = (cdiv(nx, nb[0]), cdiv(ny, nb[1]), cdiv(nz, nb[2]))
    zt = ZREG_TILE[size]
    zreg_grid = (cdiv(nx, zt[0]), cdiv(ny, zt[1]), cdiv(nz, zt[2]))
    tt = TILED_TILE[size]
    tiled_grid = (cdiv(nx, tt[0]), cdiv(ny, tt[1]), cdiv(nz, tt[2]))
    npts = nz * ny * nx

    def flat(d: Any) -> Any:
        return d.reshape(npts)

    def launch_naive() -> None:
        d_u, d_out = prob.buffers()
        _naive_kernel(shape, nb)[naive_grid, nb](flat(d_u), flat(d_out), prob.c0, prob.c1)

    def launch_zreg() -> None:
        d_u, d_out = prob.buffers()
        _zreg_kernel(shape, zt)[zreg_grid, (zt[0], zt[1], 1)](
            flat(d_u), flat(d_out), prob.c0, prob.c1)

    def launch_tiled() -> None:
        d_u, d_out = prob.buffers()
        _tiled_kernel(shape, tt)[tiled_grid, (tt[0], tt[1], 1)](
            flat(d_u), flat(d_out), prob.c0, prob.c1)

    def checker(launch: Any) -> Any:
        def check() -> float:
            u = prob.fresh_input()
            launch()
            out = prob.buffers()[1].copy_to_host()
            return rel_error(out, reference(u, float(prob.c0), float(prob.c1)))

        return check

    common = dict(flops=flops, bytes=nbytes, group="stencil", precision="float32", tolerance=1e-5)
    variants = [
        ("stencil_naive", launch_naive, f"one thread per point, block {nb}, global loads only"),
        ("stencil_zreg", launch_zreg,
         f"{zt[0]}x{zt[1]} columns marching {zt[2]} planes along z, z-neighbours in "
         "registers (prefetch 2 planes ahead), x/y neighbours from L1"),
        ("stencil_tiled", launch_tiled,
         f"{tt[0]}x{tt[1]} x-y tile in shared memory (double-buffered, 1 barrier per plane) "
         f"marching {tt[2]} planes along z"),
    ]
    # Each variant is its own Python function, so its regex is its function name (the kernel
    # name ncu sees is the mangled ``name[abi...]``).
    return [KernelCase(name=name, launch=launch, check=checker(launch),
                       kernel_regex=name + r"\[", note=note,
                       extra={"shape": shape, "block": nb, "zreg_tile": zt, "tiled_tile": tt},
                       **common)
            for name, launch, note in variants]
