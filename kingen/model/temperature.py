"""Temperature dependence of a scheme's rates: Q10s and Arrhenius activation energies.

A scheme file may add a ``[temperature]`` table. The parameters' values then hold at the
reference temperature, and each group of rates (or a single rate) scales with temperature:

.. code-block:: toml

    [temperature]
    reference_c = 22                     # °C at which the parameters' values hold

    [temperature.binding]                # a named group of rates, one Q10 for all
    rates = ["k_on", "k_off"]
    q10 = 2.4                            # fitted between bounds (default value / 2.5 .. x 2.5)
    bounds = [1.2, 5]

    [temperature.k_des]                  # a group named as a rate: that rate alone
    ea_kj_mol = 60                       # Arrhenius activation energy, kJ/mol
    fixed = true

with k(T) = k_ref · Q10^((T − T_ref)/10), or k_ref · exp(−Ea/R · (1/T − 1/T_ref)) with T in
kelvin. Each group becomes one parameter of the scheme, ``q10_<group>`` or
``ea_<group>``, which a fit varies (or holds, ``fixed = true``) like a rate constant and
profiles like one. A derived rate takes no group of its own: its factor follows from the
other rates of its cycle, so the cycle stays microscopically reversible at every
temperature. Rates in no group do not change with temperature.

Examples
--------
>>> import numpy as np
>>> from kingen.model.scheme import Scheme
>>> s = Scheme.loads('''
... [model]
... name = "two"
... [states]
... C = { conductance = 0 }
... O = { conductance = 10 }
... [parameters]
... k_on = 1.0
... k_off = 0.5
... [transitions]
... "C -> O" = "k_on * glu"
... "O -> C" = "k_off"
... [temperature]
... reference_c = 22
... [temperature.binding]
... rates = ["k_on"]
... q10 = 2.0
... ''')
>>> s.param_names
['k_on', 'k_off', 'q10_binding']
>>> at_temperature(s, s.values, 32.0).tolist()
[2.0, 0.5, 2.0]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.model.fields import Fields

# Temperatures a recording, a simulation or a reference may be at, °C: liquid water in a
# bath, and a value outside is most often a kelvin or Fahrenheit figure.
TEMPERATURE_RANGE_C = (0.0, 50.0)
GAS_CONSTANT = 8.314462618e-3  # kJ / (mol K)
KELVIN = 273.15
# Default bounds of a fitted Q10 or activation energy: its value divided and multiplied by.
DEFAULT_Q10_SPREAD = 2.5
DEFAULT_EA_SPREAD = 3.0
KINDS = {"q10": ("q10", "1"), "ea_kj_mol": ("ea", "kJ/mol")}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_GROUP_KEYS = ("rates", "q10", "ea_kj_mol", "bounds", "fixed", "scale", "description")


@dataclass(frozen=True)
class TemperatureGroup:
    """Rates that share one Q10 (``kind == "q10"``) or activation energy (``"ea"``)."""

    name: str
    kind: str
    param: int                 # index of its Q10 or Ea among the scheme's parameters
    members: tuple[int, ...]   # indices of its rates


@dataclass(frozen=True)
class Temperature:
    """A scheme's temperature dependence: the reference and the groups of rates."""

    reference_c: float
    groups: tuple[TemperatureGroup, ...]


def check_celsius(value: Any, *, file: str | None, field: str) -> float:
    """A temperature in °C inside :data:`TEMPERATURE_RANGE_C`, as a float.

    >>> check_celsius(34, file=None, field="temperature")
    34.0
    """
    lo, hi = TEMPERATURE_RANGE_C
    Fields(file or "<input>").check_number(value, field)
    if not lo <= float(value) <= hi:
        raise KingenError(f"a temperature in °C must lie in {lo:g}–{hi:g} (a kelvin or "
                          "Fahrenheit figure?)", file=file, field=field, value=value)
    return float(value)


def parse_temperature(f: Fields, table: Any, parameters: list, parameter_type: type,
                      ) -> tuple[list, Temperature | None]:
    """The ``[temperature]`` table of a scheme file: the Q10 and Ea parameters it adds
    (to append to ``parameters``) and the :class:`Temperature`, or ``([], None)``.

    ``parameters`` are the scheme's rate constants (:class:`~kingen.model.scheme.Parameter`),
    ``parameter_type`` that class (passed in: this module sits below the scheme's).
    """
    if table is None:
        return [], None
    if not isinstance(table, dict):
        raise f.error("must be a table: [temperature] reference_c = 22", "temperature", table)
    if "reference_c" not in table:
        raise f.error("missing: the temperature (°C) at which the parameters' values hold",
                      "temperature.reference_c")
    reference = check_celsius(table["reference_c"], file=f.file, field="temperature.reference_c")
    names = [p.name for p in parameters]
    taken: dict[int, str] = {}
    added: list = []
    groups: list[TemperatureGroup] = []
    for gname, spec in table.items():
        if gname == "reference_c":
            continue
        where = f"temperature.{gname}"
        if not _NAME.match(gname):
            raise f.error("a group's name is letters, digits and _ (it names the group's "
                          "parameter, q10_<name>)", where)
        if not isinstance(spec, dict):
            raise f.error("must be a group table such as { rates = [\"k_on\"], q10 = 2.4 }",
                          where, spec)
        f.keys(spec, _GROUP_KEYS, where)
        f.string(spec, "description", where, None)
        members = _members(f, spec, gname, names, where)
        kinds = [k for k in KINDS if k in spec]
        if len(kinds) != 1:
            msg = ("give q10 or ea_kj_mol, not both: a rate scales by a Q10 or by an "
                   "activation energy" if kinds else "missing: q10 = ... or ea_kj_mol = ...")
            raise f.error(msg, f"{where}.{kinds[1] if kinds else 'q10'}",
                          spec.get(kinds[1]) if kinds else None)
        key = kinds[0]
        kind, unit = KINDS[key]
        for m in members:
            if parameters[m].derived:
                raise f.error("a derived rate takes its temperature dependence from the "
                              "other rates of its cycle: leave it out of the groups",
                              f"{where}.rates", names[m])
            if m in taken:
                raise f.error(f"rate {names[m]} is already in group {taken[m]}: a rate takes "
                              "one Q10 or one activation energy", f"{where}.rates", names[m])
            taken[m] = gname
        pname = f"{kind}_{gname}"
        if pname in names or pname in {p.name for p in added}:
            raise f.error(f"the group's parameter {pname} would take the name of a rate: "
                          "rename the group", where)
        value = f.number(spec, key, where, gt=0.0)
        spread = DEFAULT_Q10_SPREAD if kind == "q10" else DEFAULT_EA_SPREAD
        if "bounds" in spec:
            lo, hi = f.numbers(spec, "bounds", where, length=2, gt=0.0)
            if lo >= hi:
                raise f.error("lower bound must be below the upper bound", f"{where}.bounds",
                              spec["bounds"])
            if not lo <= value <= hi:
                raise f.error(f"value outside its bounds [{lo:g}, {hi:g}]", f"{where}.{key}",
                              spec[key])
        else:
            lo, hi = value / spread, value * spread
        scale = f.choice(spec, "scale", ("log", "linear"), where, "log")
        fixed = f.boolean(spec, "fixed", where, False)
        groups.append(TemperatureGroup(gname, kind, len(parameters) + len(added),
                                       tuple(members)))
        added.append(parameter_type(pname, value, lo, hi, 0, unit, scale, fixed, False,
                                    kind))
    return added, Temperature(reference, tuple(groups))


def _members(f: Fields, spec: dict, gname: str, names: list[str], where: str) -> list[int]:
    """The rates of a group: its ``rates`` list, or the rate the group is named after."""
    if "rates" not in spec:
        if gname not in names:
            raise f.error(f"no such rate (rates are {', '.join(names)}); a group of several "
                          "rates lists them: rates = [\"k_on\", \"k_off\"]", where, gname)
        return [names.index(gname)]
    rates = spec["rates"]
    if not isinstance(rates, list) or not rates or not all(isinstance(r, str) for r in rates):
        raise f.error("must be a non-empty array of rate names", f"{where}.rates", rates)
    out = []
    for r in rates:
        if r not in names:
            raise f.error(f"unknown rate (rates are {', '.join(names)})", f"{where}.rates", r)
        out.append(names.index(r))
    return out


def rate_factors(scheme: Any, params: np.ndarray, celsius: float | np.ndarray) -> np.ndarray:
    """Multipliers (..., n_params) that take each rate from the reference temperature to
    ``celsius``; 1 for rates in no group and for the Q10 and Ea parameters themselves.

    A derived rate's factor is the product its cycle's rule gives, so a cycle reversible at
    the reference stays reversible at every temperature.
    """
    p = np.asarray(params, dtype=float)
    temp = scheme.temperature
    out = np.ones(p.shape)
    if temp is None:
        return out
    t = np.asarray(celsius, dtype=float)  # broadcast against the rows of params
    inv_ref = 1.0 / (temp.reference_c + KELVIN)
    with np.errstate(all="ignore"):
        for g in temp.groups:
            x = p[..., g.param]
            if g.kind == "q10":
                factor = x ** ((t - temp.reference_c) / 10.0)
            else:
                factor = np.exp(-x / GAS_CONSTANT * (1.0 / (t + KELVIN) - inv_ref))
            for m in g.members:
                out[..., m] = factor
        for rule in scheme.derived_rules:
            logf = np.zeros(p.shape[:-1])
            for j in np.flatnonzero(rule.exponents):
                logf = logf + rule.exponents[j] * np.log(out[..., j])
            out[..., rule.param] = np.exp(logf)
    return out


def at_temperature(scheme: Any, params: np.ndarray, celsius: float | None) -> np.ndarray:
    """``params`` (internal units) with every rate taken to ``celsius`` (a copy; None or a
    scheme without ``[temperature]``: unchanged).

    Derived rates must be complete in ``params`` (:meth:`Scheme.complete`).
    """
    p = np.array(params, dtype=float, copy=True)
    if celsius is None or scheme.temperature is None:
        return p
    return p * rate_factors(scheme, p, celsius)


def max_factor(scheme: Any, celsius: float) -> np.ndarray:
    """Per parameter, the largest factor any Q10 or Ea inside its bounds gives at
    ``celsius``: what a solver's step choice must allow for."""
    lo = np.array([p.lower for p in scheme.parameters])
    hi = np.array([p.upper for p in scheme.parameters])
    return np.maximum(rate_factors(scheme, lo, celsius), rate_factors(scheme, hi, celsius))


def describe(scheme: Any) -> list[str]:
    """One line per temperature group, e.g. ``binding: k_on, k_off x Q10 q10_binding``."""
    temp = scheme.temperature
    if temp is None:
        return []
    names = scheme.param_names
    return [f"{g.name}: {', '.join(names[m] for m in g.members)} scale with "
            f"{names[g.param]} (reference {temp.reference_c:g} °C)" for g in temp.groups]


def q10_exponent(celsius: float, reference_c: float) -> float:
    """(T − T_ref) / 10.

    >>> q10_exponent(32, 22)
    1.0
    """
    return (float(celsius) - float(reference_c)) / 10.0


def arrhenius_factor(ea_kj_mol: float, celsius: float, reference_c: float) -> float:
    """exp(−Ea/R · (1/T − 1/T_ref)), T in kelvin.

    >>> round(arrhenius_factor(50.0, 32.0, 22.0), 4)
    1.9497
    """
    return math.exp(-ea_kj_mol / GAS_CONSTANT * (1.0 / (celsius + KELVIN)
                                                 - 1.0 / (reference_c + KELVIN)))


def scheme_at_temperature(scheme: Any, celsius: float, *, field: str = "temperature") -> Any:
    """A copy of ``scheme`` whose rates (values and bounds) are those at ``celsius``, with
    no temperature dependence left: what a simulation at that temperature runs.

    Raises
    ------
    KingenError
        A temperature outside :data:`TEMPERATURE_RANGE_C`, or a scheme whose rates do not
        depend on temperature (no ``[temperature]`` table).

    Examples
    --------
    >>> from kingen.model.scheme import Scheme
    >>> s = Scheme.load("models/jonas_1993.toml")
    >>> try:
    ...     scheme_at_temperature(s, 34)
    ... except KingenError as err:
    ...     print(str(err).split(": ", 2)[1])
    temperature = 34
    """
    from dataclasses import replace

    given = celsius
    celsius = check_celsius(celsius, file=None, field=field)
    if scheme.temperature is None:
        raise KingenError("the scheme has no [temperature] table: its rates do not depend "
                          "on temperature", file=scheme.path, field=field, value=given)
    values = scheme.values
    factor = rate_factors(scheme, values, celsius)
    lo = rate_factors(scheme, np.array([p.lower for p in scheme.parameters]), celsius)
    hi = rate_factors(scheme, np.array([p.upper for p in scheme.parameters]), celsius)
    params = [p if p.order == 0 else replace(
        p, value=float(values[k] * factor[k]),
        lower=float(p.lower * min(lo[k], hi[k], factor[k])),
        upper=float(p.upper * max(lo[k], hi[k], factor[k])))
        for k, p in enumerate(scheme.parameters)]
    return replace(scheme, parameters=params, temperature=None)


def temperature_field(scheme: Any, param: int) -> tuple[str, str]:
    """The ``[temperature]`` group and key (``q10`` or ``ea_kj_mol``) that parameter
    ``param`` (a Q10 or an activation energy) comes from."""
    for g in scheme.temperature.groups:
        if g.param == param:
            return g.name, "q10" if g.kind == "q10" else "ea_kj_mol"
    raise KeyError(scheme.param_names[param])


def identify_factor(factor: Any) -> tuple[str, float, float] | None:
    """``("q10", Q10, T_ref)`` or ``("ea", Ea, T_ref)`` when ``factor(celsius)`` is a Q10 or
    an Arrhenius factor (1 at T_ref), else None; told from its values at three
    temperatures.

    >>> identify_factor(lambda t: 3.0 ** ((t - 22.0) / 10.0))
    ('q10', 3.0, 22.0)
    >>> kind, ea, ref = identify_factor(lambda t: arrhenius_factor(60.0, t, 20.0))
    >>> kind, round(ea, 9), round(ref, 9)
    ('ea', 60.0, 20.0)
    """
    probes = (5.0, 22.0, 37.0)
    try:
        logs = [math.log(float(factor(t))) for t in probes]
    except (ValueError, OverflowError, ZeroDivisionError, TypeError):
        return None
    for kind, x in (("q10", probes), ("ea", [1.0 / (t + KELVIN) for t in probes])):
        slope = (logs[1] - logs[0]) / (x[1] - x[0])
        if slope == 0 or abs(logs[0] + slope * (x[2] - x[0]) - logs[2]) > 1e-9 * max(
                1.0, abs(logs[2])):
            continue
        x_ref = x[0] - logs[0] / slope
        if kind == "q10":
            return "q10", round(math.exp(10.0 * slope), 12), round(x_ref, 9)
        if slope < 0:
            return "ea", round(-slope * GAS_CONSTANT, 9), round(1.0 / x_ref - KELVIN, 9)
    return None
