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


def _naive_kernel() -> Any:
    if "naive" not in _cache:
        _bind_cuda()

        @cuda.jit(fastmath=True)
        def stencil_naive(u, out, c0, c1):
            x, y, z = cuda.grid(3)
            nz, ny, nx = u.shape
            if x < nx and y < ny and z < nz:
                if x == 0 or y == 0 or z == 0 or x == nx - 1 or y == ny - 1 or z == nz - 1:
                    out[z, y, x] = u[z, y, x]
                else:
                    s = (u[z, y, x - 1] + u[z, y, x + 1]) + (u[z, y - 1, x] + u[z, y + 1, x])
                    s += u[z - 1, y, x] + u[z + 1, y, x]
                    out[z, y, x] = c0 * u[z, y, x] + c1 * s

        _cache["naive"] = stencil_naive
    return _cache["naive"]


def _tiled_kernel(bx: int, by: int, zc: int) -> Any:
    key = ("tiled", bx, by, zc)
    if key not in _cache:
        _bind_cuda()
        from numba import float32

        sy, sx = by + 2, bx + 2

        # A 2-D block owns a bx x by column and marches along z: the z-1, z, z+1 values stay
        # in registers and the x-y plane (with a one-point halo) in shared memory, so each
        # point is read from DRAM about once instead of up to seven times through the caches.
        @cuda.jit(fastmath=True)
        def stencil_tiled(u, out, c0, c1):
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

    def launch_naive() -> None:
        d_u, d_out = prob.buffers()
        _naive_kernel()[naive_grid, nb](d_u, d_out, prob.c0, prob.c1)

    def launch_tiled() -> None:
        d_u, d_out = prob.buffers()
        _tiled_kernel(bx, by, zc)[tiled_grid, (bx, by, 1)](d_u, d_out, prob.c0, prob.c1)

    def checker(launch: Any) -> Any:
        def check() -> float:
            u = prob.fresh_input()
            launch()
            out = prob.buffers()[1].copy_to_host()
            return rel_error(out, reference(u, float(prob.c0), float(prob.c1)))

        return check

    common = dict(flops=flops, bytes=nbytes, group="stencil", precision="fp32", tolerance=1e-5)
    return [
        KernelCase(
            name="stencil_naive", launch=launch_naive, check=checker(launch_naive),
            kernel_regex="stencil_naive", note=f"one thread per point, block {nb}",
            extra={"shape": shape, "block": nb}, **common,
        ),
        KernelCase(
            name="stencil_tiled", launch=launch_tiled, check=checker(launch_tiled),
            kernel_regex="stencil_tiled",
            note=f"{bx}x{by} x-y tile in shared memory marching {zc} planes along z",
            extra={"shape": shape, "tile": (bx, by, zc)}, **common,
        ),
    ]
