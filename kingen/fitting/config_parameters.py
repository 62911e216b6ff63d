"""A fit configuration's ``[parameters]`` table: which rates are free, fixed or tied, and
each one's value, bounds and scale (in the scheme file's units), applied to the scheme.
"""

from __future__ import annotations

from typing import Any

from kingen.fitting.config_protocols import ConfigFields
from kingen.fitting.params import apply_overrides, apply_ties
from kingen.model.scheme import Scheme, check_rate_range

PARAMETER_KEYS = {"bounds", "value", "scale", "fixed"}


def read_parameters(c: ConfigFields, t: dict, scheme: Scheme
                    ) -> tuple[Scheme, dict[str, tuple[str, float]]]:
    """The scheme with the ``[parameters]`` table ``t`` applied, and the ties by name."""
    names = scheme.param_names
    reserved = {"free", "fixed", "tied"}

    def known(name: Any, where: str) -> str:
        if not isinstance(name, str) or name not in names:
            raise c.error(f"unknown parameter (parameters are {', '.join(names)})", where, name)
        return name

    def name_list(key: str) -> list[str] | None:
        if key not in t:
            return None
        v = t[key]
        if not isinstance(v, list):
            raise c.error("must be a list of parameter names", f"parameters.{key}", v)
        return [known(x, f"parameters.{key}") for x in v]

    overrides: dict[str, dict] = {}
    for key, spec in t.items():
        if key in reserved:
            continue
        where = f"parameters.{key}"
        known(key, where)
        if not isinstance(spec, dict):
            raise c.error("must be a table such as { bounds = [1, 100] }", where, spec)
        c.keys(spec, PARAMETER_KEYS, where)
        o: dict[str, Any] = {}
        if "bounds" in spec:
            o["bounds"] = c.numbers(spec, "bounds", where, length=2, gt=0.0)
        if "value" in spec:
            o["value"] = c.number(spec, "value", where, gt=0.0)
        if "scale" in spec:
            o["scale"] = c.choice(spec, "scale", ("log", "linear"), where)
        if "fixed" in spec:
            o["fixed"] = c.boolean(spec, "fixed", where)
        overrides[key] = o
    free = name_list("free")
    fixed = name_list("fixed") or []
    derived = {p.name for p in scheme.parameters if p.derived}
    for n in fixed + (free or []):
        if n in derived:
            raise c.error("is derived (computed for microscopic reversibility); it cannot be "
                          "listed as free or fixed", "parameters", n)
    if free is not None:
        for p in scheme.parameters:
            if not p.derived:
                overrides.setdefault(p.name, {})["fixed"] = p.name not in free
    for n in fixed:
        if free is not None and n in free:
            raise c.error("listed both as free and as fixed", "parameters.fixed", n)
        overrides.setdefault(n, {})["fixed"] = True
    scheme = apply_overrides(scheme, overrides, file=c.file)

    ties: dict[str, tuple[str, float]] = {}
    raw = c.table(t, "tied", "parameters")
    for target, spec in raw.items():
        where = f"parameters.tied.{target}"
        known(target, where)
        if isinstance(spec, str):
            source, factor = spec, 1.0
        elif isinstance(spec, dict):
            c.keys(spec, {"to", "factor"}, where)
            source = spec.get("to")
            factor = c.number(spec, "factor", where, 1.0, gt=0.0)
        else:
            raise c.error("must be a parameter name or { to = \"k_a\", factor = 2 }", where,
                          spec)
        known(source, f"{where}.to")
        ps = {p.name: p for p in scheme.parameters}
        if source == target:
            raise c.error("a parameter cannot be tied to itself", where, source)
        if ps[target].derived or ps[source].derived:
            raise c.error("derived parameters cannot be tied", where, source)
        if source in raw:
            raise c.error("tied to a parameter that is itself tied", where, source)
        if ps[target].order != ps[source].order:
            raise c.error("tied to a parameter of another order (a binding rate and a "
                          "first-order rate)", where, source)
        for bound in (ps[source].lower * factor, ps[source].upper * factor):
            check_rate_range(bound, ps[target].internal_unit, file=c.file,
                             field=f"{where}.factor", value=factor,
                             what="with the bounds of the rate it is tied to")
        ties[target] = (source, factor)
    if ties:
        scheme = apply_ties(scheme, ties)
    return scheme, ties
