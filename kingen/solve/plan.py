"""Which schedule rows the propagator form takes, and the matrices it builds for them.

A key is one distinct (step h, concentration c, steps n) of the constant-concentration rows;
every candidate builds D = R(hQ(c))ⁿ − I once per key. A key pays for itself when the rows
that use it repeat often enough: building costs S·n RK4 steps (S unit vectors), and each use
then costs one S×S product instead of n RK4 steps.

Rows whose concentration varies (exchange edges) get one key per repetition (per sample):
its matrix is the product of that sample's n RK4 steps at the stage concentrations the stage
form reads (``conc``, from the key's first entry on), built the same way. The schedule gives
every recurrence of an edge (same shape, same phase against the samples) the same entries
of ``conc``; the edge's rows then share keys, and the same cost rule decides whether they
pay. An edge that occurs once stays in stage form.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kingen.model.scheme import Scheme
from kingen.solve.schedule import Schedule


@dataclass
class PropagatorPlan:
    """The keys of a schedule and, per row, the key it uses (−1: stage form).

    ``keys_f`` (n_keys, 4) = [h, c, own_courant, coarse_limit]; ``keys_i`` (n_keys,) = n;
    ``keys_conc`` (n_keys,) = −1 for a constant-concentration key, else the index in the
    schedule's ``conc`` of its first stage concentration; an edge key's ``c``,
    ``own_courant`` and ``coarse_limit`` are then its row's (its segment's peak and what
    bounds each candidate's own coarse steps: :mod:`kingen.solve.schedule`), a constant
    key's 0 and 1.
    Constant keys come first. A row with a varying
    concentration (``rows_i[r, 3]`` = 1) and key k takes key k + j at its repetition j.
    ``prop_samples`` and ``stage_steps`` count, per candidate over all sweeps, the products
    the propagator takes and the RK4 steps left in stage form; ``edge_samples`` is the part
    of ``prop_samples`` on rows whose concentration varies (one product each, never a span).
    """

    row_key: np.ndarray
    keys_f: np.ndarray
    keys_i: np.ndarray
    prop_samples: int
    stage_steps: int
    key_uses: list[int] = field(default_factory=list)
    _stage_rows: str = "all"
    keys_conc: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    edge_samples: int = 0

    @property
    def n_keys(self) -> int:
        """Distinct matrices the propagator builds: (h, c, n), and samples of edges."""
        return int(self.keys_i.size)

    @property
    def n_span_keys(self) -> int:
        """The constant-concentration keys (the first ones): only these have span arrays."""
        return int((self.keys_conc < 0).sum())

    @property
    def edge_rows(self) -> bool:
        """Whether rows whose concentration varies take products (their code is needed)."""
        return bool((self.keys_conc >= 0).any())

    @property
    def stage_rows(self) -> str:
        """Which rows are left in stage form: ``none``, ``smooth`` (concentration varies)
        or ``all`` kinds."""
        return self._stage_rows

    @property
    def key_steps(self) -> list[int]:
        """RK4 steps n of each key."""
        return [int(n) for n in self.keys_i]


def flops_per_step(scheme: Scheme, precision: str = "float64") -> int:
    """Floating-point operations of one stage-form RK4 step (FMA = 2).

    Each derivative costs one multiply per state plus one FMA per transition; the stage
    updates cost 13 per state; float32's compensated sum adds 3 per state.
    """
    s, t = scheme.n_states, len(scheme.transitions)
    return 4 * (s + 2 * t) + 13 * s + (3 * s if precision == "float32" else 0)


def flops_per_product(scheme: Scheme) -> int:
    """Floating-point operations of one propagator sample, p ← p + p·D (FMA = 2)."""
    s = scheme.n_states
    return 2 * s * s + s


def flops_per_span_sample(scheme: Scheme, span: int) -> float:
    """Floating-point operations per sample with spans of ``span`` samples (FMA = 2).

    Each span costs ``span`` currents (a dot product over S states each) and one product
    with M^B − I for the state (see :mod:`kingen.codegen.span`).

    >>> from kingen.model.scheme import Scheme
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> flops_per_product(s), flops_per_span_sample(s, 16)
    (528, 65.0)
    """
    s = scheme.n_states
    return (span * 2 * s + 2 * s * s + s) / span


def flops_per_span_build(scheme: Scheme, span: int, squaring: bool = False) -> int:
    """Floating-point operations of building one key's span arrays.

    By products (the CPU): S rows advanced ``span`` products, each followed by its
    current. By ``squaring`` (the GPU, :func:`kingen.codegen.span_build.emit_span_build`): the
    currents as ``span`` products of a vector with M, and M^B − I by log₂B squarings
    E ← 2E + E·E.

    >>> from kingen.model.scheme import Scheme
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> flops_per_span_build(s, 16), flops_per_span_build(s, 16, squaring=True)
    (143360, 43008)
    """
    s = scheme.n_states
    if squaring:
        return 2 * s * s * span + (span.bit_length() - 1) * s * s * (2 * s + 2)
    return s * span * (2 * s * s + s + 2 * s)


def _pays(scheme: Scheme, n: int, uses: int) -> bool:
    """Whether a matrix of n RK4 steps used ``uses`` times costs less than the steps."""
    step = flops_per_step(scheme)
    return scheme.n_states * n * step + uses * flops_per_product(scheme) < uses * n * step


class _Keys:
    """Keys found by their step h within a relative 1e-9 and the rest exactly. The schedule
    divides each row's span by its steps, so rows of one sampling interval differ in the
    last bits (Robert & Howe's standard set with ideal steps: 26 keys, 10 of them distinct);
    a row then runs at its key's h (its first row's), which moves its end by at most 1e-9
    of its span.

    >>> keys = _Keys()
    >>> keys.find(0.001, 0.0, 20), keys.find(0.000999999999999801, 0.0, 20)
    (0, 0)
    >>> keys.find(0.001, 1.0, 20), keys.find(0.0009847926963833704, 0.0, 20), keys.found
    (1, 2, [(0.001, 0.0, 20), (0.001, 1.0, 20), (0.0009847926963833704, 0.0, 20)])
    """

    def __init__(self) -> None:
        self._near: dict[tuple, list[tuple[float, int]]] = {}
        self.found: list[tuple] = []  # (h, *rest) of each key, in the order found

    def find(self, h: float, *rest) -> int:
        """The index of the key of step ``h`` and the rest (a new one if none is near)."""
        near = self._near.setdefault(rest, [])
        for h0, k in near:
            if abs(h - h0) <= 1e-9 * h0:
                return k
        near.append((h, len(self.found)))
        self.found.append((h, *rest))
        return len(self.found) - 1


def plan_propagator(scheme: Scheme, schedule: Schedule, *,
                    every_constant_row: bool = False) -> PropagatorPlan:
    """Assign keys to the rows where a matrix pays for itself.

    With ``every_constant_row`` every constant row gets a key, used once or not: the GPU
    wants it, because a kernel that also holds the stage form's constant-row code is
    allocated that code's registers (255 for a 16-state scheme) and runs its products at
    the occupancy they allow; building a few single-use matrices costs far less. Edge
    samples get keys where they pay only: an edge's matrices are as many as its samples.

    Examples
    --------
    Robert & Howe with 0.2 ms exchange: the edges at 10 mM recur 21 times in the standard
    set and are propagated; the dose-response edges, once each, are stepped.

    >>> from kingen.experiment.protocol import standard_set
    >>> from kingen.model.scheme import Scheme
    >>> from kingen.solve.schedule import build_schedule, protocol_sweeps
    >>> scheme = Scheme.load("models/robert_howe_2003.toml")
    >>> schedule = build_schedule(scheme, protocol_sweeps(standard_set(exchange=0.2))[0])
    >>> plan = plan_propagator(scheme, schedule, every_constant_row=True)
    >>> plan.edge_samples, plan.stage_steps, plan.stage_rows
    (2018, 14990, 'smooth')
    """
    rows_f, rows_i = schedule.rows_f, schedule.rows_i
    n_rows = rows_f.shape[0]
    keys = _Keys()
    row_key = np.full(n_rows, -1, dtype=np.int64)
    const = np.nonzero(rows_i[:, 3] == 0)[0]
    for r in const:
        row_key[r] = keys.find(float(rows_f[r, 1]), float(rows_f[r, 2]), int(rows_i[r, 0]))
    # a key's uses: the samples of its rows
    uses = np.bincount(row_key[const], weights=rows_i[const, 1],
                       minlength=len(keys.found)).astype(np.int64).tolist()
    keep = [k for k, (_, _, n) in enumerate(keys.found)
            if every_constant_row or _pays(scheme, n, uses[k])]
    old_to_new = np.full(len(uses) + 1, -1, dtype=np.int64)
    old_to_new[keep] = np.arange(len(keep))
    row_key = np.where(row_key >= 0, old_to_new[row_key], -1)
    keys_f = [[keys.found[k][0], keys.found[k][1], 0.0, 1.0] for k in keep]
    keys_i = [keys.found[k][2] for k in keep]
    keys_conc = [-1] * len(keep)
    key_uses = [uses[k] for k in keep]
    _edge_keys(scheme, schedule, row_key, keys_f, keys_i, keys_conc, key_uses)
    prop_samples = int(sum(rows_i[r, 1] for r in range(n_rows) if row_key[r] >= 0))
    edge_samples = int(sum(rows_i[r, 1] for r in range(n_rows)
                           if row_key[r] >= 0 and rows_i[r, 3] != 0))
    stage_steps = int(sum(rows_i[r, 0] * rows_i[r, 1] for r in range(n_rows)
                          if row_key[r] < 0))
    left = rows_i[row_key < 0]
    kinds = "none" if left.shape[0] == 0 else ("smooth" if left[:, 3].all() else "all")
    return PropagatorPlan(
        _stage_rows=kinds,
        row_key=row_key,
        keys_f=np.array(keys_f, dtype=np.float64).reshape(-1, 4),
        keys_i=np.array(keys_i, dtype=np.int64),
        keys_conc=np.array(keys_conc, dtype=np.int64),
        prop_samples=prop_samples, stage_steps=stage_steps, edge_samples=edge_samples,
        key_uses=key_uses)


def _edge_keys(scheme: Scheme, schedule: Schedule, row_key: np.ndarray, keys_f: list,
               keys_i: list, keys_conc: list, key_uses: list) -> None:
    """Append the keys of the edge rows that pay, one per repetition, and set those rows'
    ``row_key``. Rows of one edge share (h, n, repetitions, first ``conc`` entry): the
    schedule gave every recurrence of a waveform the same entries."""
    rows_f, rows_i = schedule.rows_f, schedule.rows_i
    keys = _Keys()
    edge = np.nonzero(rows_i[:, 3] != 0)[0]
    group = np.array([keys.find(float(rows_f[r, 1]), int(rows_i[r, 0]), int(rows_i[r, 1]),
                                int(schedule.row_conc[r])) for r in edge], dtype=np.int64)
    for g, (h, n, reps, start) in enumerate(keys.found):
        rows = edge[group == g]
        if not _pays(scheme, n, len(rows)):
            continue
        row_key[rows] = len(keys_i)
        for j in range(reps):
            keys_f.append([h, *rows_f[rows[0], [2, 4, 5]]])
            keys_i.append(n)
            keys_conc.append(start + 3 * n * j)
            key_uses.append(len(rows))
