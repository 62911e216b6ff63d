"""Read a kinetic scheme from an NMODL (``.mod``) file's ``KINETIC`` block.

Accepted: ``~ A <-> B (kf, kb)`` reactions whose rates are a number times at most one
``PARAMETER`` times at most one transmitter concentration (a ``POINTER``, or a variable
declared in a concentration unit), written directly or through assignments in the
``KINETIC`` block or a ``PROCEDURE`` it calls; ``CONSERVE``; ``PARAMETER`` values with their
units (``/ms``, ``/mM /ms``, ``(1/s)``, ``(/uM-ms)``, ...). The conductance of each state comes
from the ``BREAKPOINT`` assignment that is linear in the states (``g = gmax * O``), a
dimensionless count (``nchan``) multiplying it becoming ``model.channels``.

Anything else a rate depends on (the membrane potential ``v``, ``celsius``, a function call,
a variable computed elsewhere, a sum) is reported with its line and nothing is written.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from kingen.errors import KingenError
from kingen.outputs.interop.imported import (
    ImportedParameter,
    ImportedRate,
    ImportedScheme,
    ImportProblems,
    temperature_groups,
)
from kingen.outputs.interop.nmodl.calls import calls, cycles, names_used, reachable
from kingen.outputs.interop.nmodl.conductance import ConductanceReading, Terms, Unsupported
from kingen.outputs.interop.nmodl.constants import (
    FUNCTIONS,
    NotConstant,
    TemperatureFactor,
    evaluate,
    temperature_factor,
)
from kingen.outputs.interop.nmodl.declared import (
    concentration_unit,
    rate_unit,
    reversal_note,
)
from kingen.outputs.interop.nmodl.leftout import (
    left_out,
)
from kingen.outputs.interop.nmodl.parser import (
    Assign,
    Bin,
    Call,
    CallStmt,
    Conserve,
    ModFile,
    Name,
    Neg,
    Num,
    Other,
    Reaction,
    parse,
)

_SPECIAL = {"v": "the membrane potential v (a voltage-dependent rate)",
            "celsius": "the temperature celsius (a temperature factor such as Q10)",
            "t": "the time t", "dt": "the time step dt", "area": "the segment area",
            "diam": "the diameter diam"}




def read_nmodl(path: str | Path, *, agonist: str | None = None,
               celsius: float | None = None) -> ImportedScheme:
    """The kinetic scheme of an NMODL file, in kingen's internal units.

    Parameters
    ----------
    path
        The ``.mod`` file.
    agonist
        The transmitter concentration variable, when the rates multiply more than one.
    celsius
        The temperature (°C) at which a rate's dependence on ``celsius`` other than a Q10
        or Arrhenius factor is evaluated (such a rate is refused without it).

    Raises
    ------
    KingenError
        A syntax error, no ``KINETIC`` block, an ambiguous agonist (one line each, naming
        the file and line); :class:`ImportProblems` for every rate or conductance a scheme
        cannot hold, one line each.

    Examples
    --------
    >>> imported = read_nmodl("tests/data/raman_trussell_1992.mod")
    >>> imported.states, imported.agonist, imported.reference_c
    (['C0', 'C1', 'C2', 'D', 'O1', 'O2'], 'XMTR', 22.0)
    >>> [(g.name, g.kind, g.value) for g in imported.groups]
    [('rates', 'q10', 1.5)]
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KingenError(f"cannot read: {exc}", file=name) from None
    return _Reader(parse(text, name), agonist, celsius, text).scheme()


class _Reader(ConductanceReading):
    def __init__(self, mod: ModFile, agonist: str | None, celsius: float | None = None,
                 text: str = "") -> None:
        self.mod = mod
        self.path = mod.path
        self.agonist = agonist
        self.celsius = celsius
        self.text = text
        self.problems: list[tuple[int | None, str]] = []
        self.notes: list[str] = []
        # what INITIAL computes (Q10 factors, unit factors), read as constants
        self.constants: dict = {}
        self.factors: list[TemperatureFactor] = []
        self.blocks_left_out: list[str] = []  # what multiplies the conductance

    def lookup(self, env: dict):
        """Names as kingen's evaluator sees them: the KINETIC block's assignments, then
        INITIAL's, then the PARAMETERs' values; ``celsius`` only when given."""
        def inner(name: str):
            if name == "celsius":
                return self.celsius
            if name in env:
                return env[name]
            if name in self.constants:
                return self.constants[name]
            decl = self.mod.parameters.get(name)
            return None if decl is None else decl.value
        return inner

    def factor_token(self, tf: TemperatureFactor) -> str:
        """The name a temperature factor takes in a rate's product ('@' is no NMODL name)."""
        if tf not in self.factors:
            self.factors.append(tf)
        return f"@tf{self.factors.index(tf)}"

    def fail(self, message: str, line: int | None) -> KingenError:
        return KingenError(message, file=self.path, field=f"line {line or 1}")

    # -- the kinetic block
    def kinetic(self):
        blocks = self.mod.find("KINETIC")
        if not blocks:
            other = self.mod.find("DERIVATIVE") or self.mod.find("BREAKPOINT")
            line = other[0].line if other else 1
            hint = (" (it has a DERIVATIVE block: gating ODEs, not a kinetic scheme)"
                    if self.mod.find("DERIVATIVE") else "")
            raise self.fail(f"no KINETIC block: kingen imports kinetic schemes written as "
                            f"'~ A <-> B (kf, kb)' reactions{hint}", line)
        if len(blocks) > 1:
            solved = [s.block for b in self.mod.find("BREAKPOINT") for s in b.statements
                      if hasattr(s, "block")]
            chosen = [b for b in blocks if b.name in solved]
            if len(chosen) != 1:
                raise self.fail(f"{len(blocks)} KINETIC blocks and none SOLVEd in BREAKPOINT "
                                f"picks one", blocks[1].line)
            return chosen[0]
        return blocks[0]

    def statements(self, block) -> list:
        """The block's statements, with the PROCEDUREs it calls inlined (their assignments).

        A PROCEDURE is inlined at its first call only: an assignment is read as the last
        value of its name, so a second copy adds nothing, and procedures that call others
        twice would otherwise multiply (2^40 statements for 40 such levels). A recursion
        among them has been refused by :meth:`check_recursion` before."""
        procs: dict = {}
        for b in self.mod.find("PROCEDURE"):
            procs.setdefault(b.name, b)
        seen: set[str] = set()
        out = []
        # not recursive: a chain of thousands of PROCEDUREs is followed all the same
        stack = [iter(block.statements)]
        while stack:
            s = next(stack[-1], None)
            if s is None:
                stack.pop()
            elif isinstance(s, CallStmt) and s.name in procs:
                if s.name not in seen:
                    seen.add(s.name)
                    stack.append(iter(procs[s.name].statements))
            elif len(stack) == 1 or isinstance(s, (Assign, Other)):
                out.append(s)
        return out

    def check_recursion(self, roots: list) -> None:
        """Refuse PROCEDUREs or FUNCTIONs that call themselves or each other in a cycle when
        a block the scheme is read from (``roots``) calls them; note and skip the others."""
        callable_ = {b.name: b for b in self.mod.blocks if b.kind in ("PROCEDURE", "FUNCTION")}
        graph = {name: [c for c in calls(b) if c in callable_] for name, b in callable_.items()}
        used = reachable([c for b in roots for c in calls(b) if c in callable_], graph)
        for cycle in cycles(graph):
            first = callable_[cycle[0]]
            how = ("calls itself" if len(cycle) == 1 else
                   f"calls itself through {', '.join(cycle[1:])}")
            path = " -> ".join(cycle + [cycle[0]])
            if cycle[0] in used:
                raise self.fail(f"{first.kind} {first.name} {how} ({path}), and the scheme "
                                "is read through it: kingen follows no recursion (write the "
                                "rates without it)", first.line)
            self.notes.append(f"{first.kind} {first.name} (line {first.line}) {how} ({path}); "
                              "nothing the scheme reads calls it, so it was skipped.")

    # -- expressions
    def expand(self, expr, env: dict, line: int, depth: int = 0) -> Terms:
        """``expr`` as a sum of (coefficient, names) products; raises Unsupported."""
        if depth > 50:
            raise Unsupported("assignments refer to each other in a loop", line)
        if isinstance(expr, Num):
            return [(expr.value, Counter())]
        if isinstance(expr, Name):
            n = expr.name
            if n in env:
                return self.expand(env[n], env, line, depth + 1)
            if n in self.constants and n not in self.mod.states:
                return self.expand(self.constants[n], env, line, depth + 1)
            if n == "celsius" and self.celsius is not None:
                return [(self.celsius, Counter())]
            return [(1.0, Counter({n: 1}))]
        if isinstance(expr, Neg):
            return [(-c, n) for c, n in self.expand(expr.a, env, line, depth)]
        if isinstance(expr, (Call, Bin)) and (isinstance(expr, Call) or expr.op == "^"):
            number = self.constant(expr, env, line)
            if number is not None:
                return number
        if isinstance(expr, Call):
            special = sorted(n for n in names_used(expr, env) if n in _SPECIAL)
            if special:
                raise Unsupported(f"depends on {_SPECIAL[special[0]]} through "
                                   f"{expr.name}()", line)
            raise Unsupported(f"calls {expr.name}(): a rate is a number times a parameter "
                               f"[times the transmitter]", line)
        if isinstance(expr, Bin):
            a = self.expand(expr.a, env, line, depth)
            b = self.expand(expr.b, env, line, depth)
            if expr.op == "+":
                return a + b
            if expr.op == "-":
                return a + [(-c, n) for c, n in b]
            if expr.op == "*":
                return [(ca * cb, _add(na, nb)) for ca, na in a for cb, nb in b]
            if expr.op == "/":
                if len(b) != 1:
                    raise Unsupported("divides by a sum", line)
                cb, nb = b[0]
                if cb == 0:
                    raise Unsupported("divides by zero", line)
                inv = Counter({k: -p for k, p in nb.items()})
                return [(ca / cb, _add(na, inv)) for ca, na in a]
            if expr.op == "^":
                if len(b) == 1 and not b[0][1] and float(b[0][0]).is_integer() \
                        and 0 <= b[0][0] <= 8:
                    out: Terms = [(1.0, Counter())]
                    for _ in range(int(b[0][0])):
                        out = [(ca * cb, _add(na, nb)) for ca, na in out for cb, nb in a]
                    return out
                raise Unsupported("raises to a power that is not a whole number", line)
            raise Unsupported(f"uses the operator '{expr.op}'", line)
        raise Unsupported("an expression kingen cannot read", line)

    def used(self, roots: list) -> set[str]:
        """The PROCEDUREs and FUNCTIONs that ``roots`` call, directly or not."""
        callable_ = {b.name: b for b in self.mod.blocks if b.kind in ("PROCEDURE", "FUNCTION")}
        graph = {name: [c for c in calls(b) if c in callable_] for name, b in callable_.items()}
        return reachable([c for b in roots for c in calls(b) if c in callable_], graph)

    def constant(self, expr, env: dict, line: int) -> Terms | None:
        """A power or a function call as a temperature factor or a number; None when it is
        neither (a power of a parameter, a call of the file's own FUNCTION)."""
        lookup = self.lookup(env)
        tf = temperature_factor(expr, lookup)
        if tf is not None:
            return [(1.0, Counter({self.factor_token(tf): 1}))]
        if isinstance(expr, Call) and expr.name not in FUNCTIONS:
            return None
        if isinstance(expr, Bin) and isinstance(expr.b, Num) and float(
                expr.b.value).is_integer():
            return None  # a whole power of a rate stays a product (refused as one)
        try:
            return [(evaluate(expr, lookup), Counter())]
        except NotConstant as exc:
            if exc.what == "celsius":
                raise Unsupported("depends on the temperature celsius other than through a "
                                   "Q10 or Arrhenius factor: give --celsius T to evaluate it "
                                   "at T", line) from None
            return None

    def where_assigned(self, name: str) -> str:
        for b in self.mod.blocks:
            for s in b.statements:
                if isinstance(s, Assign) and s.target == name:
                    return f"{b.kind}{' ' + b.name if b.name else ''} at line {s.line}"
        return "nowhere in the file"

    # -- the scheme
    def scheme(self) -> ImportedScheme:
        mod = self.mod
        block = self.kinetic()
        self.check_recursion([block] + mod.find("BREAKPOINT"))
        states = list(mod.states)
        if not states:
            raise self.fail("no STATE block: the states of the scheme are not declared",
                            block.line)
        # what INITIAL sets is a constant, unless it is a state, a concentration, or
        # changes as the simulation runs (set again by events or in BREAKPOINT)
        varying = {s.target for b in mod.blocks if b.kind in ("NET_RECEIVE", "BREAKPOINT")
                   for s in b.statements if isinstance(s, Assign)}
        for b in mod.find("INITIAL"):
            for s in self.statements(b):
                if isinstance(s, Assign) and s.target not in set(mod.states) | varying \
                        and self.is_concentration(s.target) is None:
                    self.constants[s.target] = s.expr
        env: dict = {}
        reactions: list[Reaction] = []
        conserve = None
        for s in self.statements(block):
            if isinstance(s, Assign):
                env[s.target] = s.expr
            elif isinstance(s, Reaction):
                reactions.append(s)
            elif isinstance(s, Conserve):
                conserve = s
            elif isinstance(s, Other):
                self.problems.append((s.line, f"'{s.word}' in the KINETIC block: a scheme "
                                              f"holds fixed reactions only"))
        if not reactions:
            raise self.fail("the KINETIC block has no '~ A <-> B (kf, kb)' reaction",
                            block.line)
        if conserve is not None and set(conserve.names) != set(states):
            missing = sorted(set(states) - set(conserve.names))
            self.problems.append((conserve.line, f"CONSERVE leaves out {', '.join(missing)}: "
                                                 f"kingen conserves the sum of all states"))
        raw: list[tuple[str, str, float, Counter, int]] = []
        lines: dict[tuple[str, str], int] = {}
        for r in reactions:
            if r.op != "<->":
                self.problems.append((r.line, f"'{r.op}' (a flux or one-way reaction): a "
                                              f"scheme holds '~ A <-> B (kf, kb)' reactions"))
                continue
            if len(r.lhs) != 1 or len(r.rhs) != 1 or r.lhs[0][0] != 1 or r.rhs[0][0] != 1:
                self.problems.append((r.line, "a reaction of more than one state on a side "
                                              "(or a stoichiometry): not a channel scheme"))
                continue
            a, b = r.lhs[0][1], r.rhs[0][1]
            for s in (a, b):
                if s not in mod.states:
                    self.problems.append((r.line, f"'{s}' is not declared in STATE"))
            for src, dst, expr in ((a, b, r.kf), (b, a, r.kb)):
                try:
                    terms = self.expand(expr, env, r.line)
                except Unsupported as exc:
                    self.problems.append((r.line, f"rate {src} -> {dst} {exc.message}"))
                    continue
                terms = [(c, Counter({k: p for k, p in n.items() if p})) for c, n in terms
                         if c != 0]
                if not terms:
                    continue  # a zero rate: no transition this way
                if len(terms) > 1:
                    self.problems.append((r.line, f"rate {src} -> {dst} is a sum of terms: a "
                                                  f"rate is a number times a parameter "
                                                  f"[times the transmitter]"))
                    continue
                if (src, dst) in lines:
                    self.problems.append((r.line, f"transition {src} -> {dst} is given twice "
                                                  f"(also line {lines[(src, dst)]})"))
                    continue
                lines[(src, dst)] = r.line
                raw.append((src, dst, terms[0][0], terms[0][1], r.line))
        agonist, agonist_factor = self.pick_agonist(raw)
        rates, params = self.rates(raw, agonist, agonist_factor)
        reference, groups = temperature_groups(self.factors, self.rate_factor, params)
        conductance, channels = self.conductance(states)
        if self.problems:
            raise ImportProblems(self.path, self.problems)
        dropped = self.blocks_left_out + left_out(
            mod, agonist, self.text, self.used([block] + mod.find("INITIAL")),
            self.blocks_left_out)
        self.notes.insert(0, f"Mechanism {mod.kind or '?'} {mod.mechanism or '?'}"
                             + (f" ('{mod.title}')" if mod.title else "") + ".")
        if agonist:
            self.notes.append(f"Agonist: the transmitter concentration '{agonist}' of the "
                              f".mod file.")
        note = reversal_note(self.mod)
        if note:
            self.notes.append(note)
        if mod.find("INITIAL"):
            self.notes.append("The .mod file's INITIAL block is not carried over: kingen "
                              "starts from the equilibrium without agonist.")
        for g in groups:
            what = "Q10" if g.kind == "q10" else "activation energy"
            self.notes.append(f"Temperature: {', '.join(g.members)} scale with the {what} "
                              f"{g.value:g} of the .mod file (group {g.name}, reference "
                              f"{reference:g} degC).")
        return ImportedScheme(self.path, "NEURON NMODL", mod.title or mod.mechanism or
                              Path(self.path).stem, states, conductance, params, rates,
                              agonist="glu" if agonist is None else _agonist_name(agonist),
                              channels=channels, notes=self.notes + dropped,
                              reference_c=reference, groups=groups, left_out=dropped)

    def is_concentration(self, name: str) -> float | None:
        """Factor to mM of a transmitter concentration variable, None if not one."""
        decl = self.mod.parameters.get(name) or self.mod.assigned.get(name)
        unit = decl.unit if decl else None
        factor = concentration_unit(unit)
        if factor is not None:
            return factor
        if name in self.mod.pointer and unit is None:
            self.notes.append(f"POINTER {name} declares no unit: taken as mM.")
            return 1.0
        return None

    def pick_agonist(self, raw) -> tuple[str | None, float]:
        seen: dict[str, int] = {}
        for _, _, _, names, line in raw:
            for n in names:
                if n == self.agonist or (self.agonist is None and self.is_concentration(n)
                                         is not None):
                    seen.setdefault(n, line)
        if self.agonist is not None:
            if self.agonist not in seen:
                raise self.fail(f"--agonist {self.agonist}: no rate of the KINETIC block "
                                f"multiplies it", self.kinetic().line)
            return self.agonist, self.is_concentration(self.agonist) or 1.0
        if len(seen) > 1:
            which = ", ".join(f"{n} (line {line})" for n, line in seen.items())
            first = min(seen.values())
            raise self.fail(f"the rates multiply more than one concentration: {which}; say "
                            f"which is the agonist with --agonist NAME", first)
        if not seen:
            return None, 1.0
        (n, _), = seen.items()
        return n, self.is_concentration(n) or 1.0

    def rates(self, raw, agonist: str | None, c_factor: float):
        mod = self.mod
        params: dict[str, ImportedParameter] = {}
        rates: list[ImportedRate] = []
        self.rate_factor: dict[str, int | None] = {}
        for src, dst, coef, names, line in raw:
            uses = names.pop(agonist, 0) if agonist else 0
            tokens = {n: names.pop(n) for n in [n for n in names if n.startswith("@tf")]}
            if len(tokens) > 1 or any(p != 1 for p in tokens.values()):
                self.problems.append((line, f"rate {src} -> {dst} scales with more than one "
                                            "temperature factor, or a power of one: a "
                                            "kingen rate takes one Q10 or activation energy"))
                continue
            scaled_by = int(next(iter(tokens))[3:]) if tokens else None
            if uses not in (0, 1):
                self.problems.append((line, f"rate {src} -> {dst} has the agonist {agonist} "
                                            f"to the power {uses}"))
                continue
            # celsius is often a PARAMETER with a value: still a temperature, never a rate
            bad = [n for n in names if n in _SPECIAL or n not in mod.parameters or
                   mod.parameters[n].value is None]
            if bad:
                n = bad[0]
                if n in _SPECIAL:
                    why = f"depends on {_SPECIAL[n]}"
                elif n in mod.assigned or n in mod.parameters:
                    why = (f"depends on {n}, which the KINETIC block does not compute "
                           f"(assigned {self.where_assigned(n)})")
                else:
                    why = f"uses '{n}', which the file does not declare"
                self.problems.append((line, f"rate {src} -> {dst} {why}"))
                continue
            if len(names) > 1 or any(p != 1 for p in names.values()):
                prod = " * ".join(n if p == 1 else f"{n}^{p}" for n, p in names.items())
                self.problems.append((line, f"rate {src} -> {dst} is a product of parameters "
                                            f"({prod}): a rate is a number times one "
                                            f"parameter [times the transmitter]"))
                continue
            if coef <= 0:
                self.problems.append((line, f"rate {src} -> {dst} is negative ({coef:g})"))
                continue
            order = 2 if uses else 1
            if names:
                (pname, _), = names.items()
                decl = mod.parameters[pname]
                unit = rate_unit(decl.unit)
                if decl.unit is None:
                    unit = (1.0, 1) if order == 1 else (1.0 / c_factor, 2)
                    self.notes.append(f"PARAMETER {pname} declares no unit: taken as "
                                      + ("/ms." if order == 1 else "per ms and per unit of "
                                         "the transmitter's concentration."))
                if unit is None:
                    self.problems.append((decl.line, f"PARAMETER {pname} has the unit "
                                                     f"({decl.unit}), not a rate unit"))
                    continue
                factor, p_order = unit
                if p_order != order:
                    want = "/ms" if order == 1 else "/mM /ms"
                    self.problems.append((line, f"rate {src} -> {dst}: {pname} has the unit "
                                                f"({decl.unit}) but is used as a rate in "
                                                f"{want}"))
                    continue
                value = decl.value * factor
                if coef != 1 and abs(coef / factor - 1.0) < 1e-9:
                    # the file's own unit conversion, e.g. Ru * (1e-3) of a rate in /s:
                    # NEURON computes with the numbers, so the factor is the unit's
                    coef = 1.0
            else:
                pname = f"k_{src}_{dst}"
                value = coef * (1.0 if order == 1 else 1.0 / c_factor)
                coef = 1.0
            old = params.get(pname)
            if old is not None and old.order != order:
                self.problems.append((line, f"{pname} is used both with and without the "
                                            f"transmitter; kingen needs two parameters"))
                continue
            if self.rate_factor.setdefault(pname, scaled_by) != scaled_by:
                self.problems.append((line, f"{pname} scales with temperature in one rate and "
                                            "not (or by another factor) in another: kingen "
                                            "needs two parameters"))
                continue
            params.setdefault(pname, ImportedParameter(pname, value, order, line))
            rates.append(ImportedRate(src, dst, coef, pname, bool(uses), line))
        return rates, params


def _add(a: Counter, b: Counter) -> Counter:
    out = Counter(a)
    for k, p in b.items():
        out[k] = out.get(k, 0) + p
    return out


def _agonist_name(name: str) -> str:
    # kingen's schemes name the agonist in their rates; a .mod file's C or T is kept
    return name
