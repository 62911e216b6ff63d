"""What a writer of another format needs from a scheme: one flat description.

:func:`export_model` takes a parsed :class:`~kingen.model.scheme.Scheme`, the values to write
(the file's, or a fit's) and where they came from, and gives the writers
(:mod:`kingen.outputs.interop.nmodl.writer`, :mod:`kingen.outputs.interop.myokit.writer`)
the states, conductances, rates and initial occupancies in internal units (ms, mM,
pS), derived rates already recomputed, so that the exported model simulates exactly what
kingen simulates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from kingen.model.scheme import Scheme


@dataclass
class ExportedParameter:
    name: str
    value: float  # internal units
    order: int
    derived: bool = False
    interval: tuple[float, float] | None = None  # profile interval, internal units
    description: str = ""
    # temperature groups that scale this rate, with their powers: {group: 1} for a rate of a
    # group; a derived rate takes the powers its cycle's rule gives
    powers: dict[str, float] = field(default_factory=dict)


@dataclass
class ExportedRate:
    source: str
    target: str
    factor: float
    param: str
    agonist: bool


@dataclass
class ExportedGroup:
    """Rates that scale with one Q10 (``kind == "q10"``) or activation energy (``"ea"``,
    kJ/mol), named by their parameters."""

    name: str
    kind: str
    param: str
    members: list[str]


@dataclass
class ExportModel:
    """A scheme with values, ready to be written in another format."""

    name: str
    stem: str
    agonist: str
    states: list[str]
    conductance: dict[str, float]  # pS
    channels: float
    parameters: dict[str, ExportedParameter]
    rates: list[ExportedRate]
    initial: dict[str, float]  # rest occupancy at the exported values
    initial_given: bool = False  # the scheme file gives its initial occupancies
    provenance: list[str] = field(default_factory=list)
    source: str = ""
    reference_c: float | None = None  # the temperature the rates hold at, if they vary
    groups: list[ExportedGroup] = field(default_factory=list)

    def group_of(self, param: str) -> ExportedGroup | None:
        """The temperature group that scales rate ``param``, if any."""
        return next((g for g in self.groups if param in g.members), None)

    @property
    def rate_parameters(self) -> dict[str, ExportedParameter]:
        """The rate constants (not the Q10s and activation energies)."""
        return {k: p for k, p in self.parameters.items() if p.order}


def export_model(scheme: Scheme, params: np.ndarray | None = None, *,
                 channels: float | None = None, provenance: list[str] | None = None,
                 intervals: dict[str, tuple[float, float]] | None = None) -> ExportModel:
    """The flat description of ``scheme`` at ``params`` (internal units; None: its values).

    Examples
    --------
    >>> from kingen.model.scheme import Scheme
    >>> m = export_model(Scheme.load("models/jonas_1993.toml"))
    >>> m.rates[0], m.initial["C0"]
    (ExportedRate(source='C0', target='C1', factor=1.0, param='k01', agonist=True), 1.0)
    """
    values = scheme.values if params is None else scheme.complete(np.asarray(params, float))
    rest = scheme.rest_occupancy(values)
    intervals = intervals or {}
    descriptions = _descriptions(scheme)
    pars = {p.name: ExportedParameter(p.name, float(values[k]), p.order, p.derived,
                                      intervals.get(p.name), descriptions.get(p.name, ""))
            for k, p in enumerate(scheme.parameters)}
    rates = [ExportedRate(scheme.states[t.source], scheme.states[t.target], float(t.factor),
                          scheme.parameters[t.param].name, bool(t.agonist))
             for t in scheme.transitions]
    stem = re.sub(r"\W", "_", scheme.path.rsplit("/", 1)[-1].rsplit(".", 1)[0]) or "scheme"
    temp = scheme.temperature
    names = scheme.param_names
    groups = [] if temp is None else [
        ExportedGroup(g.name, g.kind, names[g.param], [names[m] for m in g.members])
        for g in temp.groups]
    for g in groups:
        for m in g.members:
            pars[m].powers[g.name] = 1.0
    for rule in scheme.derived_rules:
        powers: dict[str, float] = {}
        for j in np.flatnonzero(rule.exponents):
            for g, x in pars[names[j]].powers.items():
                powers[g] = powers.get(g, 0.0) + float(rule.exponents[j]) * x
        pars[names[rule.param]].powers = {g: x for g, x in powers.items() if x}
    return ExportModel(
        name=scheme.name, stem=stem, agonist=scheme.agonist, states=list(scheme.states),
        conductance={s: float(g) for s, g in zip(scheme.states, scheme.conductance)},
        channels=float(scheme.channels if channels is None else channels),
        parameters=pars, rates=rates,
        initial={s: float(x) for s, x in zip(scheme.states, rest)},
        initial_given=scheme.initial is not None,
        provenance=list(provenance or []), source=scheme.source,
        reference_c=None if temp is None else temp.reference_c, groups=groups)


def _descriptions(scheme: Scheme) -> dict[str, str]:
    from kingen.model.fields import loads_toml

    try:
        doc = loads_toml(scheme.text, scheme.path)
    except Exception:  # noqa: BLE001 - descriptions are a courtesy
        return {}
    out = {}
    for name, spec in (doc.get("parameters") or {}).items():
        if isinstance(spec, dict) and isinstance(spec.get("description"), str):
            out[name] = spec["description"]
    return out


def number(x: float) -> str:
    """The shortest text that reads back to the same float, e.g. ``4.59`` or ``1e-06``."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text
