"""The solver kernel on the GPU: launch variants, the tuned choice, and analysis cases.

The kernel itself is generated (:mod:`kingen.codegen`) and compiled by
:mod:`kingen.solve.compiled`; one thread owns one (candidate, sweep) pair and keeps its state
in registers. What can vary without changing the answer is how it is launched: threads per
block, and a cap on registers per thread (fewer registers, more resident warps, possibly
spills). ``kingen tune`` times every variant with :mod:`kingen.analysis.tune` and records the
fastest here, per device, scheme and precision; the solver then launches with it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kingen.solve.compiled import cache_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock
    fcntl = None

DEFAULT_BLOCK = 128


FORMS = ("stage", "propagator")


@dataclass(frozen=True)
class LaunchConfig:
    """How the solver kernel is built and launched.

    ``form`` is ``"stage"`` (the four RK4 stages at every step) or ``"propagator"`` (on
    constant-concentration rows, one product with M = R(hQ)ⁿ per sample); ``lanes`` is how
    many GPU threads share one (candidate, sweep) pair in the propagator form (each holds
    a slice of M's columns in registers). The CPU backend uses ``form`` only.
    """

    block: int = DEFAULT_BLOCK
    max_registers: int | None = None
    form: str = "stage"
    lanes: int = 1

    @property
    def name(self) -> str:
        """Short label, e.g. ``b128``, ``b128r96`` or ``prop-l4-b128``."""
        launch = f"b{self.block}" + (f"r{self.max_registers}" if self.max_registers else "")
        if self.form == "propagator":
            return f"prop-l{self.lanes}-{launch}"
        return launch


VARIANTS = (
    LaunchConfig(64), LaunchConfig(128), LaunchConfig(256),
    LaunchConfig(128, 128), LaunchConfig(256, 96), LaunchConfig(256, 64),
)


def _tuning_file() -> Path:
    return cache_dir() / "solver_tuning.json"


def tuning_key(device: str, scheme_key: str, precision: str) -> str:
    """Cache key of a tuned choice."""
    return f"{device}|{scheme_key}|{precision}"


def scheme_key(scheme) -> str:
    """Identifies a scheme's generated kernel (states and transitions, not values)."""
    from kingen.codegen import generate

    return generate(scheme, "objective").key


def default_config(scheme, precision: str = "float64") -> LaunchConfig:
    """The launch used where ``kingen tune`` recorded none: the propagator form.

    Lanes per (candidate, sweep) pair as measured fastest on an H100 for Robert & Howe 2003
    (16 states, benchmarks/results/h100/propagator/): four in float64, two in float32
    (a float32 column of D takes half the registers). Schemes of up to 8 states hold the
    whole of D in one thread.
    """
    if scheme.n_states <= 8:
        return LaunchConfig(form="propagator", lanes=1)
    return LaunchConfig(form="propagator", lanes=4 if precision == "float64" else 2)


def tuned_config(device: str, scheme, precision: str) -> LaunchConfig:
    """The launch configuration ``kingen tune`` chose for this device, scheme and precision,
    or the default when none was recorded."""
    try:
        table = json.loads(_tuning_file().read_text())
    except (OSError, ValueError):
        return default_config(scheme, precision)
    entry = table.get(tuning_key(device, scheme_key(scheme), precision))
    if not entry:
        return default_config(scheme, precision)
    return LaunchConfig(int(entry["block"]), entry.get("max_registers"),
                        str(entry.get("form", "stage")), int(entry.get("lanes", 1)))


def record_tuning(device: str, scheme, precision: str, config: LaunchConfig,
                  evidence: dict) -> Path:
    """Store a tuned choice (atomically) and the timings that justify it."""
    path = _tuning_file()
    key = tuning_key(device, scheme_key(scheme), precision)
    # read-modify-write under a lock: concurrent `kingen tune` runs (one per GPU) must not
    # drop each other's entries
    with open(path.with_suffix(".lock"), "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        table[key] = {**asdict(config), "evidence": evidence}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        os.replace(tmp, path)
    return path


def flops_per_step(scheme, precision: str = "float64") -> int:
    """Floating-point operations of one RK4 step of the generated code (FMA = 2).

    Each derivative costs one multiply per state plus one FMA per transition; the stage
    updates cost 13 per state; float32's compensated sum adds 3 per state.
    """
    s, t = scheme.n_states, len(scheme.transitions)
    return 4 * (s + 2 * t) + 13 * s + (3 * s if precision == "float32" else 0)


def analysis_cases(model: str | Path | None = None, n_candidates: int = 16384,
                   precision: str | None = None, protocol: str = "desensitization",
                   variants: tuple[LaunchConfig, ...] | None = None) -> list:
    """The solver kernel as :class:`~kingen.analysis.kernels.base.KernelCase` objects.

    One case per launch variant and precision, on ``n_candidates`` candidates of the scheme
    (default: Robert & Howe 2003, the largest shipped) under one standard protocol, in
    objective mode (the mode the fit runs). Each case's check compares the per-candidate
    errors with the CPU backend's. ``variants`` defaults to the launch the solver would use
    (``kingen analyze``); ``kingen tune`` passes :data:`VARIANTS`.
    """
    from kingen.analysis.kernels.base import KernelCase
    from kingen.codegen import N_OUT, N_WINDOWS
    from kingen.protocol import standard_protocol
    from kingen.scheme import Scheme
    from kingen.solve.batch import ObjectiveInputs, Simulator

    root = Path(__file__).resolve().parents[2]
    path = Path(model) if model else root / "models" / "robert_howe_2003.toml"
    scheme = Scheme.load(path)
    prot = standard_protocol(protocol)
    rng = np.random.default_rng(0)
    # candidates spread over the middle fifth of each log range: realistic, all stable
    mid = 0.5 * (np.log(scheme.lower) + np.log(scheme.upper))
    half = 0.1 * (np.log(scheme.upper) - np.log(scheme.lower))
    params = scheme.complete(np.exp(rng.uniform(mid - half, mid + half,
                                                (n_candidates, scheme.n_params))))
    probe = Simulator(scheme, [prot], backend="cpu")
    n = probe.schedule.n_samples
    windows = np.full((prot.n_sweeps, N_WINDOWS, 3), -1, dtype=np.int64)
    windows[:, 0] = (0, n - 1, 0)
    ref_trace = probe.run(scheme.values[None], "traces").traces[0] * scheme.channels
    obj = ObjectiveInputs(ref_trace + rng.normal(0, 0.5, n), np.ones(n), windows)
    steps = probe.schedule.total_steps
    cases = []
    for prec in ((precision,) if precision else ("float64", "float32")):
        sim = Simulator(scheme, [prot], backend="cuda", precision=prec, objective=obj)
        check_rows = params[:256]
        # The CPU reference is computed on the first check, not here: ncu's worker process
        # rebuilds these cases only to launch one, and the CPU run would dominate it.
        cpu_sim = Simulator(scheme, [prot], backend="cpu", precision=prec, objective=obj)
        cpu: dict[str, Any] = {}
        for variant in variants or (sim._tuned(),):
            prepared = sim.prepare_launch(params, variant)

            def launch(prepared=prepared):
                prepared()

            def check(sim=sim, variant=variant, cpu=cpu, cpu_sim=cpu_sim, rows=check_rows):
                if "ref" not in cpu:
                    cpu["ref"] = cpu_sim.run(rows, "objective").sgd
                got = sim.run(rows, "objective", launch_config=variant)
                return float(np.linalg.norm(got.sgd - cpu["ref"]) / np.linalg.norm(cpu["ref"]))

            cases.append(KernelCase(
                name=f"rk4_{path.stem}_{prec}_{variant.name}",
                launch=launch,
                flops=float(flops_per_step(scheme, prec)) * steps * n_candidates,
                bytes=float(n_candidates * (scheme.n_params * np.dtype(prec).itemsize
                                            + scheme.n_states * np.dtype(prec).itemsize
                                            + prot.n_sweeps * (N_OUT * 8 + 4))),
                check=check,
                kernel_regex="launch",
                group="rk4",
                precision="fp64" if prec == "float64" else "fp32",
                tolerance=1e-9 if prec == "float64" else 1e-4,
                note=f"{scheme.n_states}-state RK4, {steps} steps/thread, "
                     f"{n_candidates} candidates, launch {variant.name}",
                extra={"model": path.stem, "precision": prec, "variant": asdict(variant),
                       "steps_per_thread": steps, "threads": n_candidates * prot.n_sweeps},
            ))
    return cases
