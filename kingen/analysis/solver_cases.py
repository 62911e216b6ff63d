"""The solver kernel as analysis cases: problems, declared counts, checks.

Moved here from ``kingen.solve.cuda`` so that the solver never imports the analysis (the
analysis sits below the solver in kingen's layers and may import it, not the reverse).

A :class:`SolverProblem` is one batch the analysis runs: a scheme, a protocol set, candidates
spread over the middle fifth of each log range, and objective inputs (the fit's mode).
:func:`variant_case` turns it and a :class:`~kingen.solve.cuda.LaunchConfig` into a
:class:`~kingen.analysis.kernels.base.KernelCase`; :func:`exact_error` checks a variant's
traces against the exact reference (:func:`kingen.solve.reference.simulate_exact`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kingen.analysis.bound import FlopCount, variant_flops
from kingen.analysis.kernels.base import KernelCase
from kingen.errors import KingenError
from kingen.experiment.protocol import STANDARD_PROTOCOLS
from kingen.solve.plan import flops_per_step  # noqa: F401 (the flop model's unit, re-exported)

PROTOCOL_SETS = {
    "desensitization": ("desensitization",),
    # the set benchmarks.propagator and fits of the standard recordings run
    "standard": STANDARD_PROTOCOLS,
}
# Largest error of a variant's traces against the exact solution, as a fraction of the
# peak current of the sweep (the solver tests' tolerance).
EXACT_TOLERANCE = {"float64": 1e-6, "float32": 1e-3}
# Objective outputs against the CPU backend (relative norm).
CPU_TOLERANCE = {"float64": 1e-9, "float32": 1e-4}


def propagator_available(sim: Any = None) -> bool:
    """True when the solver has the propagator form (``Simulator.propagator_plan``)."""
    if sim is None:
        from kingen.solve.batch import Simulator

        sim = Simulator
    return hasattr(sim, "propagator_plan")


def protocol_set(name: str) -> list:
    """The protocols of a named set (``desensitization``, ``standard``) or one standard one."""
    from kingen.experiment.protocol import standard_protocol

    names = PROTOCOL_SETS.get(name, (name,))
    return [standard_protocol(n) for n in names]


@dataclass
class SolverProblem:
    """One batch the analysis measures: scheme, protocols, candidates and objective data."""

    path: Path
    scheme: Any
    protocols: list
    protocol_set: str
    params: np.ndarray
    objective: Any
    precision: str
    _sims: dict[str, Any] = field(default_factory=dict, repr=False)
    _ref: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def model(self) -> str:
        return self.path.stem

    @property
    def n_candidates(self) -> int:
        return int(self.params.shape[0])

    def simulator(self, backend: str = "cuda"):
        """The prepared :class:`~kingen.solve.batch.Simulator` on ``backend`` (cached)."""
        from kingen.solve.batch import Simulator
        from kingen.solve.options import SolverOptions

        if backend not in self._sims:
            options = SolverOptions(backend=backend, precision=self.precision)
            self._sims[backend] = Simulator(self.scheme, self.protocols, options,
                                            objective=self.objective)
        return self._sims[backend]

    @property
    def total_steps(self) -> int:
        return int(self.simulator("cpu").schedule.total_steps)

    @property
    def n_sweeps(self) -> int:
        return int(self.simulator("cpu").n_sweeps)

    def plan(self) -> Any:
        """The propagator plan of this batch on the GPU (which gives every constant row a
        matrix), or None when the solver has no such form."""
        sim = self.simulator("cuda")
        return sim.propagator_plan() if propagator_available(sim) else None

    def flop_count(self, config) -> FlopCount:
        """Declared flops of one candidate with ``config``, by term
        (:func:`~kingen.analysis.bound.variant_flops`)."""
        plan = self.plan() if config.form == "propagator" else None
        if config.form == "propagator" and plan is None:
            raise KingenError("the propagator form needs the solver's propagator plan",
                              field="form", value=config.form)
        return variant_flops(self.scheme, self.simulator("cpu").schedule, config,
                             self.precision, plan)

    def flops(self, config) -> float:
        """Declared flops of one launch of the whole batch with ``config``."""
        return self.n_candidates * self.flop_count(config).total

    def bytes(self, config) -> float:
        """Fewest DRAM bytes of one launch: parameters and initial state in, results out;
        in the propagator form also each M written by the build kernel and read back."""
        from kingen.codegen import out_width

        item = np.dtype(self.precision).itemsize
        s = self.scheme.n_states
        width = out_width(self.simulator("cpu")._n_windows("objective"))
        per = (self.scheme.n_params + s) * item + self.n_sweeps * (width * 8 + 4)
        if config.form == "propagator":
            plan = self.plan()
            if plan is not None:
                per += 2 * int(plan.n_keys) * s * s * item
                if config.span > 1:  # the span arrays, written once and read back
                    per += 2 * int(plan.n_span_keys) * s * (config.span + s) * item
        return float(self.n_candidates * per)

    def worker_args(self, config) -> list[str]:
        """Arguments with which :mod:`kingen.analysis._worker` rebuilds this case."""
        return ["--target", "rk4", "--model", str(self.path), "--precision", self.precision,
                "--candidates", str(self.n_candidates), "--protocols", self.protocol_set,
                "--variant", json.dumps(asdict(config))]


def solver_problem(model: str | Path | None = None, n_candidates: int = 16384,
                   precision: str = "float64", protocols: str = "desensitization",
                   seed: int = 0) -> SolverProblem:
    """Build the batch: ``n_candidates`` candidates of ``model`` (a path or a shipped name;
    default Robert & Howe 2003) under the protocol set, with objective inputs (a noisy
    trace of the file's values, one peak window per sweep)."""
    from kingen.codegen import N_WINDOWS
    from kingen.model.scheme import Scheme
    from kingen.model.shipped import resolve_model
    from kingen.solve.batch import ObjectiveInputs, Simulator
    from kingen.solve.options import SolverOptions

    if n_candidates < 1:
        raise KingenError("must be >= 1", field="candidates", value=n_candidates)
    path = resolve_model(model)
    scheme = Scheme.load(path)
    prots = protocol_set(protocols)
    rng = np.random.default_rng(seed)
    # candidates spread over the middle fifth of each log range: realistic, all stable
    mid = 0.5 * (np.log(scheme.lower) + np.log(scheme.upper))
    half = 0.1 * (np.log(scheme.upper) - np.log(scheme.lower))
    params = scheme.complete(np.exp(rng.uniform(mid - half, mid + half,
                                                (n_candidates, scheme.n_params))))
    probe = Simulator(scheme, prots, options=SolverOptions(backend="cpu"))
    n = probe.schedule.n_samples
    windows = np.full((probe.n_sweeps, N_WINDOWS, 3), -1, dtype=np.int64)
    starts = probe.schedule.sample_start
    for k in range(probe.n_sweeps):
        windows[k, 0] = (0, int(starts[k + 1] - starts[k]) - 1, 0)
    ref_trace = probe.run(scheme.values[None], "traces").traces[0] * scheme.channels
    obj = ObjectiveInputs(ref_trace + rng.normal(0, 0.5, n), np.ones(n), windows)
    return SolverProblem(Path(path), scheme, prots, protocols, params, obj, precision)


def cpu_error(problem: SolverProblem, config, rows: int = 64) -> float:
    """Relative error of the variant's objective outputs against the CPU backend's."""
    check = problem.params[:rows]
    if "cpu_sgd" not in problem._ref or problem._ref["cpu_rows"] != rows:
        problem._ref["cpu_sgd"] = problem.simulator("cpu").run(check, "objective").sgd
        problem._ref["cpu_rows"] = rows
    ref = problem._ref["cpu_sgd"]
    got = problem.simulator("cuda").run(check, "objective", launch_config=config).sgd
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def exact_error(problem: SolverProblem, config, candidates: int = 3) -> float:
    """Largest error of the variant's traces against the exact solution, as a fraction of
    each sweep's peak current, over the first ``candidates`` candidates."""
    from kingen.solve.reference import simulate_exact

    k = min(candidates, problem.n_candidates)
    if problem._ref.get("exact_k") != k:
        refs = []
        for c in range(k):
            cur = []
            for prot in problem.protocols:
                cur += simulate_exact(problem.scheme, prot, problem.params[c]).currents
            refs.append(cur)
        problem._ref["exact"], problem._ref["exact_k"] = refs, k
    res = problem.simulator("cuda").run(problem.params[:k], "traces", launch_config=config)
    worst = 0.0
    for c in range(k):
        if np.any(res.fail[c]):
            return float("inf")
        for sweep, ref in enumerate(problem._ref["exact"][c]):
            got = res.sweep_trace(c, sweep) * problem.scheme.channels
            peak = float(np.abs(ref).max()) or 1.0
            err = float(np.abs(got - ref).max()) / peak
            if not np.isfinite(err):
                return float("inf")
            worst = max(worst, err)
    return worst


def variant_case(problem: SolverProblem, config, check_rows: int = 64) -> KernelCase:
    """One launch variant of the solver kernel on ``problem`` as a :class:`KernelCase`.

    Its check compares the objective outputs of ``check_rows`` candidates with the CPU
    backend's (the CPU reference is computed on the first check, not here: ncu's worker
    process rebuilds cases only to launch one, and the CPU run would dominate it).
    """
    sim = problem.simulator("cuda")
    state: dict[str, Any] = {}
    prec = problem.precision

    def launch() -> None:
        # prepared on the first launch: building a case compiles nothing
        if "call" not in state:
            state["call"] = sim.prepare_launch(problem.params, config)
        state["call"]()

    def check() -> float:
        return cpu_error(problem, config, check_rows)

    propagator = config.form == "propagator"
    return KernelCase(
        name=f"rk4_{problem.model}_{prec}_{config.name}",
        launch=launch,
        flops=problem.flops(config),
        bytes=problem.bytes(config),
        check=check,
        # the propagator form is a build kernel and a sample kernel: profile both
        kernel_regex="." if propagator else "launch",
        kernel_count=0 if propagator else 1,
        group="rk4",
        precision=prec,
        tolerance=CPU_TOLERANCE[prec],
        note=f"{problem.scheme.n_states}-state RK4 ({config.form} form), "
             f"{problem.total_steps} steps/candidate, {problem.n_candidates} candidates, "
             f"launch {config.name}",
        extra={"model": problem.model, "model_path": str(problem.path), "precision": prec,
               "variant": asdict(config), "steps_per_candidate": problem.total_steps,
               "protocols": problem.protocol_set,
               "threads": problem.n_candidates * problem.n_sweeps * max(config.lanes, 1)},
        worker_args=problem.worker_args(config),
    )


def analysis_cases(model: str | Path | None = None, n_candidates: int = 16384,
                   precision: str | None = None, protocol: str = "desensitization",
                   variants: tuple | None = None) -> list[KernelCase]:
    """The solver kernel as :class:`KernelCase` objects, one per variant and precision.

    ``variants`` defaults to the launch the solver would use on this device (its tuned
    choice, else the default); ``precision`` None means both float64 and float32.
    """
    cases = []
    for prec in ((precision,) if precision else ("float64", "float32")):
        problem = solver_problem(model, n_candidates, prec, protocol)
        for variant in variants or (problem.simulator("cuda").launch_config(),):
            cases.append(variant_case(problem, variant))
    return cases
