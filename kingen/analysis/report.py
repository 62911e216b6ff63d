"""``kingen analyze``: check, time, profile and classify kernels; table, JSON and plots."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kingen.analysis import gpu, hardware
from kingen.analysis.classify import Thresholds, Verdict, classify
from kingen.analysis.hardware import SECTOR, DeviceInfo, time_within
from kingen.analysis.kernels.base import KernelCase, cases_for, rk4_cases
from kingen.analysis.metrics import INSTR_UNIT, MetricSet, compute
from kingen.analysis.profile import (
    ProfileRecord,
    merge_records,
    parse_ncu_csv,
    record_from_ncu,
    run_ncu,
)
from kingen.errors import KingenError


def say(*parts: Any) -> None:
    """Print one progress line now (the GPU runs are long; nothing may sit in a buffer)."""
    print(*parts, flush=True)


def profile_case(case: KernelCase, size: str, use_ncu: bool, repeats: int = 20,
                 raw_dir: Path | None = None, full: bool = False,
                 budget_s: float = 2.0) -> tuple[ProfileRecord, list[float]]:
    """Event-time a case, then profile one launch with ncu when asked and possible.

    Timing takes about ``budget_s`` seconds (at most ``repeats`` samples). ``full`` asks ncu
    for every section and metric; the default only for what the classifier reads. Returns
    the record and the event times (ms). ncu output is saved as ``raw_dir/<case>.ncu.csv``
    when ``raw_dir`` is given.
    """
    times = time_within(case.launch, budget_s=budget_s, max_repeats=repeats, warmup=3)
    t = float(np.median(times))
    if not use_ncu:
        return ProfileRecord(kernel=case.name, path="events", time_ms=t,
                             path_note="ncu not requested"), times
    return ncu_profile(case, size, t, raw_dir, full), times


def ncu_profile(case: KernelCase, size: str, time_ms: float, raw_dir: Path | None = None,
                full: bool = False) -> ProfileRecord:
    """Profile one launch of ``case`` with ncu in a worker process; the record carries the
    event time ``time_ms`` measured beforehand. Falls back to an event-path record saying
    why when ncu cannot run or read counters."""
    t = time_ms
    args = list(case.worker_args or ["--target", case.group, "--size", size])
    several = case.kernel_count != 1
    args += ["--case", case.name, "--launches", "1" if several else "2"]
    res = run_ncu(case.kernel_regex, args, launch_skip=0 if several else 1, full=full,
                  launch_count=None if several else 1)
    if raw_dir is not None and res.text:
        raw_dir.mkdir(parents=True, exist_ok=True)
        (raw_dir / f"{case.name}.ncu.csv").write_text(res.text)
    if res.ok:
        try:
            rows = parse_ncu_csv(res.text)
        except ValueError:
            rows = []
        if rows:
            if several:
                recs = [record_from_ncu(r, t, res.clock_control) for r in rows]
                return merge_records(recs, t)
            return record_from_ncu(rows[-1], t, res.clock_control)
        res.reason = "ncu printed no kernel row (regex matched nothing?)"
    return ProfileRecord(kernel=case.name, path="events", time_ms=t, path_note=res.reason)


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(
        x, spec)


def table(rows: list[tuple[KernelCase, MetricSet, Verdict]]) -> str:
    """The printed summary: one line per kernel."""
    head = (f"{'kernel':<16} {'ms':>8} {'GFLOP/s':>9} {'GB/s':>7} {'%DRAM':>6} {'%L2':>5} "
            f"{'%inst':>6} {'%FP':>5} {'path':>6}  {'verdict':<14} {'ncu SOL':<14} "
            "first recommendation")
    lines = [head, "-" * len(head)]
    for case, m, v in rows:
        fp = max((x for x in (m.pct_fp32, m.pct_fp64) if x is not None), default=None)
        lines.append(
            f"{case.name:<16} {_fmt(m.time_ms, '.3f'):>8} {_fmt(m.gflops):>9} "
            f"{_fmt(m.gbs):>7} {_fmt(m.pct_dram):>6} {_fmt(m.pct_l2):>5} "
            f"{_fmt(m.pct_inst):>6} {_fmt(fp):>5} {m.path:>6}  {v.kind:<14} "
            f"{(v.ncu_kind or '-'):<14} {v.first_recommendation}")
    return "\n".join(lines)


def flop_roofline_axes(ax: Any, dev: DeviceInfo, x: np.ndarray) -> None:
    """A flop roofline's frame: the FP32 and FP64 ceilings over the DRAM bandwidth at
    intensities ``x``, log axes and their labels."""
    bw = dev.peak("dram_gbs")
    for key, style in (("fp32_gflops", "-"), ("fp64_gflops", ":")):
        pk = dev.peak(key)
        ax.plot(x, np.minimum(pk, x * bw), "k" + style, lw=1,
                label=f"{key[:4].upper()} {pk / 1e3:.1f} TFLOP/s, DRAM {bw:.0f} GB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("flop / DRAM byte (measured bytes where ncu ran, else declared)")
    ax.set_ylabel("GFLOP/s")


def save_figure(fig: Any, path: Path) -> Path:
    """Lay out, write as a 120-dpi PNG and close."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def roofline_plots(dev: DeviceInfo, rows: list[tuple[KernelCase, MetricSet, Verdict]],
                   out_dir: Path) -> list[Path]:
    """Write ``roofline.png`` (instruction roofline, ncu kernels) and ``roofline_flops.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    ncu_rows = [r for r in rows if r[1].path == "ncu"]
    if ncu_rows:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        x = np.logspace(-2, 4, 200)
        peak = dev.warp_inst_per_s / 1e9
        for lvl, style in (("dram", "-"), ("l2", "--")):
            bw = dev.peak(f"{lvl}_gbs")
            if math.isfinite(bw):
                ax.plot(x, np.minimum(peak, x * bw / SECTOR), "k" + style, lw=1,
                        label=f"{lvl.upper()} {bw:.0f} GB/s, balance {dev.balance(lvl):.3g}")
        ax.axhline(peak, color="grey", lw=0.8)
        for i, (case, m, _v) in enumerate(ncu_rows):
            gips = m.pct_inst * peak / 100 if m.pct_inst is not None else None
            if gips is None:
                continue
            color = f"C{i % 10}"
            ax.loglog(m.intensity_dram, gips, "o", color=color, label=f"{case.name} (DRAM)")
            if m.intensity_l2:
                ax.loglog(m.intensity_l2, gips, "o", mfc="none", color=color)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"instruction intensity ({INSTR_UNIT}); hollow: L2")
        ax.set_ylabel("warp GIPS")
        ax.set_title(f"Instruction roofline, {dev.name}")
        ax.legend(fontsize=7, loc="lower right")
        paths.append(save_figure(fig, out_dir / "roofline.png"))
    fig, ax = plt.subplots(figsize=(7.5, 5))
    flop_roofline_axes(ax, dev, np.logspace(-2, 4, 200))
    for i, (case, m, _v) in enumerate(rows):
        nbytes = m.dram_bytes or case.bytes
        if m.gflops:
            ax.plot(case.flops / nbytes, m.gflops, "o", color=f"C{i % 10}", label=case.name)
    ax.set_title(f"Roofline, {dev.name}")
    ax.legend(fontsize=7, loc="lower right")
    paths.append(save_figure(fig, out_dir / "roofline_flops.png"))
    return paths


def run_analyze(target: str, out_dir: Path, use_ncu: bool = True, size: str = "default",
                remeasure: bool = False, repeats: int = 20,
                thresholds: Thresholds | None = None,
                echo: Callable[[str], Any] = say, full: bool = False,
                rk4: dict[str, Any] | None = None) -> dict[str, Any]:
    """Analyse the kernels of ``target`` on the current GPU.

    Checks every variant against its numpy reference, times it with CUDA events, profiles
    one launch with ncu (or falls back to event timing), classifies it, prints a table and
    writes ``analyze.json``, ``roofline.png`` / ``roofline_flops.png`` and the raw ncu output
    (``ncu/<case>.ncu.csv``) under ``out_dir``.

    Parameters
    ----------
    target
        ``"rk4"``, ``"stencil"``, ``"sgemm"`` or ``"all"``.
    out_dir
        Where results go (created).
    use_ncu
        Profile with Nsight Compute; False uses event timing and declared counts only.
    size
        Problem size of the reference kernels: ``"default"`` or ``"small"``.
    remeasure
        Re-run the device micro-benchmarks instead of using the cache.
    repeats
        Most timed samples per kernel (median reported); each kernel is timed for about
        two seconds.
    echo
        Where progress lines go (default: printed and flushed at once).
    full
        Every ncu section and metric (minutes per solver kernel); by default only what the
        classifier reads.
    rk4
        Options of the solver's cases (:func:`kingen.analysis.kernels.base.rk4_cases`):
        model, n_candidates, precision, protocols.

    Raises
    ------
    KingenError
        No GPU, no solver kernel for ``rk4``, unknown target.
    """
    import time

    t0 = time.perf_counter()
    # through the modules, not names bound at import: a stand-in GPU (tests) reaches here
    # only while it stands in
    gpu.require_gpu()
    th = thresholds or Thresholds()
    echo("measuring the device ceilings (about a minute)" if remeasure else
         "device ceilings: from the cache, or measured now (about a minute, once per device)")
    dev = hardware.ceilings(remeasure=remeasure)
    echo(f"device: {dev.name} (cc {dev.compute_capability[0]}.{dev.compute_capability[1]}, "
         f"{dev.sms} SMs, {dev.clock_mhz:.0f} MHz); measured DRAM {dev.peak('dram_gbs'):.0f} "
         f"GB/s, L2 {dev.peak('l2_gbs'):.0f} GB/s, FP32 {dev.peak('fp32_gflops'):.0f}, FP64 "
         f"{dev.peak('fp64_gflops'):.0f} GFLOP/s; {dev.warp_inst_per_s / 1e9:.0f} warp GIPS; "
         f"balance DRAM {dev.balance('dram'):.3g}, L2 {dev.balance('l2'):.3g} ({INSTR_UNIT})")
    echo(f"building the cases of '{target}'" + (" (the solver's: scheme, protocols, "
                                                 "candidates)" if target in ("rk4", "all")
                                                 else ""))
    cases = cases_for(target, size) if target != "all" else cases_for("stencil", size) + (
        cases_for("sgemm", size))
    if target == "all":
        try:
            cases += rk4_cases(**(rk4 or {}))
        except KingenError as exc:
            echo(f"rk4 skipped: {exc}")
    elif target == "rk4" and rk4:
        cases = rk4_cases(**rk4)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, records = [], []
    profiler = ("ncu, " + ("every section" if full else "classifier's counters only; --full "
                           "for all")) if use_ncu else "event timing only"
    for i, case in enumerate(cases, 1):
        echo(f"[{i}/{len(cases)}] {case.name}: checking against its reference "
             f"({time.perf_counter() - t0:.0f} s)")
        ok, err = case.verify()
        if not ok:
            echo(f"{case.name}: FAILED its check (relative error {err:.3g} > "
                 f"{case.tolerance:g}); not analysed")
            records.append({"name": case.name, "check": {"ok": False, "rel_error": err}})
            continue
        echo(f"[{i}/{len(cases)}] {case.name}: check ok (relative error {err:.2g}); "
             f"timing, then profiling ({profiler})")
        rec, times = profile_case(case, size, use_ncu, repeats, out_dir / "ncu", full=full)
        m = compute(case.name, rec, dev, case.flops, case.bytes, case.group, case.precision)
        v = classify(m, th)
        rows.append((case, m, v))
        records.append({
            "name": case.name, "group": case.group, "note": case.note,
            "flops": case.flops, "bytes": case.bytes, "extra": case.extra,
            "check": {"ok": ok, "rel_error": err, "tolerance": case.tolerance},
            "times_ms": times, "profile": rec.to_json(), "metrics": m.to_json(),
            "verdict": v.to_json(),
        })
        echo(f"[{i}/{len(cases)}] {case.name}: {m.time_ms:.3f} ms, {v.kind} ({v.unit}); "
             f"path {rec.path}" + (f" ({rec.path_note})" if rec.path_note else "")
             + f" ({time.perf_counter() - t0:.0f} s)")
    echo("")
    echo(table(rows))
    for _case, _m, v in rows:
        if v.agrees is False:
            echo(f"  {v.name}: disagrees with ncu: {v.disagreement}")
    result = {"command": " ".join(sys.argv), "target": target, "size": size, "full": full,
              "thresholds": th.__dict__, "device": dev.to_json(), "cases": records}
    tmp = out_dir / "analyze.json.tmp"
    tmp.write_text(json.dumps(result, indent=2, default=str))
    tmp.replace(out_dir / "analyze.json")
    if rows:
        for p in roofline_plots(dev, rows, out_dir):
            echo(f"wrote {p}")
    echo(f"wrote {out_dir / 'analyze.json'}")
    return result
