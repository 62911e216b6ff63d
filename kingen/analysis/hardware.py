"""Device ceilings: properties read off the device, peaks measured by micro-benchmarks.

Measured peaks (numba-cuda kernels, CUDA-event timing, median of several runs):

- DRAM bandwidth: a large device-to-device copy, counting bytes read plus bytes written;
  the larger of a copy kernel and the driver's memcpy.
- L2 bandwidth: a working set well inside L2 re-read many times (bytes read).
- FP32 / FP64 FMA throughput: independent FMA chains, many in flight per thread.

Instruction throughput is not measured: it is SMs x 4 schedulers x clock (one warp
instruction per scheduler per cycle), the peak of the instruction roofline. Results are
cached per device as JSON under ``$KINGEN_CACHE`` (default ``~/.cache/kingen``) with the
datasheet values beside them.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kingen.analysis.gpu import require_gpu

SECTOR = 32  # bytes per DRAM/L2 transaction (sector): the instruction roofline's byte unit

# Published peaks: bandwidth in GB/s, FP32/FP64 in GFLOP/s (non-tensor), boost clock in MHz.
# Matched on the device name, first match wins; "generic" is derived from properties.
DATASHEETS: list[tuple[str, dict[str, Any]]] = [
    ("H200", dict(label="NVIDIA H200 SXM", dram_gbs=4800.0, fp32_gflops=66900.0,
                  fp64_gflops=33500.0, sms=132, boost_mhz=1980)),
    ("H100 PCIe", dict(label="NVIDIA H100 PCIe", dram_gbs=2000.0, fp32_gflops=51200.0,
                       fp64_gflops=25600.0, sms=114, boost_mhz=1755)),
    ("H100 NVL", dict(label="NVIDIA H100 NVL", dram_gbs=3900.0, fp32_gflops=60000.0,
                      fp64_gflops=30000.0, sms=132, boost_mhz=1785)),
    ("H100", dict(label="NVIDIA H100 SXM5", dram_gbs=3350.0, fp32_gflops=66900.0,
                  fp64_gflops=33500.0, sms=132, boost_mhz=1980)),
    ("A100-SXM4-80GB", dict(label="NVIDIA A100 SXM 80GB", dram_gbs=2039.0, fp32_gflops=19500.0,
                            fp64_gflops=9700.0, sms=108, boost_mhz=1410)),
    ("A100", dict(label="NVIDIA A100 40GB", dram_gbs=1555.0, fp32_gflops=19500.0,
                  fp64_gflops=9700.0, sms=108, boost_mhz=1410)),
]

# FP32 lanes per SM by compute capability, for the generic fallback.
_FP32_PER_SM = {(6, 0): 64, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 9): 128,
                (9, 0): 128}
_FP64_RATIO = {(6, 0): 0.5, (7, 0): 0.5, (8, 0): 0.5, (9, 0): 0.5}


@dataclass
class DeviceInfo:
    """Properties of one device and its ceilings (GB/s, GFLOP/s, warp instructions/s)."""

    name: str
    compute_capability: tuple[int, int]
    sms: int
    clock_mhz: float
    mem_clock_mhz: float
    bus_width_bits: int
    l2_bytes: int
    total_mem_bytes: int
    datasheet: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def warp_inst_per_s(self) -> float:
        """Peak warp instructions per second: SMs x 4 schedulers x clock."""
        return self.sms * 4 * self.clock_mhz * 1e6

    def peak(self, what: str) -> float:
        """Measured peak when there is one, else the datasheet's (GB/s or GFLOP/s)."""
        if what in self.measured:
            return float(self.measured[what])
        return float(self.datasheet.get(what, float("nan")))

    def balance(self, level: str = "dram") -> float:
        """Machine balance in warp instructions per 32-byte transaction at ``level``."""
        bw = self.peak(f"{level}_gbs") * 1e9
        return self.warp_inst_per_s / (bw / SECTOR)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["warp_inst_per_s"] = self.warp_inst_per_s
        d["balance_dram"] = self.balance("dram")
        d["balance_l2"] = self.balance("l2") if "l2_gbs" in self.measured else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DeviceInfo:
        keys = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in keys}
        kw["compute_capability"] = tuple(kw["compute_capability"])
        return cls(**kw)


def datasheet_for(name: str, cc: tuple[int, int], sms: int, clock_mhz: float,
                  mem_clock_mhz: float, bus_width_bits: int) -> dict[str, Any]:
    """Published peaks for a device name, or ones derived from its properties."""
    for key, sheet in DATASHEETS:
        if key.lower() in name.lower():
            return dict(sheet, source="datasheet")
    lanes = _FP32_PER_SM.get(tuple(cc), 64)
    fp32 = sms * lanes * 2 * clock_mhz * 1e-3
    return dict(
        label=f"generic ({name})",
        dram_gbs=2 * mem_clock_mhz * 1e6 * bus_width_bits / 8 / 1e9,  # double data rate
        fp32_gflops=fp32,
        fp64_gflops=fp32 * _FP64_RATIO.get(tuple(cc), 1 / 32),
        sms=sms, boost_mhz=clock_mhz, source="derived from properties",
    )


def read_properties() -> DeviceInfo:
    """Read the current device's properties through numba.cuda (no measurement)."""
    cuda = require_gpu()
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    cc = tuple(dev.compute_capability)
    sms = int(dev.MULTIPROCESSOR_COUNT)
    clock = dev.CLOCK_RATE / 1e3  # kHz -> MHz
    mem_clock = dev.MEMORY_CLOCK_RATE / 1e3
    bus = int(dev.GLOBAL_MEMORY_BUS_WIDTH)
    l2 = int(dev.L2_CACHE_SIZE)
    total = int(cuda.current_context().get_memory_info()[1])
    return DeviceInfo(
        name=name, compute_capability=cc, sms=sms, clock_mhz=clock, mem_clock_mhz=mem_clock,
        bus_width_bits=bus, l2_bytes=l2, total_mem_bytes=total,
        datasheet=datasheet_for(name, cc, sms, clock, mem_clock, bus),
    )


def cache_dir() -> Path:
    """kingen's cache folder (``$KINGEN_CACHE`` or ``~/.cache/kingen``), shared with the
    solver's compiled kernels and its tuned launch choices."""
    from kingen.solve.compiled import cache_dir as solver_cache_dir

    return solver_cache_dir()


def _device_key(info: DeviceInfo) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", info.name).strip("-")
    cc = "".join(str(x) for x in info.compute_capability)
    return f"{slug}-sm{cc}-{info.sms}sm-{int(info.clock_mhz)}mhz"


def device_key() -> str:
    """A file-name-safe key naming the current device (for caches)."""
    return _device_key(read_properties())


def ceilings(remeasure: bool = False, quick: bool = False) -> DeviceInfo:
    """Properties and measured peaks of the current device, from the cache when present.

    Parameters
    ----------
    remeasure
        Ignore the cache and run the micro-benchmarks again.
    quick
        Smaller problems and fewer repeats (seconds instead of tens of seconds).
    """
    info = read_properties()
    path = cache_dir() / f"ceilings-{_device_key(info)}.json"
    if path.exists() and not remeasure:
        try:
            cached = DeviceInfo.from_json(json.loads(path.read_text()))
            if cached.measured:
                return cached
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache is re-measured, not reported
    info.measured = measure_peaks(info, quick=quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info.to_json(), indent=2))
    tmp.replace(path)  # never leave a half-written cache
    return info


# --------------------------------------------------------------------------- micro-benchmarks

_kernels: dict[str, Any] = {}
cuda: Any = None


def _build() -> dict[str, Any]:
    global cuda
    if _kernels:
        return _kernels
    cuda = require_gpu()
    from numba import float32, float64

    @cuda.jit
    def copy_kernel(src, dst):
        # Four loads in flight per thread before the stores: more bytes outstanding per SM.
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        n = src.size
        while i + 3 * stride < n:
            v0 = src[i]
            v1 = src[i + stride]
            v2 = src[i + 2 * stride]
            v3 = src[i + 3 * stride]
            dst[i] = v0
            dst[i + stride] = v1
            dst[i + 2 * stride] = v2
            dst[i + 3 * stride] = v3
            i += 4 * stride
        while i < n:
            dst[i] = src[i]
            i += stride

    @cuda.jit
    def l2_read_kernel(src, reps, out):
        # Each thread sums a strided walk over a working set that fits in L2; the result is
        # stored so the loads cannot be removed.
        tid = cuda.grid(1)
        stride = cuda.gridsize(1)
        acc = float32(0.0)
        for _ in range(reps):
            i = tid
            while i < src.size:
                acc += src[i]
                i += stride
        out[tid] = acc

    def make_fma(dtype: Any) -> Any:
        @cuda.jit(fastmath=True)
        def fma_kernel(x, iters, out):
            # 8 independent chains: enough FMAs in flight to cover the pipe latency.
            tid = cuda.grid(1)
            b = x[0]
            c = x[1]
            a0 = dtype(tid)
            a1 = a0 + b
            a2 = a0 + c
            a3 = a1 + c
            a4 = a0 - b
            a5 = a0 - c
            a6 = a4 - c
            a7 = a1 + b
            for _ in range(iters):
                for _r in range(8):  # constant trip count: unrolled, 64 FMAs per trip
                    a0 = a0 * b + c
                    a1 = a1 * b + c
                    a2 = a2 * b + c
                    a3 = a3 * b + c
                    a4 = a4 * b + c
                    a5 = a5 * b + c
                    a6 = a6 * b + c
                    a7 = a7 * b + c
            out[tid] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7

        return fma_kernel

    _kernels.update(copy=copy_kernel, l2=l2_read_kernel, fma32=make_fma(float32),
                    fma64=make_fma(float64))
    return _kernels


def time_ms(fn: Any, repeats: int = 10, warmup: int = 2, batch: int = 5) -> list[float]:
    """Times of one ``fn()`` in ms with CUDA events, after ``warmup`` untimed calls.

    Each sample times ``batch`` back-to-back calls between one pair of events and divides:
    ``fn`` only enqueues work, so the CPU-side cost of a numba launch (argument marshalling,
    tens of µs) then overlaps the previous kernel instead of sitting inside the timed
    interval. Timing single calls on an idle GPU measured that cost too: 12–18 % on a
    0.3–0.5 ms stencil (analysis/README.md).
    """
    cuda = require_gpu()
    for _ in range(warmup):
        fn()
    cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record()
        for _ in range(batch):
            fn()
        stop.record()
        stop.synchronize()
        out.append(cuda.event_elapsed_time(start, stop) / batch)
    return out


def time_within(fn: Any, budget_s: float = 2.0, max_repeats: int = 20, warmup: int = 2,
                batch: int = 5) -> list[float]:
    """Like :func:`time_ms`, with as many samples as fit in about ``budget_s`` seconds.

    One untimed call first (compilation, first-launch costs), one single timed call to size
    the rest, then at least 3 samples of up to ``batch`` calls each: a 0.5 ms stencil gets
    ``max_repeats`` samples, a 170 ms solver kernel 3 samples of 3 calls.
    """
    cuda = require_gpu()
    fn()
    cuda.synchronize()
    one = max(time_ms(fn, repeats=1, warmup=0, batch=1)[0] * 1e-3, 1e-6)
    b = max(1, min(batch, int(budget_s / (3 * one))))
    repeats = max(3, min(max_repeats, int(budget_s / (b * one))))
    return time_ms(fn, repeats=repeats, warmup=max(0, warmup - 1), batch=b)


def measure_peaks(info: DeviceInfo, quick: bool = False) -> dict[str, float]:
    """Run the micro-benchmarks; GB/s and GFLOP/s, plus how each was measured."""
    k = _build()
    reps = 5 if quick else 15
    res: dict[str, float] = {}
    res.update(_dram(k, info, reps, quick))
    res.update(_l2(k, info, reps, quick))
    for key, dt in (("fp32_gflops", np.float32), ("fp64_gflops", np.float64)):
        res[key] = _fma(k, info, reps, quick, dt)
    return res


def _dram(k: dict[str, Any], info: DeviceInfo, reps: int, quick: bool) -> dict[str, float]:
    # 2 x 512 MiB, far beyond L2; bytes read plus bytes written.
    n = (64 if quick else 128) * 2**20
    src = cuda.to_device(np.random.default_rng(0).random(n, dtype=np.float32))
    dst = cuda.device_array(n, np.float32)
    nbytes = 2.0 * 4 * n
    blocks = info.sms * 32
    t_kernel = np.median(time_ms(lambda: k["copy"][blocks, 256](src, dst), reps))
    t_memcpy = np.median(time_ms(lambda: dst.copy_to_device(src), reps))
    res = {"dram_copy_kernel_gbs": nbytes / t_kernel / 1e6,
           "dram_memcpy_gbs": nbytes / t_memcpy / 1e6}
    try:  # CuPy's copy kernel (vector loads), where installed
        import cupy

        a, b = cupy.asarray(src), cupy.empty(n, cupy.float32)
        res["dram_cupy_copy_gbs"] = nbytes / np.median(
            time_ms(lambda: cupy.copyto(b, a), reps)) / 1e6
    except Exception:  # optional; any CuPy trouble only drops this one figure
        pass
    res["dram_gbs"] = max(res.values())
    return res


def _l2(k: dict[str, Any], info: DeviceInfo, reps: int, quick: bool) -> dict[str, float]:
    # A quarter of L2 (H100's L2 is two partitions; stay well inside one), re-read.
    m = max(info.l2_bytes // 4 // 4, 2**16)
    src = cuda.to_device(np.random.default_rng(1).random(m, dtype=np.float32))
    blocks = info.sms * 8
    out = cuda.device_array(blocks * 256, np.float32)
    l2_reps = 20 if quick else 100
    t = np.median(time_ms(lambda: k["l2"][blocks, 256](src, l2_reps, out), reps))
    return {"l2_gbs": 4.0 * m * l2_reps / t / 1e6}


def _fma(k: dict[str, Any], info: DeviceInfo, reps: int, quick: bool, dt: Any) -> float:
    # 64 FMAs per loop trip per thread, 2 flops each.
    iters = 512 if quick else 2048
    blocks = info.sms * 16
    x = cuda.to_device(np.array([0.999, 1e-3], dtype=dt))
    out = cuda.device_array(blocks * 256, dt)
    kern = k["fma32"] if dt is np.float32 else k["fma64"]
    t = np.median(time_ms(lambda: kern[blocks, 256](x, iters, out), reps))
    return 2.0 * 64 * iters * blocks * 256 / t / 1e6
