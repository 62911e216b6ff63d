"""The uncertainty of a fit as a table, in the scheme file's units: from a profile's results
(:mod:`kingen.identify.profile`) or from the local uncertainty alone
(:mod:`kingen.identify.fisher`). Used by ``kingen profile``, the fit summary, ``kingen
report``, ``kingen plot`` and ``kingen export``; the rows are also stored in the run file.

>>> rows = [{"name": "k2o", "unit": "ms^-1", "best": 4.2, "lower": 3.98, "upper": 4.43,
...          "identifiable": True, "flat": False, "pairs": []},
...         {"name": "k5o", "unit": "ms^-1", "best": 4e-4, "lower": None, "upper": None,
...          "identifiable": False, "flat": True, "pairs": []}]
>>> print(table(rows, 0.95))  # doctest: +NORMALIZE_WHITESPACE
parameter best lower upper unit identifiable (95 % profile-likelihood interval)
k2o 4.2 3.98 4.43 ms^-1 yes
k5o 0.0004 open open ms^-1 no (flat)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kingen.fitting.params import file_unit_factor


def _fmt(v: float | None) -> str:
    return "open" if v is None else f"{v:.4g}"


def identifiable_text(r: dict[str, Any]) -> str:
    """``yes``, ``no (flat)``, ``no (open below)``, ... for one row."""
    if r["identifiable"]:
        return "yes"
    if r.get("flat"):
        return "no (flat)"
    return "no (open " + " and ".join(
        s for s, v in (("below", r["lower"]), ("above", r["upper"])) if v is None) + ")"


def table(rows: list[dict[str, Any]], level: float, *, what: str = "profile-likelihood"
          ) -> str:
    """Best value, interval, identifiable yes/no, file units; one line per parameter."""
    pct = f"{100 * level:g} %"
    lines = [f"{'parameter':<12}{'best':>11}{'lower':>11}{'upper':>11}  {'unit':<14}"
             f"identifiable  ({pct} {what} interval)"]
    for r in rows:
        why = identifiable_text(r)
        line = (f"{r['name']:<12}{r['best']:>11.4g}{_fmt(r['lower']):>11}"
                f"{_fmt(r['upper']):>11}  {r['unit']:<14}{why}")
        if r.get("pairs"):
            line += "; moves with " + ", ".join(
                f"{p['name']} (slope {p['slope']:+.2g})" for p in r["pairs"])
        lines.append(line)
    return "\n".join(lines)


def rows_from_results(results: dict[str, Any], scheme, pmap) -> list[dict[str, Any]]:
    """Per profiled parameter, its figures in the scheme file's units.

    ``scheme`` is the scheme as its file gives it (``file_value``: the file's own value);
    each row also carries its profile (``grid`` in file units, ``delta_chi2``) and the
    ``threshold``, for plots."""
    z = math.sqrt(results["threshold"])
    fisher = results["fisher"]
    out = []
    for name, prof in results["profiles"].items():
        j = int(prof["gene"])
        p = scheme.parameters[int(pmap.free_index[j])]
        factor = file_unit_factor(p)
        log = bool(pmap.log[j])

        def value(g: float | None, log: bool = log, factor: float = factor) -> float | None:
            if g is None or not math.isfinite(g):
                return None
            return (10.0 ** g if log else g) / factor

        se = float(fisher["se_log10"][j])
        best = prof["best"]
        out.append({
            "name": name, "unit": p.unit, "best": value(best), "lower": value(prof["lower"]),
            "upper": value(prof["upper"]), "identifiable": bool(prof["identifiable"]),
            "flat": bool(prof["flat"]), "pairs": prof["pairs"], "se_log10": se,
            "fisher_lower": value(best - z * se) if math.isfinite(se) else None,
            "fisher_upper": value(best + z * se) if math.isfinite(se) else None,
            "log": log, "file_value": p.value / factor,
            "grid": [value(g) for g in prof["grid"]], "delta_chi2": prof["delta_chi2"],
            "threshold": results["threshold"], "level": results["level"]})
    return out


def disagreements(results: dict[str, Any]) -> list[str]:
    """Where the quadratic (Fisher) interval and the profile disagree (a factor 2 in width
    on a side, or one open and the other closed)."""
    z = math.sqrt(results["threshold"])
    out = []
    for name, prof in results["profiles"].items():
        se = float(results["fisher"]["se_log10"][int(prof["gene"])])
        q = z * se
        for side, key in (("below", "lower"), ("above", "upper")):
            v = prof[key]
            if v is None and math.isfinite(q):
                bounded = prof[f"{key}_bounded"]
                out.append(f"{name}: the standard error ({se:.3g} decades) predicts a closed "
                           f"interval {side}, but the profile does not cross the threshold "
                           f"{side} (up to {'the bound' if bounded else 'the widest point'}"
                           "): trust the profile")
            elif v is not None and not math.isfinite(q):
                out.append(f"{name}: the standard error is infinite, but the profile closes "
                           f"{side}")
            elif v is not None:
                width = abs(v - prof["best"])
                if width > 0 and not 0.5 <= q / width <= 2.0:
                    out.append(f"{name}: {side} the optimum, the standard error predicts "
                               f"{q:.3g} decades and the profile gives {width:.3g}: the "
                               "likelihood is not quadratic there; trust the profile")
    return out


def local_rows(local: dict[str, Any], scheme, pmap, level: float = 0.95
               ) -> list[dict[str, Any]]:
    """Rows from the local uncertainty alone (:func:`~kingen.identify.local.local_at_best`):
    the quadratic interval best ×/÷ 10^(z·se), in file units; identifiable where the
    standard error is finite and the interval inside the bounds."""
    from scipy.stats import chi2

    z = math.sqrt(float(chi2.ppf(level, 1)))
    out = []
    for j, name in enumerate(local["names"]):
        p = scheme.parameters[int(pmap.free_index[j])]
        factor = file_unit_factor(p)
        log = bool(pmap.log[j])
        best = float(local["best_log10"][j])
        se = float(local["se_log10"][j])

        def value(g: float, log: bool = log, factor: float = factor) -> float:
            return (10.0 ** g if log else g) / factor

        lo_g, hi_g = best - z * se, best + z * se
        inside = math.isfinite(se) and pmap.lower[j] <= lo_g and hi_g <= pmap.upper[j]
        out.append({"name": name, "unit": p.unit, "best": value(best), "se_log10": se,
                    "lower": value(lo_g) if inside else None,
                    "upper": value(hi_g) if inside else None,
                    "identifiable": bool(inside), "flat": not math.isfinite(se),
                    "pairs": [], "log": log})
    return out


def strong_correlations(local: dict[str, Any], limit: float = 0.95) -> list[str]:
    """Pairs of genes whose correlation at the optimum is beyond ±``limit``."""
    names = local["names"]
    corr = np.array(local["correlation"], dtype=float)
    out = []
    for i in range(len(names)):
        for k in range(i + 1, len(names)):
            c = corr[i, k]
            if math.isfinite(c) and abs(c) > limit:
                out.append(f"{names[i]} and {names[k]} (correlation {c:+.3f})")
    return out
