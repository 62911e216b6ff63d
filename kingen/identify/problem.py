"""The fit's problem rebuilt from its run file: the objective, the genes, the best and the
hall of fame, from what the run file stores (never from the data files on disk, which may
have moved or changed since)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.experiment.chain import Chain
from kingen.fitting.objective import Objective, ProtocolData
from kingen.fitting.params import ParameterMap
from kingen.solve.options import SolverOptions
from kingen.solve.schedule import DEFAULT_COURANT


@dataclass
class Problem:
    """What a profile needs of a finished fit."""

    objective: Objective
    pmap: ParameterMap
    best_genes: np.ndarray
    hof_genes: np.ndarray
    settings: dict[str, Any]


def rebuild(store: Any, backend: str | None = None) -> Problem:
    """The :class:`Problem` of a run file open for reading (a :class:`~kingen.store.RunStore`).

    Raises
    ------
    KingenError
        If the run has no finished fit, or its stored settings do not describe the problem.
    """
    name = str(store.path)
    best = store.best()
    if best is None or not store.finished:
        raise KingenError("the run file holds no finished fit (no best candidate yet): let "
                          "kingen fit or kingen resume run to its end first", file=name)
    settings = store.config
    scheme = store.scheme()
    table = store.parameter_table()
    names = list(table["name"])
    if names != scheme.param_names:
        raise KingenError("inconsistent run file: the parameter table does not match the "
                          "scheme", file=name, field="/scheme/parameters")
    params = [replace(p, value=float(table["value"][i]), lower=float(table["lower"][i]),
                      upper=float(table["upper"][i]), fixed=bool(table["fixed"][i]),
                      scale=str(table["scale"][i]))
              for i, p in enumerate(scheme.parameters)]
    scheme = replace(scheme, parameters=params)
    ties = {str(k): (str(v[0]), float(v[1])) for k, v in settings.get("ties", {}).items()}
    pmap = ParameterMap(scheme, ties)
    if pmap.gene_names != list(settings.get("free", pmap.gene_names)):
        raise KingenError("inconsistent run file: the free parameters of its settings and "
                          "of its parameter table differ", file=name, field="/config/settings",
                          value=settings.get("free"))
    recordings, targets = store.recordings(), store.targets()
    chains = store.chains()
    items = []
    by_name = {p.get("name"): p for p in settings.get("protocols", [])}
    for protocol in store.protocols():
        s = by_name.get(protocol.name, {})
        items.append(ProtocolData(
            protocol=protocol, recording=recordings.get(protocol.name),
            targets=targets.get(protocol.name), weight=float(s.get("weight", 1.0)),
            amplitude=None if s.get("amplitude") is None else float(s["amplitude"]),
            mask=[(float(a), float(b)) for a, b in s.get("mask", [])],
            baseline=str(s.get("baseline", "none")), source=name,
            chain=chains.get(protocol.name, Chain())))
    objective = Objective(scheme, items, SolverOptions(
        backend=backend or "auto", precision=settings.get("precision", "float64"),
        step=settings.get("step"), courant=float(settings.get("courant", DEFAULT_COURANT))))
    best_genes = pmap.clip(pmap.to_genes(np.asarray(best["params"]))[0])
    hof = store.hall_of_fame()
    hof_genes = (pmap.clip(pmap.to_genes(hof[0])) if hof is not None
                 else np.zeros((0, pmap.n_genes)))
    return Problem(objective, pmap, best_genes, hof_genes, settings)
