"""What a reader of another format finds, and the kingen scheme file written from it.

A reader (:mod:`kingen.outputs.interop.nmodl`, :mod:`kingen.outputs.interop.myokit`) fills an
:class:`ImportedScheme` in kingen's internal units (ms, mM, pS). :func:`scheme_text` turns
it into scheme-file text: bounds ×/÷10 around each value, the source file named in
``model.source``, and every cycle checked for microscopic reversibility; a cycle whose
imported rates break it gets one rate marked ``derived`` (recomputed from the rest of its
cycle), said in the header so the user can pick another. The text is parsed back with
:meth:`Scheme.loads` before it is handed out.

Problems a reader finds (a voltage-dependent rate, an expression the scheme format cannot
hold) are collected and raised together as :class:`ImportProblems`, one line each.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kingen.errors import KingenError
from kingen.model.scheme import DEFAULT_BOUND_FACTOR, Scheme, exp_text
from kingen.model.temperature import arrhenius_factor


class ImportProblems(KingenError):
    """Every construct of a file that a kingen scheme cannot hold, one line each
    (``FILE:LINE: what``), after a first line that counts them."""

    def __init__(self, path: str, problems: list[tuple[int | None, str]]) -> None:
        self.problems = sorted(problems, key=lambda p: (p[0] or 0))
        self.path = path
        super().__init__("", file=path)

    def format(self) -> str:
        lines = [f"{self.path}:{line}: {what}" if line else f"{self.path}: {what}"
                 for line, what in self.problems]
        if len(lines) == 1:
            return lines[0]
        head = (f"{self.path}: {len(lines)} things a kingen scheme cannot hold (nothing "
                f"was written):")
        return "\n".join([head] + ["  " + line for line in lines])


@dataclass
class ImportedParameter:
    """A rate constant in internal units (ms⁻¹, or mM⁻¹ ms⁻¹ when ``order`` is 2)."""

    name: str
    value: float
    order: int
    line: int | None = None
    note: str = ""


@dataclass
class ImportedRate:
    """A transition ``source -> target`` at ``factor * param [* agonist]``."""

    source: str
    target: str
    factor: float
    param: str
    agonist: bool
    line: int | None = None


@dataclass
class ImportedGroup:
    """Rates (parameter names) that scale with one Q10 (``kind == "q10"``) or activation
    energy (``"ea"``, kJ/mol)."""

    name: str
    kind: str
    value: float
    members: list[str]


@dataclass
class ImportedScheme:
    """A scheme read from another format, in internal units."""

    path: str
    fmt: str
    name: str
    states: list[str]
    conductance: dict[str, float]
    parameters: dict[str, ImportedParameter]
    rates: list[ImportedRate]
    agonist: str = "glu"
    channels: float = 1.0
    notes: list[str] = field(default_factory=list)
    reference_c: float | None = None  # the temperature the rates hold at, if they vary
    groups: list[ImportedGroup] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # pieces of the file not imported


def _number(x: float) -> str:
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") and "e" not in text else text


def _toml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def scheme_text(imp: ImportedScheme) -> str:
    """Scheme-file text for an imported scheme, checked by parsing it back.

    Raises
    ------
    KingenError
        If the result is not a valid scheme (e.g. no conducting state), naming the source.
    """
    derived, notes = _reversibility(imp)
    text = _render(imp, derived, notes)
    try:
        Scheme.loads(text, path=f"<scheme imported from {imp.path}>")
    except KingenError as exc:
        raise KingenError(f"the imported scheme is not valid: {exc.message}",
                          file=imp.path, field=exc.field, value=exc.value) from None
    return text


def _render(imp: ImportedScheme, derived: dict[int, float], notes: list[str]) -> str:
    head = [f"# Imported by kingen from {imp.path} ({imp.fmt}).",
            "# Values converted to ms, mM and pS; bounds x/÷10 around each value."]
    head += [f"# {line}" for n in imp.notes + notes for line in _wrap(n)]
    out = head + ["", "[model]", f"name = {_toml_string(imp.name)}",
                  f"source = {_toml_string(str(Path(imp.path).name) + ' (' + imp.fmt + ')')}",
                  f"agonist = {_toml_string(imp.agonist)}",
                  f"channels = {_number(imp.channels)}", "",
                  "[units]", 'time = "ms"', 'concentration = "mM"', 'conductance = "pS"', "",
                  "[states]"]
    for s in imp.states:
        out.append(f"{s} = {{ conductance = {_number(imp.conductance.get(s, 0.0))} }}")
    out += ["", "[parameters]"]
    derived_params = {imp.rates[m].param: v for m, v in derived.items()}
    for p in imp.parameters.values():
        value = derived_params.get(p.name, p.value)
        unit = "ms^-1" if p.order == 1 else "mM^-1 ms^-1"
        lo, hi = value / DEFAULT_BOUND_FACTOR, value * DEFAULT_BOUND_FACTOR
        desc = p.note
        if p.name in derived_params:
            desc = (f"derived (microscopic reversibility); imported {_number(p.value)}, "
                    f"recomputed {value:.6g}" + (f"; {p.note}" if p.note else ""))
        extra = f", description = {_toml_string(desc)}" if desc else ""
        out.append(f"{p.name} = {{ value = {_number(value)}, unit = \"{unit}\", "
                   f"bounds = [{_number(lo)}, {_number(hi)}]{extra} }}")
    out += ["", "[transitions]"]
    for m, r in enumerate(imp.rates):
        parts = ([] if r.factor == 1 else [_number(r.factor)]) + [r.param]
        if r.agonist:
            parts.append(imp.agonist)
        rate = " * ".join(parts)
        key = f'"{r.source} -> {r.target}"'
        if m in derived:
            out.append(f'{key} = {{ rate = "{rate}", derived = true }}')
        else:
            out.append(f'{key} = "{rate}"')
    return "\n".join(out + _temperature(imp, set(derived_params))) + "\n"


def _temperature(imp: ImportedScheme, derived: set[str]) -> list[str]:
    """The ``[temperature]`` table of the imported groups (a derived rate takes its factor
    from its cycle, so it is in none)."""
    if imp.reference_c is None or not imp.groups:
        return []
    out = ["", "[temperature]", f"reference_c = {_number(imp.reference_c)}"]
    for g in imp.groups:
        members = [m for m in g.members if m not in derived]
        if not members:
            continue
        key = "q10" if g.kind == "q10" else "ea_kj_mol"
        names = ", ".join(_toml_string(m) for m in members)
        out += ["", f"[temperature.{g.name}]", f"rates = [{names}]",
                f"{key} = {_number(g.value)}"]
    return out


def _wrap(text: str, width: int = 88) -> list[str]:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return lines + ([cur] if cur else [])


def _broken(imp: ImportedScheme, derived: dict[int, float]) -> tuple[Scheme | None, list]:
    """The scheme rendered with ``derived`` (reversibility unchecked), and its cycles that
    break microscopic reversibility beyond the default tolerance, with their log products."""
    text = _render(imp, derived, []).replace("[model]\n",
                                              "[model]\ncheck_reversibility = false\n", 1)
    try:
        scheme = Scheme.loads(text, path=f"<scheme imported from {imp.path}>")
    except KingenError:
        return None, []
    out = []
    for cycle, (log_f, log_b) in zip(scheme.cycles, scheme.cycle_log_products()):
        if cycle.derived is not None or not cycle.backward \
                or len(cycle.backward) != len(cycle.forward):
            continue  # a one-way cycle: Scheme.loads names it when the file is checked
        if abs(log_f - log_b) > math.log1p(scheme.reversibility_tolerance):
            out.append((cycle, log_f, log_b))
    return scheme, out


def _reversibility(imp: ImportedScheme) -> tuple[dict[int, float], list[str]]:
    """Transitions to mark derived ({rate index: recomputed value}) and header notes.

    For each cycle (of those :func:`~kingen.model.scheme.find_cycles` finds) that breaks
    microscopic reversibility beyond the default tolerance, one of its rates is marked
    derived: the cycle's closing transition (the chord, as
    :meth:`Scheme.reversibility_warnings` suggests) when its parameter is its own, else the
    first rate of the cycle with a parameter of its own that closes it. The value is the one
    that makes the cycle's two products equal.
    """
    derived: dict[int, float] = {}
    notes: list[str] = []
    scheme, broken = _broken(imp, derived)
    while scheme is not None and broken:
        cycle, log_f, log_b = broken[0]
        uses = np.bincount([t.param for t in scheme.transitions], minlength=scheme.n_params)
        values = scheme.values
        order = list(dict.fromkeys((cycle.forward[0], cycle.backward[0]) + cycle.forward
                                   + cycle.backward))
        text_cycle = scheme.describe_cycle(cycle)
        for m in order:
            t = scheme.transitions[m]
            if uses[t.param] != 1 or m in derived:
                continue
            # both products were taken at c = 1, so an agonist factor cancels
            log_k = math.log(values[t.param]) + (log_b - log_f if m in cycle.forward
                                                 else log_f - log_b)
            trial = {**derived, m: math.exp(log_k)}
            new_scheme, new_broken = _broken(imp, trial)
            if new_scheme is not None and len(new_broken) < len(broken):
                derived, scheme, broken = trial, new_scheme, new_broken
                notes.append(
                    f"Cycle {text_cycle} breaks microscopic reversibility as imported (ratio "
                    f"of rate products {exp_text(log_f - log_b)}): "
                    f"{scheme.states[t.source]} -> {scheme.states[t.target]} "
                    f"({scheme.parameters[t.param].name}, imported {values[t.param]:.6g}) is "
                    f"marked derived, recomputed {math.exp(log_k):.6g}. Another rate of the "
                    f"cycle may be the one to derive; or set model.check_reversibility = "
                    f"false to keep the imported values.")
                break
        else:
            raise KingenError(
                f"cycle {text_cycle} breaks microscopic reversibility (rate products "
                f"{exp_text(log_f, '.6g')} one way, {exp_text(log_b, '.6g')} the other) and no "
                f"rate of it with a parameter of its own can close it; correct a rate in the "
                f"file", file=imp.path)
    return derived, notes


def temperature_groups(factors: list, rate_factor: dict[str, int | None], params: dict
                       ) -> tuple[float | None, list[ImportedGroup]]:
    """The reference temperature and the groups of rates of an imported scheme.

    ``factors`` are the file's temperature factors (each with ``kind``, ``value``,
    ``reference_c`` and ``name``), ``rate_factor`` the factor (index) of each rate
    parameter, None for none. Rates whose factor has another reference temperature get
    their value at the first factor's (``params``, name -> ImportedParameter, is updated).
    """
    used = sorted({k for k in rate_factor.values() if k is not None})
    if not used:
        return None, []
    reference = factors[used[0]].reference_c
    groups = []
    for k in used:
        tf = factors[k]
        members = [p for p, f in rate_factor.items() if f == k and p in params]
        if tf.reference_c != reference:
            scale = (tf.value ** ((reference - tf.reference_c) / 10.0) if tf.kind == "q10"
                     else arrhenius_factor(tf.value, reference, tf.reference_c))
            for p in members:
                params[p].value *= scale
        groups.append(ImportedGroup(_group_name(tf, k, [g.name for g in groups]), tf.kind,
                                    tf.value, members))
    return reference, groups


def _group_name(tf, k: int, taken: list[str]) -> str:
    """``binding`` for a factor of ``Q10_binding`` (or ``q10binding``, ``Ea_binding``), else
    ``rates``; a number is added where a name is taken."""
    base = re.sub(r"^(q10|ea)_?", "", tf.name, flags=re.IGNORECASE) if tf.name else ""
    base = base or ("rates" if tf.kind == "q10" else "activation")
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}{n}"
    return name
