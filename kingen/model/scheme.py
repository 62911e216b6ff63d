"""Kinetic schemes: the parsed scheme, its rates and its generator matrix.

A scheme file (TOML) names states with their conductances, parameters with values, units,
bounds and scale, and transitions whose rate is ``factor * param`` or
``factor * param * agonist``. Values are converted once, at load, to ms⁻¹ and mM⁻¹ ms⁻¹;
conductances to pS. Q[i, j] is the rate from state i to state j; rows sum to zero.

Microscopic reversibility: every independent cycle of the state graph is found (the
fundamental cycles of a spanning tree that avoids rates declared ``derived``). A derived
rate is computed from the other rates of its cycle so that any parameter set keeps
reversibility exactly; every other cycle is checked at the file's values. The file is
parsed and checked by :mod:`kingen.model.scheme_file`; the state graph (transitions,
cycles) is :mod:`kingen.model.graph`.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kingen.base.files import read_text
from kingen.errors import KingenError
from kingen.model.fields import loads_toml
from kingen.model.graph import Cycle, Transition, closed_classes, find_cycles
from kingen.model.shipped import shipped_scheme
from kingen.model.temperature import Temperature

DEFAULT_REVERSIBILITY_TOLERANCE = 0.02
DEFAULT_BOUND_FACTOR = 10.0
# Rate constants (and their bounds), once in ms^-1 or mM^-1 ms^-1, lie in this range: wide
# beyond any physical rate, narrow enough that a product of a cycle's rates, a Q matrix or an
# RK4 step never overflows or loses the rate to underflow.
RATE_RANGE = (1e-30, 1e30)
# Conductances (pS) and channel counts above this are not physical; with potentials of at
# most 10 V they keep every current finite.
MAX_CONDUCTANCE_PS = 1e12
MAX_CHANNELS = 1e12


@dataclass(frozen=True)
class Parameter:
    """A rate constant of the scheme, in internal units (ms⁻¹ or mM⁻¹ ms⁻¹).

    Attributes
    ----------
    name
        Name used in rate expressions.
    value
        Value from the file, converted.
    lower, upper
        Bounds, converted; a fit searches inside them.
    order
        1 for a first-order rate (ms⁻¹), 2 for a binding rate (mM⁻¹ ms⁻¹).
    unit
        The unit as written in the file.
    scale
        ``"log"`` or ``"linear"``: how a fit searches between the bounds.
    fixed
        Held at ``value`` by a fit.
    derived
        Computed from other rates to keep its cycle microscopically reversible.
    kind
        ``"rate"``; ``"q10"`` or ``"ea"`` for the Q10 or activation energy (kJ/mol) of a
        group of rates (order 0, see :mod:`kingen.model.temperature`).
    """

    name: str
    value: float
    lower: float
    upper: float
    order: int
    unit: str
    scale: str = "log"
    fixed: bool = False
    derived: bool = False
    kind: str = "rate"

    @property
    def internal_unit(self) -> str:
        """``ms^-1`` or ``mM^-1 ms^-1`` (a Q10: ``1``; an activation energy: ``kJ/mol``)."""
        if self.order == 0:
            return self.unit
        return "ms^-1" if self.order == 1 else "mM^-1 ms^-1"

    @property
    def free(self) -> bool:
        """Searched by a fit (neither fixed nor derived)."""
        return not (self.fixed or self.derived)


@dataclass(frozen=True)
class DerivedRule:
    """A derived parameter = exp(log_const) * prod(params ** exponents)."""

    param: int
    log_const: float
    exponents: np.ndarray


@dataclass
class Scheme:
    """A parsed, validated kinetic scheme.

    Use :meth:`load` to read a file. Parameter arrays have the parameters on their last
    axis in the order of :attr:`parameters`, in internal units.
    """

    name: str
    source: str
    path: str
    text: str
    agonist: str
    states: list[str]
    conductance: np.ndarray
    parameters: list[Parameter]
    transitions: list[Transition]
    cycles: list[Cycle]
    derived_rules: list[DerivedRule]
    channels: float = 1.0
    initial: np.ndarray | None = None  # None: equilibrium at zero agonist ("rest")
    file_units: dict[str, str] = field(default_factory=dict)
    reversibility_tolerance: float = DEFAULT_REVERSIBILITY_TOLERANCE
    check_reversibility: bool = True  # False: cycles are out of equilibrium on purpose
    temperature: Temperature | None = None  # Q10s and activation energies, if any

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, path: str | Path, *, force: bool = False) -> Scheme:
        """Read and validate a scheme file.

        ``path`` may also name a shipped scheme (``"jonas_1993"``, or the repository's
        ``"models/jonas_1993.toml"`` from any folder; see
        :func:`kingen.model.shipped.shipped_scheme`) where no such file exists. ``force`` lifts
        the size limits of :mod:`kingen.model.limits` (e.g. the number of states).

        Raises
        ------
        KingenError
            On any problem, naming the file, the field and the value.

        Examples
        --------
        >>> import kingen
        >>> scheme = kingen.Scheme.load("models/jonas_1993.toml")
        >>> scheme.states
        ['C0', 'C1', 'C2', 'O', 'C3', 'C4', 'C5']
        >>> scheme.param_names[:4]
        ['k01', 'k10', 'k12', 'k21']
        """
        if not Path(path).is_file():
            path = shipped_scheme(path) or path
        return cls.loads(read_text(path, what="scheme file"), path=str(path), force=force)

    @classmethod
    def loads(cls, text: str, path: str = "<scheme>", *, force: bool = False) -> Scheme:
        """Parse and validate scheme text (the contents of a scheme file)."""
        from kingen.model.scheme_file import SchemeParser  # it builds Scheme objects

        return SchemeParser(loads_toml(text, path), path, text, force=force).build()

    # ------------------------------------------------------------------ sizes and names
    @property
    def n_states(self) -> int:
        """Number of states."""
        return len(self.states)

    @property
    def n_params(self) -> int:
        """Number of parameters (free, fixed and derived)."""
        return len(self.parameters)

    @property
    def param_names(self) -> list[str]:
        """Parameter names in array order."""
        return [p.name for p in self.parameters]

    @property
    def values(self) -> np.ndarray:
        """The file's parameter values (derived ones recomputed), internal units."""
        return self.complete(np.array([p.value for p in self.parameters]))

    @property
    def lower(self) -> np.ndarray:
        """Lower bounds, internal units."""
        return np.array([p.lower for p in self.parameters])

    @property
    def upper(self) -> np.ndarray:
        """Upper bounds, internal units."""
        return np.array([p.upper for p in self.parameters])

    @property
    def free_mask(self) -> np.ndarray:
        """True for the parameters a fit searches."""
        return np.array([p.free for p in self.parameters])

    def state_index(self, name: str) -> int:
        """Index of a state by name."""
        try:
            return self.states.index(name)
        except ValueError:
            raise KingenError(f"unknown state (states are {', '.join(self.states)})",
                              file=self.path, field="state", value=name) from None

    # ------------------------------------------------------------------ rates
    def complete(self, params: np.ndarray, *, copy: bool = True) -> np.ndarray:
        """Recompute derived parameters so that every cycle is exactly reversible.

        Parameters
        ----------
        params
            Array (..., n_params), internal units; derived entries are overwritten.
        copy
            False: overwrite the derived entries of ``params`` itself (a float64 array) and
            return it, instead of a completed copy.
        """
        out = np.array(params, dtype=float, copy=True) if copy else params
        if not self.derived_rules:
            return out
        # the logs of the rates the rules read, only (taken before any rule writes, as always)
        used = sorted({int(j) for rule in self.derived_rules
                       for j in np.flatnonzero(rule.exponents)})
        column = {j: k for k, j in enumerate(used)}
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(out[..., used])
        # A rate of 0 (log -inf) makes the derived rates NaN, as a negative rate does, not
        # 0 or inf.
        logs[logs == -np.inf] = np.nan
        for rule in self.derived_rules:
            # Term by term, not logs @ exponents: BLAS's threads busy-wait for ~0.1 s after
            # each call, taking the cores from the work that follows.
            total = np.full(out.shape[:-1], rule.log_const)
            for j in np.flatnonzero(rule.exponents):
                total += rule.exponents[j] * logs[..., column[int(j)]]
            out[..., rule.param] = np.exp(total)
        return out

    def rates(self, params: np.ndarray | None, concentration: float | np.ndarray) -> np.ndarray:
        """Rate of every transition, ms⁻¹; shape (..., n_transitions).

        ``params`` are taken as given: call :meth:`complete` first if derived rates must be
        recomputed (``None`` means the file's values).
        """
        p = self.values if params is None else np.asarray(params, dtype=float)
        c = np.asarray(concentration, dtype=float)
        idx = np.array([t.param for t in self.transitions])
        fac = np.array([t.factor for t in self.transitions])
        ag = np.array([t.agonist for t in self.transitions])
        k = p[..., idx] * fac
        return np.where(ag, k * c[..., None], k)

    def Q(self, concentration: float | np.ndarray, params: np.ndarray | None = None,
          ) -> np.ndarray:
        """Generator matrix Q(c), shape (..., n_states, n_states); Q[i, j] is the rate i → j.

        Parameters
        ----------
        concentration
            Agonist concentration, mM (scalar or array broadcast against ``params``).
        params
            Parameters (..., n_params), internal units; ``None`` means the file's values.
        """
        k = self.rates(params, concentration)
        n = self.n_states
        q = np.zeros(k.shape[:-1] + (n, n))
        for m, t in enumerate(self.transitions):
            q[..., t.source, t.target] += k[..., m]
        diag = np.arange(n)
        q[..., diag, diag] = -q.sum(axis=-1)
        return q

    def exit_rates(self, params: np.ndarray | None, concentration: float) -> np.ndarray:
        """Total exit rate of every state, ms⁻¹; shape (..., n_states)."""
        k = self.rates(params, concentration)
        out = np.zeros(k.shape[:-1] + (self.n_states,))
        for m, t in enumerate(self.transitions):
            out[..., t.source] += k[..., m]
        return out

    def rest_occupancy(self, params: np.ndarray | None = None) -> np.ndarray:
        """Initial occupancies, shape (..., n_states).

        The file's ``initial`` when it gives one; otherwise the equilibrium with no agonist
        (the stationary distribution of Q(0)), per parameter set.
        """
        p = self.values if params is None else np.asarray(params, dtype=float)
        if self.initial is not None:
            return np.broadcast_to(self.initial, p.shape[:-1] + (self.n_states,)).copy()
        sink = self.rest_sink()
        if sink is not None:
            # every positive rate set rests in the sink: no linear solve per candidate
            out = np.zeros(p.shape[:-1] + (self.n_states,))
            out[..., sink] = 1.0
            ok = np.all(np.isfinite(p) & (p > 0), axis=-1)
            out[~ok] = np.nan
            return out
        q = self.Q(0.0, p)
        a = np.swapaxes(q, -1, -2).copy()
        a[..., -1, :] = 1.0
        b = np.zeros(p.shape[:-1] + (self.n_states,))
        b[..., -1] = 1.0
        with np.errstate(all="ignore"):
            try:
                occ = np.linalg.solve(a, b[..., None])[..., 0]
            except np.linalg.LinAlgError:
                occ = np.full(b.shape, np.nan)
                flat_a = a.reshape(-1, self.n_states, self.n_states)
                flat = occ.reshape(-1, self.n_states)
                for i in range(flat_a.shape[0]):
                    try:
                        flat[i] = np.linalg.solve(flat_a[i], b.reshape(-1, self.n_states)[i])
                    except np.linalg.LinAlgError:
                        pass
        return np.clip(occ, 0.0, 1.0) / np.clip(occ, 0.0, 1.0).sum(axis=-1, keepdims=True)

    def rest_sink(self) -> int | None:
        """The state where every receptor ends without agonist, if the structure forces one.

        When exactly one state has no agonist-free exit and every state reaches it by
        agonist-free transitions, the equilibrium without agonist is all in that state for
        every positive rate set (e.g. C0 in most AMPA schemes). Otherwise None: the rest
        distribution depends on the rates (e.g. apo-desensitization) and is solved for.
        """
        if not hasattr(self, "_sink"):
            exits: dict[int, list[int]] = {i: [] for i in range(self.n_states)}
            for t in self.transitions:
                if not t.agonist:
                    exits[t.source].append(t.target)
            sinks = [i for i, out in exits.items() if not out]
            sink = None
            if len(sinks) == 1:
                reach = {sinks[0]}
                changed = True
                while changed:
                    changed = False
                    for i, out in exits.items():
                        if i not in reach and any(j in reach for j in out):
                            reach.add(i)
                            changed = True
                if len(reach) == self.n_states:
                    sink = sinks[0]
            self._sink = sink
        return self._sink

    def current(self, occupancy: np.ndarray, driving_force_mV: float,
                channels: float | None = None) -> np.ndarray:
        """Current in pA from occupancies (..., n_states): N · Σ gᵢ pᵢ · (V − E)."""
        n = self.channels if channels is None else channels
        # pS × mV = fA; 1e-3 converts to pA.
        return n * (occupancy @ self.conductance) * driving_force_mV * 1e-3

    # ------------------------------------------------------------------ reversibility
    def cycle_products(self, params: np.ndarray | None = None) -> list[tuple[float, float]]:
        """(forward, backward) rate products of every cycle, concentration factored out."""
        p = self.values if params is None else np.asarray(params, dtype=float)
        k = self.rates(p, 1.0)
        return [(float(np.prod(k[list(c.forward)])), float(np.prod(k[list(c.backward)])))
                for c in self.cycles]

    def cycle_log_products(self, params: np.ndarray | None = None,
                           ) -> list[tuple[float, float]]:
        """Natural logs of :meth:`cycle_products`, summed term by term: a cycle of large or
        small rates whose products overflow or underflow still compares exactly."""
        p = self.values if params is None else np.asarray(params, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            logk = np.log(self.rates(p, 1.0))
        return [(float(np.sum(logk[list(c.forward)])), float(np.sum(logk[list(c.backward)])))
                for c in self.cycles]

    def describe_cycle(self, cycle: Cycle) -> str:
        """A cycle as text, e.g. ``C1-C2-C4-C3-C1``."""
        names = [self.states[i] for i in cycle.states]
        return "-".join(names + names[:1])

    def reversibility_warnings(self, varied: Collection[str] | None = None) -> list[str]:
        """One warning line per cycle that a fit can take out of microscopic reversibility.

        A cycle without a derived rate is only checked at the file's values; a fit that
        varies any of its rates independently then searches parameter sets that break
        detailed balance. Nothing is said for a cycle whose varied rates cancel out of the
        ratio of its two products (the same rate on parallel arms), nor when
        ``check_reversibility = false`` (the scheme is out of equilibrium on purpose).

        The rate suggested is one of the two directions of the cycle's closing transition
        (the chord of the spanning tree that :func:`find_cycles` builds): marking it derived
        leaves that tree, and so every other cycle, unchanged, so one suggestion per cycle
        can be followed for all cycles at once. Of the two, a rate used by no other transition
        is preferred (a shared rate cannot be derived for one cycle), then the one with the
        wider (log) bounds, since a derived rate outside its own bounds fails the candidate.

        Parameters
        ----------
        varied
            Names of the parameters the fit varies (free or tied); None: every parameter
            that is neither fixed nor derived.
        """
        if not self.check_reversibility:
            return []
        names = self.param_names
        vary = ({p.name for p in self.parameters if p.free} if varied is None
                else set(varied))
        uses = np.bincount([t.param for t in self.transitions], minlength=len(names))
        lines = []
        for cycle in self.cycles:
            if cycle.derived is not None or not cycle.backward:
                continue
            # Net power of each rate in forward product / backward product: a cycle whose
            # varied rates all cancel (shared rates on parallel arms) stays reversible.
            power = np.zeros(len(names))
            np.add.at(power, [self.transitions[k].param for k in cycle.forward], 1.0)
            np.add.at(power, [self.transitions[k].param for k in cycle.backward], -1.0)
            if not any(power[j] != 0 and names[j] in vary for j in range(len(names))):
                continue
            chord = [self.transitions[k] for k in (cycle.forward[0], cycle.backward[0])]

            def preference(t: Transition) -> tuple[bool, float]:
                p = self.parameters[t.param]
                return uses[t.param] == 1, math.log(p.upper / p.lower)

            best = max(chord, key=preference)
            pick = (f'mark one derived, e.g. "{self.states[best.source]} -> '
                    f'{self.states[best.target]}" = {{ rate = "{names[best.param]}", '
                    f'derived = true }}' if preference(best)[0]
                    else "mark one of its rates derived = true")
            lines.append(f"warning: cycle {self.describe_cycle(cycle)} has no derived rate, "
                         f"so the fit searches rates that break microscopic reversibility; "
                         f"{pick} (or set model.check_reversibility = false)")
        return lines


def exp_text(log_value: float, spec: str = ".4g") -> str:
    """``exp(log_value)`` formatted with ``spec``, or as a power of ten where it overflows
    or underflows a float."""
    if abs(log_value) < 700:
        return format(math.exp(log_value), spec)
    return f"10^{log_value / math.log(10):.1f}"


def check_rate_range(rate: float, internal_unit: str, *, file: str | None, field: str,
                     value: Any, what: str = "") -> None:
    """Refuse a rate constant (internal units) outside :data:`RATE_RANGE`.

    Such a rate overflows or underflows in the products of a cycle and in Q, and would be
    reported later as a non-unique resting state or a failed solve; here it is named.
    """
    lo, hi = RATE_RANGE
    if not lo <= rate <= hi:
        of = f" {what}" if what else ""
        raise KingenError(f"out of range: gives{of} {rate:.3g} {internal_unit}; rate "
                          f"constants must lie in [{lo:g}, {hi:g}] {internal_unit}",
                          file=file, field=field, value=value)


__all__ = ["DEFAULT_BOUND_FACTOR", "DEFAULT_REVERSIBILITY_TOLERANCE", "MAX_CHANNELS",
           "MAX_CONDUCTANCE_PS", "RATE_RANGE", "Cycle", "DerivedRule", "Parameter", "Scheme",
           "Transition", "check_rate_range", "closed_classes", "exp_text", "find_cycles"]
