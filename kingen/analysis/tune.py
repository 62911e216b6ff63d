"""Pick the fastest correct variant of a kernel for the device at hand, and remember it.

Each variant is a :class:`~kingen.analysis.kernels.base.KernelCase` computing the same thing;
each is checked against its reference, timed with CUDA events after a warm-up (median of N),
and the fastest correct one is cached per device and key in kingen's one tuning cache (the
solver's, :func:`kingen.solve.cuda.record_entry`), under keys ``kernel|<device>|<key>``.
The solver kernel's own search is :mod:`kingen.analysis.optimize` (``kingen tune``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kingen.analysis.hardware import device_key, time_ms
from kingen.analysis.kernels.base import KernelCase
from kingen.errors import KingenError
from kingen.solve.cuda import load_tuning, record_entry


@dataclass
class TuneResult:
    """The choice and the evidence for it (times in ms, relative errors)."""

    key: str
    device: str
    best: str
    times_ms: dict[str, float] = field(default_factory=dict)
    spread_ms: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def tune(cases: list[KernelCase], key: str, repeats: int = 20, warmup: int = 3,
         use_cache: bool = True) -> TuneResult:
    """Time each variant, reject those that fail their check, return the fastest.

    Parameters
    ----------
    cases
        Variants of one computation (same inputs, same answer).
    key
        What was tuned, e.g. ``"rk4-9states-4096x8"``; the cache is per device and key.
    repeats, warmup
        Timed and untimed launches per variant; the median is compared.
    use_cache
        Return a cached choice for this device and key when its variant is still offered.

    Raises
    ------
    KingenError
        When no variant passes its check.
    """
    dev = device_key()
    cache_key = f"kernel|{dev}|{key}"
    names = {c.name for c in cases}
    if use_cache:
        hit = load_tuning().get(cache_key)
        if hit and hit.get("best") in names:
            return TuneResult(**{**hit, "cached": True})
    res = TuneResult(key=key, device=dev, best="")
    for case in cases:
        ok, err = case.verify()
        res.errors[case.name] = err
        if not ok:
            res.rejected.append(case.name)
            continue
        t = time_ms(case.launch, repeats=repeats, warmup=warmup)
        res.times_ms[case.name] = float(np.median(t))
        res.spread_ms[case.name] = float(np.max(t) - np.min(t))
    if not res.times_ms:
        raise KingenError("no variant passed its check against the reference",
                          field="tune", value=key)
    res.best = min(res.times_ms, key=res.times_ms.__getitem__)
    record_entry(cache_key, {k: v for k, v in res.to_json().items() if k != "cached"})
    return res
