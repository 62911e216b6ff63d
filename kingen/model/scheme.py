"""Kinetic schemes: parse and validate a scheme file, and build its generator matrix.

A scheme file (TOML) names states with their conductances, parameters with values, units,
bounds and scale, and transitions whose rate is ``factor * param`` or
``factor * param * agonist``. Values are converted once, at load, to ms⁻¹ and mM⁻¹ ms⁻¹;
conductances to pS. Q[i, j] is the rate from state i to state j; rows sum to zero.

Microscopic reversibility: every independent cycle of the state graph is found (the
fundamental cycles of a spanning tree that avoids rates declared ``derived``). A derived
rate is computed from the other rates of its cycle so that any parameter set keeps
reversibility exactly; every other cycle is checked at the file's values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kingen.base.files import read_text
from kingen.errors import KingenError
from kingen.model import limits, units
from kingen.model.fields import Fields, loads_toml
from kingen.model.shipped import shipped_scheme
from kingen.model.temperature import Temperature, parse_temperature

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
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: no final newline (generated code)
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


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
class Transition:
    """A transition i → j with rate ``factor * params[param] * (c if agonist else 1)``."""

    source: int
    target: int
    factor: float
    param: int
    agonist: bool
    derived: bool = False
    expression: str = ""


@dataclass(frozen=True)
class Cycle:
    """A fundamental cycle: states in order, and the transitions around it both ways."""

    states: tuple[int, ...]
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    derived: int | None  # index of the derived transition closing this cycle, if any


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

        ``path`` may also name a shipped scheme (``"jonas_1993"``, or the README's
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
        return _Parser(loads_toml(text, path), path, text, force=force).build()

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


# ---------------------------------------------------------------------- parsing


class _Parser:
    def __init__(self, doc: dict[str, Any], path: str, text: str, *, force: bool = False
                 ) -> None:
        self.doc = doc
        self.path = path
        self.text = text
        self.force = force
        self.f = Fields(path)

    def error(self, message: str, field: str | None = None, value: Any = None) -> KingenError:
        return self.f.error(message, field, value)

    def build(self) -> Scheme:
        f = self.f
        f.keys(self.doc, ("model", "units", "states", "parameters", "transitions",
                         "temperature"), "")
        model = f.table(self.doc, "model", required=True)
        f.keys(model, ("name", "source", "agonist", "channels", "reversibility_tolerance",
                       "check_reversibility", "description"), "model")
        f.string(model, "description", "model", None)
        unit_table = f.table(self.doc, "units")
        f.keys(unit_table, ("time", "concentration", "conductance"), "units")
        file_units = {
            kind: f.string(unit_table, kind, "units", default)
            for kind, default in (("time", "ms"), ("concentration", "mM"),
                                  ("conductance", "pS"))}
        tf = units.factor("time", file_units["time"], file=self.path, field="units.time")
        cf = units.factor("concentration", file_units["concentration"], file=self.path,
                          field="units.concentration")
        gf = units.factor("conductance", file_units["conductance"], file=self.path,
                          field="units.conductance")

        name = f.string(model, "name", "model", Path(self.path).stem)
        agonist = model.get("agonist", "glu")
        if not isinstance(agonist, str) or not _NAME.match(agonist):
            raise self.error("must be a name such as 'glu'", "model.agonist", agonist)
        channels = f.number(model, "channels", "model", 1.0, gt=0.0, le=MAX_CHANNELS)
        tolerance = f.number(model, "reversibility_tolerance", "model",
                             DEFAULT_REVERSIBILITY_TOLERANCE, ge=0.0)
        check_rev = f.boolean(model, "check_reversibility", "model", True)

        states, conductance, initial = self.states(gf)
        params_raw = self.parameters_raw()
        transitions, usage = self.transitions(states, params_raw, agonist)
        parameters = self.parameters(params_raw, usage, tf, cf)
        added, temperature = parse_temperature(f, self.doc.get("temperature"), parameters,
                                               Parameter)
        parameters += added
        self.check_reachable(states, transitions, initial)
        if not np.any(conductance > 0):
            raise self.error("no conducting state: give at least one state a conductance > 0",
                             "states")
        cycles = find_cycles(len(states), transitions)
        rules = self.derived(states, parameters, transitions, cycles)
        scheme = Scheme(
            name=str(name), source=str(model.get("source", "")), path=self.path,
            text=self.text, agonist=agonist, states=states, conductance=conductance,
            parameters=parameters, transitions=transitions, cycles=cycles,
            derived_rules=rules, channels=channels, initial=initial, file_units=file_units,
            reversibility_tolerance=tolerance, check_reversibility=check_rev,
            temperature=temperature,
        )
        if check_rev:
            self.check_reversibility(scheme)
        self.check_derived_values(scheme)
        if initial is None:
            self.check_rest(scheme)
        return scheme

    # -- fields
    def states(self, gf: float) -> tuple[list[str], np.ndarray, np.ndarray | None]:
        table = self.f.table(self.doc, "states", required=True)
        if not table:
            raise self.error("no states", "states")
        # Before anything per state is built: a 10,000-state file would take minutes here
        # and hours in the solver.
        limits.check(len(table), limits.MAX_STATES, "states", force=self.force,
                     file=self.path, field="states",
                     hint="split the model or lump states (kingen.model.limits.MAX_STATES)")
        names, g, init, any_init = [], [], [], False
        for sname, spec in table.items():
            where = f"states.{sname}"
            if not _NAME.match(sname):
                raise self.error("state names are letters, digits and _", where)
            if not isinstance(spec, dict):
                raise self.error("must be a table such as { conductance = 0 }", where, spec)
            self.f.keys(spec, ("conductance", "initial", "description"), where)
            self.f.string(spec, "description", where, None)
            cond = self.f.number(spec, "conductance", where, 0.0, ge=0.0, factor=gf,
                                 unit="pS")
            if cond > MAX_CONDUCTANCE_PS:
                raise self.error(f"more than {MAX_CONDUCTANCE_PS:g} pS once converted: not a "
                                 "single-channel conductance", f"{where}.conductance",
                                 spec["conductance"])
            names.append(sname)
            g.append(cond)
            if "initial" in spec:
                any_init = True
                init.append(self.f.number(spec, "initial", where, ge=0.0, le=1.0))
            else:
                init.append(0.0)
        initial = None
        if any_init:
            initial = np.array(init)
            if abs(initial.sum() - 1.0) > 1e-9:
                raise self.error("initial occupancies must sum to 1", "states",
                                 float(initial.sum()))
        return names, np.array(g), initial

    def parameters_raw(self) -> dict[str, dict]:
        table = self.f.table(self.doc, "parameters", required=True)
        for pname, spec in table.items():
            where = f"parameters.{pname}"
            if not _NAME.match(pname):
                raise self.error("parameter names are letters, digits and _", where)
            if pname == "transitions" and isinstance(spec, list):
                raise self.error("'transitions = [...]' was written after [parameters], so "
                                 "TOML put it inside that table: use a [transitions] table "
                                 "or [[transitions]] entries", "parameters.transitions")
            if isinstance(spec, (int, float)) and not isinstance(spec, bool):
                table[pname] = {"value": spec}
                continue
            if not isinstance(spec, dict):
                raise self.error("must be a number or a table such as { value = 1.0 }", where,
                                 spec)
            self.f.keys(spec, ("value", "unit", "bounds", "scale", "fixed", "description"),
                        where)
            self.f.string(spec, "description", where, None)
        return table

    def transitions(self, states: list[str], params: dict[str, dict], agonist: str,
                    ) -> tuple[list[Transition], dict[str, list[tuple[int, bool, bool]]]]:
        raw = self.doc.get("transitions")
        if isinstance(raw, dict):
            raw = self.transition_table(raw)
        if not isinstance(raw, list) or not raw:
            raise self.error("missing or empty: give a [transitions] table of "
                             "\"A -> B\" = \"rate\" lines", "transitions")
        index = {s: i for i, s in enumerate(states)}
        seen: dict[tuple[int, int], int] = {}
        usage: dict[str, list[tuple[int, bool, bool]]] = {}
        out: list[Transition] = []
        names: list[str] = []
        for m, spec in enumerate(raw):
            where = f"transitions[{m}]"
            if not isinstance(spec, dict):
                raise self.error("must be a table { from, to, rate }", where, spec)
            self.f.keys(spec, ("from", "to", "rate", "derived", "description"), where)
            self.f.string(spec, "description", where, None)
            ends = []
            for key in ("from", "to"):
                value = self.f.string(spec, key, where)
                if value not in index:
                    raise self.error(f"unknown state (states are {', '.join(states)})",
                                     f"{where}.{key}", value)
                ends.append(index[value])
            i, j = ends
            if i == j:
                raise self.error("transition from a state to itself", f"{where}.to",
                                 spec["to"])
            if (i, j) in seen:
                raise self.error(
                    f"duplicate transition {states[i]} -> {states[j]} "
                    f"(also transitions[{seen[(i, j)]}])", f"{where}.to", spec["to"])
            seen[(i, j)] = m
            expr = spec.get("rate")
            if not isinstance(expr, str):
                raise self.error("missing or not a string such as \"2 * k_on * glu\"",
                                 f"{where}.rate", expr)
            factor, pname, uses_agonist = self.rate_expression(expr, f"{where}.rate", params,
                                                               agonist)
            derived = self.f.boolean(spec, "derived", where, False)
            usage.setdefault(pname, []).append((m, uses_agonist, derived))
            names.append(pname)
            out.append(Transition(i, j, factor, -1, uses_agonist, derived, expr))
        for pname in params:
            if pname not in usage:
                raise self.error("unused parameter: no transition uses it",
                                 f"parameters.{pname}")
        order = {name: k for k, name in enumerate(params)}
        out = [Transition(t.source, t.target, t.factor, order[pname], t.agonist, t.derived,
                          t.expression) for t, pname in zip(out, names)]
        return out, usage

    def transition_table(self, table: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for key, spec in table.items():
            parts = [p.strip() for p in key.replace("→", "->").split("->")]
            if len(parts) != 2 or not all(parts):
                raise self.error("a transition is written \"FROM -> TO\" = \"rate\"",
                                 f"transitions.{key!r}")
            if isinstance(spec, str):
                spec = {"rate": spec}
            elif not isinstance(spec, dict):
                raise self.error("must be a rate string or { rate = ..., derived = true }",
                                 f"transitions.{key!r}", spec)
            out.append({"from": parts[0], "to": parts[1], **spec})
        return out

    def rate_expression(self, expr: str, where: str, params: dict[str, dict], agonist: str,
                        ) -> tuple[float, str, bool]:
        factor, pname, uses_agonist = 1.0, None, False
        tokens = [t.strip() for t in expr.replace("·", "*").split("*")]
        for token in tokens:
            if _NUMBER.match(token):
                value = float(token)
                if value <= 0:
                    raise self.error("rate factor must be > 0", where, expr)
                factor *= value
                if not RATE_RANGE[0] <= factor <= RATE_RANGE[1]:
                    raise self.error(f"rate factor out of range (the factors of a rate must "
                                     f"multiply to between {RATE_RANGE[0]:g} and "
                                     f"{RATE_RANGE[1]:g})", where, expr)
            elif token == agonist:
                if uses_agonist:
                    raise self.error(f"the agonist '{agonist}' appears twice", where, expr)
                uses_agonist = True
            elif _NAME.match(token):
                if token not in params:
                    raise self.error(
                        f"unknown parameter '{token}' (parameters are "
                        f"{', '.join(params)}; the agonist is '{agonist}')", where, expr)
                if pname is not None:
                    raise self.error("a rate is factor * parameter [* agonist]: two "
                                     "parameters given", where, expr)
                pname = token
            else:
                raise self.error("a rate is written factor * parameter [* agonist], "
                                 "e.g. \"2 * k_on * glu\"", where, expr)
        if pname is None:
            raise self.error("no parameter in the rate", where, expr)
        return factor, pname, uses_agonist

    def parameters(self, raw: dict[str, dict], usage: dict[str, list[tuple[int, bool, bool]]],
                   tf: float, cf: float) -> list[Parameter]:
        out = []
        for pname, spec in raw.items():
            where = f"parameters.{pname}"
            uses = usage[pname]
            orders = {2 if ag else 1 for _, ag, _ in uses}
            if len(orders) > 1:
                raise self.error("used both with and without the agonist; a binding rate "
                                 "(per concentration) and a first-order rate need separate "
                                 "parameters", where)
            order = orders.pop()
            derived = any(d for _, _, d in uses)
            if derived and len(uses) > 1:
                raise self.error("a derived parameter must be used by exactly one transition",
                                 where)
            if "unit" in spec:
                ufac, uorder = units.parse_rate_unit(spec["unit"], file=self.path,
                                                     field=f"{where}.unit")
                if uorder != order:
                    want = ("time^-1" if order == 1 else "concentration^-1 time^-1")
                    raise self.error(f"unit does not match its use: the transitions using it "
                                     f"need {want}", f"{where}.unit", spec["unit"])
                unit = spec["unit"]
            else:
                ufac = 1.0 / tf if order == 1 else 1.0 / (tf * cf)
                unit = self._default_unit(order)
            internal = "ms^-1" if order == 1 else "mM^-1 ms^-1"
            value = self.f.number(spec, "value", where, gt=0.0, factor=ufac, unit=internal)
            check_rate_range(value, internal, file=self.path, field=f"{where}.value",
                             value=spec["value"])
            if "bounds" not in spec:
                lo, hi = value / DEFAULT_BOUND_FACTOR, value * DEFAULT_BOUND_FACTOR
                for bound in (lo, hi):
                    check_rate_range(bound, internal, file=self.path, field=f"{where}.value",
                                     value=spec["value"], what="its default bounds (x/ 10)")
            else:
                lo, hi = self.f.numbers(spec, "bounds", where, length=2, gt=0.0, factor=ufac,
                                        unit=internal)
                for k, bound in enumerate((lo, hi)):
                    check_rate_range(bound, internal, file=self.path,
                                     field=f"{where}.bounds[{k}]", value=spec["bounds"][k])
                if lo >= hi:
                    raise self.error("lower bound must be below the upper bound",
                                     f"{where}.bounds", spec["bounds"])
            if not derived and not (lo * (1 - 1e-12) <= value <= hi * (1 + 1e-12)):
                raise self.error(f"value outside its bounds [{lo / ufac:g}, {hi / ufac:g}]",
                                 f"{where}.value", spec["value"])
            scale = self.f.choice(spec, "scale", ("log", "linear"), where, "log")
            fixed = self.f.boolean(spec, "fixed", where, False)
            out.append(Parameter(pname, value, lo, hi, order, unit, scale, fixed, derived))
        return out

    def _default_unit(self, order: int) -> str:
        # spelled so that units.parse_rate_unit reads it back ("mol/l" -> "M", "MS" -> "ms")
        u = self.doc.get("units", {})
        t = units.canonical("time", str(u.get("time", "ms")))
        c = units.canonical("concentration", str(u.get("concentration", "mM")))
        return f"{t}^-1" if order == 1 else f"{c}^-1 {t}^-1"

    def check_reachable(self, states: list[str], transitions: list[Transition],
                        initial: np.ndarray | None) -> None:
        start = [0] if initial is None else [int(i) for i in np.flatnonzero(initial > 0)]
        adj: dict[int, list[int]] = {}
        for t in transitions:
            adj.setdefault(t.source, []).append(t.target)
        seen = set(start)
        stack = list(start)
        while stack:
            for j in adj.get(stack.pop(), []):
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        for i, sname in enumerate(states):
            if i not in seen:
                origin = states[start[0]]
                raise self.error(f"unreachable state: no path of transitions leads to it from "
                                 f"{origin}", f"states.{sname}")

    def derived(self, states: list[str], parameters: list[Parameter],
                transitions: list[Transition], cycles: list[Cycle]) -> list[DerivedRule]:
        closing = {c.derived for c in cycles if c.derived is not None}
        rules = []
        for m, t in enumerate(transitions):
            if not t.derived:
                continue
            where = f"transitions[{m}].derived"
            if m not in closing:
                raise self.error(f"derived rate {states[t.source]} -> {states[t.target]} "
                                 f"closes no cycle of its own (a derived rate needs a cycle "
                                 f"whose other rates are not derived)", where, True)
            cycle = next(c for c in cycles if c.derived == m)
            if not cycle.backward:
                raise self.error(f"cycle {_cycle_text(states, cycle)} has a one-way "
                                 f"transition: no rate can keep it reversible", where, True)
            # forward product includes m; solve forward == backward for k_m.
            n_ag_f = sum(transitions[k].agonist for k in cycle.forward)
            n_ag_b = sum(transitions[k].agonist for k in cycle.backward)
            if n_ag_f != n_ag_b:
                raise self.error(
                    f"cycle {_cycle_text(states, cycle)} binds agonist {n_ag_f} time(s) one "
                    f"way and {n_ag_b} the other: it cannot be reversible at every "
                    f"concentration", where, True)
            exps = np.zeros(len(parameters))
            log_const = -math.log(t.factor)
            for k in cycle.backward:
                exps[transitions[k].param] += 1
                log_const += math.log(transitions[k].factor)
            for k in cycle.forward:
                if k == m:
                    continue
                exps[transitions[k].param] -= 1
                log_const -= math.log(transitions[k].factor)
            rules.append(DerivedRule(t.param, log_const, exps))
        return rules

    def check_reversibility(self, scheme: Scheme) -> None:
        for cycle, (log_f, log_b) in zip(scheme.cycles, scheme.cycle_log_products()):
            if cycle.derived is not None:
                continue
            text = scheme.describe_cycle(cycle)
            if not cycle.backward or len(cycle.backward) != len(cycle.forward):
                raise self.error(
                    f"cycle {text} has a one-way transition, so it cannot be microscopically "
                    f"reversible (add the reverse transition, or set "
                    f"model.check_reversibility = false)", "transitions")
            n_ag_f = sum(scheme.transitions[k].agonist for k in cycle.forward)
            n_ag_b = sum(scheme.transitions[k].agonist for k in cycle.backward)
            if n_ag_f != n_ag_b:
                raise self.error(
                    f"cycle {text} binds agonist {n_ag_f} time(s) one way and {n_ag_b} the "
                    f"other: it cannot be reversible at every concentration", "transitions")
            # In log space: products of a cycle's rates may overflow or underflow while
            # their ratio is an ordinary number.
            log_ratio = log_f - log_b
            if abs(log_ratio) > math.log1p(scheme.reversibility_tolerance):
                raise self.error(
                    f"cycle {text} violates microscopic reversibility: product of rates one "
                    f"way {exp_text(log_f, '.6g')}, the other way {exp_text(log_b, '.6g')} "
                    f"(ratio {exp_text(log_ratio)}, tolerance {scheme.reversibility_tolerance:g}); "
                    f"correct a rate, or mark one rate of the cycle derived = true",
                    "transitions")

    def check_derived_values(self, scheme: Scheme) -> None:
        for rule in scheme.derived_rules:
            p = scheme.parameters[rule.param]
            value = scheme.values[rule.param]
            if not (p.lower * (1 - 1e-9) <= value <= p.upper * (1 + 1e-9)):
                raise self.error(
                    f"derived value {value:.6g} ({p.internal_unit}) falls outside the bounds "
                    f"[{p.lower:.6g}, {p.upper:.6g}]", f"parameters.{p.name}.bounds")

    def check_rest(self, scheme: Scheme) -> None:
        # Structural, not numerical: the rest distribution is unique exactly when the
        # agonist-free graph has one closed class; a rank test on Q(0) mistakes rates many
        # orders of magnitude apart for a second class (and takes minutes on large schemes).
        left = {t.source for t in scheme.transitions}
        absorbing = [i for i in range(scheme.n_states) if i not in left]
        if absorbing and scheme.n_states > 1:
            # more than one closed class follows, but initial occupancies would not mend it
            name = scheme.states[absorbing[0]]
            raise self.error(
                f"state {name} is absorbing: no transition leaves it, with or without "
                f"agonist, so every receptor would end in it and stay; add a transition out "
                f"of {name}", f"states.{name}")
        edges = [(t.source, t.target) for t in scheme.transitions if not t.agonist]
        if len(closed_classes(scheme.n_states, edges)) > 1:
            raise self.error(
                "the resting state is not unique: with no agonist the scheme has more than one "
                "closed set of states; give initial occupancies (states.X.initial)", "states")


def exp_text(log_value: float, spec: str = ".4g") -> str:
    """``exp(log_value)`` formatted with ``spec``, or as a power of ten where it overflows
    or underflows a float."""
    if abs(log_value) < 700:
        return format(math.exp(log_value), spec)
    return f"10^{log_value / math.log(10):.1f}"


def closed_classes(n_states: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    """The closed communicating classes of a directed graph (strongly connected components
    with no edge leaving them), found without recursion."""
    out_edges: list[list[int]] = [[] for _ in range(n_states)]
    in_edges: list[list[int]] = [[] for _ in range(n_states)]
    for a, b in edges:
        out_edges[a].append(b)
        in_edges[b].append(a)
    # Kosaraju: finishing order on the graph, then components on the reversed graph.
    seen = [False] * n_states
    order: list[int] = []
    for root in range(n_states):
        if seen[root]:
            continue
        seen[root] = True
        stack = [(root, 0)]
        while stack:
            node, k = stack.pop()
            if k < len(out_edges[node]):
                stack.append((node, k + 1))
                nxt = out_edges[node][k]
                if not seen[nxt]:
                    seen[nxt] = True
                    stack.append((nxt, 0))
            else:
                order.append(node)
    component = [-1] * n_states
    groups: list[list[int]] = []
    for root in reversed(order):
        if component[root] >= 0:
            continue
        component[root] = len(groups)
        members = [root]
        stack = [root]
        while stack:
            for prev in in_edges[stack.pop()]:
                if component[prev] < 0:
                    component[prev] = len(groups)
                    members.append(prev)
                    stack.append(prev)
        groups.append(members)
    leaving = {component[a] for a, b in edges if component[a] != component[b]}
    return [g for c, g in enumerate(groups) if c not in leaving]


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


def _cycle_text(states: list[str], cycle: Cycle) -> str:
    names = [states[i] for i in cycle.states]
    return "-".join(names + names[:1])


def find_cycles(n_states: int, transitions: list[Transition]) -> list[Cycle]:
    """The fundamental cycles of the state graph.

    The spanning tree is built from non-derived transitions first, so that each derived
    transition closes a cycle whose other edges are all non-derived.
    """
    pair_to_trans: dict[tuple[int, int], int] = {
        (t.source, t.target): m for m, t in enumerate(transitions)}
    edges: dict[frozenset, bool] = {}
    for t in transitions:
        key = frozenset((t.source, t.target))
        edges[key] = edges.get(key, False) or t.derived
    parent = list(range(n_states))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    tree: dict[int, list[int]] = {i: [] for i in range(n_states)}
    chords: list[tuple[int, int]] = []
    for derived_pass in (False, True):
        for key, has_derived in edges.items():
            if has_derived != derived_pass:
                continue
            a, b = sorted(key)
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[ra] = rb
                tree[a].append(b)
                tree[b].append(a)
            else:
                chords.append((a, b))

    def tree_path(a: int, b: int) -> list[int]:
        prev = {a: -1}
        queue = [a]
        for x in queue:
            if x == b:
                break
            for y in tree[x]:
                if y not in prev:
                    prev[y] = x
                    queue.append(y)
        path = [b]
        while path[-1] != a:
            path.append(prev[path[-1]])
        return path[::-1]

    cycles = []
    for a, b in chords:
        derived = None
        for src, dst in ((a, b), (b, a)):
            m = pair_to_trans.get((src, dst))
            if m is not None and transitions[m].derived:
                a, b = src, dst  # orient the cycle so the derived transition is forward
                derived = m
                break
        # cycle: a -> b, then the tree path b -> ... -> a
        loop = [a] + tree_path(b, a)[:-1]
        fwd, bwd = [], []
        for x, y in zip(loop, loop[1:] + loop[:1]):
            f = pair_to_trans.get((x, y))
            r = pair_to_trans.get((y, x))
            if f is not None:
                fwd.append(f)
            if r is not None:
                bwd.append(r)
        complete = len(fwd) == len(loop) and len(bwd) == len(loop)
        cycles.append(Cycle(tuple(loop), tuple(fwd), tuple(bwd) if complete else (),
                            derived))
    return cycles
