"""Write a scheme as a NEURON ``POINT_PROCESS`` with a ``KINETIC`` block.

The transmitter concentration is a ``RANGE`` parameter named as the scheme's agonist (mM),
to be driven by ``Vector.play`` or set by another mechanism. The conductance of every
conducting state (pS), the channel count ``nchan`` and the reversal potential ``erev`` are
parameters; ``g = nchan * Σ gX * X`` (pS) and ``i = (1e-6) * g * (v - erev)`` (nA). Every
rate constant is a ``RANGE`` parameter in ``/ms`` or ``/mM /ms``, written with all the
digits of its value; units are declared so that ``modlunit`` accepts the file. The states
start at the equilibrium without transmitter (``SOLVE kin STEADYSTATE sparse`` at the
transmitter's value at initialisation, 0 unless set), or at the scheme file's initial
occupancies when it gives them.

Rates that depend on temperature (the scheme's ``[temperature]`` groups) go through
NEURON's ``celsius``, as published models write it: each group's factor, e.g.
``tadj_binding = q10_binding^((celsius - 22 (degC))/10 (degC))``, is computed at the top of
the ``KINETIC`` block and multiplies its rates; the Q10s (or activation energies, kJ/mol)
are ``RANGE`` parameters.
"""

from __future__ import annotations

from kingen.model.temperature import GAS_CONSTANT, KELVIN
from kingen.outputs.interop.exported import ExportModel, number

# Names the writer itself uses, and names NEURON reserves: a parameter called so is renamed.
_TAKEN = {"v", "i", "g", "t", "dt", "celsius", "area", "diam", "erev", "nchan", "kin",
          "exp", "log", "sqrt", "fabs", "PI", "FARADAY", "R", "e", "secondorder", "pi",
          "vtrap", "nrn_ghk", "if", "else", "while", "for"}


def mechanism_name(model: ExportModel) -> str:
    """``kingen_<scheme file stem>``: the ``POINT_PROCESS`` name."""
    return f"kingen_{model.stem}"


def _rate_unit(order: int) -> str:
    return {0: "1", 1: "/ms"}.get(order, "/mM /ms")


def factor_name(group: str) -> str:
    """The ASSIGNED variable holding a temperature group's factor."""
    return f"tadj_{group}"


def _factor_lines(model: ExportModel, rename: dict[str, str]) -> list[str]:
    """The KINETIC block's first lines: each temperature group's factor at ``celsius``."""
    out = []
    ref = number(model.reference_c or 0.0)
    for g in model.groups:
        x = rename[g.param]
        if g.kind == "q10":
            expr = f"{x}^((celsius - {ref} (degC))/10 (degC))"
        else:  # Arrhenius: Ea in kJ/mol, R in kJ/(mol K)
            expr = (f"exp(-{x} / {number(GAS_CONSTANT)} * (1 / (celsius + {number(KELVIN)})"
                    f" - 1 / ({ref} + {number(KELVIN)})))")
        out.append(f"    {factor_name(g.name)} = {expr}")
    return out


def _scaled(parts: list[str], powers: dict[str, float]) -> list[str]:
    """A rate's factors times its temperature groups' factors (to their powers)."""
    for g, x in powers.items():
        parts.append(factor_name(g) if x == 1 else f"{factor_name(g)}^({number(x)})")
    return parts


def state_names(states: list[str]) -> dict[str, str]:
    """NMODL names of the states: NMODL names the derivative of state X ``DX``, so a state
    whose name is ``D`` + another state's (DD2 beside D2) gets a trailing ``_``.

    >>> state_names(["D2", "DD2"])
    {'D2': 'D2', 'DD2': 'DD2_'}
    """
    out = {s: s for s in states}
    for s in states:
        while out[s].startswith("D") and (out[s][1:] in states or out[s] in
                                          {"D" + x for x in out.values()}):
            out[s] += "_"
    return out


def write_nmodl(model: ExportModel) -> str:
    """NMODL text of ``model``.

    Examples
    --------
    >>> from kingen.model.scheme import Scheme
    >>> from kingen.outputs.interop.exported import export_model
    >>> text = write_nmodl(export_model(Scheme.load("models/jonas_1993.toml")))
    >>> [line.strip() for line in text.splitlines() if "C0 <-> C1" in line]
    ['~ C0 <-> C1 (k01 * glu, k10)']
    """
    rename = {p: (f"{p}_k" if p in _TAKEN else p) for p in model.parameters}
    st = state_names(model.states)
    glu = f"{model.agonist}_k" if model.agonist in _TAKEN else model.agonist
    conducting = [s for s in model.states if model.conductance[s] > 0]
    gname = {s: f"g{s}" for s in conducting}
    for s in conducting:
        while gname[s] in set(rename.values()) | set(model.states) | {glu}:
            gname[s] = "g_" + gname[s]
    mech = mechanism_name(model)
    out = [f"TITLE {model.name} (kingen export)", "", "COMMENT"]
    out += [f"  {line}" for line in model.provenance]
    if model.source:
        out.append(f"  Scheme source: {model.source}")
    renamed = [f"{s} as {st[s]}" for s in model.states if st[s] != s]
    if renamed:
        out.append(f"  States renamed (NMODL names the derivative of X 'DX'): "
                   f"{', '.join(renamed)}.")
    out += [f"  States: {', '.join(model.states)}; conducting: "
            f"{', '.join(f'{s} {model.conductance[s]:g} pS' for s in conducting)}.",
            f"  {glu}: the transmitter concentration (mM), a RANGE variable: drive it with",
            f"  Vector.play(syn._ref_{glu}, tvec, 1) or set it from another mechanism.",
            "  Rates are RANGE parameters; derived rates keep their cycle microscopically",
            "  reversible at the exported values only: recompute them if you change a rate.",
            "ENDCOMMENT", "", "NEURON {", "    THREADSAFE", f"    POINT_PROCESS {mech}",
            f"    RANGE {glu}, g, nchan, erev"]
    if conducting:
        out.append(f"    RANGE {', '.join(gname[s] for s in conducting)}")
    names = [rename[p] for p in model.parameters]
    for k in range(0, len(names), 8):
        out.append(f"    RANGE {', '.join(names[k:k + 8])}")
    out += ["    NONSPECIFIC_CURRENT i", "}", "", "UNITS {", "    (nA) = (nanoamp)",
            "    (mV) = (millivolt)", "    (pS) = (picosiemens)", "    (mM) = (milli/liter)",
            "}", "", "PARAMETER {",
            "    erev = 0 (mV)             : reversal potential",
            f"    nchan = {number(model.channels)} (1)          : number of channels",
            f"    {glu} = 0 (mM)              : transmitter concentration (input)"]
    for s in conducting:
        out.append(f"    {gname[s]} = {number(model.conductance[s])} (pS)   : conductance of {s}")
    for p in model.parameters.values():
        notes = []
        if p.derived:
            notes.append("derived: microscopic reversibility")
        group = next((g for g in model.groups if g.param == p.name), None)
        if group is not None:
            what = "Q10" if group.kind == "q10" else "activation energy (kJ/mol)"
            notes.append(f"{what} of {', '.join(group.members)} "
                         f"(reference {number(model.reference_c or 0.0)} degC)")
        if p.interval is not None:
            notes.append(f"profile interval [{p.interval[0]:.6g}, {p.interval[1]:.6g}]")
        if p.description:
            notes.append(p.description)
        note = f"   : {'; '.join(notes)}" if notes else ""
        out.append(f"    {rename[p.name]} = {number(p.value)} ({_rate_unit(p.order)}){note}")
    out += ["}", "", "ASSIGNED {", "    v (mV)", "    i (nA)", "    g (pS)"]
    if model.groups:
        out.append("    celsius (degC)")
        out += [f"    {factor_name(g.name)} (1)" for g in model.groups]
    out += ["}", "",
            "STATE { " + " ".join(st[s] for s in model.states) + " }", "", "INITIAL {"]
    if model.initial_given:
        out += [f"    {st[s]} = {number(model.initial[s])}" for s in model.states]
    else:
        out.append("    SOLVE kin STEADYSTATE sparse")
    out += ["}", "", "BREAKPOINT {",
            "    SOLVE kin METHOD sparse"]
    gsum = " + ".join(f"{gname[s]} * {st[s]}" for s in conducting) or "0"
    out += [f"    g = nchan * ({gsum})", "    i = (1e-6) * g * (v - erev)", "}", "",
            "KINETIC kin {"]
    out += _factor_lines(model, rename)
    pairs: dict[tuple[str, str], list[str]] = {}
    order: list[tuple[str, str]] = []
    for r in model.rates:
        key = (r.source, r.target) if (r.target, r.source) not in pairs else (r.target,
                                                                              r.source)
        if key not in pairs:
            pairs[key] = ["0", "0"]
            order.append(key)
        parts = _scaled(([] if r.factor == 1 else [number(r.factor)]) + [rename[r.param]],
                        model.parameters[r.param].powers)
        if r.agonist:
            parts.append(glu)
        pairs[key][0 if key == (r.source, r.target) else 1] = " * ".join(parts)
    for a, b in order:
        kf, kb = pairs[(a, b)]
        out.append(f"    ~ {st[a]} <-> {st[b]} ({kf}, {kb})")
    out += [f"    CONSERVE {' + '.join(st[s] for s in model.states)} = 1", "}", ""]
    return "\n".join(out)
