"""kingen's own arithmetic on NMODL expressions: constants and temperature factors.

Published ``.mod`` files compute constants from their parameters and NEURON's ``celsius``
in ``PARAMETER``, ``ASSIGNED`` and ``INITIAL``: Q10 factors (``Q10^((celsius - 22)/10)``),
unit factors (``(1e3)``), ``exp``, ``log`` and ``sqrt`` of numbers. :func:`evaluate` walks
the parsed expression tree (:mod:`kingen.outputs.interop.nmodl.parser`): numbers, names,
+ − × ÷, ^, ``exp``, ``log``, ``sqrt``, ``fabs``, and nothing else; nothing read from a file
is ever executed. :func:`temperature_factor` recognises the two forms a rate's temperature
dependence takes, a Q10 power and an Arrhenius exponential, by evaluating the expression at
several temperatures.

Examples
--------
>>> from kingen.outputs.interop.nmodl.parser import parse
>>> mod = parse("NEURON { SUFFIX x }\\nINITIAL { f = q^((celsius - 22 (degC))/10 (degC)) }")
>>> expr = mod.find("INITIAL")[0].statements[0].expr
>>> temperature_factor(expr, {"q": 3.0}.get)
TemperatureFactor(kind='q10', value=3.0, reference_c=22.0, name='q')
>>> evaluate(expr, {"q": 3.0, "celsius": 32.0}.get)
3.0
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kingen.model.temperature import GAS_CONSTANT, KELVIN
from kingen.outputs.interop.nmodl.parser import Bin, Call, Name, Neg, Num

# name -> a number, an expression to evaluate in its place, or None (not a constant)
Lookup = Callable[[str], Any]
FUNCTIONS: dict[str, Callable[[float], float]] = {
    "exp": math.exp, "log": math.log, "sqrt": math.sqrt, "fabs": abs, "log10": math.log10}
_MAX_DEPTH = 60
# temperatures (°C) at which an expression is evaluated to tell its form
_PROBES = (5.0, 22.0, 37.0)


class NotConstant(Exception):
    """An expression that is not a number here: the name (or construct) that makes it so."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True)
class TemperatureFactor:
    """``value^((celsius - reference_c)/10)`` (``kind == "q10"``) or
    ``exp(-value/R · (1/T - 1/T_ref))`` (``"ea"``, value in kJ/mol); ``name`` is the
    parameter that holds the value, if one does."""

    kind: str
    value: float
    reference_c: float
    name: str | None


def evaluate(expr: Any, lookup: Lookup, depth: int = 0) -> float:
    """The value of ``expr``; names through ``lookup``. Raises :class:`NotConstant`.

    >>> from kingen.outputs.interop.nmodl.parser import parse
    >>> mod = parse("NEURON { SUFFIX x }\\nINITIAL { f = sqrt(16) * (1e3) / 2^3 - exp(0) }")
    >>> evaluate(mod.find("INITIAL")[0].statements[0].expr, {}.get)
    499.0
    """
    if depth > _MAX_DEPTH:
        raise NotConstant("constants that refer to each other in a loop")
    if isinstance(expr, Num):
        return expr.value
    if isinstance(expr, Name):
        value = lookup(expr.name)
        if value is None:
            raise NotConstant(expr.name)
        return float(value) if isinstance(value, (int, float)) else evaluate(
            value, lookup, depth + 1)
    if isinstance(expr, Neg):
        return -evaluate(expr.a, lookup, depth + 1)
    if isinstance(expr, Call):
        func = FUNCTIONS.get(expr.name)
        if func is None or len(expr.args) != 1:
            raise NotConstant(f"{expr.name}()")
        return _checked(func, evaluate(expr.args[0], lookup, depth + 1), expr.name)
    if isinstance(expr, Bin):
        a = evaluate(expr.a, lookup, depth + 1)
        b = evaluate(expr.b, lookup, depth + 1)
        try:
            if expr.op == "+":
                out = a + b
            elif expr.op == "-":
                out = a - b
            elif expr.op == "*":
                out = a * b
            elif expr.op == "/":
                out = a / b
            elif expr.op == "^":
                out = a ** b
            else:
                raise NotConstant(f"the operator '{expr.op}'")
        except (ZeroDivisionError, OverflowError):
            raise NotConstant(f"'{expr.op}' gives no number") from None
        if isinstance(out, complex) or not math.isfinite(out):
            raise NotConstant(f"'{expr.op}' gives no finite number")
        return float(out)
    raise NotConstant("an expression kingen cannot evaluate")


def _checked(func: Callable[[float], float], x: float, name: str) -> float:
    try:
        out = func(x)
    except (ValueError, OverflowError):
        raise NotConstant(f"{name}({x:g}) gives no number") from None
    if not math.isfinite(out):
        raise NotConstant(f"{name}({x:g}) gives no finite number")
    return float(out)


def uses_celsius(expr: Any, lookup: Lookup) -> bool:
    """Whether ``expr`` depends on ``celsius`` (through the constants ``lookup`` gives)."""
    def without(name: str) -> Any:
        return None if name == "celsius" else lookup(name)

    try:
        evaluate(expr, without)
    except NotConstant as exc:
        return exc.what == "celsius"
    return False


def temperature_factor(expr: Any, lookup: Lookup) -> TemperatureFactor | None:
    """The Q10 or Arrhenius factor ``expr`` is, or None.

    ``expr`` is a Q10 factor when it is ``base ^ exponent`` with ``base`` a constant and
    the exponent (T − T_ref)/10 in ``celsius``; an Arrhenius factor when it is
    ``exp(argument)`` with the argument linear in 1/(T + 273.15) and 0 at some T_ref.
    """
    if not uses_celsius(expr, lookup):
        return None
    if isinstance(expr, Bin) and expr.op == "^":
        try:
            base = evaluate(expr.a, _at(lookup, None))
            exps = [evaluate(expr.b, _at(lookup, t)) for t in _PROBES]
        except NotConstant:
            return None
        slopes = [(e2 - e1) / (t2 - t1) for (t1, e1), (t2, e2)
                  in zip(zip(_PROBES, exps), zip(_PROBES[1:], exps[1:]))]
        if base > 0 and all(abs(s - 0.1) < 1e-9 for s in slopes):
            return TemperatureFactor("q10", base, _PROBES[0] - 10.0 * exps[0],
                                     _name_of(expr.a))
        return None
    if isinstance(expr, Call) and expr.name == "exp" and len(expr.args) == 1:
        try:
            args = [evaluate(expr.args[0], _at(lookup, t)) for t in _PROBES]
        except NotConstant:
            return None
        inv = [1.0 / (t + KELVIN) for t in _PROBES]
        slope = (args[1] - args[0]) / (inv[1] - inv[0])
        predicted = args[0] + slope * (inv[2] - inv[0])
        if slope >= 0 or abs(predicted - args[2]) > 1e-9 * max(1.0, abs(args[2])):
            return None
        reference = 1.0 / (inv[0] - args[0] / slope) - KELVIN
        return TemperatureFactor("ea", -slope * GAS_CONSTANT, reference,
                                 _parameter_in(expr.args[0], lookup))
    return None


def _at(lookup: Lookup, celsius: float | None) -> Lookup:
    """``lookup`` with ``celsius`` at a value (None: not a constant)."""
    def inner(name: str) -> Any:
        return celsius if name == "celsius" else lookup(name)
    return inner


def _name_of(expr: Any) -> str | None:
    return expr.name if isinstance(expr, Name) else None


def _parameter_in(expr: Any, lookup: Lookup) -> str | None:
    """The first name other than ``celsius`` in ``expr`` that holds a number (the
    activation energy of an Arrhenius factor), if any."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Name) and e.name != "celsius" and isinstance(lookup(e.name),
                                                                       (int, float)):
            return e.name
        if isinstance(e, Bin):
            stack += [e.b, e.a]
        elif isinstance(e, (Neg,)):
            stack.append(e.a)
        elif isinstance(e, Call):
            stack += list(e.args)[::-1]
    return None

