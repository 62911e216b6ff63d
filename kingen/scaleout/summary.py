"""A batch's summary: ``batch_summary.csv``, ``batch_summary.html`` and the scheme ranking.

One row per fit: cell, scheme, seed, status (``ok`` or ``failed`` with its one-line
reason), the final error per protocol, the fitted parameters in the scheme file's units, and
AIC/BIC. The fitness kingen minimises is a sum of squared, normalised residuals (SSR, see
:mod:`kingen.fitting.objective`), one per recorded sample and per summary target (n of them), so
with k free parameters (the searched rate constants, plus the amplitudes and offsets solved
per recording: one amplitude unless it is fixed, or one per sweep, or two for a rundown;
one offset per sweep or per protocol where the recording chain fits them):

    AIC = n ln(SSR / n) + 2k,    BIC = n ln(SSR / n) + k ln n.

The normalisation depends on the data alone, so differences of AIC or BIC between schemes
fitted to the same cell are those of Gaussian least squares; across cells they mean
nothing. A fit on the likelihood whose noise comes from the recordings' baselines has a
fitness that is χ² = −2 log L + const itself: then AIC = χ² + 2k and BIC = χ² + k ln n
(:func:`aic_bic_chi2`).

The ranking view takes, per cell and scheme, the converged seed with the lowest AIC and
orders the schemes by it (ΔAIC, ΔBIC, Akaike weight). A fit that did not converge is not
ranked: an Akaike weight between a fit at its optimum and one that stopped short of it
says nothing. Such fits are listed under their cell with the reason (:func:`left_out`).
Where a scheme of a cell has several seeds, their spread in fitness and in every rate is
shown (:func:`seed_spread`).

>>> aic_bic(ssr=2.0, n=100, k=4)
(-383.2023..., -372.7816...)
"""

from __future__ import annotations

import csv
import html
import io
import math
from pathlib import Path
from typing import Any

from kingen.base.files import atomic_write, check_replaceable

FIRST_COLUMNS = ("id", "cell", "scheme", "seed", "status", "reason", "converged",
                 "convergence", "fitness", "n_free",
                 "n_samples", "aic", "bic", "generations", "stopped", "resumed", "search_s",
                 "wall_s", "worker", "run_file")
CSV_NAME = "batch_summary.csv"
HTML_NAME = "batch_summary.html"


def aic_bic(ssr: float, n: int, k: int) -> tuple[float, float]:
    """AIC and BIC of a least-squares fit: ``ssr`` over ``n`` residuals, ``k`` free
    parameters (NaN when undefined)."""
    if n <= 0 or not math.isfinite(ssr) or ssr < 0:
        return math.nan, math.nan
    ll = n * math.log(max(ssr, 1e-300) / n)
    return ll + 2 * k, ll + k * math.log(n)


def aic_bic_chi2(chi2: float, n: int, k: int) -> tuple[float, float]:
    """AIC and BIC from χ² = −2 log L + const (the noise known): χ² + 2k, χ² + k ln n.

    >>> aic_bic_chi2(100.0, n=1000, k=4)
    (108.0, 127.6310...)
    """
    if n <= 0 or not math.isfinite(chi2):
        return math.nan, math.nan
    return chi2 + 2 * k, chi2 + k * math.log(n)


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """The first columns, then every error and parameter column any row has, in order."""
    cols = list(FIRST_COLUMNS)
    for row in rows:
        for key in row:
            if key not in cols:
                cols.append(key)
    return cols


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.10g}"
    return str(v)


def csv_text(rows: list[dict[str, Any]]) -> str:
    """``batch_summary.csv`` as text."""
    buf = io.StringIO()
    cols = columns(rows)
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for row in rows:
        w.writerow([_cell(row.get(c)) for c in cols])
    return buf.getvalue()


def ranking(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per cell, its schemes best first: ``{"scheme", "seed", "aic", "bic", "d_aic",
    "d_bic", "weight", "fitness"}`` for the lowest-AIC seed of each scheme."""
    best: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if not _rankable(row):
            continue
        per = best.setdefault(row["cell"], {})
        cur = per.get(row["scheme"])
        if cur is None or row["aic"] < cur["aic"]:
            per[row["scheme"]] = row
    out: dict[str, list[dict[str, Any]]] = {}
    for cell, per in sorted(best.items()):
        ordered = sorted(per.values(), key=lambda r: r["aic"])
        a0, b0 = ordered[0]["aic"], min(r["bic"] for r in ordered)
        weights = [math.exp(-0.5 * (r["aic"] - a0)) for r in ordered]
        total = sum(weights)
        out[cell] = [{"scheme": r["scheme"], "seed": r["seed"], "aic": r["aic"],
                      "bic": r["bic"], "d_aic": r["aic"] - a0, "d_bic": r["bic"] - b0,
                      "weight": w / total, "fitness": r.get("fitness", math.nan)}
                     for r, w in zip(ordered, weights, strict=True)]
    return out


def _rankable(row: dict[str, Any]) -> bool:
    return (row.get("status") == "ok" and row.get("converged") is True
            and math.isfinite(row.get("aic", math.nan)))


def left_out(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per cell, the finished fits the ranking leaves out because they did not converge:
    ``{"scheme", "seed", "reason"}`` (their converged line).

    >>> left_out([{"cell": "c1", "scheme": "a", "seed": 0, "status": "ok",
    ...            "converged": False, "convergence": "not converged: maximum generations"}])
    {'c1': [{'scheme': 'a', 'seed': 0, 'reason': 'not converged: maximum generations'}]}
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("status") == "ok" and row.get("converged") is not True:
            out.setdefault(str(row["cell"]), []).append(
                {"scheme": row["scheme"], "seed": row["seed"],
                 "reason": row.get("convergence") or "not converged"})
    return dict(sorted(out.items()))


def _rate_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The fitted parameters' columns (``name (unit)``)."""
    return [c for c in columns(rows) if c not in FIRST_COLUMNS and ":" not in c
            and c.endswith(")") and " (" in c]


def seed_spread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell and scheme fitted with several seeds (finished fits): ``cell``, ``scheme``,
    ``seeds``, ``converged`` (how many), ``fitness_min``, ``fitness_max`` and ``rates``:
    per parameter, the spread of its seeds' values in decades (log10 max/min; NaN where a
    value is not positive).

    >>> rows = [{"cell": "c", "scheme": "a", "seed": s, "status": "ok", "converged": True,
    ...          "fitness": f, "k1 (ms^-1)": v} for s, f, v in ((0, 10.0, 1.0), (1, 12.0, 10.0))]
    >>> spread = seed_spread(rows)[0]
    >>> spread["seeds"], spread["fitness_max"] - spread["fitness_min"], spread["rates"]
    (2, 2.0, {'k1 (ms^-1)': 1.0})
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("status") == "ok":
            groups.setdefault((str(row["cell"]), str(row["scheme"])), []).append(row)
    rates = _rate_columns(rows)
    out = []
    for (cell, scheme), group in sorted(groups.items()):
        if len(group) < 2:
            continue
        fit = [float(r.get("fitness", math.nan)) for r in group]
        spread = {}
        for c in rates:
            v = [float(r[c]) for r in group if isinstance(r.get(c), float | int)]
            spread[c] = (math.log10(max(v) / min(v)) if v and min(v) > 0 else math.nan)
        out.append({"cell": cell, "scheme": scheme, "seeds": len(group),
                    "converged": sum(1 for r in group if r.get("converged") is True),
                    "fitness_min": min(fit), "fitness_max": max(fit), "rates": spread})
    return out


def ranking_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The ranking as plain text (printed at the end of ``kingen batch``): converged fits
    only; the others listed with their reason."""
    lines = []
    ranked_cells = ranking(rows)
    skipped = left_out(rows)
    for cell in sorted(set(ranked_cells) | set(skipped)):
        ranked = ranked_cells.get(cell, [])
        text = ", ".join(f"{r['scheme']} (ΔAIC {r['d_aic']:.3g}, w {r['weight']:.2f})"
                         for r in ranked) or "no converged fit to rank"
        lines.append(f"{cell}: {text}")
        lines += [f"  not ranked: {r['scheme']} seed {r['seed']}: {r['reason']}"
                  for r in skipped.get(cell, [])]
    for g in seed_spread(rows):
        widest = max(((v, c) for c, v in g["rates"].items() if math.isfinite(v)),
                     default=(math.nan, ""))
        lines.append(f"{g['cell']}/{g['scheme']}: {g['seeds']} seeds ({g['converged']} "
                     f"converged): fitness {g['fitness_min']:.6g} to {g['fitness_max']:.6g}"
                     + (f"; widest rate spread {widest[1]} {widest[0]:.2g} decades"
                        if widest[1] else ""))
    return lines


def html_text(rows: list[dict[str, Any]], title: str) -> str:
    """``batch_summary.html``: the ranking per cell, then every fit."""
    e = html.escape
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
           f"<title>{e(title)}</title>",
           "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;"
           "margin-bottom:1.5em}td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"
           "th{background:#eee}td.t{text-align:left}tr.failed td{background:#fde2e2}</style>",
           "</head><body>", f"<h1>{e(title)}</h1>"]
    n_ok = sum(1 for r in rows if r.get("status") == "ok")
    out.append(f"<p>{len(rows)} fits: {n_ok} ok, {len(rows) - n_ok} failed. AIC and BIC "
               "compare schemes fitted to the same cell (see the kingen documentation, "
               "'Scale out').</p>")
    n_conv = sum(1 for r in rows if _rankable(r))
    out.append(f"<p>{n_conv} of {n_ok} finished fits converged; only those are ranked.</p>")
    out.append("<h2>Schemes ranked per cell (lowest AIC first; best converged seed of each)"
               "</h2>")
    skipped = left_out(rows)
    for cell, ranked in ranking(rows).items():
        out.append(f"<h3>{e(cell)}</h3><table><tr><th>rank</th><th>scheme</th><th>seed</th>"
                   "<th>AIC</th><th>ΔAIC</th><th>BIC</th><th>ΔBIC</th>"
                   "<th>Akaike weight</th><th>fitness</th></tr>")
        for i, r in enumerate(ranked, 1):
            out.append(f"<tr><td>{i}</td><td class='t'>{e(r['scheme'])}</td><td>{r['seed']}"
                       f"</td><td>{r['aic']:.6g}</td><td>{r['d_aic']:.3g}</td>"
                       f"<td>{r['bic']:.6g}</td><td>{r['d_bic']:.3g}</td>"
                       f"<td>{r['weight']:.3f}</td><td>{r['fitness']:.4g}</td></tr>")
        out.append("</table>")
        out += _left_out_html(skipped.pop(cell, []))
    for cell, fits in skipped.items():
        out.append(f"<h3>{e(cell)}</h3><p>no converged fit to rank.</p>")
        out += _left_out_html(fits)
    out += _spread_html(seed_spread(rows))
    out.append("<h2>Every fit</h2><table><tr>")
    cols = columns(rows)
    out += [f"<th>{e(c)}</th>" for c in cols]
    out.append("</tr>")
    for row in rows:
        cls = " class='failed'" if row.get("status") != "ok" else ""
        out.append(f"<tr{cls}>" + "".join(
            f"<td class='t'>{e(_cell(row.get(c)))}</td>" if not isinstance(row.get(c), float)
            else f"<td>{e(_cell(row.get(c)))}</td>" for c in cols) + "</tr>")
    out.append("</table></body></html>")
    return "\n".join(out) + "\n"


def _left_out_html(fits: list[dict[str, Any]]) -> list[str]:
    e = html.escape
    if not fits:
        return []
    return (["<p>Not ranked (did not converge):</p><ul>"]
            + [f"<li>{e(str(r['scheme']))} seed {e(str(r['seed']))}: {e(str(r['reason']))}"
               "</li>" for r in fits] + ["</ul>"])


def _spread_html(groups: list[dict[str, Any]]) -> list[str]:
    e = html.escape
    if not groups:
        return []
    rates = sorted({c for g in groups for c in g["rates"]})
    out = ["<h2>Spread over seeds (fits of one scheme to one cell)</h2><table><tr>"
           "<th>cell</th><th>scheme</th><th>seeds</th><th>converged</th>"
           "<th>fitness min</th><th>fitness max</th>"
           + "".join(f"<th>{e(c)}: decades</th>" for c in rates) + "</tr>"]
    for g in groups:
        cells = "".join(f"<td>{_cell(g['rates'].get(c, math.nan))}</td>" for c in rates)
        out.append(f"<tr><td class='t'>{e(g['cell'])}</td><td class='t'>{e(g['scheme'])}</td>"
                   f"<td>{g['seeds']}</td><td>{g['converged']}</td>"
                   f"<td>{g['fitness_min']:.6g}</td><td>{g['fitness_max']:.6g}</td>{cells}"
                   "</tr>")
    out.append("</table>")
    return out


def write_summary(folder: Path, rows: list[dict[str, Any]], title: str) -> tuple[Path, Path]:
    """Write ``batch_summary.csv`` and ``batch_summary.html`` into ``folder`` (each
    through a temporary file: never half written)."""
    rows = sorted(rows, key=lambda r: (str(r.get("cell")), str(r.get("scheme")),
                                       int(r.get("seed", 0))))
    paths = folder / CSV_NAME, folder / HTML_NAME
    for path, text in zip(paths, (csv_text(rows), html_text(rows, title)), strict=True):
        check_replaceable(path, "output", kind="batch summary")
        atomic_write(path, lambda tmp, t=text: tmp.write_text(t, encoding="utf-8"))
    return paths
