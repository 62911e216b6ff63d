"""Pick the fastest correct variant of a reference kernel for the device at hand.

Each variant is a :class:`~kingen.analysis.kernels.base.KernelCase` computing the same thing;
each is checked against its reference and timed with CUDA events after a warm-up (median of
N); the fastest correct one is returned with the evidence. Nothing is cached: the reference
kernels (stencil, SGEMM) are measured, not used. The solver kernel's own search, whose
choice the solver remembers per device and scheme, is :mod:`kingen.analysis.optimize`
(``kingen tune``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kingen.analysis.hardware import device_key, time_ms
from kingen.analysis.kernels.base import KernelCase
from kingen.errors import KingenError


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def tune(cases: list[KernelCase], key: str, repeats: int = 20, warmup: int = 3
         ) -> TuneResult:
    """Time each variant, reject those that fail their check, return the fastest.

    Parameters
    ----------
    cases
        Variants of one computation (same inputs, same answer).
    key
        What was tuned, e.g. ``"stencil-default"``.
    repeats, warmup
        Timed and untimed launches per variant; the median is compared.

    Raises
    ------
    KingenError
        When no variant passes its check.
    """
    res = TuneResult(key=key, device=device_key(), best="")
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
    return res
