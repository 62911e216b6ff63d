"""One GPU call of a :class:`~kingen.solve.batch.Simulator`: the device arrays it keeps from
call to call, the kernels' arguments, and the kernels in the order they run (the matrix
builds, the span builds, the sample kernel; in the propagator form's objective calls, the
candidates gathered into :mod:`kingen.solve.warp_order`'s layout before them and their
results scattered back after).

The host's share of a call is what it does before the first kernel starts and after the
last one ends. The resting occupancies, which only the sample kernel reads, are solved
while the builds run (:func:`cuda_call`'s ``S0`` given as a function), and
:meth:`~kingen.solve.batch.Simulator.run` makes its result store while the sample kernel
runs.

It is the simulator's GPU half, kept in a module of its own, and reads the simulator's own
fields (its device arrays, its schedule, its plan).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kingen.codegen.propagator import padded_states
from kingen.codegen.span import fold_padded
from kingen.solve import staging
from kingen.solve.warp_order import warp_order

if TYPE_CHECKING:
    from kingen.solve.batch import Simulator

_BUILD_BLOCK = 128
# matched from the message's start, which numba-cuda may open with a terminal's bold code
LOW_OCCUPANCY = r"(\x1b\[[0-9;]*m)?Grid size \d+ will likely result in GPU under-utilization"


def cuda_call(sim: Simulator, module, config, P: np.ndarray,
              S0: np.ndarray | Callable[[], np.ndarray], extra: tuple, fail: np.ndarray,
              mode: str, on_device: bool = False, *, tol: float
              ) -> tuple[Callable[[], None], list]:
    """Upload what changes per call of ``sim``; return the launch and the device outputs.

    ``S0`` given as a function is called, and its result uploaded, once the launch has
    queued the matrix builds (which do not read it): the host's solve overlaps them. The
    launch's ``stages`` are its kernels by name, in order, for timing them apart (with
    ``S0`` given as an array).
    """
    from numba import cuda

    # Arrays that do not change between calls stay on the device.
    d = sim._device_arrays
    if not d:
        s = sim.schedule
        for name, arr in (("rows_f", s.rows_f), ("rows_i", s.rows_i),
                          ("row_start", s.row_start), ("conc", s.conc),
                          ("row_conc", s.row_conc), ("drive", sim.drive),
                          ("flt", sim._flt()), ("sample_start", s.sample_start)):
            d[name] = cuda.to_device(arr)
        if sim.objective is not None:
            d["win"] = cuda.to_device(sim.objective.windows)
    pad = padding(config)
    if sim.objective is not None and (
            "data" not in d or d["data"].shape[0] < sim.objective.data.size + pad):
        # spans load the samples a span ahead without clamping the index: zeros past
        # the end (weight 0) for the last span's loads to land on
        for name in ("data", "weight"):
            values = getattr(sim.objective, name)
            d[name] = cuda.to_device(np.concatenate([values, np.zeros(pad)]))
    n = P.shape[1]
    # objective calls of the propagator form lay their candidates out by their own steps
    # (kingen.solve.warp_order): uploaded in the caller's order, gathered into the layout's
    # on the device, and their results scattered back
    order = (warp_order(sim.scheme, sim.schedule, P)
             if mode == "objective" and config.form != "stage" else None)
    dP = staging.scratch("P", P.shape, P.dtype, d)
    dS0 = staging.scratch("S0", (sim.scheme.n_states, n), P.dtype, d)
    up_P, up_S0 = dP, dS0
    if order is not None:
        up_P = staging.scratch("P_given", P.shape, P.dtype, d)
        up_S0 = staging.scratch("S0_given", (sim.scheme.n_states, n), P.dtype, d)
        d_order = staging.scratch("order", (n,), np.int64, d)
        d_order.copy_to_device(order)
    up_P.copy_to_device(P)
    if not callable(S0):
        up_S0.copy_to_device(S0)
    if mode == "objective":
        # every thread writes all its outputs and its failure code: nothing to upload
        dev_extra = (d["data"], d["weight"], d["win"],
                     staging.scratch("out", sim._out_shape(n), np.float64, d))
        dfail = staging.scratch("fail", fail.shape, fail.dtype, d)
    elif on_device:  # the traces stay where written; the rest in kept buffers (a fresh
        # allocation costs the host 0.2 ms a call, kingen.solve.staging). The kernel
        # writes a failure code only on failure, so the codes go up zeroed; occupancies
        # go up when asked for; the two unused arguments are never read.
        dev_extra = tuple(staging.scratch(f"arg{k}", x.shape, x.dtype, d)
                          for k, x in enumerate(extra))
        dfail = staging.scratch("fail", fail.shape, fail.dtype, d)
        dfail.copy_to_device(fail)
        if extra[1].size > 1:  # not the (1, 1, 1) stand-in
            dev_extra[1].copy_to_device(extra[1])
    else:
        dev_extra = tuple(cuda.to_device(x) for x in extra)
        dfail = cuda.to_device(fail)
    if config.form == "stage":
        total = n * sim.n_sweeps
        common = tuple(d[k] for k in ("rows_f", "rows_i", "row_start", "conc",
                                      "row_conc", "drive", "flt", "sample_start"))
        args = (n, sim.n_sweeps, dP, dS0) + common + (tol,) + \
            dev_extra + (dfail,)
        build = None
    else:
        plan, S = sim.propagator_plan(), sim.scheme.n_states
        if "row_key" not in d:
            d["row_key"] = cuda.to_device(plan.row_key)
            d["keys_f"] = cuda.to_device(plan.keys_f)
            d["keys_i"] = cuda.to_device(plan.keys_i)
            d["keys_conc"] = cuda.to_device(plan.keys_conc)
        # D is rebuilt by every call before it is read: keep one buffer per shape
        # rather than paying a large allocation per generation
        d_key = ("D", (plan.n_keys, S, padded_states(S, config.lanes), n), P.dtype.str)
        if d_key not in d:
            for key in [k for k in d if isinstance(k, tuple) and k[0] == "D"]:
                del d[key]
            d[d_key] = cuda.device_array(d_key[1], dtype=P.dtype)
        dD = d[d_key]
        span_arrays: tuple = ()
        fold = getattr(module, "FOLD_ORDER", 0) if config.span > 1 else 0
        if config.span > 1:
            span_arrays = span_buffers(sim, n, config, fold)
        build_extra, launch_extra, n_span = (), (), plan.n_span_keys
        if fold:  # built by fold entries (key, filter), each row reading its own
            host, dev_key = sim._fold_arrays(config), ("fold", config.lanes, config.span)
            if dev_key not in d:
                d[dev_key] = tuple(map(cuda.to_device, host))
            row_fold, fold_key, hk, fc = d[dev_key]
            build_extra, launch_extra = (fold_key, hk), (fc, row_fold)
            n_span = int(host[0].max()) + 1
        total = n * sim.n_sweeps * config.lanes
        common = tuple(d[k] for k in ("rows_f", "rows_i", "row_start", "row_key", "conc",
                                      "row_conc", "drive", "flt", "sample_start"))
        args = (n, sim.n_sweeps, dP, dS0) + common + (tol, dD) + \
            span_arrays + launch_extra + dev_extra + (dfail,)
        n_build = n * plan.n_keys * sim.scheme.n_states
        build_args = (n, plan.n_keys, dP, d["keys_f"], d["keys_i"], d["keys_conc"],
                      d["conc"], dD)
        build = (n_build + _BUILD_BLOCK - 1) // _BUILD_BLOCK if n_build else None
    blocks = (total + config.block - 1) // config.block

    given_out = (dev_extra, dfail)
    if order is not None:  # the kernels write the layout's order, put back after them
        dev_extra = (*dev_extra[:3],
                     staging.scratch("out_laid", sim._out_shape(n), np.float64, d))
        dfail = staging.scratch("fail_laid", fail.shape, fail.dtype, d)
        args = args[:-2] + (dev_extra[3], dfail)

    stages = []
    if order is not None:
        stages.append(("order", lambda: _take(module, up_P, d_order, dP)))
    if build:
        stages.append(("build", lambda: module.build[build, _BUILD_BLOCK](*build_args)))
        if span_arrays and n_span:
            groups = module.SPAN_GROUPS
            span_blocks = (n * n_span + groups - 1) // groups
            stages.append(("build_span", lambda: module.build_span[
                span_blocks, groups * sim.scheme.n_states](n, n_span, dD, *span_arrays,
                                                            *build_extra)))
    if order is not None:
        stages.append(("order_rest", lambda: _take(module, up_S0, d_order, dS0)))
    stages.append(("launch", lambda: module.launch[blocks, config.block](*args)))
    if order is not None:
        stages.append(("unorder", lambda: _put(module, dev_extra[3], dfail, d_order,
                                               *given_out)))
    s0_stage = "launch" if order is None else "order_rest"

    def call() -> None:
        with warnings.catch_warnings():
            # Small batches under-fill the GPU; that is expected, not the user's concern.
            # By message: numba-cuda raises its own class, not numba.core.errors'.
            warnings.filterwarnings("ignore", message=LOW_OCCUPANCY)
            for name, stage in stages:
                if name == s0_stage and callable(S0):
                    # a copy from pageable memory follows the builds in the stream
                    up_S0.copy_to_device(S0())
                stage()

    call.stages = stages  # each kernel alone, in order, for timing them apart
    return call, list(given_out[0]) + [given_out[1]]


def _take(module, given, order, laid) -> None:
    """Gather (rows, N) ``given`` into the layout's order (:mod:`kingen.solve.warp_order`)."""
    total = laid.shape[0] * laid.shape[1]
    module.take[(total + _BUILD_BLOCK - 1) // _BUILD_BLOCK, _BUILD_BLOCK](given, order, laid)


def _put(module, out, fail, order, given_out: tuple, given_fail) -> None:
    """Scatter the kernels' results (out (values, N, sweeps), fail (sweeps, N)) back into
    the caller's order."""
    for src, dst in ((out, given_out[3]),
                     (fail.reshape(fail.shape[0], fail.shape[1], 1),
                      given_fail.reshape(fail.shape[0], fail.shape[1], 1))):
        total = src.shape[0] * src.shape[1] * src.shape[2]
        module.put[(total + _BUILD_BLOCK - 1) // _BUILD_BLOCK, _BUILD_BLOCK](src, order, dst)


def span_buffers(sim: Simulator, n: int, config, fold: int = 0) -> tuple:
    """The span arrays GV (key, row, sample, candidate) and DV (D's layout) on the
    device, one set per shape, rebuilt by every call; the constant keys have them
    (one key's worth at least: a device array is never empty). With a folded filter
    of order ``fold`` they are indexed by (key, filter) entries, and WV (entry, filter
    state component, row, candidate) follows (see :mod:`kingen.codegen.span`)."""
    from numba import cuda

    keys = max(1, sim._fold_arrays(config)[1].size if fold
               else sim.propagator_plan().n_span_keys)
    S = sim.scheme.n_states
    shapes = ((keys, S, config.span, n),
              (keys, S, padded_states(S, config.lanes), n))
    if fold:
        shapes += ((keys, fold_padded(fold, config.lanes), S, n),)
    key = ("span", shapes, np.dtype(sim.precision).str)
    d = sim._device_arrays
    if key not in d:
        for old in [k for k in d if isinstance(k, tuple) and k[0] == "span"]:
            del d[old]
        d[key] = tuple(cuda.device_array(shape, dtype=sim.precision) for shape in shapes)
    return d[key]


def padding(config) -> int:
    """Zeros the device's data and weights carry past their end for ``config``: a sweep's
    last span loads the samples of the span after it (kingen.codegen.span), two spans on
    at most.

    >>> from kingen.solve.cuda import LaunchConfig
    >>> padding(LaunchConfig.parse("prop-l8-s16-b128")), padding(LaunchConfig.parse("prop-l4-b128"))
    (32, 0)
    """
    return 2 * config.span if config.span > 1 else 0
