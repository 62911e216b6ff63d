"""7-point 3-D heat-equation stencil: naive, and tiled with on-chip reuse along z.

One explicit step ``out = c0*u + c1*(sum of the 6 neighbours)`` on the interior of an
``nz x ny x nx`` float32 grid (x fastest); boundary points are copied. Per interior point:
5 adds for the neighbours, 1 multiply, 1 FMA = 8 flops. The fewest DRAM bytes are one read of
``u`` and one write of ``out``: 8 bytes per point, so the kernel is memory-bound on any GPU
(about 1 flop per byte against a balance of tens).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kingen.analysis._gpu import cuda_module
from kingen.analysis.kernels.base import KernelCase, rel_error

ALPHA = 0.1  # explicit step dt*D/h^2; < 1/6 keeps the scheme stable
SIZES = {"default": (512, 512, 512), "small": (256, 256, 256), "tiny": (8, 9, 11)}
# Tile per size: (block x, block y, z chunk). Tiny tiles make the simulator test cross
# block edges in all three directions.
TILES = {"default": (32, 16, 64), "small": (32, 16, 64), "tiny": (4, 4, 3)}
# Coarsened tile per size: (threads in x, threads in y, z chunk, points per thread in x).
TILES_X = {"default": (32, 8, 32, 4), "small": (32, 8, 32, 4), "tiny": (4, 4, 3, 2)}
NAIVE_BLOCK = {"default": (32, 8, 1), "small": (32, 8, 1), "tiny": (4, 4, 2)}

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


def _naive3d_kernel() -> Any:
    if "naive3d" not in _cache:
        _bind_cuda()

        @cuda.jit(fastmath=True)
        def stencil_naive3d(u, out, c0, c1):
            x, y, z = cuda.grid(3)
            nz, ny, nx = u.shape
            if x < nx and y < ny and z < nz:
                if x == 0 or y == 0 or z == 0 or x == nx - 1 or y == ny - 1 or z == nz - 1:
                    out[z, y, x] = u[z, y, x]
                else:
                    s = (u[z, y, x - 1] + u[z, y, x + 1]) + (u[z, y - 1, x] + u[z, y + 1, x])
                    s += u[z - 1, y, x] + u[z + 1, y, x]
                    out[z, y, x] = c0 * u[z, y, x] + c1 * s

        _cache["naive3d"] = stencil_naive3d
    return _cache["naive3d"]


def _tiled3d_kernel(bx: int, by: int, zc: int) -> Any:
    key = ("tiled3d", bx, by, zc)
    if key not in _cache:
        _bind_cuda()
        from numba import float32

        sy, sx = by + 2, bx + 2

        # A 2-D block owns a bx x by column and marches along z: the z-1, z, z+1 values stay
        # in registers and the x-y plane (with a one-point halo) in shared memory, so each
        # point is read from DRAM about once instead of up to seven times through the caches.
        @cuda.jit(fastmath=True)
        def stencil_tiled3d(u, out, c0, c1):
            tile = cuda.shared.array((sy, sx), float32)
            tx = cuda.threadIdx.x
            ty = cuda.threadIdx.y
            x = cuda.blockIdx.x * bx + tx
            y = cuda.blockIdx.y * by + ty
            z0 = cuda.blockIdx.z * zc
            nz, ny, nx = u.shape
            inside = x < nx and y < ny
            z1 = min(z0 + zc, nz)
            below = float32(0.0)
            cur = float32(0.0)
            if inside:
                cur = u[z0, y, x]
                if z0 > 0:
                    below = u[z0 - 1, y, x]
            for z in range(z0, z1):
                above = float32(0.0)
                if inside and z + 1 < nz:
                    above = u[z + 1, y, x]  # issued early: in flight across the barrier
                cuda.syncthreads()
                tile[ty + 1, tx + 1] = cur
                if inside:
                    if tx == 0 and x > 0:
                        tile[ty + 1, 0] = u[z, y, x - 1]
                    if tx == bx - 1 and x + 1 < nx:
                        tile[ty + 1, bx + 1] = u[z, y, x + 1]
                    if ty == 0 and y > 0:
                        tile[0, tx + 1] = u[z, y - 1, x]
                    if ty == by - 1 and y + 1 < ny:
                        tile[by + 1, tx + 1] = u[z, y + 1, x]
                cuda.syncthreads()
                if inside:
                    if x == 0 or y == 0 or z == 0 or x == nx - 1 or y == ny - 1 or z == nz - 1:
                        out[z, y, x] = cur
                    else:
                        s = (tile[ty + 1, tx] + tile[ty + 1, tx + 2]) + (
                            tile[ty, tx + 1] + tile[ty + 2, tx + 1]
                        )
                        s += below + above
                        out[z, y, x] = c0 * cur + c1 * s
                below = cur
                cur = above

        _cache[key] = stencil_tiled3d
    return _cache[key]


def _naive_kernel() -> Any:
    if "naive" not in _cache:
        _bind_cuda()
        from numba import uint64

        # Flat, unsigned indices: numba adds a negative-index wrap-around check to every signed
        # index and the 3-D form multiplies three 64-bit strides per access; measured, that
        # made the 3-D kernels issue-bound (about 200 thread instructions per point).
        @cuda.jit(fastmath=True)
        def stencil_naive(u, out, nx, ny, nz, c0, c1):
            x, y, z = cuda.grid(3)
            if x < nx and y < ny and z < nz:
                one = uint64(1)
                sy = uint64(nx)
                sz = uint64(nx * ny)
                p = uint64(x) + uint64(y) * sy + uint64(z) * sz
                if x == 0 or y == 0 or z == 0 or x == nx - 1 or y == ny - 1 or z == nz - 1:
                    out[p] = u[p]
                else:
                    s = (u[p - one] + u[p + one]) + (u[p - sy] + u[p + sy])
                    s += u[p - sz] + u[p + sz]
                    out[p] = c0 * u[p] + c1 * s

        _cache["naive"] = stencil_naive
    return _cache["naive"]


def _tiled_kernel(bx: int, by: int, zc: int, cx: int) -> Any:
    key = ("tiled", bx, by, zc, cx)
    if key not in _cache:
        _bind_cuda()
        from numba import float32, uint64

        w = bx * cx  # tile width in x: each thread owns cx points, bx apart (coalesced)
        sx = w + 2
        size = (by + 2) * sx
        rh = w - bx + 1  # right-halo offset from the last thread's first point

        # The x-y plane (with a one-point halo) lives in shared memory and z-1/z/z+1 in
        # registers, so each point is read from DRAM about once. Flat unsigned indices,
        # computed once and advanced a plane per step, and cx points per thread at constant
        # offsets keep index arithmetic off the issue slots (numba indexes in 64 bits).
        @cuda.jit(fastmath=True)
        def stencil_tiled(u, out, nx, ny, nz, c0, c1):
            tile = cuda.shared.array(size, float32)
            bel = cuda.local.array(cx, float32)
            cur = cuda.local.array(cx, float32)
            abv = cuda.local.array(cx, float32)
            tx = cuda.threadIdx.x
            ty = cuda.threadIdx.y
            xb = cuda.blockIdx.x * w
            y = cuda.blockIdx.y * by + ty
            z0 = cuda.blockIdx.z * zc
            z1 = min(z0 + zc, nz)
            yin = y < ny
            yint = y > 0 and y < ny - 1
            left = yin and tx == 0 and xb > 0
            right = yin and tx == bx - 1 and xb + w < nx
            down = yin and ty == 0 and y > 0
            up = yin and ty == by - 1 and y + 1 < ny
            one = uint64(1)
            st = uint64(sx)
            sy = uint64(nx)
            sz = uint64(nx * ny)
            s = uint64((ty + 1) * sx + tx + 1)
            p = uint64(xb + tx) + uint64(y) * sy + uint64(z0) * sz
            for j in range(cx):
                bel[j] = float32(0.0)
                cur[j] = float32(0.0)
                if yin and xb + tx + j * bx < nx:
                    cur[j] = u[p + uint64(j * bx)]
                    if z0 > 0:
                        bel[j] = u[p + uint64(j * bx) - sz]
            for z in range(z0, z1):
                for j in range(cx):
                    abv[j] = float32(0.0)
                    if yin and xb + tx + j * bx < nx and z + 1 < nz:
                        abv[j] = u[p + uint64(j * bx) + sz]  # in flight across the barrier
                cuda.syncthreads()
                for j in range(cx):
                    tile[s + uint64(j * bx)] = cur[j]
                    if xb + tx + j * bx < nx:
                        if down:
                            tile[s + uint64(j * bx) - st] = u[p + uint64(j * bx) - sy]
                        if up:
                            tile[s + uint64(j * bx) + st] = u[p + uint64(j * bx) + sy]
                if left:
                    tile[s - one] = u[p - one]
                if right:
                    tile[s + uint64(rh)] = u[p + uint64(rh)]
                cuda.syncthreads()
                for j in range(cx):
                    x = xb + tx + j * bx
                    if yin and x < nx:
                        q = s + uint64(j * bx)
                        if yint and x > 0 and x < nx - 1 and z > 0 and z < nz - 1:
                            t = (tile[q - one] + tile[q + one]) + (tile[q - st] + tile[q + st])
                            t += bel[j] + abv[j]
                            out[p + uint64(j * bx)] = c0 * cur[j] + c1 * t
                        else:
                            out[p + uint64(j * bx)] = cur[j]
                    bel[j] = cur[j]
                    cur[j] = abv[j]
                p += sz

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
    nbytes = 2.0 * 4 * nz * ny * nx

    nb = NAIVE_BLOCK[size]
    naive_grid = (-(-nx // nb[0]), -(-ny // nb[1]), -(-nz // nb[2]))
    bx, by, zc = TILES[size]
    tiled_grid = (-(-nx // bx), -(-ny // by), -(-nz // zc))

    npts = nz * ny * nx

    def flat(d: Any) -> Any:
        return d.reshape(npts)

    def launch_naive() -> None:
        d_u, d_out = prob.buffers()
        _naive_kernel()[naive_grid, nb](flat(d_u), flat(d_out), nx, ny, nz, prob.c0, prob.c1)

    def launch_tiled() -> None:
        d_u, d_out = prob.buffers()
        _tiled_kernel(bx, by, zc, 1)[tiled_grid, (bx, by, 1)](
            flat(d_u), flat(d_out), nx, ny, nz, prob.c0, prob.c1)

    qx, qy, qz, cx = TILES_X[size]
    x4_grid = (-(-nx // (qx * cx)), -(-ny // qy), -(-nz // qz))

    def launch_tiled_x() -> None:
        d_u, d_out = prob.buffers()
        _tiled_kernel(qx, qy, qz, cx)[x4_grid, (qx, qy, 1)](
            flat(d_u), flat(d_out), nx, ny, nz, prob.c0, prob.c1)

    def launch_naive3d() -> None:
        d_u, d_out = prob.buffers()
        _naive3d_kernel()[naive_grid, nb](d_u, d_out, prob.c0, prob.c1)

    def launch_tiled3d() -> None:
        d_u, d_out = prob.buffers()
        _tiled3d_kernel(bx, by, zc)[tiled_grid, (bx, by, 1)](d_u, d_out, prob.c0, prob.c1)

    def checker(launch: Any) -> Any:
        def check() -> float:
            u = prob.fresh_input()
            launch()
            out = prob.buffers()[1].copy_to_host()
            return rel_error(out, reference(u, float(prob.c0), float(prob.c1)))

        return check

    common = dict(flops=flops, bytes=nbytes, group="stencil", precision="fp32", tolerance=1e-5)
    variants = [
        ("stencil_naive", launch_naive, f"one thread per point, block {nb}, flat indices"),
        ("stencil_tiled", launch_tiled,
         f"{bx}x{by} x-y tile in shared memory marching {zc} planes along z, flat indices"),
        ("stencil_tiled_x4", launch_tiled_x,
         f"as stencil_tiled, {qx * cx}x{qy} tile, {cx} points per thread in x, {qz} planes"),
        ("stencil_naive3d", launch_naive3d, "as stencil_naive with u[z, y, x] indexing"),
        ("stencil_tiled3d", launch_tiled3d, "as stencil_tiled with u[z, y, x] indexing"),
    ]
    # The coarsened variant is the same Python function as stencil_tiled (other constants);
    # the worker launches only the chosen case, so the shared regex matches only it.
    KREGEX = {"stencil_tiled_x4": r"stencil_tiled\["}
    return [KernelCase(name=name, launch=launch, check=checker(launch),
                       kernel_regex=KREGEX.get(name, name + r"\["), note=note,
                       extra={"shape": shape, "block": nb, "tile": (bx, by, zc),
                              "tile_x": TILES_X[size]}, **common)
            for name, launch, note in variants]
