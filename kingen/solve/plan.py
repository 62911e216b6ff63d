"""Which schedule rows the propagator form takes, and the matrices it builds for them.

A key is one distinct (step h, concentration c, steps n) of the constant-concentration rows;
every candidate builds D = R(hQ(c))ⁿ − I once per key. A key pays for itself when the rows
that use it repeat often enough: building costs S·n RK4 steps (S unit vectors), and each use
then costs one S×S product instead of n RK4 steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kingen.model.scheme import Scheme
from kingen.solve.schedule import Schedule


@dataclass
class PropagatorPlan:
    """The keys of a schedule and, per row, the key it uses (−1: stage form).

    ``keys_f`` (n_keys, 2) = [h, c]; ``keys_i`` (n_keys,) = n. ``prop_samples`` and
    ``stage_steps`` count, per candidate over all sweeps, the products the propagator takes
    and the RK4 steps left in stage form.
    """

    row_key: np.ndarray
    keys_f: np.ndarray
    keys_i: np.ndarray
    prop_samples: int
    stage_steps: int
    key_uses: list[int] = field(default_factory=list)
    _stage_rows: str = "all"

    @property
    def n_keys(self) -> int:
        """Distinct (h, c, n) the propagator builds a matrix for."""
        return int(self.keys_i.size)

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


def flops_per_span_build(scheme: Scheme, span: int) -> int:
    """Floating-point operations of building one key's span arrays (S rows advanced
    ``span`` products, each followed by its current)."""
    s = scheme.n_states
    return s * span * (2 * s * s + s + 2 * s)


def plan_propagator(scheme: Scheme, schedule: Schedule, *,
                    every_constant_row: bool = False) -> PropagatorPlan:
    """Assign keys to the constant-concentration rows where a matrix pays for itself.

    With ``every_constant_row`` every constant row gets a key, used once or not: the GPU
    wants it, because a kernel that also holds the stage form's constant-row code is
    allocated that code's registers (255 for a 16-state scheme) and runs its products at
    the occupancy they allow; building a few single-use matrices costs far less.
    """
    rows_f, rows_i = schedule.rows_f, schedule.rows_i
    n_rows = rows_f.shape[0]
    key_of: dict[tuple[float, float, int], int] = {}
    uses: list[int] = []
    row_key = np.full(n_rows, -1, dtype=np.int64)
    for r in range(n_rows):
        if rows_i[r, 3] != 0:
            continue
        key = (float(rows_f[r, 1]), float(rows_f[r, 2]), int(rows_i[r, 0]))
        if key not in key_of:
            key_of[key] = len(uses)
            uses.append(0)
        row_key[r] = key_of[key]
        uses[row_key[r]] += int(rows_i[r, 1])
    step = flops_per_step(scheme)
    product = flops_per_product(scheme)
    keep = []
    for key, k in key_of.items():
        n = key[2]
        build = scheme.n_states * n * step
        if every_constant_row or build + uses[k] * product < uses[k] * n * step:
            keep.append(key)
    new_index = {key: i for i, key in enumerate(keep)}
    old_to_new = np.full(len(uses) + 1, -1, dtype=np.int64)
    for key, k in key_of.items():
        old_to_new[k] = new_index.get(key, -1)
    row_key = np.where(row_key >= 0, old_to_new[row_key], -1)
    prop_samples = int(sum(rows_i[r, 1] for r in range(n_rows) if row_key[r] >= 0))
    stage_steps = int(sum(rows_i[r, 0] * rows_i[r, 1] for r in range(n_rows)
                          if row_key[r] < 0))
    left = rows_i[row_key < 0]
    kinds = "none" if left.shape[0] == 0 else ("smooth" if left[:, 3].all() else "all")
    return PropagatorPlan(
        _stage_rows=kinds,
        row_key=row_key,
        keys_f=np.array([[h, c] for h, c, _ in keep], dtype=np.float64).reshape(-1, 2),
        keys_i=np.array([n for _, _, n in keep], dtype=np.int64),
        prop_samples=prop_samples, stage_steps=stage_steps,
        key_uses=[uses[key_of[key]] for key in keep])
