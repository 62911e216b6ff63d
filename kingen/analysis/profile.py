"""Profile one launch of a kernel with Nsight Compute, or fall back to event timing.

:func:`run_ncu` runs ``ncu --csv --page raw`` on a fresh Python process
(:mod:`kingen.analysis._worker`) that rebuilds the case by name and launches it
``launch_skip + 1`` times; only the last launch is profiled. :func:`parse_ncu_csv` and
:func:`record_from_ncu` turn ncu's raw page into a :class:`ProfileRecord`. Without ncu, or
without permission to read the counters (``ERR_NVGPUCTRPERM``), the record holds the CUDA-event
time and the flop and byte counts the kernel declares, and ``path`` says so.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

# Sections of ncu's "full" set that hold what the classifier reads, plus metrics named
# explicitly because the sections show some only as derived values. ``kingen analyze
# --full`` collects all of them; the default collects QUICK_SECTIONS and the metrics
# without SASS instrumentation (QUICK_METRICS): each SASS-patched metric and the source
# counters replay a long kernel, the solver's, many times over.
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "Occupancy",
            "LaunchStats", "SchedulerStats", "WarpStateStats", "InstructionStats",
            "SourceCounters")
EXTRA_METRICS = (
    "smsp__inst_executed.sum", "smsp__inst_issued.sum", "gpu__time_duration.sum",
    "gpc__cycles_elapsed.max",
    "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "l1tex__t_bytes.sum",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_fp64.sum",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_dfma_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_dadd_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_dmul_pred_on.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "smsp__sass_average_branch_targets_threads_uniform.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread", "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks", "launch__waves_per_multiprocessor",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "sm__instruction_throughput.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
)
QUICK_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats")
QUICK_METRICS = tuple(m for m in EXTRA_METRICS if "sass" not in m)

_SCALE = {"": 1.0, "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
          "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
          "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9,
          "cycle": 1.0, "kcycle": 1e3, "mcycle": 1e6, "inst": 1.0, "kinst": 1e3,
          "minst": 1e6, "ginst": 1e9, "warp": 1.0, "sector": 1.0, "ksector": 1e3,
          "msector": 1e6, "request": 1.0, "krequest": 1e3, "mrequest": 1e6, "register": 1.0}


@dataclass
class ProfileRecord:
    """What one profiled launch measured. Bytes in bytes, times in ms, percentages 0-100.

    ``path`` is ``"ncu"`` (hardware counters) or ``"events"`` (CUDA events plus declared
    counts); ``path_note`` says why the fallback was taken. Fields ncu did not report are None.
    """

    kernel: str
    path: str
    time_ms: float
    path_note: str = ""
    duration_ms: float | None = None  # ncu's, at its clock setting
    cycles_elapsed: float | None = None  # GPC cycles of the profiled launch
    clock_control: str | None = None
    inst_executed: float | None = None  # warp instructions
    inst_issued: float | None = None
    dram_bytes: float | None = None
    l2_bytes: float | None = None
    l1_bytes: float | None = None
    local_bytes: float | None = None
    fp32_pipe_pct: float | None = None
    fp64_pipe_pct: float | None = None
    fp32_flops: float | None = None  # from SASS thread-instruction counts
    fp64_flops: float | None = None
    fp32_inst: float | None = None  # thread instructions FFMA + FADD + FMUL
    fp64_inst: float | None = None  # thread instructions DFMA + DADD + DMUL
    issue_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    occupancy_limiter: str | None = None
    registers_per_thread: float | None = None
    waves: float | None = None
    sectors_per_request: float | None = None
    branch_efficiency_pct: float | None = None
    stalls: dict[str, float] = field(default_factory=dict)
    sol_compute_pct: float | None = None
    sol_memory_pct: float | None = None
    sol_dram_pct: float | None = None
    sol_l2_pct: float | None = None
    sol_l1_pct: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def find_ncu() -> str | None:
    """Path to ``ncu``: on PATH, under /usr/local/cuda*/bin or /opt/nvidia/nsight-compute."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


# ------------------------------------------------------------------------------ parsing


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A", "nan"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[dict[str, tuple[str, str]]]:
    """Parse the output of ``ncu --csv --page raw`` into one dict per profiled kernel.

    Each dict maps a column (``"Kernel Name"``, metric names) to ``(value, unit)`` as
    printed. Lines before the header (the program's own output, ``==PROF==`` messages) are
    skipped.

    Raises
    ------
    ValueError
        When the text holds no raw-page table.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID","Process ID"')), None)
    if start is None:
        raise ValueError("no ncu raw-page table in the output")
    table = [ln for ln in lines[start:] if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(table))))
    header, units, body = rows[0], rows[1], rows[2:]
    out = []
    for row in body:
        if len(row) != len(header):
            continue
        out.append({h: (v, u) for h, v, u in zip(header, row, units, strict=True)})
    return out


def _get(row: dict[str, tuple[str, str]], name: str) -> float | None:
    if name not in row:
        return None
    value, unit = row[name]
    x = _number(value)
    if x is None:
        return None
    unit = unit.strip().lower()
    if unit.endswith("/second") or unit in ("%", "ratio"):
        return x
    return x * _SCALE.get(unit, 1.0)


def _sum(row: dict[str, tuple[str, str]], *names: str) -> float | None:
    vals = [_get(row, n) for n in names]
    if all(v is None for v in vals):
        return None
    return float(sum(v for v in vals if v is not None))


_STALL = re.compile(r"^smsp__average_warps?_issue_stalled_([a-z_]+?)_per_issue_active\.ratio$")


def record_from_ncu(row: dict[str, tuple[str, str]], time_ms: float,
                    clock_control: str | None = None) -> ProfileRecord:
    """Build a :class:`ProfileRecord` from one parsed raw-page row."""
    g = lambda n: _get(row, n)  # noqa: E731
    dur = g("gpu__time_duration.sum")
    ffma, fadd, fmul = (g(f"smsp__sass_thread_inst_executed_op_{o}_pred_on.sum")
                        for o in ("ffma", "fadd", "fmul"))
    dfma, dadd, dmul = (g(f"smsp__sass_thread_inst_executed_op_{o}_pred_on.sum")
                        for o in ("dfma", "dadd", "dmul"))
    fp32 = None if ffma is None else 2 * ffma + (fadd or 0) + (fmul or 0)
    fp64 = None if dfma is None else 2 * dfma + (dadd or 0) + (dmul or 0)
    limits = {k: g(f"launch__occupancy_limit_{k}")
              for k in ("registers", "shared_mem", "warps", "blocks")}
    limits = {k: v for k, v in limits.items() if v is not None}
    limiter = min(limits, key=lambda k: limits[k]) if limits else None
    sec, req = (g("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
                g("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"))
    stalls = {}
    for name in row:
        m = _STALL.match(name)
        if m and not m.group(1).startswith("not_issued"):
            v = g(name)
            if v is not None:
                stalls[m.group(1)] = v
    name = row.get("Kernel Name", ("?", ""))[0]
    return ProfileRecord(
        kernel=name, path="ncu", time_ms=time_ms, clock_control=clock_control,
        duration_ms=None if dur is None else dur * 1e3,
        cycles_elapsed=g("gpc__cycles_elapsed.max"),
        inst_executed=g("smsp__inst_executed.sum"), inst_issued=g("smsp__inst_issued.sum"),
        dram_bytes=_sum(row, "dram__bytes_read.sum", "dram__bytes_write.sum"),
        l2_bytes=g("lts__t_bytes.sum"), l1_bytes=g("l1tex__t_bytes.sum"),
        local_bytes=_sum(row, "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
                         "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"),
        fp32_pipe_pct=g("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
        fp64_pipe_pct=g("sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active"),
        fp32_flops=fp32, fp64_flops=fp64,
        fp32_inst=_sum(row, *(f"smsp__sass_thread_inst_executed_op_{o}_pred_on.sum"
                              for o in ("ffma", "fadd", "fmul"))),
        fp64_inst=_sum(row, *(f"smsp__sass_thread_inst_executed_op_{o}_pred_on.sum"
                              for o in ("dfma", "dadd", "dmul"))),
        issue_pct=g("smsp__issue_active.avg.pct_of_peak_sustained_active"),
        achieved_occupancy_pct=g("sm__warps_active.avg.pct_of_peak_sustained_active"),
        theoretical_occupancy_pct=g("sm__maximum_warps_per_active_cycle_pct"),
        occupancy_limiter=limiter,
        registers_per_thread=g("launch__registers_per_thread"),
        waves=g("launch__waves_per_multiprocessor"),
        sectors_per_request=None if not sec or not req else sec / req,
        branch_efficiency_pct=g("smsp__sass_average_branch_targets_threads_uniform.pct"),
        stalls=stalls,
        sol_compute_pct=g("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        sol_memory_pct=g("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        sol_dram_pct=g("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        sol_l2_pct=g("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        sol_l1_pct=g("l1tex__throughput.avg.pct_of_peak_sustained_active"),
        raw={k: v[0] for k, v in row.items()},
    )


# ------------------------------------------------------------------------------ running


@dataclass
class NcuResult:
    """Outcome of one ncu invocation: the raw text when it worked, else why not."""

    ok: bool
    text: str
    reason: str = ""
    clock_control: str = "base"
    command: list[str] = field(default_factory=list)


def ncu_command(ncu: str, kernel_regex: str, worker_args: list[str], launch_skip: int = 1,
                clock_control: str = "base", metrics: tuple[str, ...] = EXTRA_METRICS,
                base_units: bool = True, sections: tuple[str, ...] = SECTIONS,
                launch_count: int | None = 1) -> list[str]:
    """The ncu command line that profiles launch ``launch_skip`` of the matching kernel
    (``launch_count`` None: every matching launch from there on)."""
    cmd = [ncu, "--target-processes", "all", "--csv", "--page", "raw",
           "-k", f"regex:{kernel_regex}", "--launch-skip", str(launch_skip)]
    if launch_count is not None:
        cmd += ["--launch-count", str(launch_count)]
    if base_units:
        cmd += ["--print-units", "base"]
    if clock_control != "base":
        cmd += ["--clock-control", clock_control]
    for s in sections:
        cmd += ["--section", s]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    return cmd + [sys.executable, "-m", "kingen.analysis._worker", *worker_args]


_UNKNOWN = re.compile(r"[Ff]ailed to find metric[s]?\s*'?\"?([A-Za-z0-9_.]+)")


def run_ncu(kernel_regex: str, worker_args: list[str], launch_skip: int = 1,
            timeout_s: float = 300.0, full: bool = True,
            launch_count: int | None = 1) -> NcuResult:
    """Run ncu on the worker; retry with ``--clock-control none`` and without unknown metrics.

    ``full`` collects every section and metric; otherwise :data:`QUICK_SECTIONS` and
    :data:`QUICK_METRICS`. Never raises for profiler trouble: the result says what went wrong.
    """
    ncu = find_ncu()
    if ncu is None:
        return NcuResult(False, "", "ncu not found on PATH")
    metrics = list(EXTRA_METRICS if full else QUICK_METRICS)
    sections = SECTIONS if full else QUICK_SECTIONS
    clock = "base"
    base_units = True
    last = ""
    for _ in range(len(EXTRA_METRICS) + 3):
        cmd = ncu_command(ncu, kernel_regex, worker_args, launch_skip, clock, tuple(metrics),
                          base_units, sections, launch_count)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  env=dict(os.environ))
        except subprocess.TimeoutExpired:
            return NcuResult(False, "", f"ncu timed out after {timeout_s:.0f} s", clock, cmd)
        out = proc.stdout + "\n" + proc.stderr
        last = out
        if "ERR_NVGPUCTRPERM" in out:
            return NcuResult(False, out, "no permission to read GPU counters (ERR_NVGPUCTRPERM)",
                             clock, cmd)
        if '"ID","Process ID"' in proc.stdout:
            return NcuResult(True, proc.stdout, "", clock, cmd)
        m = _UNKNOWN.search(out)
        if m and m.group(1) in metrics:
            metrics.remove(m.group(1))  # this ncu/GPU lacks it; the sections still cover most
            continue
        if base_units and "print-units" in out:
            base_units = False  # an older ncu without the option; units are parsed anyway
            continue
        if clock == "base":
            clock = "none"  # some setups refuse to lock clocks
            continue
        break
    tail = " | ".join(ln.strip() for ln in last.strip().splitlines()[-3:])
    return NcuResult(False, last, f"ncu produced no metrics: {tail}", clock, [])


def merge_records(recs: list[ProfileRecord], time_ms: float) -> ProfileRecord:
    """One record for several kernels that together make one launch (the propagator form's
    build and sample kernels): counts add up; utilisations are averaged, weighted by each
    kernel's duration; launch properties (registers, occupancy, waves) are the longest
    kernel's."""
    if len(recs) == 1:
        recs[0].time_ms = time_ms
        return recs[0]
    w = [r.duration_ms or r.cycles_elapsed or 1.0 for r in recs]
    total_w = sum(w)
    main = recs[max(range(len(recs)), key=w.__getitem__)]

    def add(name: str) -> float | None:
        vals = [getattr(r, name) for r in recs]
        return None if all(v is None for v in vals) else float(sum(v or 0.0 for v in vals))

    def avg(name: str) -> float | None:
        # over the kernels that report it
        pairs = [(getattr(r, name), x) for r, x in zip(recs, w) if getattr(r, name) is not None]
        if not pairs:
            return None
        return float(sum(v * x for v, x in pairs) / sum(x for _, x in pairs))

    stalls: dict[str, float] = {}
    for r, x in zip(recs, w):
        for k, v in r.stalls.items():
            stalls[k] = stalls.get(k, 0.0) + v * x / total_w
    summed = ("duration_ms", "cycles_elapsed", "inst_executed", "inst_issued", "dram_bytes",
              "l2_bytes", "l1_bytes", "local_bytes", "fp32_flops", "fp64_flops", "fp32_inst",
              "fp64_inst")
    averaged = ("fp32_pipe_pct", "fp64_pipe_pct", "issue_pct", "achieved_occupancy_pct",
                "sectors_per_request", "branch_efficiency_pct", "sol_compute_pct",
                "sol_memory_pct", "sol_dram_pct", "sol_l2_pct", "sol_l1_pct")
    kw: dict[str, Any] = {k: add(k) for k in summed}
    kw.update({k: avg(k) for k in averaged})
    return ProfileRecord(
        kernel=" + ".join(r.kernel for r in recs), path="ncu", time_ms=time_ms,
        path_note=f"{len(recs)} kernels merged", clock_control=main.clock_control,
        theoretical_occupancy_pct=main.theoretical_occupancy_pct,
        occupancy_limiter=main.occupancy_limiter,
        registers_per_thread=max((r.registers_per_thread or 0.0) for r in recs) or None,
        waves=main.waves, stalls=stalls, **kw)
