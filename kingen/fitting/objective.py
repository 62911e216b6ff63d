"""What a candidate is scored on: errors per protocol against recordings and summary targets.

:class:`Objective` is built once per fit from the scheme and, per protocol, a recording
and/or summary targets. It prepares one :class:`~kingen.solve.batch.Simulator` whose kernel
reduces every (candidate, sweep) pair to Σw·g², Σw·g·d and four window values, and turns a
batch result into per-candidate, per-protocol errors.

The amplitude A of a recorded protocol (number of channels: the fitted current is A × the
one-channel current of the scheme) is solved in closed form by least squares over all its
sweeps, A = Σw·g·d / Σw·g², clamped ≥ 0, unless the configuration fixes it. The trace
error of the protocol is the *relative squared error*

    e_trace = Σ w (A g − d)² / Σ w d² = (Σw·d² − 2A Σw·g·d + A² Σw·g²) / Σw·d²,

0 for a perfect fit and 1 for a fit no better than zero current, whatever the size of the
current. Placement on the sample grid: :mod:`kingen.fitting.placement`; the chain's
amplitudes and offsets: :mod:`kingen.fitting.scales`; targets: :mod:`kingen.fitting.targets`.

A protocol's error is e_trace + e_targets (whichever it has). A fit scores candidates on
the likelihood (:meth:`Objective.set_noise`, with the noise model of
:mod:`kingen.identify.noise`): protocol p's χ²_p is Σ w (A g − d)² / (σ_p² τ_p) plus its
targets' Σ s_t w_t ((m_t − y_t) / scale_t)², and the fitness is Σ_p weight_p · χ²_p, which
with the default weights of 1 is χ² = −2 log L + const, the quantity ``kingen profile``
and the Fisher information use. Without a noise model (runs written before kingen fitted
the likelihood, and objectives built alone) the fitness is Σ_p weight_p · error_p. A
candidate that fails in any sweep (``fail`` ≠ 0) gets fitness +inf and its failure code;
the rest of the batch is unaffected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kingen.codegen import FAIL_NONFINITE
from kingen.errors import KingenError
from kingen.experiment.chain import Chain, check_filter
from kingen.experiment.features import fit_hill_batch
from kingen.experiment.protocol import Protocol
from kingen.experiment.recordings import Recording, Targets
from kingen.fitting.params import void_outside
from kingen.fitting.placement import BASELINES, place_recording
from kingen.fitting.scales import score_rows, solve_scales
from kingen.fitting.scores import Evaluation, NoiseWeights
from kingen.fitting.targets import (
    TARGET_KEYS,
    ProtocolPlan,
    fit_recovery_batch,
    host_windows,
    sweep_windows,
    switched_off,
)
from kingen.fitting.temperature import simulator_for
from kingen.fitting.traces import TraceScoring
from kingen.model.scheme import Scheme
from kingen.solve.batch import BatchResult, ObjectiveInputs
from kingen.solve.options import SolverOptions, options_from_keywords
from kingen.solve.schedule import protocol_sweeps

__all__ = ["BASELINES", "PLAUSIBLE_CHANNELS", "TARGET_KEYS", "Evaluation", "NoiseWeights",
           "Objective", "ProtocolData", "fit_hill_batch", "fit_recovery_batch",
           "host_windows", "solve_scales", "solver_scheme", "sweep_windows"]


# Channels a recording can plausibly hold: fewer than one is no current, more than a million
# is more than a whole neuron's AMPA receptors. Outside, the current's unit is most often
# wrong (nA under a pA header, or pA under an nA header).
PLAUSIBLE_CHANNELS = (1.0, 1e6)


@dataclass
class ProtocolData:
    """One protocol of a fit and what it is compared with.

    Attributes
    ----------
    protocol
        The protocol (its sweeps set the sample grids).
    recording
        Recorded sweeps, matched to the protocol's sweeps by label, else by order.
    targets
        Summary targets.
    weight
        Weight of this protocol's error in the fitness.
    amplitude
        Fixed amplitude (number of channels); None solves it by least squares.
    mask
        Time ranges (ms, from each sweep's start) whose samples are ignored.
    baseline
        What is subtracted from the recording first (:data:`BASELINES`): ``"none"``, the
        mean pre-pulse current of all sweeps (``"pre-pulse"``) or of each sweep
        (``"per-sweep"``).
    source
        Where this protocol was configured (for error messages).
    chain
        The recording chain (:class:`~kingen.experiment.chain.Chain`): the filter the
        model current passes through before it is compared, and how amplitudes and
        offsets are fitted.
    """

    protocol: Protocol
    recording: Recording | None = None
    targets: Targets | None = None
    weight: float = 1.0
    amplitude: float | None = None
    mask: list[tuple[float, float]] = field(default_factory=list)
    baseline: str = "none"
    source: str = "<config>"
    chain: Chain = field(default_factory=Chain)
    noise: NoiseWeights | None = None


def solver_scheme(scheme: Scheme) -> Scheme:
    """The scheme as the solver sees it: derived rates as plain parameters.

    :meth:`Objective.guard` has already computed every derived rate and failed the
    candidates that take one outside its bounds, so the solver must not recompute them
    (``Scheme.complete`` on every candidate, every generation).
    """
    from dataclasses import replace

    params = [replace(p, derived=False) for p in scheme.parameters]
    return replace(scheme, parameters=params, derived_rules=[])


class Objective(TraceScoring):
    """Errors per protocol for batches of candidates.

    Parameters
    ----------
    scheme
        The scheme (with the fit's overrides applied).
    items
        One :class:`ProtocolData` per protocol.
    options
        The solver's options (:class:`~kingen.solve.options.SolverOptions`), passed to
        :class:`~kingen.solve.batch.Simulator`.
    backend, precision, step, courant
        Deprecated: give them in ``options``.

    Raises
    ------
    KingenError
        If a recording does not match its protocol's sweeps, holds no usable sample, or a
        target cannot be mapped onto the protocol.
        A recorded sweep that starts after 0 with the gap unmasked is no error here: it
        is listed in ``late_starts``, which a new fit (:func:`kingen.fit`) refuses.

    Examples
    --------
    Score two candidates (the demo model's own rates, twice) against the demo's data:

    >>> import kingen, numpy as np
    >>> cfg = kingen.load_config(kingen.demo_config())
    >>> objective = kingen.Objective(cfg.scheme, cfg.protocols,
    ...                              kingen.SolverOptions(backend="cpu"))
    >>> objective.names
    ['deactivation', 'desensitization', 'recovery', 'dose_response']
    >>> evaluation, _ = objective.evaluate(np.stack([cfg.scheme.values] * 2))
    >>> evaluation.fitness.shape, evaluation.errors.shape, evaluation.fail.tolist()
    ((2,), (2, 4), [0, 0])
    """

    def __init__(self, scheme: Scheme, items: list[ProtocolData],
                 options: SolverOptions | None = None, *, backend: str | None = None,
                 precision: str | None = None, step: float | None = None,
                 courant: float | None = None) -> None:
        options = options_from_keywords(options, "Objective", backend=backend,
                                        precision=precision, step=step, courant=courant)
        if not items:
            raise KingenError("no protocols to fit", field="protocols")
        self.scheme = scheme
        self.items = list(items)
        self.protocols = [it.protocol for it in items]
        self.names = [p.name for p in self.protocols]
        sweeps, self.spans = protocol_sweeps(self.protocols)
        self.sample_start = np.concatenate(
            [[0], np.cumsum([s.n_samples for s in sweeps])]).astype(np.int64)
        n = int(self.sample_start[-1])
        self.data = np.zeros(n)
        self.weight = np.zeros(n)
        self.plans: list[ProtocolPlan] = []
        self.warnings: list[str] = []
        # recorded sweeps that start after 0 with the gap unmasked: a new fit refuses them
        # (kingen.fit); a run that has one is still resumed, profiled and read
        self.late_starts: list[KingenError] = []
        windows = []
        for item, (a, _) in zip(self.items, self.spans, strict=True):
            plan = ProtocolPlan(item, a)
            self.plans.append(plan)
            windows.append(plan.windows if plan.targets else switched_off(plan.windows))
            if item.recording is not None:
                place_recording(self, item, a)
            elif item.targets is None:
                raise KingenError("nothing to fit: give a recording or targets",
                                  file=item.source,
                                  field=f"protocols.{item.protocol.name}")
        self.windows = np.concatenate(windows).astype(np.int64)
        self.dd = np.array([float((self.weight[self._slice(p)] * self.data[self._slice(p)] ** 2)
                                  .sum()) for p in range(len(self.items))])
        # the data's own sums per sweep, for amplitudes and offsets fitted per sweep
        wd = self.weight * self.data
        self.sweep_sd = np.add.reduceat(wd, self.sample_start[:-1])
        self.sweep_sw = np.add.reduceat(self.weight, self.sample_start[:-1])
        self.sweep_sdd = np.add.reduceat(wd * self.data, self.sample_start[:-1])
        filters = [self._chain_filter(item) for item in self.items]
        for item, dd in zip(self.items, self.dd, strict=True):
            # the errors are relative to the data's own size: data of size 0 has none
            if item.recording is not None and not (np.finfo(float).tiny <= dd < math.inf):
                raise KingenError("the recorded current is zero throughout, or too small or "
                                  "large to square (beyond 1e±154 pA): check its unit",
                                  file=item.recording.source,
                                  field=f"protocols.{item.protocol.name}")
        for p, item in enumerate(self.items):
            if item.recording is not None and self.one_channel_pA(p) > 0:
                peak = float(np.max(np.abs(self.data[self._slice(p)])))
                self.warnings += self._size_warnings(p, peak / self.one_channel_pA(p),
                                                     f"the largest recorded current, {peak:.3g} "
                                                     "pA, is that of fully open")
        self.proto_weight = np.array([it.weight for it in self.items], dtype=float)
        self.noise: list[NoiseWeights] | None = None
        if all(it.noise is not None for it in self.items):
            self.set_noise([it.noise for it in self.items])
        self.derived = np.array([p.derived for p in scheme.parameters], dtype=bool)
        sum_g = any(not self._plain(p) and item.chain.offset != "none"
                    for p, item in enumerate(self.items))
        # one solver per temperature when protocols are recorded at several
        self.simulator = simulator_for(solver_scheme(scheme), self.protocols, options,
                                       rates_of=scheme,
                                       objective=ObjectiveInputs(self.data, self.weight,
                                                                 self.windows, sum_g),
                                       filters=filters)
        if not np.array_equal(self.simulator.schedule.sample_start, self.sample_start):
            raise RuntimeError("sample grids of the objective and the schedule differ")

    # ------------------------------------------------------------------ the likelihood
    def set_noise(self, weights: list[NoiseWeights]) -> None:
        """Score candidates on the likelihood from now on: the fitness becomes
        Σ_p weight_p · χ²_p (see the module docstring) and :attr:`Evaluation.chi2` the χ².

        The weights are kept in :attr:`items` too, so that an objective built from them
        (a worker's) scores the same.

        Parameters
        ----------
        weights
            One :class:`NoiseWeights` per protocol (from
            :func:`kingen.identify.likelihood.noise_weights`).

        Examples
        --------
        >>> import kingen
        >>> cfg = kingen.load_config(kingen.demo_config())
        >>> options = cfg.solver.replace(backend="cpu")
        >>> objective = kingen.Objective(cfg.scheme, cfg.protocols, options)
        >>> objective.fitness_kind
        'relative'
        >>> objective.set_noise([NoiseWeights(trace=1.0)] * objective.n_protocols)
        >>> objective.fitness_kind
        'chi2'
        """
        if len(weights) != self.n_protocols:
            raise ValueError("one NoiseWeights per protocol")
        for p, (w, plan) in enumerate(zip(weights, self.plans, strict=True)):
            if len(w.targets) != len(plan.targets):
                raise ValueError(f"protocol {self.names[p]}: one factor per target")
            self.items[p] = replace(self.items[p], noise=w)
        self.noise = list(weights)
        self._trace_coef = np.array([w.trace for w in weights], dtype=float)
        self._target_factor = [np.array(w.targets, dtype=float) for w in weights]

    @property
    def fitness_kind(self) -> str:
        """``"chi2"`` when candidates are scored on the likelihood, else ``"relative"``
        (the weighted relative errors of runs written before)."""
        return "relative" if self.noise is None else "chi2"

    # ------------------------------------------------------------------ the chain
    def _chain_filter(self, item: ProtocolData) -> Any:
        """The protocol's filter, checked against its sweeps; the chain's amplitude and
        offset need a recording to be fitted to."""
        chain, where = item.chain, f"protocols.{item.protocol.name}"
        if item.recording is None and chain.offset != "none":
            raise KingenError("an offset is fitted to a recording: this protocol has none",
                              file=item.source, field=f"{where}.offset", value=chain.offset)
        if item.recording is None and chain.amplitude != "per-protocol":
            raise KingenError("amplitudes per sweep are fitted to a recording: this protocol "
                              "has none", file=item.source, field=f"{where}.amplitude",
                              value=chain.amplitude)
        if item.amplitude is not None and chain.amplitude != "per-protocol":
            raise KingenError("a fixed amplitude is one number for the protocol",
                              file=item.source, field=f"{where}.amplitude",
                              value=chain.amplitude)
        if chain.filter is not None:
            check_filter(chain.filter, [s.dt for s in item.protocol.sweeps], file=item.source,
                         field=f"{where}.filter")
        return chain.filter

    def _plain(self, p: int) -> bool:
        """Protocol ``p``'s trace error takes one amplitude and no offset."""
        chain = self.items[p].chain
        return chain.offset == "none" and chain.amplitude == "per-protocol"

    def _scales(self, p: int, sgg: np.ndarray, sgd: np.ndarray, sg: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sse, amplitudes, offsets) of protocol ``p`` from its sweeps' sums (N, K):
        :func:`solve_scales` with its chain."""
        a, b = self.spans[p]
        item = self.items[p]
        return solve_scales(sgg, sgd, sg, self.sweep_sd[a:b], self.sweep_sw[a:b],
                            self.sweep_sdd[a:b], amplitude=item.chain.amplitude,
                            offset=item.chain.offset, fixed=item.amplitude)

    def _protocol_amplitude(self, p: int, amp: np.ndarray) -> np.ndarray:
        """The one amplitude a protocol reports (and its current-valued targets use) from
        its sweeps' (N, K): their mean when fitted per sweep, else the first sweep's."""
        return amp.mean(axis=1) if self.items[p].chain.amplitude == "per-sweep" else amp[:, 0]

    def _sample_scales(self, p: int, traces: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Amplitude and offset of every sample of protocol ``p`` (N, samples), fitted to
        ``traces`` (all sweeps, finite), and the protocol's amplitude (N,)."""
        a, b = self.spans[p]
        starts = self.sample_start[a:b + 1] - self.sample_start[a]
        g = traces[:, self._slice(p)]
        w, d = self.weight[self._slice(p)], self.data[self._slice(p)]
        sgg = np.add.reduceat(g * g * w, starts[:-1], axis=1)
        sgd = np.add.reduceat(g * (w * d), starts[:-1], axis=1)
        sg = np.add.reduceat(g * w, starts[:-1], axis=1)
        _, amp, off = self._scales(p, sgg, sgd, sg)
        sizes = np.diff(starts)
        return (np.repeat(amp, sizes, axis=1), np.repeat(off, sizes, axis=1),
                self._protocol_amplitude(p, amp))

    # ------------------------------------------------------------------ data placement
    def _slice(self, p: int) -> slice:
        a, b = self.spans[p]
        return slice(int(self.sample_start[a]), int(self.sample_start[b]))
    # ------------------------------------------------------------------ current size
    def one_channel_pA(self, p: int) -> float:
        """The current of one channel fully open under protocol ``p``, pA (the largest
        conductance of the scheme at the sweeps' largest driving force)."""
        drive = max((abs(s.holding - s.reversal) for s in self.items[p].protocol.sweeps),
                    default=0.0)
        return float(np.max(self.scheme.conductance)) * drive * 1e-3

    def _size_warnings(self, p: int, channels: float, what: str) -> list[str]:
        """A warning naming the likely unit where ``channels`` (fully open channels the
        current of protocol ``p`` takes) is outside :data:`PLAUSIBLE_CHANNELS`."""
        lo, hi = PLAUSIBLE_CHANNELS
        # no channel passes a current at the reversal potential: no size to judge
        if not math.isfinite(channels) or lo <= channels <= hi or not self.one_channel_pA(p):
            return []
        item = self.items[p]
        source = item.recording.source if item.recording is not None else item.source
        likely = ("is the current in nA under a current_pA header?" if channels < lo else
                  "is the current in pA under a current_nA header?")
        return [f"warning: {source}: protocols.{item.protocol.name}: {what} {channels:.3g} "
                f"channels (one open channel passes {self.one_channel_pA(p):.3g} pA; "
                f"plausible: {lo:g} to {hi:g}): {likely}"]

    def amplitude_warnings(self, amplitudes: dict[str, float]) -> list[str]:
        """Warnings for fitted amplitudes (channels, by protocol) below one channel or above
        :data:`PLAUSIBLE_CHANNELS`, naming the likely unit of the current.

        Examples
        --------
        >>> import kingen
        >>> cfg = kingen.load_config(kingen.demo_config())
        >>> objective = kingen.Objective(cfg.scheme, cfg.protocols,
        ...                              kingen.SolverOptions(backend="cpu"))
        >>> objective.amplitude_warnings({"deactivation": 120.0})
        []
        >>> objective.amplitude_warnings({"deactivation": 0.69})[0].split(": ")[-1]
        'is the current in nA under a current_pA header?'
        """
        out = []
        for p, item in enumerate(self.items):
            amp = amplitudes.get(item.protocol.name, math.nan)
            if item.amplitude is None:  # a fixed amplitude is the user's own number
                out += self._size_warnings(p, abs(amp), "the fitted amplitude is")
        return out

    # ------------------------------------------------------------------ evaluation
    def guard(self, params: np.ndarray, *, complete: bool = True) -> np.ndarray:
        """Parameters with derived rates recomputed; rows whose derived rates leave their
        bounds become NaN, which the solver fails (code 4) without simulating them.

        Parameters
        ----------
        params
            (N, n_params) internal units.
        complete
            False: the derived rates of ``params`` are already computed
            (:meth:`~kingen.fitting.params.ParameterMap.to_params` does it), only their bounds are
            checked. Either way ``params`` itself is never written into.
        """
        p = np.atleast_2d(np.asarray(params, dtype=np.float64))
        if complete:
            p = self.scheme.complete(p)
        if self.derived.any():
            j = np.flatnonzero(self.derived)
            # a copy only where a row is outside: p is the caller's unless completed here
            p = void_outside(p, j, self.scheme.lower[j] * (1 - 1e-9),
                             self.scheme.upper[j] * (1 + 1e-9), copy=not complete)
        return p

    @property
    def n_protocols(self) -> int:
        """Number of protocols."""
        return len(self.items)

    def evaluate(self, params: np.ndarray, *, complete: bool = True,
                 while_solving: Callable[[], object] | None = None,
                 batch_rows: int | None = None,
                 rest: np.ndarray | Callable[[], np.ndarray] | None = None
                 ) -> tuple[Evaluation, BatchResult]:
        """Score a batch: ONE solver call for all candidates and sweeps.

        Parameters
        ----------
        params
            (N, n_params) internal units.
        complete
            False when the derived rates of ``params`` are already computed (see
            :meth:`guard`).
        while_solving
            Called once while the solver runs (see :meth:`kingen.solve.batch.Simulator.run`).
        batch_rows
            The rows of the whole batch ``params`` is a block of (a shard's), which chooses
            the default launch (see :meth:`kingen.solve.batch.Simulator.run`).
        rest
            The rows' resting occupancies, already solved, or a function that returns
            them (see :meth:`kingen.solve.batch.Simulator.run`).
        """
        # the guard leaves every derived rate computed: the solver need not redo them
        result = self.simulator.run(self.guard(params, complete=complete), "objective",
                                    complete=False, while_solving=while_solving,
                                    batch_rows=batch_rows, rest=rest)
        return self.reduce(result.sgg, result.sgd, result.windows, result.fail,
                           result.sg), result

    def reduce(self, sgg: np.ndarray, sgd: np.ndarray, windows: np.ndarray,
               fail: np.ndarray, sg: np.ndarray | None = None) -> Evaluation:
        """Turn per-(candidate, sweep) sums and window values into errors.

        Parameters
        ----------
        sgg, sgd
            (N, n_sweeps) Σw·g², Σw·g·d.
        windows
            (N, n_sweeps, 4, 2) window values and peak sample indices.
        fail
            (N, n_sweeps) failure codes.
        sg
            (N, n_sweeps) Σw·g, which a chain's fitted offsets need.
        """
        n, n_p = sgg.shape[0], self.n_protocols
        recorded = np.array([item.recording is not None for item in self.items])
        plain = np.array([self._plain(p) for p in range(n_p)])
        fixed = np.array([np.nan if item.amplitude is None else float(item.amplitude)
                          for item in self.items])
        noise = self.noise is not None
        errors, amps = np.empty((n, n_p)), np.empty((n, n_p))
        chi2_p, chi2 = (np.empty((n, n_p)), np.empty(n)) if noise else (np.empty((0, 0)),
                                                                        np.empty(0))
        fitness, fcode = np.empty(n), np.empty(n, dtype=np.int64)
        # the numpy work between the passes: chains that fit more than one amplitude, and
        # targets; without any, one pass does all
        between = bool((recorded & ~plain).any()) or any(plan.targets for plan in self.plans)
        sgg, sgd = np.asarray(sgg, dtype=np.float64), np.asarray(sgd, dtype=np.float64)
        fail = np.ascontiguousarray(fail)
        spans = np.array(self.spans, dtype=np.int64)
        weight = np.ascontiguousarray(self.proto_weight, dtype=np.float64)
        coef = self._trace_coef if noise else weight
        args = (sgg, sgd, fail, spans, self.dd, recorded & plain, fixed, coef, weight,
                FAIL_NONFINITE)
        outs = (errors, amps, chi2_p, fitness, fcode, chi2)
        score_rows(*args, True, not between, *outs)
        sweep_amps = offsets = None
        if (recorded & ~plain).any():
            sweep_amps = np.zeros(sgg.shape)
            offsets = np.zeros(sgg.shape)
            for p, (a, b) in enumerate(self.spans):
                if not recorded[p]:
                    sweep_amps[:, a:b] = np.nan
                elif plain[p]:
                    sweep_amps[:, a:b] = amps[:, [p]]
                else:
                    sse, amp, off = self._scales(p, sgg[:, a:b], sgd[:, a:b],
                                                 None if sg is None else sg[:, a:b])
                    errors[:, p] += sse / self.dd[p]
                    if noise:
                        chi2_p[:, p] = sse * self._trace_coef[p]
                    amps[:, p] = self._protocol_amplitude(p, amp)
                    sweep_amps[:, a:b], offsets[:, a:b] = amp, off
        if between:
            with np.errstate(all="ignore"):
                for p, (item, plan) in enumerate(zip(self.items, self.plans, strict=True)):
                    if plan.targets:
                        amp = amps[:, p] if item.recording is not None else None
                        r, tw, amp = self._target_rows(plan, windows, amp)
                        errors[:, p] += (tw * r * r).sum(axis=1) / tw.sum()
                        if noise:
                            chi2_p[:, p] += (self._target_factor[p] * tw * r * r).sum(axis=1)
                        if amp is not None:
                            amps[:, p] = amp
            score_rows(*args, False, True, *outs)
        if not noise:
            chi2 = None
        return Evaluation(fitness, errors, fcode, amps, sweep_amps, offsets, chi2)

    def _amplitude(self, item: ProtocolData, s_gd: np.ndarray, s_gg: np.ndarray) -> np.ndarray:
        if item.amplitude is not None:
            return np.full(s_gd.shape, float(item.amplitude))
        return np.maximum(np.where(s_gg > 0, s_gd / np.where(s_gg > 0, s_gg, 1.0), 0.0), 0.0)

    def target_residuals(self, plan: Any, win: np.ndarray, amp: np.ndarray | None
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(model − value) / scale of a protocol's summary targets, per candidate, and the
        targets' weights; current-valued targets use the amplitude fitted to them."""
        values, current = plan.model_values(win)
        _, amp_t = self._target_error(plan, win, amp)
        tv = np.array([t.value for t in plan.targets])
        sc = np.array([t.scale for t in plan.targets])
        tw = np.array([t.weight for t in plan.targets])
        model = values.copy()
        if amp_t is not None:
            model[:, current] *= amp_t[:, None]
        return (model - tv) / sc, tw

    def _target_error(self, plan: ProtocolPlan, windows: np.ndarray,
                      amp: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        r, tw, amp = self._target_rows(plan, windows, amp)
        return (tw * r * r).sum(axis=1) / tw.sum(), amp

    def _target_rows(self, plan: ProtocolPlan, windows: np.ndarray, amp: np.ndarray | None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(model − value) / scale of a protocol's targets (N, T), their weights (T,), and
        the amplitude the current-valued ones take."""
        values, current = plan.model_values(windows)
        tv = np.array([t.value for t in plan.targets])
        sc = np.array([t.scale for t in plan.targets])
        tw = np.array([t.weight for t in plan.targets])
        if amp is None and plan.item.amplitude is not None:
            amp = np.full(values.shape[0], float(plan.item.amplitude))
        if amp is None and current.any():
            m = values[:, current]
            w = tw[current] / sc[current] ** 2
            num = (m * tv[current] * w).sum(axis=1)
            den = (m * m * w).sum(axis=1)
            amp = np.maximum(np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0), 0.0)
        model = values.copy()
        if amp is not None:
            model[:, current] *= amp[:, None]
        return (model - tv) / sc, tw, amp
