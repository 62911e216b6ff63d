"""Figures of a run: fits, dose-response, recovery, convergence, parameters.

Figures are drawn on :class:`matplotlib.figure.Figure` objects, never through pyplot, so no
backend or global state is touched (safe in notebooks, servers and threads). Every figure
has a fixed size in inches and is saved at :data:`DPI` without tight cropping, so a PNG's
pixel size is ``FIGURE_SIZES[kind] * DPI``. Files are written to a temporary name and moved
into place: a crash never leaves half an image.

Colours: protocol ``k`` of a run is drawn in ``PROTOCOL_COLORS[k]`` in every figure;
recorded data are grey.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from kingen._version import __version__
from kingen.base.files import atomic_write, check_replaceable
from kingen.errors import KingenError
from kingen.store import RunStore, RunView, as_store

log = logging.getLogger("kingen.outputs.plot")

DPI = 100
FIGURE_SIZES: dict[str, tuple[float, float]] = {
    "fit": (8.0, 5.0),
    "fits_overview": (12.0, 8.0),
    "dose_response": (6.5, 4.8),
    "recovery": (6.5, 4.8),
    "convergence": (11.0, 4.5),
    "parameters": (10.0, 5.5),
    "correlations": (7.0, 6.0),
    "traces": (8.0, 5.0),
}
PROTOCOL_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
                   "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f")
DATA_COLOR = "0.55"
# A current before the recording's filter, drawn behind the filtered one
UNFILTERED = 0.35
FORMATS = ("png", "pdf")
STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": DPI,
    "savefig.dpi": DPI, "pdf.fonttype": 42,  # editable text in Illustrator/Inkscape
}


def protocol_color(index: int) -> str:
    """The colour of the run's ``index``-th protocol."""
    return PROTOCOL_COLORS[index % len(PROTOCOL_COLORS)]


def safe_name(name: str) -> str:
    """A protocol name made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "protocol"


def safe_names(names: Sequence[str]) -> dict[str, str]:
    """Each protocol name made safe for a file name, and distinct: names that clean to the
    same text (``deact α``, ``deact β``) would write over each other's files.

    >>> safe_names(["deact α", "deact β", "recovery"])
    {'deact α': 'deact', 'deact β': 'deact_2', 'recovery': 'recovery'}
    """
    out: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        base = candidate = safe_name(name)
        n = 1
        while candidate.lower() in taken:  # case too: some filesystems ignore it
            n += 1
            candidate = f"{base}_{n}"
        taken.add(candidate.lower())
        out[name] = candidate
    return out


def _figure(kind: str, **kwargs: Any) -> Figure:
    return Figure(figsize=FIGURE_SIZES[kind], dpi=DPI, layout="constrained", **kwargs)


def _save(fig: Figure, path: Path) -> Path:
    """Save atomically (temporary file, then rename); the format comes from the suffix.

    The file names kingen as its maker (PNG ``Software``, PDF and SVG ``Creator``): that is
    how a later figure knows it may replace it (:func:`kingen.base.files.check_replaceable`).
    """
    fmt = path.suffix.lstrip(".").lower() or "png"
    check_replaceable(path, "-o", kind="figure")
    maker = {"png": "Software", "pdf": "Creator", "svg": "Creator"}.get(fmt)
    metadata = {maker: f"kingen {__version__}"} if maker else None

    def write(tmp: Path) -> None:
        with matplotlib.rc_context(STYLE):
            fig.savefig(tmp, format=fmt, dpi=DPI, metadata=metadata)

    atomic_write(path, write)
    return path


def _save_all(fig: Figure, out_dir: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    return [_save(fig, out_dir / f"{stem}.{fmt}") for fmt in formats]


# --------------------------------------------------------------------------- simulate --plot

def plot_traces(time_ms: list[np.ndarray], currents_pA: list[np.ndarray], labels: list[str],
                title: str, out: str | os.PathLike[str],
                concentration_mM: list[np.ndarray] | None = None,
                unfiltered_pA: list[np.ndarray] | None = None) -> Path:
    """Current against time, one line per sweep, with the concentration on a small axis above.

    Parameters
    ----------
    time_ms, currents_pA
        One array per sweep, ms and pA.
    labels
        One label per sweep (shown in the legend up to 12 sweeps).
    title
        The figure's title.
    out
        The image file; its suffix picks the format (``.png`` if none).
    concentration_mM
        The agonist concentration per sweep, mM, or None (no upper axis).
    unfiltered_pA
        With a recording filter, the currents before it, drawn lighter behind them.

    Returns
    -------
    Path
        The file written.
    """
    path = Path(out)
    if not path.suffix:
        path = path.with_suffix(".png")
    n = len(currents_pA)
    if len(time_ms) != n or len(labels) != n:
        raise KingenError(f"{len(time_ms)} time arrays, {n} currents and {len(labels)} labels",
                          file=str(path), field="plot")
    with matplotlib.rc_context(STYLE):
        fig = _figure("traces")
        if concentration_mM is not None:
            gs = fig.add_gridspec(2, 1, height_ratios=(1, 4))
            ax_c = fig.add_subplot(gs[0])
            ax = fig.add_subplot(gs[1], sharex=ax_c)
        else:
            ax_c, ax = None, fig.add_subplot()
        colors = _sweep_colors(n)
        for k in range(n):
            if unfiltered_pA is not None:
                ax.plot(time_ms[k], unfiltered_pA[k], color=colors[k], lw=0.9, alpha=UNFILTERED,
                        label="unfiltered" if k == 0 else None, zorder=1)
            ax.plot(time_ms[k], currents_pA[k], color=colors[k], lw=1.1, label=str(labels[k]))
            if ax_c is not None and concentration_mM is not None:
                ax_c.plot(time_ms[k], concentration_mM[k], color=colors[k], lw=1.0)
        if ax_c is not None:
            ax_c.set_ylabel("[agonist] (mM)")
            ax_c.tick_params(labelbottom=False)
            ax_c.set_title(title)
        else:
            ax.set_title(title)
        ax.set_xlabel("Time (ms)")
        ax.set_ylabel("Current (pA)")
        if n <= 12:
            ax.legend(title="sweep", frameon=False, ncols=1 if n <= 6 else 2)
        return _save(fig, path)


def _sweep_colors(n: int, base: str | None = None) -> list[Any]:
    """Distinct colours for overlaid sweeps: shades of ``base``, or viridis."""
    if n == 1:
        return [base or PROTOCOL_COLORS[0]]
    if base is None:
        cmap = matplotlib.colormaps["viridis"]
        return [cmap(x) for x in np.linspace(0.0, 0.9, n)]
    rgb = np.array(matplotlib.colors.to_rgb(base))
    # From a darker shade to a lighter tint of one hue: the protocol stays recognisable
    # and the sweep order stays visible.
    out = []
    for f in np.linspace(-0.4, 0.4, n):
        out.append(tuple(rgb * (1 + f) if f < 0 else rgb + (1 - rgb) * f))
    return out


# --------------------------------------------------------------------------- the run

def _color(r: RunView, name: str) -> str:
    return protocol_color(r.names.index(name))


def plot_run(run: str | os.PathLike[str] | RunStore, out_dir: str | os.PathLike[str], *,
             formats: Sequence[str] = FORMATS,
             on_skip: Callable[[str], None] | None = None) -> list[Path]:
    """Write every figure of a run (PNG and PDF) into ``out_dir``.

    Works on a finished run and on a live one (it reads what is committed). A figure whose
    data are absent (no dose-response protocol, no generation yet...) is skipped, and
    ``on_skip`` (default: the ``kingen.outputs.plot`` logger) is told why.

    Parameters
    ----------
    run
        A run file or an open :class:`RunStore`.
    out_dir
        Where to write; created if needed.
    formats
        Image formats (suffixes).
    on_skip
        Called with one line per skipped figure.

    Returns
    -------
    list of Path
        The files written.

    Examples
    --------
    >>> import kingen
    >>> paths = kingen.plot_run("demo.h5", "demo_figures", formats=("png",))  # doctest: +SKIP
    >>> sorted(p.name for p in paths)[:2]  # doctest: +SKIP
    ['convergence.png', 'dose_response.png']
    """
    paths, _ = plot_run_detailed(run, out_dir, formats=formats, on_skip=on_skip)
    return [p for group in paths.values() for p in group]


def plot_run_detailed(run: str | os.PathLike[str] | RunStore | RunView,
                      out_dir: str | os.PathLike[str], *, formats: Sequence[str] = FORMATS,
                      on_skip: Callable[[str], None] | None = None,
                      ) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """Like :func:`plot_run`, returning ``({figure: [files]}, {figure: why skipped})``;
    ``run`` may also be a :class:`~kingen.store.RunView` already open."""
    if isinstance(run, RunView):
        return _draw_all(run, Path(out_dir), formats, on_skip or log.info)
    store, opened = as_store(run)
    try:
        return _draw_all(RunView(store), Path(out_dir), formats, on_skip or log.info)
    finally:
        if opened:
            store.close()


def _draw_all(r: RunView, out: Path, formats: Sequence[str], tell: Callable[[str], None]
              ) -> tuple[dict[str, list[Path]], dict[str, str]]:
    written: dict[str, list[Path]] = {}
    skipped: dict[str, str] = {}
    figures: list[tuple[str, Callable[[], Figure | str]]] = []
    for name, file_name in safe_names(r.names).items():
        figures.append((f"fit_{file_name}", lambda n=name: _fit_figure(r, n)))
    figures += [("fits_overview", lambda: _overview_figure(r)),
                ("dose_response", lambda: _dose_figure(r)),
                ("recovery", lambda: _recovery_figure(r)),
                ("convergence", lambda: _convergence_figure(r)),
                ("parameters", lambda: _parameter_figure(r)),
                ("correlations", lambda: _correlation_figure(r)),
                ("profiles", lambda: profile_figure(r))]
    for stem, _ in figures:  # every file checked before any is drawn
        for fmt in formats:
            check_replaceable(out / f"{stem}.{fmt}", "-o", kind="figure",
                              inputs={r.path: "the run file being plotted"})
    for stem, draw in figures:
        with matplotlib.rc_context(STYLE):
            result = draw()
        if isinstance(result, str):
            skipped[stem] = result
            tell(f"skipped {stem}: {result}")
            continue
        written[stem] = _save_all(result, out, stem, formats)
    return written, skipped


# --------------------------------------------------------------------------- fits

def _draw_fit(ax: Any, r: RunView, name: str, *, legend: bool = True) -> bool:
    if r.best is None or name not in r.best["traces"]:
        return False
    tr = r.best["traces"][name]
    color = _color(r, name)
    n = len(tr["time_ms"])
    if tr["data_pA"] is not None:
        for k in range(n):
            ax.plot(tr["time_ms"][k], tr["data_pA"][k], color=DATA_COLOR, lw=0.8, alpha=0.8,
                    label="data" if k == 0 else None, zorder=1)
    shades = _sweep_colors(n, color)
    filtered = tr.get("model_pA") is not None
    for k in range(n):
        if filtered:  # the model's own current, before the recording's filter
            ax.plot(tr["time_ms"][k], tr["model_pA"][k], color=shades[k], lw=1.0,
                    alpha=UNFILTERED, label="model, unfiltered" if k == 0 else None, zorder=2)
        ax.plot(tr["time_ms"][k], tr["fit_pA"][k], color=shades[k], lw=1.4,
                label=("fit, filtered" if filtered else "fit") if k == 0 else None, zorder=2)
    protocol = r.protocols[r.names.index(name)]
    err = r.best["errors"].get(name, math.nan)
    about = [protocol.kind] if protocol.kind != name else []
    about += [f"{n} sweeps"] if n > 1 else []
    detail = f" ({', '.join(about)})" if about else ""
    ax.set_title(f"{name}{detail}; error {err:.3g}")
    ax.set_xlabel("Time (ms)")
    ax.set_ylabel("Current (pA)")
    if legend:
        ax.legend(frameon=False, loc="best")
    return True


def _fit_figure(r: RunView, name: str) -> Figure | str:
    if r.best is None:
        return "no best candidate in the run file yet"
    if name not in r.best["traces"]:
        return f"no traces of protocol {name!r} were stored"
    fig = _figure("fit")
    gs = fig.add_gridspec(2, 1, height_ratios=(1, 5))
    ax_c = fig.add_subplot(gs[0])
    ax = fig.add_subplot(gs[1], sharex=ax_c)
    _draw_fit(ax, r, name)
    title = ax.get_title()
    ax.set_title("")
    protocol = r.protocols[r.names.index(name)]
    tr = r.best["traces"][name]
    shades = _sweep_colors(len(tr["time_ms"]), _color(r, name))
    for k, (sweep, t) in enumerate(zip(protocol.sweeps, tr["time_ms"], strict=False)):
        ax_c.plot(t, sweep.concentration(t), color=shades[k], lw=1.0)
    ax_c.set_ylabel("[agonist]\n(mM)")
    ax_c.tick_params(labelbottom=False)
    ax_c.set_title(f"{r.title}: {title}")
    return fig


def _overview_figure(r: RunView) -> Figure | str:
    if r.best is None or not r.best["traces"]:
        return "no best candidate with traces in the run file yet"
    names = [n for n in r.names if n in r.best["traces"]]
    cols = 1 if len(names) == 1 else 2
    rows = math.ceil(len(names) / cols)
    fig = _figure("fits_overview")
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, name in enumerate(names):
        _draw_fit(axes[k // cols][k % cols], r, name, legend=(k == 0))
    for k in range(len(names), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    fig.suptitle(f"{r.title}: fitted (colour) and recorded (grey) currents")
    return fig


# --------------------------------------------------------------------------- summary curves

def _kind(r: RunView, kind: str) -> list[str]:
    return [p.name for p in r.protocols if p.kind == kind]


def _curves(r: RunView, name: str, key: str, from_targets: Callable[[Any], np.ndarray | None]
            ) -> tuple[np.ndarray, np.ndarray]:
    """(data, fit) rows of a summary curve (``dose_response``, ``recovery``) of protocol
    ``name``: from the best candidate's features, the data's from the targets when the
    protocol was fitted to summary targets."""
    data = np.array(r.features(name, "data").get(key) or [], dtype=float)
    tgt = r.targets.get(name)
    if data.size == 0 and tgt is not None:
        rows = from_targets(tgt)
        data = data if rows is None else rows
    return data, np.array(r.features(name, "fit").get(key) or [], dtype=float)


def _dose_rows(t: Any) -> np.ndarray | None:
    d = t.dose_response
    if d is None:
        return None
    ss = d.ss_pA if d.ss_pA is not None else np.full(d.peak_pA.size, np.nan)
    return np.column_stack([d.concentration_mM, d.peak_pA, ss])


def _recovery_rows(t: Any) -> np.ndarray | None:
    return None if t.recovery is None else np.column_stack([t.recovery.interval_ms,
                                                            t.recovery.ratio])


def _dose_figure(r: RunView) -> Figure | str:
    names = _kind(r, "dose_response")
    if not names:
        return "no dose-response protocol in this run"
    fig = _figure("dose_response")
    ax = fig.add_subplot()
    drawn = False
    for name in names:
        color = _color(r, name)
        data, fit = _curves(r, name, "dose_response", _dose_rows)
        if data.size == 0 and fit.size == 0:
            continue
        # Normalise both to the recorded peak at the highest response, so that the fit's
        # amplitude error stays visible.
        ref_rows = data if data.size else fit
        norm = np.nanmax(np.abs(ref_rows[:, 1])) or 1.0
        feats = r.features(name, "fit")
        for col, label, marker, ls in ((1, "peak", "o", "-"), (2, "steady state", "s", "--")):
            if data.size and np.any(np.isfinite(data[:, col])):
                ax.plot(data[:, 0], np.abs(data[:, col]) / norm, marker, color=DATA_COLOR,
                        mfc="white" if col == 2 else DATA_COLOR, ms=6,
                        label=f"data, {label}")
            if fit.size and np.any(np.isfinite(fit[:, col])):
                key = "ec50_peak_mM" if col == 1 else "ec50_ss_mM"
                ec50 = feats.get(key, math.nan)
                extra = f" (EC50 {ec50:.3g} mM)" if ec50 == ec50 else ""
                ax.plot(fit[:, 0], np.abs(fit[:, col]) / norm, ls, marker=marker, ms=3,
                        color=color, label=f"fit, {label}{extra}")
        drawn = True
    if not drawn:
        return "the dose-response protocol has neither data nor fitted features stored"
    ax.set_xscale("log")
    ax.set_xlabel("Agonist concentration (mM)")
    ax.set_ylabel("Response |I| / recorded peak")
    ax.set_title(f"{r.title}: dose-response")
    ax.legend(frameon=False, loc="upper left")
    return fig


def _recovery_figure(r: RunView) -> Figure | str:
    names = _kind(r, "recovery")
    if not names:
        return "no recovery (paired-pulse) protocol in this run"
    fig = _figure("recovery")
    ax = fig.add_subplot()
    drawn = False
    for name in names:
        color = _color(r, name)
        data, fit = _curves(r, name, "recovery", _recovery_rows)
        if data.size:
            tau = r.features(name, "data").get("tau_rec_ms", math.nan)
            extra = f" (τ {tau:.3g} ms)" if tau == tau else ""
            ax.plot(data[:, 0], data[:, 1], "o", color=DATA_COLOR, ms=6,
                    label=f"data{extra}")
        if fit.size:
            tau = r.features(name, "fit").get("tau_rec_ms", math.nan)
            extra = f" (τ {tau:.3g} ms)" if tau == tau else ""
            ax.plot(fit[:, 0], fit[:, 1], "-", marker="o", ms=3, color=color,
                    label=f"fit, {name}{extra}")
        drawn = drawn or bool(data.size or fit.size)
    if not drawn:
        return "the recovery protocol has neither data nor fitted features stored"
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.axhline(1.0, color="0.85", lw=0.8, zorder=0)
    ax.set_xlabel("Interval between pulses (ms)")
    ax.set_ylabel("Recovery I2 / I1")
    ax.set_title(f"{r.title}: recovery from desensitization")
    ax.legend(frameon=False, loc="lower right")
    return fig


# --------------------------------------------------------------------------- the search

def _convergence_figure(r: RunView) -> Figure | str:
    h = r.history(population=False)
    if h["generation"].size == 0:
        return "no completed generation yet"
    gens = h["generation"]
    fig = _figure("convergence")
    ax, ax_p = fig.subplots(1, 2)
    fit = h["fitness"]
    with np.errstate(all="ignore"):
        best = np.where(np.isfinite(h["best"]), h["best"], np.nanmin(fit, axis=1))
        median = np.where(np.isfinite(h["median"]), h["median"],
                          np.nanmedian(np.where(np.isfinite(fit), fit, np.nan), axis=1))
    ax.plot(gens, best, color="black", lw=1.6, label="best")
    ax.plot(gens, median, color="0.5", lw=1.2, ls="--", label="median")
    _log_if_positive(ax, np.concatenate([best, median]))
    ax.set_xlabel("Generation")
    ax.set_ylabel("Error (weighted, dimensionless)")
    ax.set_title("Convergence")
    ax.legend(frameon=False)
    # The best candidate's error under each protocol, in the protocol colours.
    err = h["errors"]
    masked = np.where(np.isfinite(fit), fit, np.inf)
    idx = np.argmin(masked, axis=1)
    per = err[np.arange(len(idx)), idx]
    for k, name in enumerate(r.names):
        ax_p.plot(gens, per[:, k], color=protocol_color(k), lw=1.3, label=name)
    _log_if_positive(ax_p, per.ravel())
    ax_p.set_xlabel("Generation")
    ax_p.set_ylabel("Error of the best candidate")
    ax_p.set_title("Error per protocol")
    ax_p.legend(frameon=False, fontsize=8)
    fig.suptitle(f"{r.title}: search progress")
    return fig


def _log_if_positive(ax: Any, values: np.ndarray) -> None:
    v = values[np.isfinite(values)]
    if v.size and np.all(v > 0):
        ax.set_yscale("log")


def best_so_far(params: np.ndarray, fitness: np.ndarray) -> np.ndarray:
    """Each generation's best candidate so far (the hall of fame's first as of then), from
    every generation's best (rows of ``params``, their ``fitness``; NaN where none).

    A generation's own best may be worse than an earlier one (a search without elitism
    lost it; CMA-ES samples anew): the run's best is the best so far, never the last
    population's.

    Examples
    --------
    >>> best_so_far(np.array([[1.0], [2.0], [3.0]]), np.array([0.5, 0.9, 0.1]))[:, 0].tolist()
    [1.0, 1.0, 3.0]
    """
    out = np.array(params, dtype=float, copy=True)
    best, row = math.inf, None
    for g, f in enumerate(np.asarray(fitness, dtype=float)):
        if math.isfinite(f) and f < best:
            best, row = f, out[g].copy()
        if row is not None:
            out[g] = row
    return out


def _within_bounds(p: Any, values: np.ndarray) -> np.ndarray:
    """Positions of ``values`` of parameter ``p`` within its bounds (0 lower, 1 upper)."""
    with np.errstate(all="ignore"):
        if p.scale == "log":
            return (np.log10(values) - math.log10(p.lower)) / (
                math.log10(p.upper) - math.log10(p.lower))
        return (values - p.lower) / (p.upper - p.lower)


def _parameter_figure(r: RunView) -> Figure | str:
    gens, params, fit = r.store.best_per_generation()
    if gens.size == 0:
        return "no completed generation yet"
    free = np.flatnonzero(r.free_mask)
    if free.size == 0:
        return "no free parameter"
    params = best_so_far(params, fit)
    best = r.best  # the reported best: the hall of fame's, polished when the fit polished
    reported = (np.asarray(best["params"], dtype=float)
                if best is not None and np.all(np.isfinite(best["params"])) else None)
    fig = _figure("parameters")
    ax = fig.add_subplot()
    pars = r.scheme.parameters
    cmap = matplotlib.colormaps["tab20"]
    for n, j in enumerate(free):
        p = pars[j]
        ax.plot(gens, _within_bounds(p, params[:, j]), color=cmap(n % 20), lw=1.3,
                label=p.name)
        if reported is not None:
            ax.plot([gens[-1]], [_within_bounds(p, reported[j])], "o", color=cmap(n % 20),
                    ms=5, mec="black", mew=0.6, gid="reported best")
    ax.set_ylim(-0.03, 1.03)
    ax.axhline(0, color="0.8", lw=0.8, zorder=0)
    ax.axhline(1, color="0.8", lw=0.8, zorder=0)
    ax.set_xlabel("Generation")
    ax.set_ylabel("Position within bounds\n(0 = lower, 1 = upper; log scale)")
    ax.set_title(f"{r.title}: best candidate's rate constants per generation"
                 + ("\n(best so far; dots: the reported best)" if reported is not None
                    else " (best so far)"))
    ax.legend(frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5),
              ncols=1 if free.size <= 16 else 2, fontsize=8)
    return fig


# --------------------------------------------------------------------------- uncertainty

def _correlation_figure(r: RunView) -> Figure | str:
    """The correlations of the free rates (log10) at the best, from the Fisher information
    stored at the end of the fit (``/profiles/local``)."""
    local = r.local_uncertainty
    if not local or not local.get("names"):
        return ("no local uncertainty in the run file (computed at the end of a fit; "
                "kingen profile RUN.h5 adds it to older files)")
    names = list(local["names"])
    corr = np.array([[math.nan if v is None else v for v in row]
                     for row in local["correlation"]], dtype=float)
    fig = _figure("correlations")
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(corr), cmap="RdBu_r", vmin=-1, vmax=1)
    n = len(names)
    ax.set_xticks(range(n), names, rotation=90)
    ax.set_yticks(range(n), names)
    if n <= 16:
        for i in range(n):
            for k in range(n):
                v = corr[i, k]
                ax.text(k, i, "—" if not math.isfinite(v) else f"{v:.2f}", ha="center",
                        va="center", fontsize=7,
                        color="white" if math.isfinite(v) and abs(v) > 0.6 else "black")
    fig.colorbar(im, ax=ax, shrink=0.8, label="correlation of log10 rates")
    ax.set_title(f"{r.title}: correlations at the best (Fisher information)")
    return fig


# --------------------------------------------------------------------------- profiles

def profile_figure(r: RunView) -> Figure | str:
    """One panel per profiled parameter (``kingen profile``): Δχ² against the rate (file
    units, log axis for log-scaled rates), the threshold of the confidence level, the
    interval, the best value and the model file's value; or why there is none."""
    state = r.profiles
    title = r.title
    rows = (state or {}).get("table") or []
    if not rows:
        return ("no finished profiles in the run file (kingen profile RUN.h5 computes them)"
                if state is None or not state.get("results") else "no profiled parameter")
    n = len(rows)
    cols = min(4, n)
    nrows = math.ceil(n / cols)
    fig = Figure(figsize=(3.3 * cols, 2.7 * nrows + 0.5), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, row in zip(axes.flat, rows, strict=False):
        x = np.array([math.nan if v is None else v for v in row["grid"]], dtype=float)
        y = np.array([math.nan if v is None else v for v in row["delta_chi2"]], dtype=float)
        order = np.argsort(x)
        ok = np.isfinite(x[order]) & np.isfinite(y[order])
        ax.plot(x[order][ok], y[order][ok], "o-", color=PROTOCOL_COLORS[0], ms=3, lw=1.2)
        thr = float(row["threshold"])
        ax.axhline(thr, color="0.35", ls="--", lw=1,
                   label=f"{100 * float(row['level']):g} % threshold")
        lo, hi = row["lower"], row["upper"]
        finite = x[np.isfinite(x)]
        if finite.size:
            ax.axvspan(lo if lo is not None else finite.min(),
                       hi if hi is not None else finite.max(), color="0.9", zorder=0,
                       label="interval")
        ax.axvline(row["best"], color="black", lw=1.2, label="best")
        ax.axvline(row["file_value"], color=PROTOCOL_COLORS[3 % len(PROTOCOL_COLORS)],
                   ls=":", lw=1.5, label="model file")
        # a log axis only where the profile spans a factor 3 or more: its labels would
        # crowd a narrow range
        if row.get("log", True) and finite.size and finite.min() > 0 and (
                finite.max() / finite.min() >= 3.0):
            ax.set_xscale("log")
        top = np.nanmax(y) if np.isfinite(y).any() else thr
        ax.set_ylim(-0.05 * max(top, thr), min(max(top, 1.3 * thr), 6.0 * thr))
        ax.set_xlabel(f"{row['name']} ({row['unit']})")
        ax.set_ylabel("Δχ² (−2 Δlog L)")
        verdict = "identifiable" if row["identifiable"] else "not identifiable"
        ax.set_title(f"{row['name']}: {verdict}", fontsize=9)
    axes.flat[0].legend(frameon=False, fontsize=7)
    fig.suptitle(f"{title}: profile likelihoods" if title else "Profile likelihoods")
    return fig


__all__ = ["DPI", "FIGURE_SIZES", "PROTOCOL_COLORS", "plot_run", "plot_run_detailed",
           "profile_figure",
           "plot_traces", "protocol_color"]
