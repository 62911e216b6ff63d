"""The batched RK4 solver behind one function, on the GPU or on all CPU cores.

A batch is candidates × sweeps. :class:`Simulator` prepares everything that does not change
between generations (schedule, waveforms, data, device arrays) once; each call then moves
only the parameters in and a small result array out. :func:`simulate_batch` is the one-shot
form.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from kingen.codegen import FAIL_PARAMS, N_WINDOWS, out_width
from kingen.codegen.span import fold_arrays
from kingen.errors import KingenError
from kingen.experiment.chain import SECTION_VALUES, filter_sections
from kingen.experiment.protocol import Protocol
from kingen.model.scheme import Scheme
from kingen.solve.backends import choose_backend
from kingen.solve.compiled import solver_module
from kingen.solve.cpu import run_on_cpu
from kingen.solve.gpu_call import cuda_call
from kingen.solve.inputs import solver_inputs, solver_rates, solver_rest
from kingen.solve.options import SolverOptions, options_from_keywords
from kingen.solve.plan import PropagatorPlan, plan_propagator
from kingen.solve.results import BatchResult, ObjectiveInputs, result_store, window_values
from kingen.solve.schedule import build_schedule, protocol_sweeps

log = logging.getLogger("kingen")

# Tolerance on probabilities (range and conservation) before a candidate is failed.
TOLERANCE = {"float64": 1e-6, "float32": 1e-3}


class Simulator:
    """A prepared batch: one scheme, a list of protocols, a backend and a precision.

    Parameters
    ----------
    scheme
        The kinetic scheme.
    protocols
        Protocols whose sweeps make up the batch's second dimension.
    options
        Backend, precision, step, Courant number and launch configuration
        (:class:`~kingen.solve.options.SolverOptions`; default: its defaults).
    objective
        Data, weights and windows for objective mode (see :class:`ObjectiveInputs`).
    filters
        The recording filter of each protocol (a :class:`kingen.experiment.chain.Filter`, or
        None for none): every sample's current passes through it, inside the kernel, before
        it is reduced or returned (see :meth:`run`'s ``filtered``).
    """

    def __init__(
        self,
        scheme: Scheme,
        protocols: list[Protocol],
        options: SolverOptions | None = None,
        *,
        objective: ObjectiveInputs | None = None,
        filters: list | None = None,
    ) -> None:
        self.options = options = options if options is not None else SolverOptions()
        self.scheme = scheme
        self.protocols = list(protocols)
        self.sweeps, self.spans = protocol_sweeps(self.protocols)
        self.precision = options.precision
        self.backend, status = choose_backend(options.backend)
        self.simulator = bool(status and status.simulator and self.backend == "cuda")
        self.device = (status.device if self.backend == "cuda" and status else "cpu")
        self.schedule = build_schedule(scheme, self.sweeps, step=options.step,
                                       courant=options.courant)
        self.drive = np.array([s.driving_force * 1e-3 for s in self.sweeps])
        if objective is not None:
            # cast once here, not on every generation's call
            objective = ObjectiveInputs(np.ascontiguousarray(objective.data, np.float64),
                                       np.ascontiguousarray(objective.weight, np.float64),
                                       np.ascontiguousarray(objective.windows, np.int64),
                                       bool(objective.sum_g))
        self.objective = objective
        if objective is not None:
            n = self.schedule.n_samples
            if objective.data.shape != (n,) or objective.weight.shape != (n,):
                raise ValueError(f"data and weight must have {n} samples")
            if objective.windows.shape != (len(self.sweeps), N_WINDOWS, 3):
                raise ValueError("windows must be (n_sweeps, 4, 3)")
        self.sections = filter_sections(self.protocols, filters)
        self._device_arrays: dict[str | tuple, object] = {}
        self._host: dict[str, np.ndarray] = {}  # scratch that calls rewrite (on_device)
        self._modules: dict[tuple, object] = {}  # each launch's compiled module
        self._fold_host: dict[tuple, tuple] = {}  # a folded filter's arrays, per launch
        self._gpu_lock = threading.Lock()
        self._config: dict[bool, object] = {}  # the default launch, per batch size class
        self._plan: PropagatorPlan | None = None

    def __getstate__(self) -> dict:
        # device arrays and the lock belong to this process: a copy builds its own
        state = self.__dict__.copy()
        state["_device_arrays"], state["_host"], state["_modules"] = {}, {}, {}
        del state["_gpu_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._gpu_lock = threading.Lock()

    # ------------------------------------------------------------------ public
    @property
    def n_sweeps(self) -> int:
        """Sweeps in the batch."""
        return len(self.sweeps)

    @property
    def n_sections(self) -> int:
        """Second-order sections of the longest filter of the batch (0: no filter)."""
        return 0 if self.sections is None else self.sections.shape[1]

    def run(self, params: np.ndarray, mode: str = "objective", *,
            with_occupancy: bool = False, launch_config=None, complete: bool = True,
            while_solving: Callable[[], object] | None = None, filtered: bool = True,
            on_device: bool = False, batch_rows: int | None = None,
            rest: np.ndarray | Callable[[], np.ndarray] | None = None) -> BatchResult:
        """Simulate every candidate under every sweep.

        Parameters
        ----------
        params
            (N, n_params) parameters, internal units. Rows with non-finite or non-positive
            values fail with code 4 and are not simulated.
        mode
            ``objective`` (needs ``objective`` inputs) or ``traces``.
        with_occupancy
            In trace mode, also return occupancies.
        launch_config
            The GPU's launch (``LaunchConfig``); default: :meth:`launch_config`'s.
        complete
            Recompute the derived rates (default). False: ``params`` holds them already
            (:meth:`kingen.model.scheme.Scheme.complete` has run on it).
        while_solving
            Called once while the solver runs (on the GPU after the launch, on the CPU
            before the solve), so that work it starts elsewhere does not compete with the
            solve's preparation for the interpreter's lock.
        filtered
            Pass the current through the protocols' filters (default); False gives the
            model's own current (a plot shows both).
        on_device
            Trace mode, for a reduction where the traces are made
            (:mod:`kingen.solve.gnsums`): on the GPU leave them on the device (``traces`` is
            then a device array), on the CPU write them into a buffer the simulator keeps.
            Either is valid until the next call, and a failed candidate's samples there
            are not NaN: its ``fail`` code says so.
        batch_rows
            Rows of the whole batch these are a block of: its default launch is taken.
        rest
            The rows' resting occupancies (N, n_states), solved already from the same rates
            (see :meth:`inputs`), or a function that returns them, called where they are
            needed (on the GPU once the matrix builds are queued); None: solved here.
        """
        if mode not in ("objective", "traces"):
            raise KingenError("unknown mode (use objective or traces)", field="mode",
                              value=mode)
        if mode == "objective" and self.objective is None:
            raise KingenError("objective mode needs data: build the Simulator with "
                              "objective=...", field="mode", value=mode)
        t_start = time.perf_counter()
        P, p, bad = solver_rates(self.scheme, params, self.precision, complete=complete)
        n = P.shape[1]

        def rest_state() -> np.ndarray:  # on the GPU while the matrix builds run
            nonlocal bad  # and the rows whose resting state fails
            S0, bad = solver_rest(self.scheme, p, bad, self.precision,
                                  rest=rest() if callable(rest) else rest)
            return S0

        fail = np.zeros((self.n_sweeps, n), dtype=np.int32)
        if mode == "objective":
            obj, n_out = self.objective, self._out_shape(n)[0]
            # fresh every call (a result may keep views of it); the kernel's results fill
            # its first planes (on the GPU by the copy back, the store made while the
            # kernels run), and the windows are a view
            store = out = None
            if self.backend == "cpu":
                store = result_store(n, self.n_sweeps, self._sums(), self._n_windows(mode))
                out = store[:n_out]
                out[...] = 0.0
            extra = (obj.data, obj.weight, obj.windows, out)
        else:
            shape = (n, self.schedule.n_samples)
            if on_device and self.backend == "cuda":
                traces = np.empty(shape)  # kept on the GPU: only its shape is read
            elif on_device:  # scratch every call rewrites: a fresh NaN-filled GB cost a solve
                if getattr(self._host.get("traces"), "shape", None) != shape:
                    self._host["traces"] = np.empty(shape)
                traces = self._host["traces"]
            else:
                traces = np.full(shape, np.nan, dtype=np.float64)
            occ_shape = ((n, self.schedule.n_samples, self.scheme.n_states) if with_occupancy
                         else (1, 1, 1))
            occ = np.full(occ_shape, np.nan, dtype=np.float64)
            extra = (traces, occ, np.zeros(1), np.zeros(1))
        t_prep = time.perf_counter()
        config = self._config_for(launch_config, with_occupancy, mode, batch_rows or n)
        module = self._module(mode, config, with_occupancy, self.n_sections if filtered else 0)
        if self.backend == "cpu":
            S0 = rest_state()
            if while_solving is not None:
                while_solving()
            t_compile = time.perf_counter()  # the callback's time is not the solve's
            self._cpu_call(module, config, P, S0, extra, fail)
            results = list(extra) + [fail]
            t_run = time.perf_counter()
        else:
            from numba import cuda

            # one call at a time: the device buffers are the simulator's, not the call's
            with self._gpu_lock:
                t_compile = time.perf_counter()
                call, dev_out = self._cuda_call(module, config, P, rest_state, extra, fail,
                                                mode, on_device)
                try:
                    call()
                    if while_solving is not None:
                        while_solving()
                    if mode == "objective":
                        store = result_store(n, self.n_sweeps, self._sums(),
                                             self._n_windows(mode))
                        out = store[:n_out]
                finally:  # the kernels write the simulator's buffers: they must finish
                    cuda.synchronize()
                t_run = time.perf_counter()
                if mode == "objective":  # the inputs (data, weights, windows) stay there
                    dev_out[3].copy_to_host(out)
                    results = [*extra[:3], out, dev_out[4].copy_to_host()]
                elif on_device:  # the traces stay; the failure codes come back
                    results = [*dev_out[:-1], dev_out[-1].copy_to_host()]
                else:
                    results = [x.copy_to_host() for x in dev_out]
        fail = results[-1].T.copy()
        fail[bad, :] = FAIL_PARAMS
        res = BatchResult(self.backend, self.device, self.precision, self.schedule, fail)
        if mode == "objective":
            res.sgg, res.sgd = out[0], out[1]
            res.windows = window_values(store, n, self.n_sweeps, self._sums())
            failed = fail != 0
            res.sgg[failed] = np.inf
            res.sgd[failed] = 0.0
            if self._sums() == 3:
                res.sg = out[2]
                res.sg[failed] = 0.0
        else:
            res.traces = results[0]
            if with_occupancy:
                res.occupancy = results[1]
            for k in range(0 if on_device else self.n_sweeps):
                a, b = self.schedule.sample_start[k], self.schedule.sample_start[k + 1]
                res.traces[fail[:, k] != 0, a:b] = np.nan
        t_end = time.perf_counter()
        res.timings = {"prepare_s": t_prep - t_start, "compile_s": t_compile - t_prep,
                       "solve_s": t_run - t_compile, "finish_s": t_end - t_run,
                       "total_s": t_end - t_start}
        return res

    def _out_shape(self, n: int) -> tuple[int, int, int]:
        """The objective mode's results: (value, candidate, sweep); see ``out_width``."""
        return (out_width(self._n_windows("objective"), self._sums()), n, self.n_sweeps)

    def _sums(self) -> int:
        """Sums per pair the objective mode reduces: Σw·g², Σw·g·d (and Σw·g)."""
        return 3 if self.objective is not None and self.objective.sum_g else 2

    def prepare_launch(self, params: np.ndarray, launch_config=None):
        """A function that launches the objective solve once on data already on the GPU,
        without synchronising: for timing and profiling the bare kernels (in the propagator
        form, the build kernel and the sample kernel). It launches on this simulator's
        device buffers: a later :meth:`run` with as many candidates replaces its inputs."""
        P, S0, _ = self.inputs(params)
        n = P.shape[1]
        config = self._config_for(launch_config, False, n=n)
        module = self._module("objective", config, False, self.n_sections)
        out = np.empty((0, 0, 0))  # the kernel's results stay on the GPU
        obj = self.objective
        assert obj is not None
        extra = (obj.data, obj.weight, obj.windows, out)
        call, _ = self._cuda_call(module, config, P, S0, extra,
                                  np.zeros((self.n_sweeps, n), dtype=np.int32), "objective")
        return call

    def propagator_plan(self) -> PropagatorPlan:
        """The keys and rows the propagator form uses for this batch's schedule (on the GPU
        every constant-concentration row has one)."""
        if self._plan is None:
            self._plan = plan_propagator(self.scheme, self.schedule,
                                         every_constant_row=self.backend == "cuda")
        return self._plan

    def launch_config(self, n_candidates: int | None = None):
        """The launch used when none is given: on the GPU the one ``kingen tune`` recorded
        for this device, scheme and precision, else the default for the scheme's size, its
        stage rows, its filter and the batch's size (``n_candidates``; None: a fit's
        generation); on the CPU the propagator form with spans of 16 samples."""
        from kingen.solve.cuda import CPU_DEFAULT, small_batch, tuned_config

        if self.backend != "cuda":
            return CPU_DEFAULT
        small = small_batch(n_candidates)
        if small not in self._config:
            self._config[small] = tuned_config(self.device, self.scheme, self.precision,
                                               self.propagator_plan().stage_rows,
                                               self.n_sections > 0, small)
        return self._config[small]

    def inputs(self, params: np.ndarray, complete: bool = True,
               rest: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``params`` (N, n_params) in the solver's layout and precision: the rates
        (n_params, N), the initial occupancies (n_states, N) and the rows that fail unsolved
        (:func:`~kingen.solve.inputs.solver_inputs`, whose ``rest`` takes resting
        occupancies solved already)."""
        return solver_inputs(self.scheme, params, self.precision, complete=complete,
                             rest=rest)

    # ------------------------------------------------------------------ internals
    def _flt(self) -> np.ndarray:
        """The kernels' ``flt`` argument: each sweep's filter sections (one unused row when
        the batch has no filter: a kernel argument may not be empty on every target)."""
        if self.sections is None:
            return np.zeros((self.n_sweeps, 1, SECTION_VALUES))
        return self.sections

    def _config_for(self, launch_config, with_occupancy: bool, mode: str = "objective",
                    n: int | None = None):
        from kingen.solve.cuda import FORMS
        config = launch_config or self.options.launch or self.launch_config(n)
        if config.form not in FORMS:
            raise KingenError("unknown solver form (use stage or propagator)", field="form",
                              value=config.form)
        if config.span > 1 and config.lanes < 2 and self.backend == "cuda":
            raise KingenError("spans on the GPU need at least two lanes (e.g. "
                              "prop-l8-s16-b128)", field="variant", value=config.name)
        if with_occupancy and (config.lanes != 1 or config.span > 1):
            # occupancies are written by the thread that holds the whole state, sample by
            # sample: one product per sample
            config = replace(config, lanes=1, span=1)
        return config

    def _module(self, mode: str, config, with_occupancy: bool, n_sections: int = 0):
        """A launch's compiled module, on either backend, found once: making its source to
        look it up cost 4 ms a call, a fifth of a profile's step."""
        key = (mode, config, with_occupancy, n_sections)
        if key not in self._modules:
            self._modules[key] = solver_module(
                self.scheme, mode, self.precision, self.backend, with_occupancy=with_occupancy,
                simulator=self.simulator, form=config.form, span=config.span,
                max_registers=config.max_registers, block=config.block,
                lanes=config.lanes if self.backend == "cuda" else 1,
                stage_rows=self.propagator_plan().stage_rows, n_windows=self._n_windows(mode),
                n_sections=n_sections, with_sum=self._sums() == 3,
                edge_rows=self.propagator_plan().edge_rows)
        return self._modules[key]

    def _n_windows(self, mode: str) -> int:
        """Feature windows the objective uses (the kernel carries only these)."""
        if mode != "objective" or self.objective is None:
            return N_WINDOWS
        used = np.nonzero((self.objective.windows[:, :, 2] >= 0).any(axis=0))[0]
        return int(used.max()) + 1 if used.size else 0

    def _fold_arrays(self, config) -> tuple:
        """A folded filter's host arrays (:func:`kingen.codegen.span.fold_arrays`)."""
        key = (config.lanes, config.span)
        if key not in self._fold_host:
            plan = self.propagator_plan()
            self._fold_host[key] = fold_arrays(plan.row_key, self.schedule.row_start,
                                               plan.n_span_keys, self.sections, config.span,
                                               config.lanes)
        return self._fold_host[key]

    def _cpu_call(self, module, config, P: np.ndarray, S0: np.ndarray, extra: tuple,
                  fail: np.ndarray) -> None:
        run_on_cpu(module, config, P, S0, extra, fail, plan=self.propagator_plan(),
                   schedule=self.schedule, drive=self.drive, flt=self._flt(),
                   tol=TOLERANCE[self.precision])

    def _cuda_call(self, module, config, P: np.ndarray,
                   S0: np.ndarray | Callable[[], np.ndarray], extra: tuple, fail: np.ndarray,
                   mode: str, on_device: bool = False):
        """:func:`kingen.solve.gpu_call.cuda_call` of this simulator."""
        return cuda_call(self, module, config, P, S0, extra, fail, mode, on_device,
                         tol=TOLERANCE[self.precision])


def simulate_batch(
    scheme: Scheme,
    protocols: list[Protocol] | Protocol,
    params: np.ndarray,
    mode: str = "traces",
    *,
    options: SolverOptions | None = None,
    objective: ObjectiveInputs | None = None,
    with_occupancy: bool = False,
    filters: list | None = None,
    backend: str | None = None,
    precision: str | None = None,
    step: float | None = None,
) -> BatchResult:
    """Simulate a batch of candidates under every sweep of the protocols, by RK4.

    Parameters
    ----------
    scheme
        The kinetic scheme.
    protocols
        One protocol or a list.
    params
        (N, n_params) rate constants in internal units (ms⁻¹, mM⁻¹ ms⁻¹).
    mode
        ``traces`` (currents at the sample times) or ``objective`` (errors and window values
        reduced in the kernel; needs ``objective``).
    options
        Backend, precision, step (:class:`~kingen.solve.options.SolverOptions`).
    objective
        Data, weights and windows for objective mode.
    with_occupancy
        In trace mode, also return the occupancies.
    filters
        The recording filter of each protocol, or None (see :class:`Simulator`).
    backend, precision, step
        Deprecated: give them in ``options``.

    Examples
    --------
    Two candidates (the scheme's own rates, and all of them doubled) under deactivation:

    >>> import kingen
    >>> scheme = kingen.Scheme.load("models/jonas_1993.toml")
    >>> params = np.vstack([scheme.values, 2 * scheme.values])
    >>> result = simulate_batch(scheme, kingen.standard_protocol("deactivation"), params,
    ...                         options=kingen.SolverOptions(backend="cpu"))
    >>> result.traces.shape  # (candidates, samples of every sweep)
    (2, 1501)
    >>> bool(result.traces[1].min() < 0)  # inward current (pA)
    True
    """
    if isinstance(protocols, Protocol):
        protocols = [protocols]
    options = options_from_keywords(options, "simulate_batch", backend=backend,
                                    precision=precision, step=step)
    sim = Simulator(scheme, protocols, options, objective=objective, filters=filters)
    log.info("kingen: solving on %s (%s, %s)", sim.backend, sim.device, options.precision)
    return sim.run(params, mode, with_occupancy=with_occupancy)
