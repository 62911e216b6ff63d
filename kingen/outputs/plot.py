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

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from kingen.base.files import check_replaceable
from kingen.errors import KingenError
from kingen.outputs.figstyle import (
    DATA_COLOR,
    DPI,
    FIGURE_SIZES,
    FORMATS,
    PROTOCOL_COLORS,
    STYLE,
    UNFILTERED,
    log,
    new_figure,
    protocol_color,
    safe_names,
    save_all,
    save_figure,
)
from kingen.outputs.searchplots import (
    convergence_figure,
    correlation_figure,
    parameter_figure,
    profile_figure,
)
from kingen.store import RunStore, RunView, as_store

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
        fig = new_figure("traces")
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
        return save_figure(fig, path)


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
                ("convergence", lambda: convergence_figure(r)),
                ("parameters", lambda: parameter_figure(r)),
                ("correlations", lambda: correlation_figure(r)),
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
        written[stem] = save_all(result, out, stem, formats)
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
    fig = new_figure("fit")
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
    fig = new_figure("fits_overview")
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
    fig = new_figure("dose_response")
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
    fig = new_figure("recovery")
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


# the style and the search's figures are importable from here too, as before their modules
__all__ = ["DPI", "FIGURE_SIZES", "FORMATS", "PROTOCOL_COLORS", "plot_run",
           "plot_run_detailed", "profile_figure", "plot_traces", "protocol_color", "safe_names"]
