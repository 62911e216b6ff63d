"""Figures of a run's search and what it says of the parameters: convergence, the
parameters' path, their correlations at the optimum, and profile likelihoods.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from kingen.outputs.figstyle import DPI, PROTOCOL_COLORS, new_figure, protocol_color
from kingen.store import RunView

# --------------------------------------------------------------------------- the search

def convergence_figure(r: RunView) -> Figure | str:
    """The best and median error per generation, and each protocol's error of the best."""
    h = r.history(population=False)
    if h["generation"].size == 0:
        return "no completed generation yet"
    gens = h["generation"]
    fig = new_figure("convergence")
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


def parameter_figure(r: RunView) -> Figure | str:
    """The best-so-far candidate's free rate constants per generation, placed within their
    bounds (0: lower, 1: upper), and the reported best."""
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
    fig = new_figure("parameters")
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

def correlation_figure(r: RunView) -> Figure | str:
    """The parameters' correlations at the optimum (from the local uncertainty)."""
    """The correlations of the free rates (log10) at the best, from the Fisher information
    stored at the end of the fit (``/profiles/local``)."""
    local = r.local_uncertainty
    if not local or not local.get("names"):
        return ("no local uncertainty in the run file (computed at the end of a fit; "
                "kingen profile RUN.h5 adds it to older files)")
    names = list(local["names"])
    corr = np.array([[math.nan if v is None else v for v in row]
                     for row in local["correlation"]], dtype=float)
    fig = new_figure("correlations")
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
