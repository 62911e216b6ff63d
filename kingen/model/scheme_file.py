"""The scheme file's parser: TOML fields to a validated :class:`~kingen.model.scheme.Scheme`.

:class:`SchemeParser` reads the tables of a scheme file (``model``, ``units``, ``states``,
``parameters``, ``transitions``, ``temperature``), converts values to internal units once,
and checks what a scheme must be: every state reachable, a conducting state, rates in range
and inside their bounds, derived rates that close a cycle of their own, microscopic
reversibility of every other cycle, and a unique resting state. Every problem is one
:class:`~kingen.errors.KingenError` naming the file, field and value.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.model import limits, units
from kingen.model.fields import Fields
from kingen.model.graph import Cycle, Transition, closed_classes, cycle_text, find_cycles
from kingen.model.scheme import (
    DEFAULT_BOUND_FACTOR,
    DEFAULT_REVERSIBILITY_TOLERANCE,
    MAX_CHANNELS,
    MAX_CONDUCTANCE_PS,
    RATE_RANGE,
    DerivedRule,
    Parameter,
    Scheme,
    check_rate_range,
    exp_text,
)
from kingen.model.temperature import parse_temperature

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: no final newline (generated code)
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


class SchemeParser:
    """Build a :class:`Scheme` from a scheme file's parsed TOML (``doc``) and its text."""

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
                raise self.error(f"cycle {cycle_text(states, cycle)} has a one-way "
                                 f"transition: no rate can keep it reversible", where, True)
            # forward product includes m; solve forward == backward for k_m.
            n_ag_f = sum(transitions[k].agonist for k in cycle.forward)
            n_ag_b = sum(transitions[k].agonist for k in cycle.backward)
            if n_ag_f != n_ag_b:
                raise self.error(
                    f"cycle {cycle_text(states, cycle)} binds agonist {n_ag_f} time(s) one "
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
