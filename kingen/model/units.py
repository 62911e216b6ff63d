"""Unit conversion to kingen's internal units: ms, mM, pS, pA, mV.

Files declare their units; everything is converted once, at load, with these factors.
A factor multiplies a value in the given unit to give the value in the internal unit.
"""

from __future__ import annotations

import re

from kingen.errors import KingenError

TIME_MS = {"s": 1e3, "sec": 1e3, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "μs": 1e-3, "min": 6e4}
CONCENTRATION_MM = {
    "M": 1e3, "mM": 1.0, "uM": 1e-3, "µM": 1e-3, "μM": 1e-3, "nM": 1e-6,
    "mol/l": 1e3, "mmol/l": 1.0, "umol/l": 1e-3,
}
CONDUCTANCE_PS = {"S": 1e12, "mS": 1e9, "uS": 1e6, "µS": 1e6, "nS": 1e3, "pS": 1.0, "fS": 1e-3}
CURRENT_PA = {"A": 1e12, "mA": 1e9, "uA": 1e6, "µA": 1e6, "nA": 1e3, "pA": 1.0, "fA": 1e-3}
VOLTAGE_MV = {"V": 1e3, "mV": 1.0, "uV": 1e-3, "µV": 1e-3}

_KINDS = {
    "time": TIME_MS,
    "concentration": CONCENTRATION_MM,
    "conductance": CONDUCTANCE_PS,
    "current": CURRENT_PA,
    "voltage": VOLTAGE_MV,
}
_INTERNAL = {"time": "ms", "concentration": "mM", "conductance": "pS", "current": "pA",
             "voltage": "mV"}


def factor(kind: str, unit: str, *, file: str | None = None, field: str | None = None) -> float:
    """Factor from ``unit`` to the internal unit of ``kind``.

    Parameters
    ----------
    kind
        One of ``time``, ``concentration``, ``conductance``, ``current``, ``voltage``.
    unit
        The unit as written in a file, e.g. ``"s"``, ``"uM"``, ``"nA"``.
    file, field
        Where the unit was read, for the error message.

    Raises
    ------
    KingenError
        If the unit is not a known unit of that kind.
    """
    table = _KINDS[kind]
    key = unit.strip() if isinstance(unit, str) else unit
    # Exact spellings only: case carries meaning in units (mS is not MS, mM is not MM).
    if isinstance(key, str) and key in table:
        return table[key]
    known = ", ".join(table)
    raise KingenError(f"unknown {kind} unit (use one of {known})", file=file, field=field,
                      value=unit)


def canonical(kind: str, unit: str) -> str:
    """The first spelling in the table of ``kind`` with the same factor as ``unit``
    (e.g. ``mol/l`` -> ``M``): one that :func:`parse_rate_unit` can read."""
    value = factor(kind, unit)
    return next(name for name, v in _KINDS[kind].items() if v == value)


def internal_unit(kind: str) -> str:
    """The internal unit of ``kind`` (``ms``, ``mM``, ``pS``, ``pA`` or ``mV``)."""
    return _INTERNAL[kind]


_TOKEN = re.compile(r"^\s*(?P<unit>[A-Za-zµμ]+)\s*(?:\^?\s*(?P<exp>[-+]?\d+))?\s*$")


def parse_rate_unit(
    unit: str, *, file: str | None = None, field: str | None = None
) -> tuple[float, int]:
    """Parse a rate-constant unit such as ``1/s``, ``s^-1``, ``/M/s`` or ``mM^-1 ms^-1``.

    Returns
    -------
    factor
        Multiplier from the unit to ms⁻¹ (first order) or mM⁻¹ ms⁻¹ (second order).
    order
        1 for a first-order rate (time⁻¹), 2 for a second-order rate
        (concentration⁻¹ time⁻¹).

    Raises
    ------
    KingenError
        If the unit is not time⁻¹ or concentration⁻¹ time⁻¹.
    """
    bad = KingenError(
        "not a rate unit: write time^-1 (e.g. '1/s', 'ms^-1') or concentration^-1 time^-1 "
        "(e.g. '1/(M*s)', 'mM^-1 ms^-1')",
        file=file, field=field, value=unit,
    )
    if not isinstance(unit, str) or not unit.strip():
        raise bad
    text = unit.replace("·", " ").replace("*", " ").replace("(", " ").replace(")", " ")
    text = text.replace("−", "-").replace("⁻¹", "^-1")
    # Split into numerator and denominator on '/' (a leading '1' is allowed).
    parts = text.split("/")
    exponents: dict[str, int] = {}
    for index, part in enumerate(parts):
        sign = 1 if index == 0 else -1
        for token in part.split():
            if token == "1":
                continue
            match = _TOKEN.match(token)
            if not match:
                raise bad
            name = match.group("unit")
            exp = int(match.group("exp")) if match.group("exp") else 1
            exponents[name] = exponents.get(name, 0) + sign * exp
    time_units = [u for u in exponents if u in TIME_MS]
    conc_units = [u for u in exponents if u in CONCENTRATION_MM]
    if set(exponents) - set(time_units) - set(conc_units) or len(time_units) != 1:
        raise bad
    t = time_units[0]
    if exponents[t] != -1 or len(conc_units) > 1:
        raise bad
    total = 1.0 / TIME_MS[t]
    if not conc_units:
        return total, 1
    c = conc_units[0]
    if exponents[c] != -1:
        raise bad
    return total / CONCENTRATION_MM[c], 2
