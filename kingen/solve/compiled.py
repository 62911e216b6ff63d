"""Turn generated solver source into importable modules for Numba's CPU and CUDA targets.

The source is written to a file in kingen's cache folder and imported from there, so that
Numba's on-disk cache (``cache=True``) keeps the compiled code between runs: a scheme
compiles once per machine, not once per process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from kingen.codegen import N_WINDOWS, generate, generate_matrix_build, generate_propagator
from kingen.codegen.propagator import shared_stride
from kingen.codegen.span import fold_order, span_shared_extra
from kingen.codegen.span_build import span_groups
from kingen.model.scheme import Scheme

_LOADED: dict[str, ModuleType] = {}

# Occupancies below these are set to zero after each CPU step (subnormals are ~100x slower on
# Intel cores; see ``generate``). Above them every product, compensation term and square in
# the step and the objective stays a normal number.
CPU_FLUSH_BELOW = {"float64": 1e-100, "float32": 1e-25}
# Entries of the propagator's D = M − I below these are stored as zero: their products with
# occupancies above CPU_FLUSH_BELOW stay normal numbers, and no result changes.
D_FLUSH_BELOW = {"float64": 1e-150, "float32": 1e-12}

_CPU_HEADER = """\
import math
import numpy as np
from numba import get_thread_id, njit, prange
from numba import uint64 as U

F = np.{precision}
F64 = np.float64
DEVICE = njit(cache=True, nogil=True)
"""

_CPU_LAUNCH = """

@njit(parallel=True, cache=True)
def launch(N, n_sweeps, P, S0, rows_f, rows_i, row_start, conc, row_conc, drive, flt,
           sample_start, tol, a0, a1, a2, a3, fail):
    for i in prange(N * n_sweeps):
        run_thread(i // n_sweeps, i % n_sweeps, P, S0, rows_f, rows_i, row_start, conc,
                   row_conc, drive, flt, sample_start, tol, a0, a1, a2, a3, fail)
"""

_CUDA_HEADER = """\
import math
import numba
import numpy as np
from numba import cuda
from numba import uint64 as U

F = np.{precision}
F64 = np.float64
DEVICE = cuda.jit(device=True)
"""

_CUDA_LAUNCH = """

@cuda.jit({options})
def launch(N, n_sweeps, P, S0, rows_f, rows_i, row_start, conc, row_conc, drive, flt,
           sample_start, tol, a0, a1, a2, a3, fail):
    i = cuda.grid(1)
    if i < N * n_sweeps:
        run_thread(i % N, i // N, P, S0, rows_f, rows_i, row_start, conc, row_conc, drive,
                   flt, sample_start, tol, a0, a1, a2, a3, fail)
"""

# Warp-level exchange of the propagator form's lanes: the generated code calls WARP_SYNC and
# SHFL_XOR, which become numba-cuda's intrinsics on a GPU (an alias of them does not type).
# Numba's CUDA simulator has neither syncwarp nor shuffles; there a barrier per pair of lanes
# stands in for both (the simulator runs every thread of a block as a Python thread, and all
# lanes of a pair take the same branches).

_SIM_WARP = """
import threading

_SIM_LOCK = threading.Lock()
_SIM_PAIRS = {}


def _sim_pair():
    key = (cuda.blockIdx.x, cuda.threadIdx.x // LANES)
    with _SIM_LOCK:
        if key not in _SIM_PAIRS:
            _SIM_PAIRS[key] = (threading.Barrier(LANES), {})
        return _SIM_PAIRS[key]


def WARP_SYNC(mask):
    _sim_pair()[0].wait()


def SHFL_XOR(mask, value, offset):
    barrier, slots = _sim_pair()
    lane = cuda.threadIdx.x % LANES
    slots[lane] = value
    barrier.wait()
    other = slots[lane ^ offset]
    barrier.wait()
    return other
"""

# The CPU propagator form has two ways through a batch (kingen.solve.cpu chooses):
#
# - by candidate: one parallel loop over candidates, each iteration building its candidate's
#   matrices (D, then the span arrays) in its thread's slot and then running all of its
#   sweeps on them, so that the matrices are read from that core's cache while they are hot
#   (on 16 cores the separate builds scaled 4-8x, and the samples read matrices written by
#   other cores from memory);
# - by pairs: ``build`` and ``build_span`` fill the matrices of every candidate (slot =
#   candidate), then one parallel loop over (candidate, sweep) pairs, candidate by
#   candidate: for batches too small to give every thread several candidates.
#
# Both ways share ``launch``'s one loop, so that ``run_thread``, most of the module's code,
# is compiled into one parallel function only. ``{span_args}`` is ", GV, DV" with spans,
# ``{span_build}`` the span arrays' builder and ``{span_loop}`` its call per candidate (see
# kingen.codegen.span).
_CPU_PROP_LAUNCH = """

@njit(parallel=True, cache=True)
def build(N, n_keys, P, keys_f, keys_i, keys_conc, conc, D):
    for t in prange(N * n_keys):
        build_thread(t % N, t % N, t // N, P, keys_f, keys_i, keys_conc, conc, D)

{span_build}
@njit(parallel=True, cache=True)
def launch(N, n_sweeps, n_keys, n_span_keys, by_candidate, solve, P, S0, rows_f, rows_i,
           row_start, row_key, keys_f, keys_i, keys_conc, conc, row_conc, drive, flt,
           sample_start, tol, D{span_args}, a0, a1, a2, a3, fail):
    n = N if by_candidate else N * n_sweeps
    for t in prange(n):
        # one integer type in both branches (a mix of signed and unsigned would be float)
        u = np.int64(t)
        if by_candidate:
            c = u
            slot = np.int64(get_thread_id())
            first, last = np.int64(0), np.int64(n_sweeps)
            for k in range(n_keys):
                build_thread(c, slot, k, P, keys_f, keys_i, keys_conc, conc, D)
{span_loop}        else:
            c = u // n_sweeps
            slot = c
            first = u % n_sweeps
            last = first + 1
        if solve:
            for w in range(first, last):
                run_thread(c, w, slot, P, S0, rows_f, rows_i, row_start, row_key, conc,
                           row_conc, drive, flt, sample_start, tol, D{span_args}, a0, a1,
                           a2, a3, fail)
"""

_CPU_SPAN_BUILD = """
@njit(parallel=True, cache=True)
def build_span(N, n_keys, D, GV, DV):
    for t in prange(N * n_keys):
        span_thread(t // n_keys, t % n_keys, D, GV, DV)

"""

_CPU_SPAN_LOOP = """\
            for k in range(n_span_keys):
                span_thread(slot, k, D, GV, DV)
"""

_CUDA_PROP_LAUNCH = """

LANES = {lanes}
FOLD_ORDER = {fold}

@cuda.jit({options})
def build(N, n_keys, P, keys_f, keys_i, keys_conc, conc, D):
    S = D.shape[1]
    t = cuda.grid(1)
    if t < N * n_keys * S:
        r = t // N
        build_thread(t % N, r // S, r % S, P, keys_f, keys_i, keys_conc, conc, D)

{span_build}
@cuda.jit({capped})
def launch(N, n_sweeps, P, S0, rows_f, rows_i, row_start, row_key, conc, row_conc, drive,
           flt, sample_start, tol, D{span_args}, a0, a1, a2, a3, fail):
    sh = cuda.shared.array({shared}, dtype=F)
    t = cuda.grid(1)
    pair = t // {lanes}
    lane = t % {lanes}
    gmask = numba.uint32((({full}) << ((cuda.threadIdx.x % 32) // {lanes} * {lanes}))
                         & 0xFFFFFFFF)
    base = (cuda.threadIdx.x // {lanes}) * {stride}
    if pair < N * n_sweeps:
        run_thread(pair % N, pair // N, lane, gmask, sh, base, P, S0, rows_f, rows_i,
                   row_start, row_key, conc, row_conc, drive, flt, sample_start, tol,
                   D{span_args}, a0, a1, a2, a3, fail)


# candidates into and out of the layout of kingen.solve.warp_order
@cuda.jit({options})
def take(src, order, dst):
    t = cuda.grid(1)
    n = dst.shape[1]
    if t < dst.shape[0] * n:
        dst[t // n, t % n] = src[t // n, order[t % n]]


@cuda.jit({options})
def put(src, order, dst):
    t = cuda.grid(1)
    n = src.shape[1]
    w = src.shape[2]
    if t < src.shape[0] * n * w:
        s = t % (n * w) // w
        dst[t // (n * w), order[s], t % w] = src[t // (n * w), s, t % w]
"""

_CUDA_SPAN_BUILD = """
SPAN_GROUPS = {groups}


@cuda.jit({options})
def build_span(N, n_keys, D, GV, DV{fold_args}):
    # the S threads of one (key, candidate) are neighbours in a block of {groups} groups and
    # share its D (one word more per group, so that the two groups of a warp read different
    # banks) and a vector; every thread takes span_thread's barriers, and only those of an
    # existing (key, candidate) load and store. With a folded filter k counts (key, filter)
    # entries, and fold_key[k] is the key
    Ms = cuda.shared.array(({groups}, {states} * {states} + 1), dtype=F64)
    Vs = cuda.shared.array(({groups}, 2 * {states} + 1), dtype=F64)
    grp = cuda.threadIdx.x // {states}
    i = cuda.threadIdx.x % {states}
    m = cuda.blockIdx.x * {groups} + grp
    active = m < N * n_keys
    c = m % N
    k = m // N
    if active:
        kd = {key_of_k}
        for j in range({states}):
            Ms[grp, i * {states} + j] = F64(D[kd, i, j, c])
    cuda.syncthreads()
    span_thread(c, k, i, active, Ms[grp], Vs[grp], GV, DV{thread_args})

"""


def cache_dir() -> Path:
    """kingen's cache folder: ``$KINGEN_CACHE``, else ``~/.cache/kingen``."""
    root = os.environ.get("KINGEN_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "kingen"
    try:
        path.mkdir(parents=True, exist_ok=True)
        # a probe of its own: a shared name races with other processes probing at once
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test."):
            pass
    except OSError:
        path = Path(tempfile.gettempdir()) / "kingen-cache"
        path.mkdir(parents=True, exist_ok=True)
    return path


def solver_module(scheme: Scheme, mode: str, precision: str, target: str, *,
                  with_occupancy: bool = False, simulator: bool = False,
                  max_registers: int | None = None, form: str = "stage", lanes: int = 1,
                  block: int = 128, stage_rows: str = "all",
                  n_windows: int = N_WINDOWS, span: int = 1, n_sections: int = 0,
                  with_sum: bool = False, edge_rows: bool = False) -> ModuleType:
    """The compiled solver module for a scheme, mode, precision, target (cpu or cuda) and form.

    The module has ``launch``: for the CPU a parallel function over all (candidate, sweep)
    pairs, for CUDA a kernel with one thread per pair (``lanes`` threads in the propagator
    form). The propagator form's module also has ``build``, which fills D = R(hQ)ⁿ − I for
    every (candidate, key); on the CPU its ``launch`` can instead build each candidate's
    matrices in the thread that then runs its sweeps (see :mod:`kingen.solve.cpu`).
    ``block`` matters only to the CUDA propagator form with more than one lane, whose
    shared memory is sized per block; ``stage_rows`` says which rows
    the propagator form's code must also step in stage form (see
    :func:`kingen.codegen.generate_propagator`), and ``edge_rows`` whether rows whose
    concentration varies take products. With ``span`` > 1 the module also
    has ``build_span``, which fills the span arrays from D (see
    :mod:`kingen.codegen.span`). ``n_sections`` (the recording filter's second-order
    sections, read from the ``flt`` argument) and ``with_sum`` (Σw·g) are as for
    :func:`kingen.codegen.generate`.
    """
    flush = CPU_FLUSH_BELOW[precision] if target == "cpu" else 0.0
    if form == "stage":
        code = generate(scheme, mode, with_occupancy=with_occupancy,
                        compensated=precision == "float32", flush_below=flush,
                        n_windows=n_windows, n_sections=n_sections, with_sum=with_sum,
                        merged=target == "cpu")
    elif form == "propagator":
        code = generate_propagator(scheme, mode, lanes=lanes, with_occupancy=with_occupancy,
                                   compensated=precision == "float32", flush_below=flush,
                                   d_flush=D_FLUSH_BELOW[precision], stage_rows=stage_rows,
                                   n_windows=n_windows, target=target, span=span,
                                   n_sections=n_sections, with_sum=with_sum,
                                   edge_rows=edge_rows, with_build=target != "cpu")
    else:
        raise ValueError(f"form must be 'stage' or 'propagator', got {form!r}")
    if target == "cpu":
        text = _CPU_HEADER.format(precision=precision)
        launch = _CPU_LAUNCH if form == "stage" else _CPU_PROP_LAUNCH.format(
            span_args=", GV, DV" if span > 1 else "",
            span_build=_CPU_SPAN_BUILD if span > 1 else "",
            span_loop=_CPU_SPAN_LOOP if span > 1 else "")
        if form != "stage":
            # let the compiler fuse the product's multiply-adds (no reassociation: the
            # compensated float32 sums must stay as written)
            text = text.replace("DEVICE = njit(cache=True, nogil=True)",
                                "DEVICE = njit(cache=True, nogil=True, fastmath={'contract'})")
            # the matrices' builders come from the module that the scheme's kernels share
            header = text
            for s, name in [(1, "build_thread"), (span, "span_thread")][:1 + (span > 1)]:
                build = generate_matrix_build(scheme, d_flush=D_FLUSH_BELOW[precision], span=s)
                shared = _load(f"kingen_build_cpu_{precision}_{build.key}",
                               header + "\n" + build.source)
                text += f"from {shared.__name__} import {name}\n"
        text += "\n" + code.source + launch
    elif target == "cuda":
        text = _CUDA_HEADER.format(precision=precision)
        options = [] if simulator else ["cache=True"]
        # a cap binds the sample kernel alone: the builds only lost by one (3x the time at
        # 128 registers, analysis/h200/optimization_log_ideal.md, step 1)
        capped = options + ([f"max_registers={int(max_registers)}"]
                            if max_registers and not simulator else [])
        if form == "stage":
            launch = _CUDA_LAUNCH.format(options=", ".join(capped))
        else:
            # a filtered span shares the filter's state (or its currents) through the
            # pair's shared memory
            stride = shared_stride(scheme.n_states, lanes,
                                   span_shared_extra(n_sections, lanes, span))
            fold = fold_order(n_sections) if span > 1 else 0
            span_build = _CUDA_SPAN_BUILD.format(
                options=", ".join(options), groups=span_groups(scheme.n_states),
                states=scheme.n_states, fold_args=", WV, fold_key, HK" if fold else "",
                key_of_k="fold_key[k]" if fold else "k",
                thread_args=", WV, HK" if fold else "") if span > 1 else ""
            launch = _CUDA_PROP_LAUNCH.format(
                options=", ".join(options), capped=", ".join(capped), lanes=lanes,
                stride=stride, fold=fold, full=(1 << lanes) - 1, span_build=span_build,
                span_args=("" if span == 1 else ", GV, DV, WV, FC, row_fold" if fold
                           else ", GV, DV"),
                shared=max(1, (block // lanes) * stride) if lanes > 1 else 1)
        source = code.source
        if form != "stage" and simulator:
            text += _SIM_WARP
        elif form != "stage":
            source = source.replace("WARP_SYNC(", "cuda.syncwarp(").replace(
                "SHFL_XOR(", "cuda.shfl_xor_sync(")
        text += "\n" + source + launch
    else:
        raise ValueError(target)
    regs = f"_r{max_registers}" if max_registers and target == "cuda" else ""
    variant = "" if form == "stage" else f"_prop{lanes}" + (
        f"b{block}" if lanes > 1 and target == "cuda" else "") + (f"s{span}" if span > 1 else "")
    # keyed by the whole text: it names the shared builders' module too
    key = hashlib.sha1(text.encode()).hexdigest()[:16]
    name = (f"kingen_rk4_{target}_{precision}_{key}{variant}{regs}"
            f"{'_sim' if simulator else ''}")
    return _load(name, text)


def _load(name: str, text: str) -> ModuleType:
    """Module ``name`` of source ``text``, written to the cache folder (once: Numba's cache
    is keyed by the file) and imported from there."""
    if name in _LOADED:
        return _LOADED[name]
    folder = cache_dir() / "solvers"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _LOADED[name] = module
    return module
