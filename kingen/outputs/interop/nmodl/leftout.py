"""The pieces of a ``.mod`` file that do not feed its kinetic scheme, one line each.

Published synapse files carry more than the ``KINETIC`` block: a ``NET_RECEIVE`` block that
releases transmitter on each event, a transmitter that diffuses or decays in time, a
``POINTER`` to another mechanism's transmitter, a magnesium block ``B(v)`` that multiplies
the conductance, ``VERBATIM`` C code. A kingen scheme holds none of them (a protocol gives
the agonist's concentration; the scheme's conductance is that of its states), so the import
leaves them out and says so, one line per piece, e.g. ``Mg block B(v) multiplies the
conductance: not imported``.
"""

from __future__ import annotations

import re

from kingen.outputs.interop.nmodl.constants import FUNCTIONS
from kingen.outputs.interop.nmodl.parser import Assign, Bin, Call, ModFile, Name, Neg, Num

_VERBATIM = re.compile(r"^[ \t]*VERBATIM\b", re.MULTILINE)
_COMMENT = re.compile(r"^[ \t]*COMMENT\b.*?^[ \t]*ENDCOMMENT\b", re.MULTILINE | re.DOTALL)


def left_out(mod: ModFile, agonist: str | None, text: str, used: set[str],
             said: list[str] = ()) -> list[str]:
    """One line per piece of ``mod`` outside its kinetic scheme.

    ``used`` names the PROCEDUREs and FUNCTIONs the scheme is read through (the KINETIC
    block's and INITIAL's); the others are left out, each named once (not again when a
    line of ``said`` names it already).
    """
    out = []
    for b in mod.find("NET_RECEIVE"):
        out.append(f"NET_RECEIVE (line {b.line}) handles synaptic events: not imported (a "
                   "protocol gives the transmitter's concentration)")
    if agonist is not None and agonist in mod.pointer:
        out.append(f"POINTER {agonist}: the transmitter comes from another mechanism: not "
                   "imported (a protocol gives its concentration)")
    if agonist is not None:
        for where in assignments(mod, agonist):
            out.append(f"the transmitter {agonist} is computed in {where} (its release or "
                       "diffusion): not imported (a protocol gives its concentration)")
    for b in mod.blocks:
        if b.kind in ("PROCEDURE", "FUNCTION") and b.name not in used and not any(
                f"{b.kind} {b.name}," in line or f"{b.kind} {b.name})" in line
                for line in said):
            out.append(f"{b.kind} {b.name} (line {b.line}) does not feed the kinetic "
                       "scheme: not imported")
    for n in verbatim_lines(text):
        out.append(f"VERBATIM (line {n}) is C code: not imported")
    return out


def verbatim_lines(text: str) -> list[int]:
    """Lines where a ``VERBATIM`` block starts, outside ``COMMENT`` blocks."""
    blank = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [blank.count("\n", 0, m.start()) + 1 for m in _VERBATIM.finditer(blank)]


def assignments(mod: ModFile, name: str) -> list[str]:
    """Where ``name`` is assigned outside the KINETIC and INITIAL blocks, e.g.
    ``BREAKPOINT at line 40``."""
    out = []
    for b in mod.blocks:
        if b.kind in ("KINETIC", "INITIAL"):
            continue
        for s in b.statements:
            if isinstance(s, Assign) and s.target == name:
                out.append(f"{b.kind}{' ' + b.name if b.name else ''} at line {s.line}")
                break
    return out


def voltage_factor(mod: ModFile, name: str) -> str | None:
    """The left-out line of a factor ``name`` of the conductance that the file computes
    (a magnesium block ``B``): None when the file does not assign it."""
    for b in mod.blocks:
        for s in b.statements:
            if isinstance(s, Assign) and s.target == name:
                where = f"{b.kind}{' ' + b.name if b.name else ''}, line {s.line}"
                if b.kind in ("PROCEDURE", "FUNCTION") or "v" in names_in(s.expr):
                    return f"Mg block {name}(v) multiplies the conductance: not imported ({where})"
                return f"{name} multiplies the conductance: not imported ({where})"
    return None


def without_calls(expr: object, mod: ModFile) -> tuple[object, list[str]]:
    """``expr`` with the calls of the file's own FUNCTIONs that multiply it set to 1, and
    the left-out line of each (``g = gmax * O * mgblock(v)``)."""
    dropped: list[str] = []

    def strip(e: object) -> object:
        if isinstance(e, Call) and e.name not in FUNCTIONS:
            blocks = mod.find("FUNCTION", e.name)
            where = f" (FUNCTION {e.name}, line {blocks[0].line})" if blocks else ""
            dropped.append(f"Mg block {e.name}(v) multiplies the conductance: not "
                           f"imported{where}")
            return Num(1.0, e.line)
        if isinstance(e, Bin) and e.op in ("*", "/"):
            return Bin(e.op, strip(e.a), e.b if e.op == "/" else strip(e.b), e.line)
        return e

    return strip(expr), dropped


def current_factors(mod: ModFile, expr: object, conductance: str) -> list[str]:
    """Left-out lines of what multiplies the conductance in a current's assignment
    (``i = g * B * (v - e)``): names the file computes, and its own FUNCTIONs."""
    out = []
    for n in sorted(names_in(expr) - {conductance, "v"}):
        if n in mod.parameters or n in mod.states:
            continue
        line = voltage_factor(mod, n)
        if line is not None:
            out.append(line)
    _, calls = without_calls(expr, mod)
    return out + calls


def names_in(expr: object) -> set[str]:
    """The names an expression uses (not the functions it calls)."""
    out: set[str] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Name):
            out.add(e.name)
        elif isinstance(e, Bin):
            stack += [e.a, e.b]
        elif isinstance(e, Neg):
            stack.append(e.a)
        elif isinstance(e, Call):
            stack += list(e.args)
    return out
