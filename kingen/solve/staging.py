"""Device buffers kept from call to call: a GPU call's small inputs, its scratch, and the
device copies of host arrays that stay the same from call to call.

A numba-cuda allocation costs about 0.2 ms of the host's time on the H200 machine, and so
does each upload into a fresh array (``cuda.to_device``). A profile step's Gauss–Newton
sums made seventeen of them. Here a call's small host arrays travel in one upload per dtype
into a buffer that is kept while it is large enough (:func:`upload`), and its scratch
arrays are kept by name and shape (:func:`scratch`; a simulator keeps its own the same
way). A host array that many calls read has one device copy while it lives
(:func:`resident`). The two passes of a 352-candidate step went from 7.3 to 4.5 ms
(``python -m benchmarks lm_step``, ``docs/performance.md``).

A buffer is reused by the next call under the same name. That is safe on one stream: the
kernels of a call are queued on the default stream after its uploads, and a later upload
(a synchronous copy on that stream) starts only once they have run. Threads that share the
GPU (a Dask worker's tasks) take :data:`LOCK` around a call, from its uploads to its last
copy back.

Examples
--------
>>> import numpy as np
>>> from kingen.solve import staging
>>> first, count = np.array([0, 11]), np.array([10, 10])
>>> with staging.LOCK:                                            # doctest: +SKIP
...     d_first, d_count = staging.upload("example", first, count)
...     d_first.copy_to_host().tolist()
[0, 11]
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

LOCK = threading.RLock()
_buffers: dict[tuple, object] = {}
_copies: dict[int, tuple] = {}  # id → (weak reference, device copy): see resident


def upload(name: str, *arrays: np.ndarray) -> list:
    """Device views of ``arrays`` (C-ordered copies, their shapes and dtypes), uploaded
    in one copy per dtype into buffers kept under ``name``; valid until the next call
    with that name."""
    from numba import cuda

    host = [np.ascontiguousarray(a) for a in arrays]
    views: list = [None] * len(host)
    for dtype in dict.fromkeys(a.dtype for a in host):
        members = [i for i, a in enumerate(host) if a.dtype == dtype]
        total = sum(host[i].size for i in members)
        key = ("upload", name, dtype.str)
        buf = _buffers.get(key)
        if buf is None or buf.size < total:
            buf = _buffers[key] = cuda.device_array(max(total, 1), dtype=dtype)
        packed = np.concatenate([host[i].ravel() for i in members]) if total else None
        if total:
            buf[:total].copy_to_device(packed)
        offset = 0
        for i in members:
            size = host[i].size
            views[i] = buf[offset:offset + max(size, 1)].reshape(host[i].shape) if size \
                else cuda.device_array(host[i].shape, dtype=dtype)
            offset += size
    return views


def scratch(name: str, shape: tuple[int, ...], dtype=np.float64,
            buffers: dict | None = None):
    """A device array kept under ``name`` in ``buffers`` (this module's by default) while
    its shape and dtype stay the same; the kernels that use it write every entry."""
    from numba import cuda

    kept = _buffers if buffers is None else buffers
    key = ("scratch", name)
    buf = kept.get(key)
    if buf is None or buf.shape != tuple(shape) or buf.dtype != np.dtype(dtype):
        buf = kept[key] = cuda.device_array(shape, dtype=dtype)
    return buf


def resident(x: np.ndarray):
    """The device copy of a host array that stays the same from call to call (a
    Gauss–Newton layout's samples, weights and data: megabytes that every LM step would
    otherwise send again), made once and kept while the array lives."""
    from numba import cuda

    hit = _copies.get(id(x))
    if hit is not None and hit[0]() is x:
        return hit[1]
    dev = cuda.to_device(np.ascontiguousarray(x))
    _copies[id(x)] = (weakref.ref(x), dev)
    # dropped as the array dies, before its id can be another's
    weakref.finalize(x, _copies.pop, id(x), None)
    return dev
