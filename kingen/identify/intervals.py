"""The intervals of profile likelihoods: where each profile crosses the threshold, whether
it is identifiable, and which other rates move with it (:func:`profile_results`, read from a
:class:`~kingen.identify.profile.ProfileEngine`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kingen.identify.fisher import local_uncertainty

PAIR_CORRELATION = 0.95  # along a profile: |r| of another gene against the profiled one
PAIR_SLOPE = 0.5       # ... and |slope| (decades per decade)
PAIR_RANGE = 0.1       # ... and its range (decades) to call the pair "moving together"
MAX_PAIRS = 3          # the strongest pairs reported per parameter


def profile_results(eng: Any, names: list[str]) -> dict[str, Any]:
    """Intervals, identifiability and moving pairs (genes, decades), per parameter.

    Returns
    -------
    dict
        ``chi2_min``, ``threshold``, ``level``, ``fisher`` (see
        :func:`~kingen.identify.fisher.local_uncertainty`), and ``profiles``: per name,
        ``best``, ``grid``, ``delta_chi2``, ``others`` (the other genes along the
        profile), ``lower``, ``upper`` (None: open), ``lower_bounded``, ``upper_bounded``
        (the side reached the parameter's bound), ``flat``, ``identifiable``,
        ``pairs`` (names that move with it, and their slopes).
    """
    cmin = eng.chi2_min
    centre = eng.x[0]
    local = local_uncertainty(eng.fisher, names)
    out: dict[str, Any] = {"chi2_min": cmin, "chi2_optimum": float(eng.chi2[0]),
                           "threshold": eng.thr, "level": eng.level,
                           "fisher": local, "profiles": {}}
    for j in eng.genes:
        idx = eng.profile_index(j)
        vals = np.array([centre[j] if b == 0 else eng.value[b] for b in idx])
        d = eng.chi2[idx] - cmin
        xs = eng.x[idx]
        lower, upper = crossing(eng.thr, vals, d, centre[j], -1), crossing(eng.thr,
            vals, d, centre[j], 1)
        finite = np.isfinite(d)
        flat = bool(finite.any() and d[finite].max() < eng.thr)
        pairs = moving_pairs(eng, j, vals, d, xs, names)
        out["profiles"][names[j]] = {
            "gene": j, "best": float(centre[j]), "grid": vals.tolist(),
            "delta_chi2": [float(v) if math.isfinite(v) else None for v in d],
            "others": xs.tolist(),
            "lower": lower, "upper": upper,
            "lower_bounded": bool(abs(vals.min() - eng.lower[j]) < 1e-9),
            "upper_bounded": bool(abs(vals.max() - eng.upper[j]) < 1e-9),
            "flat": flat, "identifiable": lower is not None and upper is not None,
            "pairs": pairs}
    return out

def crossing(thr: float, vals: np.ndarray, d: np.ndarray, centre: float, side: int
              ) -> float | None:
    """Where Δχ² first reaches the threshold walking from the optimum (linear
    interpolation), or None."""
    order = np.argsort((vals - centre) * side)
    prev_v, prev_d = centre, 0.0
    for i in order:
        if (vals[i] - centre) * side <= 0 or not math.isfinite(d[i]):
            continue
        if d[i] >= thr:
            t = (thr - prev_d) / (d[i] - prev_d) if d[i] > prev_d else 1.0
            return float(prev_v + min(max(t, 0.0), 1.0) * (vals[i] - prev_v))
        prev_v, prev_d = float(vals[i]), float(max(d[i], prev_d))
    return None

def moving_pairs(eng: Any, j: int, vals: np.ndarray, d: np.ndarray, xs: np.ndarray,
           names: list[str]) -> list[dict[str, Any]]:
    near = np.isfinite(d) & (d <= 2.0 * eng.thr)
    if near.sum() < 3 or np.ptp(vals[near]) <= 0:
        return []
    v = vals[near] - vals[near].mean()
    out = []
    for k in range(eng.n):
        if k == j:
            continue
        y = xs[near, k]
        if np.ptp(y) < PAIR_RANGE:
            continue
        yc = y - y.mean()
        slope = float(v @ yc / (v @ v))
        r = float(v @ yc / math.sqrt((v @ v) * (yc @ yc)))
        if abs(r) >= PAIR_CORRELATION and abs(slope) >= PAIR_SLOPE:
            out.append({"name": names[k], "slope": slope, "r": r})
    out.sort(key=lambda p: -abs(p["r"]))
    return out[:MAX_PAIRS]
