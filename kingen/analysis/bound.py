"""The arithmetic bound of the solver kernel: the flops one candidate costs in each variant.

"Share of bound" is the measured rate over the rate the device's peak FP64 (or FP32) flop/s
would give if the variant did nothing but its own arithmetic. Each variant (stage form,
propagator, spans, lanes) does different arithmetic for the same answer, so the count
follows the variant, term by term (S states, g the conductances, B samples per span, FMA =
2 flops, per candidate over all sweeps):

==================  ==============================================================
``stage``           rows left in stage form: their RK4 steps
                    (:func:`~kingen.solve.plan.flops_per_step` each)
``products``        propagated rows: one product p ← p + p·D per sample (2S² + S);
                    with spans, a constant row of r samples takes ⌊r/B⌋ products with
                    M^B − I and r mod B single products (its tail); edge rows one
                    product per sample
``currents``        every recorded sample's current: 2·nnz(g) from the state, or 2S
                    from a dense span column Mʲ·g (span samples and tails)
``matrix_builds``   each key's M = R(hQ)ⁿ: S unit rows advanced n float64 RK4 steps
``span_builds``     each constant key's span arrays: on the CPU S rows advanced B
                    products, each followed by its current, S·B·(2S² + S + 2S); on
                    the GPU (lanes ≥ 2) B products of the vector g and log₂B
                    squarings, 2S²·B + log₂B·S²·(2S + 2)
==================  ==============================================================

The builds run in float64 whatever the precision: in a float32 run they count at the FP64
peak (:meth:`FlopCount.bound`'s ``fp64_peak``).

Lanes share a sample's arithmetic out among threads without adding to it, so they leave
the count (and the bound) unchanged; they change how near the bound the kernel runs.

A span sample costs 2S + (2S² + S)/B against 2S² + S + 2·nnz(g) without spans.

Examples
--------
Robert & Howe 2003 (S = 16, 3 conducting states) with spans of 16: a sample in a full span
costs 2·16 + (2·16² + 16)/16 = 32 + 33 = 65 flops, against 2·16² + 16 + 2·3 = 534 with one
product per sample; the span arrays of one key cost 16·16·(512 + 16 + 32) = 143,360 by
products (CPU), and 2·256·16 + 4·256·34 = 43,008 by squaring (GPU).

>>> from kingen.model.scheme import Scheme
>>> from kingen.solve.plan import flops_per_span_build, flops_per_span_sample
>>> s = Scheme.load("models/robert_howe_2003.toml")
>>> flops_per_span_sample(s, 16), flops_per_span_build(s, 16)
(65.0, 143360)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.solve.plan import flops_per_product, flops_per_span_build, flops_per_step

TERMS = ("stage", "products", "currents", "matrix_builds", "span_builds")


@dataclass(frozen=True)
class FlopCount:
    """Flops of one candidate's solve (all sweeps) in one variant, by term (see the module
    docstring); ``total`` is their sum."""

    variant: str
    stage: float
    products: float
    currents: float
    matrix_builds: float
    span_builds: float

    @property
    def total(self) -> float:
        return float(sum(getattr(self, t) for t in TERMS))

    @property
    def builds(self) -> float:
        """Flops of the build kernels (matrices and span columns)."""
        return self.matrix_builds + self.span_builds

    def bound(self, peak_flops: float, fp64_peak: float | None = None) -> float:
        """Candidates per second if only this arithmetic ran: the builds (float64) at
        ``fp64_peak`` flop/s (None: ``peak_flops``), the rest at ``peak_flops``."""
        seconds = (self.total - self.builds) / peak_flops + self.builds / (
            fp64_peak or peak_flops)
        return 1.0 / seconds

    def share(self, candidates_per_s: float, peak_flops: float,
              fp64_peak: float | None = None) -> float:
        """A measured rate as a fraction of :meth:`bound`."""
        return candidates_per_s / self.bound(peak_flops, fp64_peak)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def variant_flops(scheme: Any, schedule: Any, config: Any, precision: str = "float64",
                  plan: Any = None) -> FlopCount:
    """The flops one candidate costs in the variant ``config`` (a
    :class:`~kingen.solve.cuda.LaunchConfig`: ``form``, ``span``, ``lanes``, ``name``).

    Parameters
    ----------
    scheme, schedule
        The scheme and its :class:`~kingen.solve.schedule.Schedule` (``rows_i``: steps per
        repetition, repetitions, recorded, smooth).
    precision
        ``float32`` adds the compensated sum to each RK4 step.
    plan
        The :class:`~kingen.solve.plan.PropagatorPlan` of the propagator form (its
        ``row_key``, ``key_steps``, ``keys_conc``); needed unless ``config.form`` is
        ``stage``.

    Examples
    --------
    A schedule of one sweep, 1,000 recorded samples of one RK4 step each, on a constant row
    that has its key (Robert & Howe, float64, fps = 4·(16 + 2·42) + 13·16 = 608):

    >>> from types import SimpleNamespace
    >>> import numpy as np
    >>> from kingen.model.scheme import Scheme
    >>> from kingen.solve.cuda import LaunchConfig
    >>> s = Scheme.load("models/robert_howe_2003.toml")
    >>> sched = SimpleNamespace(rows_i=np.array([[1, 1000, 1, 0]]))
    >>> plan = SimpleNamespace(row_key=np.array([0]), key_steps=[1],
    ...                        keys_conc=np.array([-1]))
    >>> variant_flops(s, sched, LaunchConfig()).total  # 1000 steps, 1000 currents of 6
    614000.0
    >>> f = variant_flops(s, sched, LaunchConfig.parse("prop-l8-s16-b128"), plan=plan)
    >>> f.products, f.currents, f.matrix_builds, f.span_builds  # 62 spans + a tail of 8
    (36960.0, 32000.0, 9728.0, 43008.0)
    """
    rows = np.asarray(schedule.rows_i, dtype=np.int64).reshape(-1, 4)
    steps, reps, recorded = rows[:, 0], rows[:, 1], rows[:, 2] != 0
    s = scheme.n_states
    fps = flops_per_step(scheme, precision)
    product = flops_per_product(scheme)
    sparse_current = 2 * int(np.count_nonzero(scheme.conductance))
    name = getattr(config, "name", str(config))
    if config.form != "propagator":
        return FlopCount(name, float(fps * (steps * reps).sum()), 0.0,
                         float(sparse_current * reps[recorded].sum()), 0.0, 0.0)
    if plan is None:
        raise KingenError("the propagator form needs the solver's propagator plan",
                          field="form", value=config.form)
    key = np.asarray(plan.row_key, dtype=np.int64)
    span = int(config.span)
    keys_conc = np.asarray(plan.keys_conc, dtype=np.int64)
    stage_rows = key < 0
    # a row of constant concentration with a key of its own takes spans; edges never do
    constant = ~stage_rows & (keys_conc[np.maximum(key, 0)] < 0)
    spanned = constant & (span > 1)
    state_rows = ~stage_rows & ~spanned
    n_products = reps[state_rows].sum() + (reps[spanned] // span + reps[spanned] % span).sum()
    currents = (sparse_current * reps[recorded & ~spanned].sum()
                + 2 * s * reps[recorded & spanned].sum())
    n_span_keys = int((keys_conc < 0).sum()) if span > 1 else 0
    return FlopCount(
        name,
        stage=float(fps * (steps * reps)[stage_rows].sum()),
        products=float(product * n_products),
        currents=float(currents),
        matrix_builds=float(s * flops_per_step(scheme, "float64")
                            * sum(int(n) for n in plan.key_steps)),
        span_builds=float(n_span_keys * flops_per_span_build(scheme, span,
                                                             squaring=config.lanes > 1)),
    )
