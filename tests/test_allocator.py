"""The allocator settings a fit runs with: freed memory is reused, not faulted in afresh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kingen.base.allocator import is_glibc
from kingen.solve.options import SolverOptions

# A generation's worth of arrays, allocated, written, freed, five times over; the minor page
# faults of the last four. Arrays under 4 MB: numpy asks for huge pages from 4 MB on. With
# "thread" the generations run on a thread of their own, with twice the arrays: more than
# one heap of that thread's arena (64 MiB each).
_GENERATIONS = """
import resource, sys, threading
import numpy as np
if sys.argv[1] == "kept":
    from kingen.base.allocator import keep_freed_memory
    assert keep_freed_memory()
elif sys.argv[1] == "kept-off":  # KINGEN_KEEP_FREED_MEMORY=0 in the environment
    from kingen.base.allocator import keep_freed_memory
    assert not keep_freed_memory()
threaded = sys.argv[2:] == ["thread"]
faults = []
def generations():
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        arrays = [np.ones(3 * 2**20 // 8) for _ in range(24 if threaded else 12)]
        del arrays
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
if threaded:
    worker = threading.Thread(target=generations)
    worker.start()
    worker.join()
else:
    generations()
print(sum(faults[1:]))
"""


def _faults(mode: str, *where: str) -> int:
    out = subprocess.run([sys.executable, "-c", _GENERATIONS, mode, *where],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _huge_pages_always() -> bool:
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


# Asked without setting anything: this test process keeps its own allocator as it is. With
# huge pages always on, or malloc tuned from the environment, the default faults differ.
@pytest.mark.skipif(not is_glibc() or _huge_pages_always()
                    or any(k.startswith("MALLOC_") for k in os.environ),
                    reason="glibc's mallopt, with the kernel's and the C library's defaults")
def test_a_process_that_keeps_freed_memory_reuses_it_without_page_faults(monkeypatch):
    monkeypatch.delenv("KINGEN_KEEP_FREED_MEMORY", raising=False)
    default, kept = _faults("default"), _faults("kept")
    # by default the heap's freed top (36 MB) is trimmed and faulted in again each time
    assert default > 1000
    assert kept < default / 20


@pytest.mark.skipif(not is_glibc() or _huge_pages_always()
                    or any(k.startswith("MALLOC_") for k in os.environ),
                    reason="glibc's mallopt, with the kernel's and the C library's defaults")
def test_a_thread_of_its_own_reuses_freed_memory_beyond_its_arenas_first_heap(monkeypatch):
    # a Dask worker runs each shard, and each fit of a batch, on a thread of its own
    monkeypatch.delenv("KINGEN_KEEP_FREED_MEMORY", raising=False)
    default, kept = _faults("default", "thread"), _faults("kept", "thread")
    # 72 MB a generation: without the top pad its arena's second heap is unmapped and
    # faulted in again each time (about 3,000 faults of 4 KiB a generation)
    assert default > 1000
    assert kept < 100


@pytest.mark.skipif(not is_glibc(), reason="glibc's mallopt only")
def test_kingen_keep_freed_memory_0_leaves_the_allocator_as_it_is(monkeypatch):
    monkeypatch.setenv("KINGEN_KEEP_FREED_MEMORY", "0")
    assert _faults("kept-off") > 1000 or _huge_pages_always()


def test_the_fit_and_the_sharded_workers_set_it_up(tmp_path, monkeypatch):
    from test_fit_helpers import write_problem

    from kingen.fitting.config import load_config
    from kingen.runs import fit as run
    from kingen.scaleout import worker

    calls: list[str] = []
    monkeypatch.setattr(run, "keep_freed_memory", lambda: calls.append("fit"))
    monkeypatch.setattr(worker, "keep_freed_memory", lambda: calls.append("worker"))
    path = write_problem(tmp_path, ga="generations = 1")
    run.fit(path, progress=False)
    cfg = load_config(path)
    worker.SolverPlugin(cfg.scheme, cfg.protocols,
                        options=SolverOptions(backend="cpu")).setup()
    assert calls == ["fit", "worker"]
