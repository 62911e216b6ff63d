"""Fixed-step RK4 schedules: where each sweep steps, with which step size, and where it samples.

A schedule is shared by every candidate of a batch. Each sweep is cut at its segment
boundaries and its sample times; every piece gets the fewest equal steps that keep RK4
stable for every candidate inside the scheme's bounds at that piece's concentration
(Gershgorin: the spectral radius of Q(c) is at most twice the largest total exit rate,
taken with every parameter at the value that maximises it). Long agonist-free stretches
thus take long steps while 10 mM pulses take short ones. Where the concentration varies,
each sample takes its share of the steps of the segment's highest concentration by how much
its concentration changes, never fewer than its own needs (:func:`_smooth_steps`).

Rows are stored as two arrays so that a GPU thread reads them as plain numbers:
``rows_f`` (n_rows, 6) = [t0, h, concentration, step_time, own_courant, coarse_limit] and
``rows_i`` (n_rows, 4) = [steps per repetition, repetitions, record, smooth];
``row_start`` (n_sweeps + 1) indexes each sweep's rows. After each repetition of a row with
``record`` = 1 the solver stores one sample.

Rows whose concentration varies (``smooth`` = 1: finite exchange edges, synaptic transients)
read it from ``conc`` rather than computing the waveform: the concentration is the same for
every candidate, so it is evaluated once here, at the three stage times (t, t + h/2, t + h)
of every step, and the solver reads ``conc[row_conc[r] + 3 * k + stage]`` for step k of row
r. On the GPU the threads of a warp read the same word, one broadcast load where the
waveform cost several error functions.

A smooth row that repeats an earlier one (the same edge, at the same phase against the
sample grid, at another pulse or in another sweep) shares that row's entries of ``conc`` and
its step: its times differ only by rounding, and the two forms of the solver then read
one waveform, so the propagator form can build each of its samples' matrices once
(:mod:`kingen.solve.plan`).

**Each candidate's own steps on smooth rows.** The schedule's steps keep RK4 stable for the
fastest rates the bounds allow; a candidate near published rates is often ten times slower.
On a smooth row each candidate therefore takes coarse steps of m of the schedule's steps,
m = ⌊own_courant / (h·ρ)⌋ (at least 1, at most the row's steps per repetition), with ρ the
Gershgorin bound of its own rates at the highest concentration of the row's segment (the
edge's plateau, the transient's peak), which the row holds in ``concentration``: every
sample of an edge then takes about the steps its plateau needs, or the schedule's where
those are fewer. (At each sample's own highest concentration, an edge's foot would take one
step a sample while its concentration grows a hundredfold: 1e-5 of the peak.) However slow
its rates, RK4 must still resolve the concentration's own change: m is at most the row's
``coarse_limit``, the most steps over which Simpson's rule, which RK4 applies to the
concentration, still integrates it as the schedule's steps do, to ``MAX_COARSE_QUADRATURE``
of the segment's peak (:func:`_coarse_limit`). ``own_courant`` is a quarter of the
schedule's ``courant`` (four times the steps its own rates need for stability; 0 where a
fixed ``step`` was asked for, which the rows then take).

A coarse step's stage concentrations are entries of ``conc`` already: its start is a fine
step's start, its middle a fine step's start or midpoint, its end a fine step's end
(:func:`coarse_stage_entries`). Both forms of the solver take the same coarse steps, so
they still agree to rounding. On Robert & Howe's standard set with 0.2 ms exchange the
published rates take 1.7 times fewer steps on the edges than the schedule's (61,330 of
103,208), every rate at its lower bound 9.4 times fewer, with errors against the exact
reference of 4.2e-8 and 5.0e-8 of the peak (the schedule's own at the upper bounds: 1.7e-7;
``analysis/h200/optimization_log_exchange.md``, step 14). :func:`coarse_steps` counts them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kingen.experiment.protocol import MAX_CONCENTRATION_MM, Protocol, Sweep
from kingen.model.scheme import Scheme

# RK4 is stable for real h·λ in (−2.785, 0); the default keeps h·ρ at 2.5, just inside
# that, where ρ is the Gershgorin bound on the spectral radius (at most twice the largest
# exit rate). With ×10 bounds the file's own rates then sit near h·λ ≈ 0.1–0.3, where RK4's
# error stays below 1e-6 of the peak (tests/test_solver.py measures it).
RK4_STABILITY_LIMIT = 2.785
DEFAULT_COURANT = 2.5
# A candidate's own coarse steps on smooth rows keep h·ρ at this share of the courant, ρ from
# its own rates (four times the steps its stability needs): at half the courant the error
# against the exact reference grew from 5e-7 to 9.6e-7 of the peak on Geiger's miniature set
# and from 2.5e-9 to 7e-7 on Robert & Howe's standard set; at a quarter, 5.1e-7 and 4.2e-8,
# within the schedule's own error at the upper bounds (1.7e-7; the exchange log's step 14).
OWN_COURANT_SHARE = 0.25
# ... and, whatever its rates, integrate the concentration within each to this share of
# the segment's peak times the step (_coarse_limit).
MAX_COARSE_QUADRATURE = 1e-8
_ON_SAMPLE = 1e-9  # ms: a boundary this close to a sample time is on it
# Two smooth rows are one waveform when their steps agree to this fraction and their stage
# concentrations to this fraction of the sweep's largest pulse or transient. Rounding of
# times moves a 0.2 ms edge by ~1e-11 of its height at 2 s, and a stage time that rounds to
# the other side of an edge's cut (EDGE_HALF_WIDTH_SIGMAS) by 1e-9 of it; an edge shifted by
# 1e-6 ms differs by ~1e-5 and keeps its own values.
_SAME_WAVEFORM = 1e-8
# Rows are filed by their mean concentration in bins this wide (mM), at least the largest
# tolerance above: a row that may match sits in its own bin or a neighbour, so that a
# protocol of thousands of distinct edges compares each with a few rows, not with all.
_WAVEFORM_BIN = _SAME_WAVEFORM * MAX_CONCENTRATION_MM


@dataclass
class Schedule:
    """Step plan for a list of sweeps (see module docstring)."""

    rows_f: np.ndarray
    rows_i: np.ndarray
    row_start: np.ndarray
    sample_start: np.ndarray  # (n_sweeps + 1): offsets of each sweep's samples
    steps_per_sweep: np.ndarray  # RK4 steps each sweep takes, for throughput figures
    conc: np.ndarray  # concentrations at the stage times of the smooth rows' steps, mM
    row_conc: np.ndarray  # (n_rows,): each smooth row's first entry in conc (0 elsewhere)

    @property
    def n_sweeps(self) -> int:
        """Number of sweeps."""
        return self.row_start.size - 1

    @property
    def n_samples(self) -> int:
        """Total samples over all sweeps."""
        return int(self.sample_start[-1])

    @property
    def total_steps(self) -> int:
        """RK4 steps for one candidate over all sweeps."""
        return int(self.steps_per_sweep.sum())


def max_rates(scheme: Scheme) -> np.ndarray:
    """The largest value each parameter can take inside its bounds.

    A derived rate is held to its own declared bounds too: combining the extremes of every
    other rate of its cycle would allow values orders of magnitude beyond them, and steps
    far smaller than any candidate in bounds needs. Candidates outside the bounds may still
    be simulated; if RK4 is unstable for them they come back with a failure code.
    """
    return scheme.upper.copy()


def step_limit(scheme: Scheme, concentration: float, params_max: np.ndarray,
               courant: float) -> float:
    """Largest stable RK4 step (ms) for every candidate in bounds at this concentration."""
    exits = scheme.exit_rates(params_max, concentration)
    rho = 2.0 * float(exits.max())
    return math.inf if rho == 0 else courant / rho


def build_schedule(
    scheme: Scheme,
    sweeps: list[Sweep],
    *,
    step: float | None = None,
    courant: float = DEFAULT_COURANT,
) -> Schedule:
    """Plan the RK4 steps of every sweep.

    Parameters
    ----------
    scheme
        The scheme (its bounds set the stiffness the steps must handle).
    sweeps
        The sweeps, in batch order.
    step
        A fixed step size, ms, overriding the automatic choice (still aligned to samples
        and segment boundaries, so the step taken is at most this).
    courant
        h·ρ target of the automatic choice; must be below RK4's limit of 2.785.
    """
    if not 0 < courant < RK4_STABILITY_LIMIT:
        raise ValueError(f"courant must be in (0, {RK4_STABILITY_LIMIT}), got {courant}")
    pmax = max_rates(scheme)
    own = 0.0 if step is not None else OWN_COURANT_SHARE * courant
    rows_f: list[list[float]] = []
    rows_i: list[list[int]] = []
    row_start = [0]
    sample_start = [0]
    steps = []
    conc: list[np.ndarray] = []
    row_conc: list[int] = []
    seen: dict[tuple[int, int, int], list[tuple[float, int, np.ndarray]]] = {}
    used = 0
    for sweep in sweeps:
        first = len(rows_f)
        n_steps = _plan_sweep(scheme, sweep, pmax, step, courant, rows_f, rows_i)
        for r in range(first, len(rows_f)):
            if rows_i[r][3]:
                values = stage_concentrations(sweep, rows_f[r], rows_i[r])
                earlier = _same_waveform(seen, rows_f[r], rows_i[r], values,
                                         _SAME_WAVEFORM * _height(sweep))
                if earlier is None:
                    rows_f[r][5] = _coarse_limit(values, rows_i[r], rows_f[r][2])
                    seen.setdefault(_waveform_bin(rows_i[r], values), []).append(
                        (rows_f[r][1], rows_f[r][2], rows_f[r][5], used, values))
                    row_conc.append(used)
                    conc.append(values)
                    used += values.size
                else:
                    # its segment's peak and limit too: both forms take the same steps on it
                    rows_f[r][1], rows_f[r][2], rows_f[r][5], start = earlier
                    row_conc.append(start)
                rows_f[r][4] = own
            else:
                row_conc.append(0)
        row_start.append(len(rows_f))
        sample_start.append(sample_start[-1] + sweep.n_samples)
        steps.append(n_steps)
    return Schedule(np.array(rows_f, dtype=np.float64).reshape(-1, 6),
                    np.array(rows_i, dtype=np.int64).reshape(-1, 4),
                    np.array(row_start, dtype=np.int64), np.array(sample_start, dtype=np.int64),
                    np.array(steps, dtype=np.int64),
                    # one entry at least: a kernel argument may not be empty on every target
                    np.concatenate(conc) if conc else np.zeros(1),
                    np.array(row_conc, dtype=np.int64))


def coarse_stage_entries(first: int, f: int, m: int) -> tuple[int, int, int]:
    """The ``conc`` entries of a coarse step over fine steps f … f + m − 1 of a smooth row
    whose entries start at ``first``: its start (fine step f's), its middle (fine step
    f + m/2's start for even m, fine step f + (m − 1)/2's midpoint for odd m) and its end
    (fine step f + m − 1's). The solver's generated code computes the same indices.

    Examples
    --------
    >>> coarse_stage_entries(0, 0, 1)       # one fine step: its own three stages
    (0, 1, 2)
    >>> coarse_stage_entries(0, 3, 4)       # fine steps 3-6: middle at step 5's start
    (9, 15, 20)
    """
    start = first + 3 * f
    return start, start + 3 * (m // 2) + m % 2, start + 3 * m - 1


def coarse_steps(scheme: Scheme, schedule: Schedule, params: np.ndarray) -> np.ndarray:
    """How many of each row's steps each candidate takes as one (see the module docstring):
    what the solver's generated code computes per (candidate, row), here for counting.

    Parameters
    ----------
    scheme, schedule
        The scheme and a schedule built for it.
    params
        (n_candidates, n_params) complete parameter sets.

    Returns
    -------
    numpy.ndarray
        (n_candidates, n_rows) int64: 1 on constant rows, and on smooth rows where the
        schedule's step is fixed.

    Examples
    --------
    Robert & Howe's edges at 10 mM: the published rates take two of the schedule's steps as
    one where the edge is steepest (65 steps a sample), those at the upper bounds none.

    >>> from kingen.experiment.protocol import standard_protocol
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> sweeps = protocol_sweeps([standard_protocol("deactivation", exchange=0.2)])[0]
    >>> sch = build_schedule(s, sweeps)
    >>> per = coarse_steps(s, sch, s.complete(np.stack([s.values, s.upper])))
    >>> steep = (sch.rows_i[:, 3] == 1) & (sch.rows_i[:, 0] == 65)
    >>> sorted(set(per[0, steep].tolist())), sorted(set(per[1, steep].tolist()))
    ([2], [1])
    """
    params = np.atleast_2d(np.asarray(params, dtype=np.float64))
    rows_f, rows_i = schedule.rows_f, schedule.rows_i
    per = np.ones((params.shape[0], rows_f.shape[0]), dtype=np.int64)
    spectral: dict[float, np.ndarray] = {}  # 2 × the largest exit rate, per segment peak
    for r in np.flatnonzero((rows_i[:, 3] != 0) & (rows_f[:, 4] > 0)):
        n, own, peak = int(rows_i[r, 0]), float(rows_f[r, 4]), float(rows_f[r, 2])
        if peak not in spectral:  # a protocol's hundreds of edge rows share a few peaks
            spectral[peak] = 2.0 * scheme.exit_rates(params, peak).max(axis=-1)
        with np.errstate(invalid="ignore"):
            rho = spectral[peak] * rows_f[r, 1]
            m = np.where(rho * n <= own, n,
                         np.where(2.0 * rho <= own, np.floor(own / np.where(rho > 0, rho, 1.0)),
                                  1.0))
        per[:, r] = np.minimum(m.astype(np.int64), int(rows_f[r, 5]))
    return per


def candidate_steps(schedule: Schedule, per: np.ndarray) -> np.ndarray:
    """RK4 steps each candidate takes over all sweeps, from :func:`coarse_steps`' ``per``.

    Examples
    --------
    >>> from kingen.experiment.protocol import standard_protocol
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> sch = build_schedule(s, protocol_sweeps([standard_protocol("deactivation",
    ...                                                             exchange=0.2)])[0])
    >>> steps = candidate_steps(sch, coarse_steps(s, sch, s.complete(np.stack([s.values,
    ...                                                                         s.upper]))))
    >>> sch.total_steps, steps.tolist()      # the edges' 4,200 steps: 2,562 at published rates
    (32470, [30832, 32470])
    """
    n, reps = schedule.rows_i[:, 0], schedule.rows_i[:, 1]
    return (-(-n // per) * reps).sum(axis=1)


def stage_concentrations(sweep: Sweep, row_f: list[float], row_i: list[int]) -> np.ndarray:
    """The concentration at the three RK4 stage times of every step of one smooth row.

    Step k (over all repetitions) starts at t = t0 + k·h; its stages are at t, t + h/2 and
    t + h, computed as the solver computed them when it evaluated the waveform itself.
    Ideal steps inside the row are evaluated at the row's middle (``Sweep.concentration``'s
    ``steps_at``).

    Returns
    -------
    numpy.ndarray
        (3 · steps,) float64, stage by stage.

    Examples
    --------
    >>> from kingen.experiment.protocol import Pulse, Sweep
    >>> sweep = Sweep("one pulse", 5.0, 0.1, pulses=(Pulse(1.0, 2.0, 10.0, rise=0.2),))
    >>> c = stage_concentrations(sweep, [0.9, 0.05, 0.0, 1.0], [4, 1, 1, 1])
    >>> c.shape, round(float(c[6]), 3)          # step 2 starts at 1.0 ms: half way up
    ((12,), 5.0)
    """
    t0, h, _, mid = row_f[:4]
    k = np.arange(int(row_i[0]) * int(row_i[1]), dtype=np.float64)
    t = t0 + k * h
    times = np.stack([t, t + 0.5 * h, t + h], axis=1).ravel()
    return np.asarray(sweep.concentration(times, steps_at=mid), dtype=np.float64)


def _height(sweep: Sweep) -> float:
    """The largest concentration of one pulse or transient of a sweep, mM."""
    return max([p.concentration for p in sweep.pulses] + [t.peak for t in sweep.transients]
               + [0.0])


def _coarse_limit(values: np.ndarray, row_i: list[int], peak: float) -> int:
    """The most of a smooth row's steps a candidate may take as one, whatever its rates.

    RK4 integrates the concentration within a step as Simpson's rule does: a coarse step
    of m steps is allowed where, in every repetition, Simpson's rule over each of its coarse
    steps (its stage values :func:`coarse_stage_entries` picks from ``values``) differs from
    the sum over its fine steps by at most ``MAX_COARSE_QUADRATURE`` × ``peak`` × the coarse
    step's length: the concentration is then resolved as the schedule's own steps resolve
    it, in absolute terms, on an edge's steep part and on its foot alike. m is tried in
    powers of two, and the row's whole repetition.

    Examples
    --------
    Sixteen steps: a cubic is integrated exactly by any step, a sharp rise is not.

    >>> t = (np.arange(16)[:, None] + [0.0, 0.5, 1.0]).ravel() / 16  # each step's stages
    >>> _coarse_limit(t ** 3, [16, 1, 1, 1], 1.0), _coarse_limit(t ** 8, [16, 1, 1, 1], 1.0)
    (16, 1)
    """
    n, reps = int(row_i[0]), int(row_i[1])
    if peak <= 0.0 or n == 1:
        return n
    stages = values.reshape(reps, n, 3)
    fine = (stages[..., 0] + 4.0 * stages[..., 1] + stages[..., 2]) / 6.0  # per unit h
    cumulative = np.concatenate([np.zeros((reps, 1)), np.cumsum(fine, axis=1)], axis=1)
    flat = values.reshape(reps, 3 * n)
    best = 1
    for m in sorted({1 << k for k in range(1, n.bit_length())} | {n}):
        if m > n:
            break
        starts = np.arange(0, n, m)
        sizes = np.minimum(m, n - starts)
        i0, i1, i2 = coarse_stage_entries(0, starts, sizes)
        coarse = sizes * (flat[:, i0] + 4.0 * flat[:, i1] + flat[:, i2]) / 6.0
        exact = cumulative[:, starts + sizes] - cumulative[:, starts]
        if np.abs(coarse - exact).max() > MAX_COARSE_QUADRATURE * peak * m:
            break
        best = m
    return best


def _waveform_bin(row_i: list[int], values: np.ndarray) -> tuple[int, int, int]:
    """Where a smooth row is filed: its steps, repetitions and mean concentration's bin."""
    return int(row_i[0]), int(row_i[1]), math.floor(float(values.mean()) / _WAVEFORM_BIN)


def _same_waveform(seen: dict, row_f: list[float], row_i: list[int], values: np.ndarray,
                   tol: float) -> tuple[float, float, float, int] | None:
    """The step, segment peak, coarse limit and ``conc`` offset of an earlier smooth row
    with this row's steps and waveform, up to rounding (concentrations within ``tol``, mM),
    or None."""
    h = row_f[1]
    n, reps, b = _waveform_bin(row_i, values)
    for near in (b, b - 1, b + 1):
        for h_seen, peak, limit, start, other in seen.get((n, reps, near), ()):
            if (abs(h - h_seen) <= _SAME_WAVEFORM * h_seen
                    and float(np.abs(values - other).max()) <= tol):
                return h_seen, peak, limit, start
    return None


def _plan_sweep(scheme: Scheme, sweep: Sweep, pmax: np.ndarray, step: float | None,
                courant: float, rows_f: list, rows_i: list) -> int:
    dt = sweep.dt
    total = 0
    for seg in sweep.segments():
        mid = 0.5 * (seg.start + seg.end)
        # samples strictly after seg.start and up to seg.end
        k_first = math.floor(seg.start / dt + _ON_SAMPLE / dt) + 1
        k_last = math.floor(seg.end / dt + _ON_SAMPLE / dt)
        k_last = min(k_last, sweep.n_samples - 1)
        # pieces (start, length, repetitions, record): up to the first sample, the whole
        # samples, the rest
        pieces: list[tuple[float, float, int, int]] = []
        t = seg.start
        if k_first <= k_last:
            t_first = k_first * dt
            if t_first - t > _ON_SAMPLE:
                pieces.append((t, t_first - t, 1, 1))
            if k_last > k_first:
                pieces.append((t_first, dt, k_last - k_first, 1))
            t = k_last * dt
        if seg.end - t > _ON_SAMPLE:
            pieces.append((t, seg.end - t, 1, 0))
        if seg.smooth and step is None:
            pieces = [(t0 + k * length, length, 1, record)
                      for t0, length, reps, record in pieces for k in range(reps)]
            steps, peak = _smooth_steps(scheme, sweep, pieces, mid, pmax, courant)
        else:
            h_max = min(dt, step if step is not None
                        else step_limit(scheme, seg.concentration, pmax, courant))
            steps = [_steps(length, h_max) for _, length, _, _ in pieces]
            peak = seg.concentration
        i = 0
        while i < len(pieces):
            t0, length, reps, record = pieces[i]
            j = i + 1
            # whole samples of one step count: one row, repeated
            while (j < len(pieces) and length == dt and pieces[j][1] == dt
                   and pieces[j][3] == record and steps[j] == steps[i]):
                reps += pieces[j][2]
                j += 1
            total += _row(rows_f, rows_i, t0, length, reps, record, steps[i], peak, mid,
                          int(seg.smooth))
            i = j
    return total


def _smooth_steps(scheme: Scheme, sweep: Sweep, pieces: list[tuple[float, float, int, int]],
                  mid: float, pmax: np.ndarray, courant: float) -> tuple[list[int], float]:
    """RK4 steps of each piece (start, length, …) of a smooth segment, and the segment's
    highest concentration.

    The segment's stiffest concentration sets the step where its concentration changes
    most, as it sets the step of the whole segment elsewhere; a piece whose concentration
    changes by a share s of that piece's change takes s of those steps, but never fewer than
    its own largest concentration needs for stability. The samples on an edge's foot and on
    its plateau, or on a transient's tail, then take the few steps their concentration
    needs: Robert & Howe's edges at 10 mM need 29 % fewer steps in the standard set, and the
    error against the exact reference stays near 1e-8 of the peak or below, where
    ``tests/test_solver.py`` allows 1e-6 (``python -m benchmarks edge_steps``). The change is
    measured by its total variation over 9 probes per piece: a measured waveform, read from
    a file and interpolated, varies in steps that its pieces must still resolve.
    """
    start, length = np.array([piece[:2] for piece in pieces]).T
    probe = start[:, None] + np.linspace(0.0, 1.0, 9) * length[:, None]
    conc = sweep.concentration(probe.ravel(), steps_at=mid).reshape(probe.shape)
    rho = 2.0 * scheme.exit_rates(pmax, conc.max(axis=1)).max(axis=-1)
    h_segment = courant / rho.max() if rho.max() > 0 else math.inf
    variation = np.abs(np.diff(conc, axis=1)).sum(axis=1)
    share = variation / variation.max() if variation.max() > 0 else np.zeros(len(pieces))
    steps = []
    for k in range(len(pieces)):
        stable = _steps(length[k], courant / rho[k]) if rho[k] > 0 else 1
        steps.append(max(stable, math.ceil(_steps(length[k], h_segment) * share[k])))
    return steps, float(conc.max())


def _steps(length: float, h_max: float) -> int:
    """The fewest equal steps of at most ``h_max`` that cover ``length``."""
    return max(1, math.ceil(length / h_max * (1 - 1e-12)))


def _row(rows_f: list, rows_i: list, t0: float, length: float, reps: int, record: int,
         n: int, conc: float, mid: float, smooth: int) -> int:
    rows_f.append([t0, length / n, conc, mid, 0.0, 1.0])
    rows_i.append([n, reps, record, smooth])
    return n * reps


def protocol_sweeps(protocols: list[Protocol]) -> tuple[list[Sweep], list[tuple[int, int]]]:
    """Flatten protocols into one sweep list; returns it and each protocol's (first, end)."""
    sweeps: list[Sweep] = []
    spans = []
    for p in protocols:
        spans.append((len(sweeps), len(sweeps) + p.n_sweeps))
        sweeps.extend(p.sweeps)
    return sweeps, spans
