"""A run's report: one self-contained HTML page and its markdown twin.

The page embeds its figures as base64 PNG (it can be mailed or archived alone); the
markdown links the PNG files written beside it. Both hold the same sections: status,
fitted parameters (in the scheme file's units, with bounds), error per protocol, features
fitted vs data, polish, run settings and environment.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kingen.base.files import check_replaceable
from kingen.errors import KingenError
from kingen.outputs.export import write_text_atomic
from kingen.outputs.plot import plot_run_detailed
from kingen.store import RunStore, RunView, as_store

FIGURE_CAPTIONS = {
    "fits_overview": "Fitted (colour) and recorded (grey) currents, every protocol.",
    "dose_response": "Dose-response: peak and steady-state responses, data and fit.",
    "recovery": "Recovery from desensitization: I2/I1 against the interval between pulses.",
    "convergence": "Best and median error per generation; the best candidate's error per "
                   "protocol.",
    "parameters": "Rate constants of each generation's best candidate, as positions "
                  "within their bounds (log scale).",
    "correlations": "Correlations of the free rates (log10) at the best, from the Fisher "
                    "information (—: not determined by the data).",
    "profiles": "Profile likelihoods (kingen profile): Δχ² of the best fit with the rate held "
                "at each value, against the threshold of the confidence level; shaded: the "
                "interval; solid: the best value; dotted: the model file's value.",
}


@dataclass
class _Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class _Content:
    title: str
    status: list[tuple[str, str]]
    tables: list[_Table] = field(default_factory=list)
    figures: list[tuple[str, Path, str]] = field(default_factory=list)  # (stem, png, caption)
    skipped: dict[str, str] = field(default_factory=dict)
    config_text: str = ""
    settings: str = ""


def _g(x: Any, digits: int = 4) -> str:
    """A number for a table: 4 significant digits, '—' for missing."""
    if x is None:
        return "—"
    if isinstance(x, (list, tuple)):
        return "—"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not math.isfinite(v):
        return "—"
    return f"{v:.{digits}g}"


def _feature_unit(key: str) -> str:
    for suffix, unit in (("_ms", "ms"), ("_pA", "pA"), ("_mM", "mM")):
        if key.endswith(suffix):
            return unit
    return ""


def _feature_cell(features: dict, key: str) -> str:
    """A feature's value, with its bootstrap interval when there is one, or the reason it
    is not determined (kingen.experiment.features' ``not_determined``)."""
    why = (features.get("not_determined") or {}).get(key)
    if why:
        return why
    ci = features.get(f"{key}_ci")
    if isinstance(ci, list) and len(ci) == 2 and all(
            isinstance(v, (int, float)) and math.isfinite(v) for v in ci):
        return f"{_g(features.get(key))} [{_g(ci[0], 3)}, {_g(ci[1], 3)}]"
    return _g(features.get(key))


def _collect(run: RunView, out_dir: Path) -> _Content:
    store = run.store
    scheme = run.scheme
    best = run.best
    n_gen = store.n_generations
    finished = store.finished
    c = _Content(title=f"kingen fit: {scheme.name}", status=[])
    hist = run.history(population=False)
    t_total = hist["timings"].get("total_s")
    status = [
        ("Run file", run.path),
        ("Created", store.created or "—"),
        ("Generations completed", str(n_gen)),
        ("Finished", finished or "no: still running, or stopped without saying why "
                                 "(killed?); kingen resume continues it"),
        ("Scheme", f"{scheme.name} ({scheme.n_states} states, {scheme.n_params} rate "
                   f"constants, {int(run.free_mask.sum())} free)"),
        ("Protocols", ", ".join(run.names)),
        ("Population", str(store.population_size)),
    ]
    if best is not None:
        status.append(("Best fitness", _g(best["fitness"], 6)))
    if t_total is not None and np.isfinite(t_total).any():
        status.append(("Time in generations", f"{np.nansum(t_total):.1f} s"))
    solver = hist["timings"].get("solver_s")
    if solver is not None and t_total is not None and np.nansum(t_total) > 0:
        share = np.nansum(solver) / np.nansum(t_total)
        status.append(("Share of time in the solver", f"{100 * share:.0f} %"))
    status.append(("Report written", _dt.datetime.now(_dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")))
    c.status = status

    # Parameters, in the scheme file's units.
    try:
        params, origin = run.fitted_params()
    except KingenError:
        params, origin = None, "no candidate yet"
    start = run.in_file_units(scheme.values)
    lo, hi = (run.in_file_units(b) for b in run.bounds)
    fitted = None if params is None else run.in_file_units(params)
    roles = run.roles()
    rows = []
    for k, p in enumerate(scheme.parameters):
        role = roles[p.name]
        note = ""
        if fitted is not None and role == "free" and p.scale == "log":
            pos = (math.log(fitted[k]) - math.log(lo[k])) / (math.log(hi[k]) - math.log(lo[k]))
            note = "at lower bound" if pos < 0.01 else ("at upper bound" if pos > 0.99 else "")
        rows.append([p.name, _g(None if fitted is None else fitted[k]), _g(start[k]),
                     _g(lo[k]), _g(hi[k]), p.unit, role, note])
    c.tables.append(_Table("Fitted parameters", ["parameter", "fitted", "scheme file",
                                                 "lower", "upper", "unit", "", "note"],
                           rows, f"Values of the {origin}, in the scheme file's units."))

    if best is not None:
        rows = [[name, _g(best["errors"].get(name), 4),
                 _g(best["amplitudes"].get(name), 4)] for name in run.names]
        c.tables.append(_Table("Error per protocol", ["protocol", "error", "amplitude"],
                               rows, "Amplitude: the number of channels fitted for that "
                                     "recording (fitted current = amplitude × the scheme's "
                                     "one-channel current)."))
        rows = []
        for name in run.names:
            fit, data = run.features(name, "fit"), run.features(name, "data")
            for key in [k for k in {**data, **fit} if not isinstance(
                    fit.get(k, data.get(k)), (list, dict))]:
                d, f = data.get(key), fit.get(key)
                ratio = (_g(float(f) / float(d), 3) if isinstance(d, (int, float))
                         and isinstance(f, (int, float)) and d else "—")
                rows.append([name, key, _feature_cell(data, key), _feature_cell(fit, key),
                             ratio, _feature_unit(key)])
        if rows:
            c.tables.append(_Table("Features, fitted vs data",
                                   ["protocol", "feature", "data", "fit", "fit / data",
                                    "unit"], rows))
        polish = best.get("polish")
        if polish and polish.get("objective") == "chi2":
            c.tables.extend(_refinement_tables(polish))
        elif polish:  # a run written before fits minimised the likelihood
            rows = [[str(k), _g(v, 6) if not isinstance(v, (dict, list, str)) else
                     (v if isinstance(v, str) else json.dumps(v))] for k, v in polish.items()]
            c.tables.append(_Table("Local polish", ["", "value"], rows,
                                   "Least-squares polish of the best candidate in log space."))

    c.tables.extend(_uncertainty_tables(run))

    env = store.environment
    c.tables.append(_Table("Environment", ["", "value"], [[k, v] for k, v in env.items()]))

    written, skipped = plot_run_detailed(run, out_dir, on_skip=lambda _: None)
    c.skipped = skipped
    order = ["fits_overview", "dose_response", "recovery", "convergence", "parameters",
             "correlations", "profiles"]
    for stem in order:
        pngs = [p for p in written.get(stem, []) if p.suffix == ".png"]
        if pngs:
            c.figures.append((stem, pngs[0], FIGURE_CAPTIONS[stem]))
    c.config_text = store.config_text
    c.settings = json.dumps(store.config, indent=2, default=str)
    return c


REFINEMENT_ROWS = (("starts", "hall-of-fame members refined"),
                   ("chi2_before", "χ² of the search's best"),
                   ("chi2_after", "χ² after the refinement"),
                   ("iterations", "iterations of the best's descent"),
                   ("evaluations", "candidates evaluated"),
                   ("stopped", "why the descent stopped"),
                   ("converged", "converged"))


def _refinement_tables(record: dict) -> list[_Table]:
    """The final Levenberg–Marquardt refinement, the noise model the χ² was scored with, and
    the later updates of the best (by ``kingen profile``), from the best's ``polish`` record."""
    rows = [[label, _g(record[key], 8) if isinstance(record.get(key), float)
             else str(record.get(key, "—"))] for key, label in REFINEMENT_ROWS]
    tables = [_Table("Refinement", ["", "value"], rows,
                     "The fit's last step: Levenberg–Marquardt on χ² (−2 log L) from the "
                     "best hall-of-fame members.")]
    noise = record.get("noise") or {}
    names = noise.get("names") or []
    if names:
        def col(key: str) -> list:
            values = noise.get(key) or []
            return list(values) + [None] * (len(names) - len(values))

        rows = [[name, _g(sigma, 4) if sigma is not None else "—", source,
                 _g(n_eff, 4) if n_eff is not None else "—"]
                for name, sigma, source, n_eff in zip(
                    names, col("sigma_pA"), col("source"), col("n_eff"))]
        tables.append(_Table("Noise model", ["protocol", "σ (pA)", "from", "n_eff"], rows,
                             "Each protocol's noise, which weights its residuals in χ²."))
    updates = record.get("updates") or []
    if updates:
        rows = [[str(i + 1), _update_line(note)] for i, note in enumerate(updates)]
        tables.append(_Table("Updates of the best", ["", "note"], rows,
                             "Better points found after the fit, by kingen profile."))
    return tables


def _update_line(note: object) -> str:
    """One later update of the best, as a line: when, by what, χ² before and after."""
    if not isinstance(note, dict):
        return str(note)
    old, new = note.get("old_fitness"), note.get("new_fitness")
    change = (f"; χ² {_g(old, 10)} → {_g(new, 10)}"
              if isinstance(old, float) and isinstance(new, float) else "")
    return f"{note.get('when', '?')}: {note.get('what', 'updated')}{change}"


def _uncertainty_tables(run: RunView) -> list[_Table]:
    """The identifiability table (profiles once ``kingen profile`` has run, else the local
    approximation from the end of the fit), and the noise model it rests on."""
    from kingen.identify.table import identifiable_text, strong_correlations

    found = run.uncertainty()
    if found is None:
        return []
    rows_in, what, level = found
    rows = []
    for r in rows_in:
        moves = ", ".join(f"{p['name']} ({p['slope']:+.2g})" for p in r.get("pairs") or [])
        rows.append([r["name"], _g(r["best"]), "open" if r["lower"] is None else _g(r["lower"]),
                     "open" if r["upper"] is None else _g(r["upper"]), r["unit"],
                     identifiable_text(r), moves])
    note = (f"{100 * level:g} % {what} intervals, in the scheme file's units. "
            + ("Identifiable: the profile crosses the threshold on both sides; 'moves "
               "with': rates that change along the profile (slope in decades per decade)."
               if what.startswith("profile") else
               "From the standard errors at the best (a quadratic approximation); run "
               f"`kingen profile {run.path}` for profile-likelihood intervals."))
    local = run.local_uncertainty or {}
    strong = strong_correlations(local) if local.get("correlation") else []
    if strong:
        note += " Strongly correlated at the best: " + "; ".join(strong) + "."
    out = [_Table("Identifiability", ["parameter", "best", "lower", "upper", "unit",
                                      "identifiable", "moves with"], rows, note)]
    noise = local.get("noise") or (run.profiles or {}).get("noise")
    if noise:
        nrows = [[name, _g(s), src or "—", _g(tau, 3), _g(neff, 5), _g(rms)]
                 for name, s, src, tau, neff, rms in zip(
                     noise["names"], noise["sigma_pA"], noise["source"], noise["tau_samples"],
                     noise["n_eff"], noise["residual_rms_pA"], strict=True)]
        out.append(_Table("Noise model", ["protocol", "σ (pA)", "from", "τ (samples)",
                                          "independent samples", "residual rms (pA)"], nrows,
                          " ".join(noise.get("notes") or [])
                          or "σ: the noise of the likelihood; τ: its correlation time."))
    return out


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1200px; color: #222; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; } tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; } pre { background: #f6f6f6; padding: 0.8em;
overflow-x: auto; } .note { color: #555; font-size: 0.9em; }
"""


def _is_num(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _html_table(t: _Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in t.header)
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{e(v)}</td>' if _is_num(v) else f"<td>{e(v)}</td>"
                         for v in row) + "</tr>" for row in t.rows)
    note = f'<p class="note">{e(t.note)}</p>' if t.note else ""
    return f"<h2>{e(t.title)}</h2>{note}<table><tr>{head}</tr>{body}</table>"


def _html(c: _Content) -> str:
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>{e(c.title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(c.title)}</h1>",
             _html_table(_Table("Status", ["", ""], [[k, v] for k, v in c.status]))]
    parts += [_html_table(t) for t in c.tables if t.title != "Environment"]
    parts.append("<h2>Figures</h2>")
    for stem, png, caption in c.figures:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(f"<figure><img alt='{e(stem)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{e(caption)} ({e(png.name)}, PDF beside it)"
                     f"</figcaption></figure>")
    for stem, why in c.skipped.items():
        parts.append(f"<p class='note'>Figure {e(stem)} not drawn: {e(why)}.</p>")
    parts.append("<h2>Run settings</h2><p class='note'>The configuration file as given:</p>"
                 f"<pre>{e(c.config_text)}</pre><details><summary>Resolved settings "
                 f"(JSON)</summary><pre>{e(c.settings)}</pre></details>")
    parts += [_html_table(t) for t in c.tables if t.title == "Environment"]
    parts.append("</body></html>")
    return "\n".join(parts)


# --------------------------------------------------------------------------- markdown

def _md_cell(v: str) -> str:
    return v.replace("|", "\\|").replace("\n", " ")


def _md_table(t: _Table) -> str:
    lines = [f"## {t.title}", ""]
    if t.note:
        lines += [t.note, ""]
    lines.append("| " + " | ".join(_md_cell(h) or " " for h in t.header) + " |")
    lines.append("|" + "|".join("---:" if t.rows and all(_is_num(r[i]) for r in t.rows)
                                else "---" for i in range(len(t.header))) + "|")
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in t.rows]
    return "\n".join(lines) + "\n"


def _markdown(c: _Content, out_dir: Path) -> str:
    parts = [f"# {c.title}", "", _md_table(_Table("Status", ["", ""],
                                                  [[k, v] for k, v in c.status]))]
    parts += [_md_table(t) for t in c.tables if t.title != "Environment"]
    parts += ["## Figures", ""]
    for stem, png, caption in c.figures:
        rel = os.path.relpath(png, out_dir)
        parts += [f"![{stem}]({rel})", "", f"*{caption}*", ""]
    for stem, why in c.skipped.items():
        parts += [f"Figure {stem} not drawn: {why}.", ""]
    parts += ["## Run settings", "", "```toml", c.config_text.rstrip(), "```", ""]
    parts += [_md_table(t) for t in c.tables if t.title == "Environment"]
    return "\n".join(parts)


def write_report(run: str | os.PathLike[str] | RunStore,
                 out_dir: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """Write ``report.html`` (self-contained) and ``report.md`` with the run's figures.

    Parameters
    ----------
    run
        A run file or an open :class:`RunStore` (a live run is reported as it stands).
    out_dir
        Where to write; default ``<run file stem>_report`` beside the run file.

    Returns
    -------
    (Path, Path)
        The HTML and markdown files.

    Examples
    --------
    >>> import kingen
    >>> html, md = kingen.write_report("demo.h5")  # doctest: +SKIP
    >>> html.name, md.name  # doctest: +SKIP
    ('report.html', 'report.md')
    """
    store, opened = as_store(run)
    try:
        out = Path(out_dir) if out_dir is not None else store.path.with_name(
            f"{store.path.stem}_report")
        html_path, md_path = out / "report.html", out / "report.md"
        for path in (html_path, md_path):  # before any figure is drawn
            check_replaceable(path, "-o", kind="report",
                              inputs={store.path: "the run file being reported"})
        out.mkdir(parents=True, exist_ok=True)
        content = _collect(RunView(store), out)
        write_text_atomic(html_path, _html(content))
        write_text_atomic(md_path, _markdown(content, out))
        return html_path, md_path
    finally:
        if opened:
            store.close()


__all__ = ["write_report"]
