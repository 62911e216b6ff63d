"""What a reader of another format finds, and the kingen scheme file written from it.

A reader (:mod:`kingen.interop.nmodl`, :mod:`kingen.interop.myokit`) fills an
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kingen.errors import KingenError
from kingen.scheme import DEFAULT_BOUND_FACTOR, Scheme, exp_text


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
    return "\n".join(out) + "\n"


def _wrap(text: str, width: int = 88) -> list[str]:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return lines + ([cur] if cur else [])


def _reversibility(imp: ImportedScheme) -> tuple[dict[int, float], list[str]]:
    """Transitions to mark derived ({rate index: recomputed value}) and header notes.

    The cycles are those kingen finds (the fundamental cycles of :func:`find_cycles`); one
    that breaks microscopic reversibility beyond the default tolerance gets the rate that
    :meth:`Scheme.reversibility_warnings` would suggest marked derived (its chord,
    preferring a rate no other transition shares).
    """
    text = _render(imp, {}, []).replace("[model]\n", "[model]\ncheck_reversibility = false\n",
                                        1)
    try:
        scheme = Scheme.loads(text, path=f"<scheme imported from {imp.path}>")
    except KingenError:
        return {}, []  # scheme_text reports the problem once the file is rendered
    derived: dict[int, float] = {}
    notes: list[str] = []
    uses = np.bincount([t.param for t in scheme.transitions], minlength=scheme.n_params)
    values = scheme.values
    for cycle, (log_f, log_b) in zip(scheme.cycles, scheme.cycle_log_products()):
        if not cycle.backward or len(cycle.backward) != len(cycle.forward):
            continue  # a one-way cycle: Scheme.loads names it
        if abs(log_f - log_b) <= math.log1p(scheme.reversibility_tolerance):
            continue
        chord = [k for k in (cycle.forward[0], cycle.backward[0])
                 if uses[scheme.transitions[k].param] == 1]
        text_cycle = scheme.describe_cycle(cycle)
        if not chord:
            raise KingenError(
                f"cycle {text_cycle} breaks microscopic reversibility (rate products "
                f"{exp_text(log_f, '.6g')} one way, {exp_text(log_b, '.6g')} the other) and "
                f"every rate that could close it is shared with another transition, so none "
                f"can be derived; correct a rate in the file", file=imp.path)
        m = chord[0]
        t = scheme.transitions[m]
        # the rate that makes both products equal: forward has m, or backward has m
        k_m = values[t.param] * t.factor
        log_k = math.log(k_m) + (log_b - log_f if m in cycle.forward else log_f - log_b)
        if t.agonist:
            pass  # the agonist factor cancels: both products were taken at c = 1
        new_value = math.exp(log_k) / t.factor
        derived[m] = new_value
        notes.append(
            f"Cycle {text_cycle} breaks microscopic reversibility as imported (ratio of rate "
            f"products {exp_text(log_f - log_b)}): {scheme.states[t.source]} -> "
            f"{scheme.states[t.target]} ({scheme.parameters[t.param].name}, imported "
            f"{values[t.param]:.6g}) is marked derived, recomputed {new_value:.6g}. "
            f"Another rate of the cycle may be the one to derive; or set "
            f"model.check_reversibility = false to keep the imported values.")
    return derived, notes
