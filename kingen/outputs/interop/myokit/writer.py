"""Write a scheme as a Myokit model (``.mmt``) with a concentration input.

One component, named after the scheme file, holds the agonist concentration (mM; bound to
``pace``, so a ``myokit.Protocol`` drives it), the rate constants (``[1/ms]``,
``[1/mM/ms]``), one ``dot(X)`` equation per state in the full ODE form that
``myokit.lib.markov.LinearModel`` reads, the conductance ``g`` (pS) and the current ``i``
(pA) at a fixed potential ``V`` and reversal ``E``. For
``myokit.lib.markov.AnalyticalSimulation``, pass the concentration as ``vm``:
``LinearModel.from_component(model.get(name), vm=name + ".glu")``.

Rates that depend on temperature (the scheme's ``[temperature]`` groups) go through a
temperature variable ``celsius`` (°C, at the reference temperature as written): each
group's factor, e.g. ``tadj_binding = q10_binding ^ ((celsius - 22) / 10)``, multiplies its
rates.
"""

from __future__ import annotations

from kingen.model.temperature import GAS_CONSTANT, KELVIN
from kingen.outputs.interop.exported import ExportModel, number

_TAKEN = {"time", "pace", "g", "i", "V", "E", "nchan", "dot", "exp", "log", "if", "and",
          "or", "not", "sqrt", "floor", "ceil", "abs", "celsius"}


def _temperature_lines(model: ExportModel, rename: dict[str, str]) -> list[str]:
    """The temperature variable and each group's factor."""
    if not model.groups:
        return []
    ref = number(model.reference_c or 0.0)
    out = [f"celsius = {ref} [1] in [1]",
           f"    desc: temperature, degrees Celsius (the rates hold at {ref})"]
    for g in model.groups:
        x = rename[g.param]
        if g.kind == "q10":
            expr = f"{x} ^ ((celsius - {ref}) / 10)"
        else:
            expr = (f"exp(-{x} / {number(GAS_CONSTANT)} * (1 / (celsius + {number(KELVIN)}) "
                    f"- 1 / ({ref} + {number(KELVIN)})))")
        out += [f"tadj_{g.name} = {expr}", "    in [1]",
                f"    desc: temperature factor of {', '.join(g.members)}"]
    return out


def component_name(model: ExportModel) -> str:
    """The component holding the scheme: ``kingen_<scheme file stem>``."""
    return f"kingen_{model.stem}"


def write_myokit(model: ExportModel) -> str:
    """``.mmt`` text of ``model``.

    Examples
    --------
    >>> from kingen.model.scheme import Scheme
    >>> from kingen.outputs.interop.exported import export_model
    >>> text = write_myokit(export_model(Scheme.load("models/jonas_1993.toml")))
    >>> [line for line in text.splitlines() if line.startswith("dot(C0)")]
    ['dot(C0) = -(k01 * glu) * C0 + k10 * C1']
    """
    rename = {p: (f"{p}_k" if p in _TAKEN else p) for p in model.parameters}
    glu = f"{model.agonist}_k" if model.agonist in _TAKEN else model.agonist
    comp = component_name(model)
    conducting = [s for s in model.states if model.conductance[s] > 0]
    gname = {s: f"g{s}" for s in conducting}
    for s in conducting:
        while gname[s] in set(rename.values()) | set(model.states) | {glu}:
            gname[s] = "g_" + gname[s]
    desc = [f"{model.name} (kingen export)"] + model.provenance
    if model.source:
        desc.append(f"Scheme source: {model.source}")
    desc.append(f"{glu}: the agonist concentration (mM), bound to pace. For "
                f"myokit.lib.markov, give it as vm: LinearModel.from_component("
                f"model.get('{comp}'), vm='{comp}.{glu}').")
    out = ["[[model]]", f"name: {comp}", 'desc: """']
    out += [line.replace('"""', "'''") for line in desc]
    out += ['"""', "# Initial values: the equilibrium without agonist"]
    out += [f"{comp}.{s} = {number(model.initial[s])}" for s in model.states]
    out += ["", "[engine]", "time = 0 [ms] in [ms]", "    bind time", "", f"[{comp}]",
            f"{glu} = 0 [mM] in [mM]", "    bind pace",
            "    desc: agonist concentration (input)",
            "V = -60 [mV] in [mV]", "    desc: membrane potential (held)",
            "E = 0 [mV] in [mV]", "    desc: reversal potential",
            f"nchan = {number(model.channels)} [1] in [1]", "    desc: number of channels"]
    for s in conducting:
        out += [f"{gname[s]} = {number(model.conductance[s])} [pS] in [pS]",
                f"    desc: conductance of {s}"]
    for p in model.parameters.values():
        unit = {0: "1", 1: "1/ms"}.get(p.order, "1/mM/ms")
        out.append(f"{rename[p.name]} = {number(p.value)} [{unit}] in [{unit}]")
        notes = []
        if p.derived:
            notes.append("derived: microscopic reversibility (at the exported values)")
        if p.interval is not None:
            notes.append(f"profile interval [{p.interval[0]:.6g}, {p.interval[1]:.6g}] "
                         f"{unit}")
        if p.description:
            notes.append(p.description)
        group = next((g for g in model.groups if g.param == p.name), None)
        if group is not None:
            notes.append(("Q10" if group.kind == "q10" else "activation energy, kJ/mol")
                         + f" of {', '.join(group.members)}")
        if notes:
            out.append("    desc: " + "; ".join(n.replace("\n", " ") for n in notes))

    out += _temperature_lines(model, rename)

    def rate(r) -> str:
        parts = ([] if r.factor == 1 else [number(r.factor)]) + [rename[r.param]]
        for g, x in model.parameters[r.param].powers.items():
            parts.append(f"tadj_{g}" if x == 1 else f"tadj_{g} ^ ({number(x)})")
        if r.agonist:
            parts.append(glu)
        return " * ".join(parts)

    for s in model.states:
        terms = []
        outs = [rate(r) for r in model.rates if r.source == s]
        if outs:
            terms.append(f"-({' + '.join(outs)}) * {s}")
        for r in model.rates:
            if r.target == s:
                terms.append(f"{rate(r)} * {r.source}")
        rhs = " + ".join(terms) if terms else "0"
        out += [f"dot({s}) = {rhs}".replace("+ -", "- "), "    in [1]"]
    # a sum of (factor x state) terms: LinearModel cannot read nchan * (sum of states)
    gsum = " + ".join(f"nchan * {gname[s]} * {s}" for s in conducting) or "0 [pS]"
    isum = " + ".join(f"nchan * {gname[s]} * {s} * (V - E) * 1e-3 [pA/pS/mV]"
                      for s in conducting) or "0 [pA]"
    out += [f"g = {gsum}", "    in [pS]", "    desc: conductance of all channels",
            f"i = {isum}", "    in [pA]", "    desc: current", ""]
    return "\n".join(out)
