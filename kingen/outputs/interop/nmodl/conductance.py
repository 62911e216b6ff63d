"""The conductance of a ``.mod`` file's states, from its ``BREAKPOINT``.

The assignment that is linear in the states and declared in a conductance unit
(``g = gmax * O``, pS, nS, uS, umho) gives each state's conductance; a dimensionless count
multiplying it (``nchan``) becomes ``model.channels``. What else multiplies it, a
magnesium block ``B(v)`` above all, is left out with one line
(:mod:`kingen.outputs.interop.nmodl.leftout`).
"""

from __future__ import annotations

from collections import Counter

from kingen.outputs.interop.nmodl.declared import CHANNEL_NAMES, CONDUCTANCE, nmodl_unit
from kingen.outputs.interop.nmodl.leftout import current_factors, voltage_factor, without_calls
from kingen.outputs.interop.nmodl.parser import Assign

Terms = list[tuple[float, Counter]]  # a sum of products: coefficient, names with powers

class Unsupported(Exception):
    """A rate or conductance outside what a scheme holds (message, line)."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class ConductanceReading:
    """The conductance part of the reader (``mod``, ``statements``, ``expand``,
    ``problems``, ``notes`` and ``blocks_left_out`` are the reader's)."""

    def conductance(self, states: list[str]) -> tuple[dict[str, float], float]:
        mod = self.mod
        env: dict = {}
        candidates = []
        for b in mod.find("BREAKPOINT"):
            for s in self.statements(b):
                if isinstance(s, Assign):
                    env[s.target] = s.expr
                    candidates.append(s)
        for s in candidates:
            expr, calls = without_calls(s.expr, mod)
            try:
                terms = self.expand(expr, {}, s.line)
            except Unsupported:
                continue
            if "v" in {n for _, ns in terms for n in ns}:
                continue
            if not any(st in ns for _, ns in terms for st in states):
                continue
            decl = mod.assigned.get(s.target) or mod.parameters.get(s.target)
            unit = decl.unit if decl else None
            exps, ok = nmodl_unit(unit)
            if not (ok and len(exps) == 1 and list(exps.values()) == [1]
                    and list(exps)[0] in CONDUCTANCE):
                continue
            to_ps = CONDUCTANCE[list(exps)[0]]
            self.blocks_left_out += calls
            for b in mod.find("BREAKPOINT"):
                for c in b.statements:
                    if isinstance(c, Assign) and c.target in mod.currents:
                        self.blocks_left_out += current_factors(mod, c.expr, s.target)
            return self.state_conductances(s, terms, states, to_ps)
        self.problems.append((candidates[-1].line if candidates else None,
                              "no conductance found: kingen needs a BREAKPOINT assignment "
                              "such as 'g = gmax * O' with g declared in a conductance "
                              "unit (pS, nS, uS, umho)"))
        return {}, 1.0

    def state_conductances(self, s: Assign, terms: Terms, states: list[str], to_ps: float):
        mod = self.mod
        common = set.intersection(*[set(ns) for _, ns in terms]) if terms else set()
        for n in sorted(common):
            decl = mod.parameters.get(n)
            line = None if n in states or (decl and decl.value is not None) else \
                voltage_factor(mod, n)
            if line is not None and all(ns[n] == 1 for _, ns in terms):
                self.blocks_left_out.append(line)
                terms = [(c, Counter({k: p for k, p in ns.items() if k != n}))
                         for c, ns in terms]
                common.discard(n)
        channels, chan_name = 1.0, None
        for n in sorted(common):
            decl = mod.parameters.get(n)
            if decl and decl.value and (n in CHANNEL_NAMES or decl.unit == "1") and all(
                    ns[n] == 1 for _, ns in terms):
                channels, chan_name = decl.value, n
                break
        out: dict[str, float] = {}
        for coef, ns in terms:
            ns = Counter({k: p for k, p in ns.items() if k != chan_name})
            st = [k for k in ns if k in states]
            if len(st) != 1 or ns[st[0]] != 1:
                self.problems.append((s.line, f"{s.target} is not a sum of (conductance x "
                                              f"state) terms"))
                return {}, 1.0
            value = coef
            for k, p in ns.items():
                if k == st[0]:
                    continue
                decl = mod.parameters.get(k)
                if decl is None or decl.value is None:
                    self.problems.append((s.line, f"the conductance {s.target} depends on "
                                                  f"{k}, not a PARAMETER with a value"))
                    return {}, 1.0
                value *= decl.value ** p
            out[st[0]] = out.get(st[0], 0.0) + value * to_ps
        if chan_name:
            self.notes.append(f"Channels: {chan_name} = {channels:g}; state conductances from "
                              f"'{s.target}' (line {s.line}).")
        else:
            self.notes.append(f"State conductances from '{s.target}' (line {s.line}), as the "
                              f"whole mechanism's conductance with channels = 1 (the .mod "
                              f"file gives no single-channel conductance).")
        return out, channels
