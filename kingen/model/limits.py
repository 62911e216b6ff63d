"""Resource limits: how large a scheme, sweep or fit kingen takes on without ``--force``.

Each limit is checked on an estimate made *before* anything is allocated or solved, so a
file asking for terabytes or for years of work ends in one line giving the figure and the
limit, not in ``ArrayMemoryError`` or a hang. ``--force`` on the command line, ``force =
true`` in a fit configuration, or ``force=True`` in the Python calls lifts every limit, for
a machine that can do it. The defaults are far above any published AMPA model or protocol:

=============================  ==================  =========================================
limit                          default             what it bounds
=============================  ==================  =========================================
:data:`MAX_STATES`             500 states          states of a scheme (solver code is
                                                   generated per state)
:data:`MAX_SAMPLES_PER_SWEEP`  10,000,000          samples of one sweep (duration / dt)
:data:`MAX_PULSES_PER_SWEEP`   2,000               pulses or transients of one sweep
:data:`MAX_SWEEPS`             100,000             sweeps of one protocol
:data:`MAX_STEPS_PER_CANDIDATE`  1,000,000,000     RK4 steps to simulate one candidate
                                                   under every protocol
:data:`MAX_EXACT_RATE`         1e10 /ms            fastest exit rate of a state that the
                                                   exact reference solves (1e13 /s: beyond
                                                   any molecular process)
:data:`MEMORY_FRACTION`        0.5                 share of the free memory one
                                                   generation's arrays (a fit), or a
                                                   simulation's traces, may take
=============================  ==================  =========================================
"""

from __future__ import annotations

import os
from typing import Any

from kingen.errors import KingenError

MAX_STATES = 500
MAX_SAMPLES_PER_SWEEP = 10_000_000
# Segmenting a sweep costs pulses squared: 2,000 pulses is a 20 s train at 100 Hz.
MAX_PULSES_PER_SWEEP = 2_000
MAX_SWEEPS = 100_000
MAX_STEPS_PER_CANDIDATE = 1_000_000_000
# expm's rounding is about 3e-19 times the fastest rate, relative to the current (1e-9 at
# this limit, 4e-3 at 1e16 /ms; tests/test_reference.py, against a lumped scheme).
MAX_EXACT_RATE = 1e10
MEMORY_FRACTION = 0.5
FORCE_HINT = "pass --force (force = true in a fit configuration) to try anyway"


def free_memory() -> int | None:
    """Bytes of memory free now, or None where the system does not say."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not POSIX, or the name is unknown
        return None


def size_text(n_bytes: float) -> str:
    """Bytes as ``74.5 GiB``."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.3g} {unit}" if unit != "B" else f"{value:.0f} B"
        value /= 1024
    return f"{value:.3g} PiB"  # pragma: no cover


def count_text(n: float) -> str:
    """A count as ``12,345`` or ``1.5e+13``."""
    return f"{int(n):,}" if n < 1e15 else f"{n:.3g}"


def check(needed: float, limit: float, what: str, *, force: bool, file: str | None = None,
          field: str | None = None, value: Any = None, hint: str = "") -> None:
    """Refuse ``needed`` above ``limit`` unless ``force``.

    Parameters
    ----------
    needed, limit
        The estimate and the limit, as counts.
    what
        What is counted, e.g. ``"samples in one sweep"``: the message reads ``needs
        <needed> <what>; the limit is <limit>``.
    hint
        What to change instead (``"raise dt or shorten the sweep"``).
    """
    if force or needed <= limit:
        return
    fix = f"{hint}, or {FORCE_HINT}" if hint else FORCE_HINT
    raise KingenError(f"needs {count_text(needed)} {what}; the limit is {count_text(limit)}: "
                      f"{fix}", file=file, field=field, value=value)


def check_memory(n_bytes: float, what: str, *, force: bool, file: str | None = None,
                 field: str | None = None, value: Any = None, hint: str = "") -> None:
    """Refuse to allocate ``n_bytes`` for ``what`` beyond :data:`MEMORY_FRACTION` of the free
    memory, unless ``force``; says nothing where the free memory is unknown."""
    free = free_memory()
    if force or free is None or n_bytes <= MEMORY_FRACTION * free:
        return
    fix = f"{hint}, or {FORCE_HINT}" if hint else FORCE_HINT
    raise KingenError(f"needs {size_text(n_bytes)} for {what}; {size_text(free)} free (the "
                      f"limit is {MEMORY_FRACTION:.0%} of that): {fix}", file=file,
                      field=field, value=value)
