"""Read a kinetic scheme from a Myokit model (``.mmt``) in Markov form.

The model is parsed by Myokit itself (``myokit.parse_model``: Myokit's own parser, which
evaluates nothing of the file) and checked with ``myokit.lib.markov.LinearModel``: the
states' derivatives must be linear combinations of the states, summing to zero. Every
inflow term ``k * [c *] X`` of ``dot(Y)`` is a transition X -> Y whose rate must be a number
times one literal constant (a parameter), times at most the agonist concentration: a
variable in a concentration unit or bound to ``pace``. Rates depending on the membrane
potential or on anything else are reported with their line; nothing is written.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from kingen.errors import KingenError
from kingen.model.temperature import identify_factor
from kingen.outputs.interop.imported import (
    ImportedParameter,
    ImportedRate,
    ImportedScheme,
    ImportProblems,
    temperature_groups,
)
from kingen.outputs.interop.nmodl.constants import TemperatureFactor

# names a model's temperature variable (°C) goes by
_TEMPERATURE_NAMES = ("celsius", "temperature", "T_celsius", "temp_c")

_CHANNEL_NAMES = {"nchan", "n_chan", "nchannels", "n_channels", "channels", "N", "Nchan"}
_LINEAR_ONLY = ("not a linear (Markov) model: only linear Markov models import, in the form "
                "myokit.lib.markov reads")


def read_myokit(path: str | Path, *, agonist: str | None = None) -> ImportedScheme:
    """The kinetic scheme of a Myokit model, in kingen's internal units.

    Parameters
    ----------
    path
        The ``.mmt`` file.
    agonist
        The agonist concentration variable (name or ``component.name``), when more than
        one could be.

    Raises
    ------
    KingenError
        On a syntax error (naming the line), a model that is not linear in its states, an
        ambiguous agonist; :class:`ImportProblems` for every rate a scheme cannot hold.
    """
    import myokit

    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KingenError(f"cannot read: {exc}", file=name) from None
    try:
        model = myokit.parse_model(text)
    except myokit.ParseError as exc:
        what = str(exc).split(": ", 1)[-1] if ": " in str(exc) else str(exc)
        raise KingenError(f"Myokit cannot parse it: {what}", file=name,
                          field=f"line {getattr(exc, 'line', 0) or 1}") from None
    except myokit.MyokitError as exc:
        raise KingenError(f"Myokit rejects the model: {' '.join(str(exc).split())}",
                          file=name, field="line 1") from None
    return _Reader(name, text, model, agonist).scheme()


class _Reader:
    def __init__(self, path: str, text: str, model, agonist: str | None) -> None:
        self.path = path
        self.text = text
        self.model = model
        self.agonist = agonist
        self.problems: list[tuple[int | None, str]] = []
        self.notes: list[str] = []

    def line_of(self, var) -> int:
        """The line where ``var`` is defined (``name =`` or ``dot(name) =`` under its
        component's header)."""
        comp = var.parent().qname() if hasattr(var.parent(), "qname") else ""
        lines = self.text.splitlines()
        pat = re.compile(rf"^\s*(dot\(\s*{re.escape(var.name())}\s*\)|"
                         rf"{re.escape(var.name())})\s*=")
        inside = False
        for k, line in enumerate(lines, 1):
            head = re.match(r"^\s*\[([^\[\]]+)\]\s*$", line)
            if head:
                inside = head.group(1).strip() == comp
                continue
            if inside and pat.match(line):
                return k
        return 1

    def fail(self, message: str, line: int) -> KingenError:
        return KingenError(message, file=self.path, field=f"line {line}")

    def scheme(self) -> ImportedScheme:

        model = self.model
        comps = [c for c in model.components() if any(v.is_state() for v in c.variables())]
        if not comps:
            raise self.fail("no state variables (dot(X) = ...): not a kinetic scheme", 1)
        comps.sort(key=lambda c: -sum(v.is_state() for v in c.variables()))
        if len(comps) > 1:
            others = ", ".join(c.qname() for c in comps[1:])
            self.notes.append(f"States of component {comps[0].qname()} are the scheme; "
                              f"{others} also hold states and are left out.")
        comp = comps[0]
        states = [v for v in comp.variables() if v.is_state()]
        # Myokit writes the numbers into Python code it runs: inf or nan fail there
        self.check_numbers()
        agonist = self.pick_agonist(states)
        vm = model.label("membrane_potential")
        retain = [v for v in model.variables(deep=True) if v.is_literal() or v.binding()]
        if agonist is not None and agonist not in retain:
            retain.append(agonist)
        self.temperature_factors(retain)
        self.check_linear(states, retain)
        if agonist is not None:
            import myokit.lib.markov as markov

            try:
                markov.LinearModel(model, states, [], None, agonist)
            # LinearModel misses some nonlinear forms and fails in code it generates
            except (markov.LinearModelError, NameError, ArithmeticError) as exc:
                raise self.fail(f"{_LINEAR_ONLY}: {' '.join(str(exc).split())}",
                                self.line_of(states[0])) from None
        names = [s.name() for s in states]
        params: dict[str, ImportedParameter] = {}
        rates: list[ImportedRate] = []
        for target in states:
            line = self.line_of(target)
            expr = target.rhs().clone(expand=True, retain=retain)
            seen: set = set()
            for sign, term in _split_terms(expr):
                try:
                    factor, atoms = _atoms(term)
                except ValueError as exc:
                    self.problems.append((line, f"dot({target.name()}) has a term {term}: "
                                                f"{exc}"))
                    continue
                src = [a for a in atoms if not isinstance(a, str) and a in states]
                if len(src) != 1:
                    self.problems.append((line, f"dot({target.name()}) has a term {term} "
                                                f"that is not a rate times one state"))
                    continue
                source = src[0]
                if source is target:
                    continue  # outflow: LinearModel checked that it balances the inflows
                if sign < 0:
                    self.problems.append((line, f"dot({target.name()}) has a negative "
                                                f"inflow from {source.name()}: {term}"))
                    continue
                rest = [a for a in atoms if a is not source]
                if "outflow" in rest:
                    self.problems.append((line, f"dot({target.name()}): the rate from "
                                                f"{source.name()} is a sum of terms"))
                    continue
                self.rate(source, target, factor, rest, agonist, vm, line, seen, params,
                          rates)
        conductance, channels = self.conductance(comp, states, retain, vm)
        reference, groups = temperature_groups(self.factors, self.rate_factor, params)
        if self.problems:
            raise ImportProblems(self.path, self.problems)
        title = model.name() or Path(self.path).stem
        self.notes.insert(0, f"Myokit model '{title}', component {comp.qname()}.")
        if agonist is not None:
            self.notes.append(f"Agonist: {agonist.qname()} of the .mmt file.")
        self.notes.append("The model's initial state is not carried over: kingen starts from "
                          "the equilibrium without agonist.")
        return ImportedScheme(self.path, "Myokit", title, names, conductance, params, rates,
                              agonist=agonist.name() if agonist is not None else "glu",
                              channels=channels, notes=self.notes, reference_c=reference,
                              groups=groups)

    def temperature_factors(self, retain: list) -> None:
        """Find the variables that are a Q10 or an Arrhenius factor of the temperature
        variable (``celsius``), and keep them whole (``retain``) for the rates to name."""
        import myokit

        self.factors: list[TemperatureFactor] = []
        self.factor_of: dict = {}
        self.rate_factor: dict[str, int | None] = {}
        temps = [v for v in self.model.variables(deep=True)
                 if v.is_literal() and v.name() in _TEMPERATURE_NAMES]
        if len(temps) != 1:
            return
        temp = temps[0]
        literals = [v for v in self.model.variables(deep=True) if v.is_literal()]
        for var in self.model.variables(deep=True):
            if var.is_literal() or var.is_state() or var.rhs() is None:
                continue
            expr = var.rhs().clone(expand=True, retain=literals)
            if temp not in {r.var() for r in expr.references()}:
                continue

            def at(t: float, expr=expr) -> float:
                return float(expr.clone(subst={myokit.Name(temp): myokit.Number(t)},
                                        expand=True).eval())

            found = identify_factor(at)
            if found is None:
                continue
            kind, value, reference = found
            named = [r.var() for r in expr.references()
                     if r.var() is not temp and r.var().is_literal()]
            tf = TemperatureFactor(kind, value, reference, named[0].name() if named else None)
            if tf not in self.factors:
                self.factors.append(tf)
            self.factor_of[var] = self.factors.index(tf)
            retain.append(var)

    def check_numbers(self) -> None:
        """Refuse a number that is not finite: inf, nan, or one that overflows (1e400)."""
        import myokit

        for var in self.model.variables(deep=True):
            found = [] if var.rhs() is None else [
                float(n.eval()) for n in var.rhs().walk([myokit.Number])]
            line = self.line_of(var)
            if var.is_state():
                found.append(float(var.initial_value().eval()))
                line = self.initial_line(var) if not math.isfinite(found[-1]) else line
            bad = next((x for x in found if not math.isfinite(x)), None)
            if bad is not None:
                raise self.fail(f"{var.qname()} holds {bad}: numbers must be finite (not inf "
                                "or nan, nor past 1.8e308 as 1e400 is)", line)

    def initial_line(self, var) -> int:
        """The line of a state's initial value (``comp.X = 1`` under ``[[model]]``)."""
        pat = re.compile(rf"^\s*{re.escape(var.qname())}\s*=")
        return next((k for k, line in enumerate(self.text.splitlines(), 1) if pat.match(line)),
                    1)

    def check_linear(self, states, retain) -> None:
        """Refuse a derivative with a term that multiplies states (or a state by itself):
        a kinetic scheme is linear in its states."""
        for target in states:
            expr = target.rhs().clone(expand=True, retain=retain)
            for _, term in _split_terms(expr):
                try:
                    _, atoms = _atoms(term)
                except ValueError:
                    continue  # named, term by term, with the other problems
                if sum(a in states for a in atoms if not isinstance(a, str)) > 1:
                    raise self.fail(f"{_LINEAR_ONLY}: dot({target.name()}) has the term "
                                    f"{term}, a product of states", self.line_of(target))

    def rate(self, source, target, factor, rest, agonist, vm, line, seen, params, rates):
        import myokit

        key = (source.name(), target.name())
        uses = sum(a is agonist for a in rest)
        rest = [a for a in rest if a is not agonist]
        scaled = [self.factor_of[a] for a in rest if a in self.factor_of]
        rest = [a for a in rest if a not in self.factor_of]
        if len(scaled) > 1:
            self.problems.append((line, f"rate {source.name()} -> {target.name()} scales "
                                        "with more than one temperature factor"))
            return
        desc = f"rate {source.name()} -> {target.name()}"
        volts = [a for a in rest if a is vm or _is_voltage(a)]
        if volts:
            self.problems.append((line, f"{desc} depends on the membrane potential "
                                        f"{volts[0].qname()} (a voltage-dependent rate)"))
            return
        if uses > 1:
            self.problems.append((line, f"{desc} has the agonist to the power {uses}"))
            return
        bad = [a for a in rest if not a.is_literal()]
        if bad:
            self.problems.append((line, f"{desc} depends on {bad[0].qname()}, which is not a "
                                        f"constant"))
            return
        if len(rest) > 1:
            self.problems.append((line, f"{desc} is a product of parameters "
                                        f"({' * '.join(a.name() for a in rest)}): a rate is a "
                                        f"number times one parameter [times the agonist]"))
            return
        if key in seen:
            self.problems.append((line, f"{desc} is a sum of terms"))
            return
        seen.add(key)
        order = 2 if uses else 1
        want = myokit.parse_unit("1/ms" if order == 1 else "1/mM/ms")
        if rest:
            p = rest[0]
            pname = p.name()
            value = float(p.eval())
            unit = p.unit()
            if unit is None:
                self.notes.append(f"{p.qname()} declares no unit: taken as "
                                  + ("1/ms." if order == 1 else "1/mM/ms."))
            else:
                try:
                    value *= float(myokit.Unit.conversion_factor(unit, want).value())
                except myokit.IncompatibleUnitError:
                    self.problems.append((self.line_of(p), f"{p.qname()} has the unit {unit} "
                                                           f"but is used as a rate in {want}"))
                    return
        else:
            pname = f"k_{source.name()}_{target.name()}"
            value, factor = factor, 1.0
            if uses and agonist.unit() is not None:
                value /= self.agonist_factor(agonist)
        old = params.get(pname)
        if old is not None and old.order != order:
            self.problems.append((line, f"{pname} is used both with and without the agonist; "
                                        f"kingen needs two parameters"))
            return
        if factor <= 0:
            self.problems.append((line, f"{desc} is not positive"))
            return
        scaled_by = scaled[0] if scaled else None
        if self.rate_factor.setdefault(pname, scaled_by) != scaled_by:
            self.problems.append((line, f"{pname} scales with temperature in one rate and not "
                                        "(or by another factor) in another"))
            return
        params.setdefault(pname, ImportedParameter(pname, value, order, line))
        rates.append(ImportedRate(source.name(), target.name(), factor, pname, bool(uses),
                                  line))

    def agonist_factor(self, var) -> float:
        import myokit

        return float(myokit.Unit.conversion_factor(var.unit(), myokit.parse_unit("mM")).value())

    def pick_agonist(self, states):
        import myokit

        model = self.model
        if self.agonist is not None:
            name = self.agonist
            found = [v for v in model.variables(deep=True)
                     if v.qname() == name or v.name() == name]
            if len(found) != 1:
                raise self.fail(f"--agonist {name}: {'no' if not found else 'more than one'} "
                                f"variable of that name", 1)
            return found[0]
        used = set()
        for s in states:
            for v in s.rhs().clone(expand=True, retain=[
                    v for v in model.variables(deep=True)
                    if v.is_literal() or v.binding()]).references():
                used.add(v.var())
        cands = []
        for v in used:
            if v.is_state():
                continue
            unit = v.unit()
            if v.binding() == "pace":
                cands.append(v)
                continue
            if unit is not None:
                try:
                    myokit.Unit.conversion_factor(unit, myokit.parse_unit("mM"))
                    cands.append(v)
                except myokit.IncompatibleUnitError:
                    pass
        if len(cands) > 1:
            which = ", ".join(f"{v.qname()} (line {self.line_of(v)})" for v in cands)
            raise self.fail(f"the rates multiply more than one concentration: {which}; say "
                            f"which is the agonist with --agonist NAME",
                            min(self.line_of(v) for v in cands))
        return cands[0] if cands else None

    def conductance(self, comp, states, retain, vm):
        import myokit

        for var in comp.variables():
            if var.is_state() or var.unit() is None:
                continue
            try:
                to_ps = float(myokit.Unit.conversion_factor(var.unit(),
                                                            myokit.parse_unit("pS")).value())
            except myokit.IncompatibleUnitError:
                continue
            expr = var.rhs().clone(expand=True, retain=retain)
            try:
                terms = [(sign, *_atoms(t)) for sign, t in _split_terms(expr)]
            except ValueError:
                continue
            if not terms or any(sum(a in states for a in atoms) != 1 for _, _, atoms in terms):
                continue
            if vm is not None and any(vm in atoms for _, _, atoms in terms):
                continue
            common = set.intersection(*[{a for a in atoms if a not in states}
                                        for _, _, atoms in terms])
            chan = next((a for a in common if a.is_literal() and (
                a.name() in _CHANNEL_NAMES or (a.unit() is not None and a.unit() ==
                                               myokit.units.dimensionless))), None)
            channels = float(chan.eval()) if chan is not None else 1.0
            out: dict[str, float] = {}
            for sign, factor, atoms in terms:
                st = next(a for a in atoms if a in states)
                value = sign * factor
                for a in atoms:
                    if a is st or a is chan:
                        continue
                    value *= float(a.eval())
                out[st.name()] = out.get(st.name(), 0.0) + value * to_ps
            self.notes.append(
                f"State conductances from {var.qname()} (line {self.line_of(var)})"
                + (f", channels = {chan.name()} = {channels:g}." if chan is not None else
                   ", as the whole model's conductance with channels = 1."))
            return out, channels
        self.problems.append((None, f"no conductance found in component {comp.qname()}: "
                                    f"kingen needs a variable in a conductance unit (pS, nS, "
                                    f"...) that is a sum of conductance x state terms"))
        return {}, 1.0


def _is_voltage(var) -> bool:
    """A variable in a unit of potential (mV, V): a membrane potential without its label."""
    import myokit

    unit = var.unit()
    if unit is None:
        return False
    try:
        myokit.Unit.conversion_factor(unit, myokit.parse_unit("mV"))
        return True
    except myokit.IncompatibleUnitError:
        return False


def _split_terms(expr, sign: int = 1, out=None):
    """(sign, term) pairs of a sum."""
    import myokit

    out = [] if out is None else out
    if isinstance(expr, myokit.Plus):
        _split_terms(expr[0], sign, out)
        _split_terms(expr[1], sign, out)
    elif isinstance(expr, myokit.Minus):
        _split_terms(expr[0], sign, out)
        _split_terms(expr[1], -sign, out)
    elif isinstance(expr, myokit.PrefixMinus):
        _split_terms(expr[0], -sign, out)
    elif isinstance(expr, myokit.PrefixPlus):
        _split_terms(expr[0], sign, out)
    elif isinstance(expr, myokit.Multiply) and _is_sum(expr[0]) and not _has_state(expr[0]):
        # -(a + b) * X: an outflow written as one product; keep it whole
        out.append((sign, expr))
    else:
        out.append((sign, expr))
    return out


def _is_sum(expr) -> bool:
    import myokit

    while isinstance(expr, (myokit.PrefixMinus, myokit.PrefixPlus)):
        expr = expr[0]
    return isinstance(expr, (myokit.Plus, myokit.Minus))


def _has_state(expr) -> bool:
    return any(r.var().is_state() for r in expr.references())


def _atoms(term) -> tuple[float, list]:
    """``term`` as a number times a product of variables; ValueError otherwise.

    An outflow ``(a + b) * X`` is accepted as a product with its sum evaluated away: only
    its state matters to the caller, which skips a state's own outflow.
    """
    import myokit

    if isinstance(term, myokit.Number):
        return float(term.eval()), []
    if isinstance(term, myokit.Name):
        return 1.0, [term.var()]
    if isinstance(term, myokit.PrefixMinus):
        f, a = _atoms(term[0])
        return -f, a
    if isinstance(term, myokit.PrefixPlus):
        return _atoms(term[0])
    if isinstance(term, myokit.Multiply):
        for k in (0, 1):
            if _is_sum(term[k]) and not _has_state(term[k]) and _has_state(term[1 - k]):
                f, a = _atoms(term[1 - k])
                return f, a + ["outflow"]
        fa, aa = _atoms(term[0])
        fb, ab = _atoms(term[1])
        return fa * fb, aa + ab
    if isinstance(term, myokit.Divide):
        fa, aa = _atoms(term[0])
        if isinstance(term[1], myokit.Number):
            return fa / float(term[1].eval()), aa
        raise ValueError("divides by a variable: a rate is a number times a parameter "
                         "[times the agonist]")
    if isinstance(term, myokit.Function):
        raise ValueError(f"calls {term.__class__.__name__.lower()}(): a rate is a number "
                         f"times a parameter [times the agonist]")
    raise ValueError("not a product of a number, a parameter and a state")
