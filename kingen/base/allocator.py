"""The process's memory allocator, set up for a fit: freed memory is kept for reuse.

A fit allocates and frees the same large arrays every generation: the offspring, their
rate constants, the solver's inputs and results, the next population (megabytes each at
tens of thousands of candidates). glibc's ``malloc`` gives blocks above its mmap threshold
back to the system when they are freed, and trims the free top of its heap, so each
generation's arrays come back as fresh pages, and the first write to each 4 KiB page costs
a page fault (dearer still in a virtual machine). A Dask nanny even starts its workers
with ``MALLOC_TRIM_THRESHOLD_=65536``, trimming as much as it can. A thread other than
the main one (a Dask worker's task: a shard, a batch's fit) allocates from an arena of its
own, made of heaps of 64 MiB, and glibc unmaps each heap it added to such an arena as soon
as that heap is wholly free, whatever the trim threshold: a thread whose generation needs
more than one heap faults the others in afresh every generation.

:func:`keep_freed_memory` raises both limits and pads the top of every heap by a heap's
size (``mallopt``), so the process reuses the memory it freed, on every thread: after its
first generations a fit's memory stays at its peak instead of going back and forth.
Measured at 65,536 candidates:

- the GA's step on the 2-core CI machine, 46.2 → 35.8 ms (median; the work around the
  operators 27.5 → 19.1 ms; ``benchmarks/results/cpu-2core/ga_step/
  2026-11-24_5bbd686_allocator_{default,kept}.json``);
- on the H100 machine's host, the solver's host work: preparation 11.1–11.3 → 9.4–9.7
  ms, results 12.3–14.6 → 7.1–7.6 ms; the generation as a whole did not change beyond
  that host's noise (median 0.441–0.443 s against 0.441 s;
  ``benchmarks/results/h100/fit_gpu/2026-11-24_5bbd686_heap_{old,new}_65536_{1,2}.json``).

The top pad matters on threads whose generation outgrows one heap: 72 MB of arrays a
generation on a thread of its own faulted about 3,000 pages in afresh each generation
without it, none with it (``tests/test_allocator.py``). A shard of 32,768 R&H candidates on
a Dask worker of the H100 machine stays within one heap: 6.5–11.5 faults per evaluation
before, 4.5–5 after, its host work unchanged within noise
(``benchmarks/results/h100/host_work/2026-11-24_e4b3831_pad_{old,new}_32768_{1,2}.json``).

Other C libraries (macOS, musl) are left as they are, and so is glibc where
``KINGEN_KEEP_FREED_MEMORY=0`` is set: the memory a process holds then falls back when a fit
frees it (a Dask worker's memory limits, for one, watch what a process holds).
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 * 2**20
"""Blocks up to this size come from the heap: glibc's largest threshold on 64-bit
(``HEAP_MAX_SIZE / 2``); larger ones are still mapped and unmapped."""
TRIM_THRESHOLD = 2**30
"""The free top of the heap the process keeps (1 GiB) before it gives any back."""
TOP_PAD = 64 * 2**20
"""The free space kept at the top of every heap (a thread's arena's heap size, 64 MiB on
64-bit): glibc then never finds a thread's heap free enough to unmap. It is address space,
not memory: a page is resident only once written."""

_kept: bool | None = None


def keep_freed_memory() -> bool:
    """Keep the memory a fit frees for its next generation (glibc only; once per process).

    Returns
    -------
    bool
        Whether glibc took the settings (False on other C libraries, or where
        ``KINGEN_KEEP_FREED_MEMORY=0``).

    Examples
    --------
    On glibc it takes (unless ``KINGEN_KEEP_FREED_MEMORY=0``), elsewhere it does nothing:

    >>> from kingen.base.allocator import is_glibc, keep_freed_memory
    >>> keep_freed_memory() == is_glibc()
    True
    """
    global _kept
    if _kept is None:
        _kept = _set_thresholds()
    return _kept


def is_glibc() -> bool:
    """Whether this process runs on glibc (whose ``mallopt`` :func:`keep_freed_memory`
    sets); asks only, sets nothing."""
    return _mallopt() is not None


def _mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl's mallopt does nothing
            return None
        return libc.mallopt
    except (OSError, AttributeError):
        return None


def _set_thresholds() -> bool:
    if os.environ.get("KINGEN_KEEP_FREED_MEMORY", "").strip() == "0":
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; the mmap threshold first (it also stops glibc's own
    # adjustment of both thresholds)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                and mallopt(_M_TOP_PAD, TOP_PAD))
