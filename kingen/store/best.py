"""The run file's best candidate, written from its genes: at the end of a fit, and again
when ``kingen profile`` finds a better one.

:func:`write_best` computes what :meth:`~kingen.store.runstore.RunStore.write_best` stores
(errors, amplitudes, traces and features of the candidate) and writes it, with the
record of how it was found (``best/polish``: the objective, the noise model, the
refinement). :func:`update_best` replaces the best with a better one and adds a note to that
record: what found it, when, and the old and new χ² and parameters. The report, the plots
and the exports read the best from the run file, so they follow.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import numpy as np

from kingen.errors import KingenError


def write_best(store: Any, objective: Any, pmap: Any, genes: np.ndarray, fitness: float,
               record: dict[str, Any] | None) -> None:
    """Write the candidate ``genes`` (of ``pmap``) as the run's best, with ``fitness`` (its
    χ²) and ``record`` (see :func:`kingen.identify.refine.finish`), through ``store``
    (a :class:`~kingen.store.runstore.RunStore` open for writing)."""
    params = pmap.to_params(np.asarray(genes, dtype=float)[None, :])[0]
    ev, _ = objective.evaluate(params[None, :])
    errors = {n: float(e) for n, e in zip(objective.names, ev.errors[0], strict=True)}
    traces, amps = objective.traces(params)
    store.write_best(params=params, fitness=float(fitness), errors=errors, amplitudes=amps,
                     traces=traces, features=features_of(objective, traces), polish=record)


def update_best(store: Any, objective: Any, pmap: Any, genes: np.ndarray, chi2: float,
                what: str) -> dict[str, Any]:
    """Replace the run's best by ``genes`` (χ² ``chi2``, lower than the best's) and note it
    in the best's record; returns the note.

    Raises
    ------
    KingenError
        If the run has no best, or ``chi2`` is not lower than its fitness.
    """
    old = store.best()
    if old is None or not chi2 < old["fitness"]:
        raise KingenError("no better best to write", file=str(store.path), field="/best")
    record = dict(old.get("polish") or {})
    new_params = pmap.to_params(np.asarray(genes, dtype=float)[None, :])[0]
    names = list(objective.scheme.param_names)
    note = {"what": what, "when": _dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"), "old_fitness": float(old["fitness"]), "new_fitness": float(chi2),
        "old_params": dict(zip(names, map(float, old["params"]), strict=True)),
        "new_params": dict(zip(names, map(float, new_params), strict=True))}
    record["updates"] = list(record.get("updates") or []) + [note]
    record["chi2_after"] = float(chi2)
    write_best(store, objective, pmap, genes, chi2, record)
    return note


def features_of(objective: Any, traces: dict[str, dict]) -> dict[str, dict]:
    """Features of the fit and of the data (or its targets) per protocol, from
    :meth:`~kingen.fitting.objective.Objective.traces`; a protocol whose features cannot
    be measured gets none."""
    from kingen.experiment.features import protocol_features

    out: dict[str, dict] = {}
    for item in objective.items:
        name = item.protocol.name
        tr = traces[name]
        entry: dict[str, dict] = {}
        try:
            entry["fit"] = protocol_features(item.protocol, tr["time_ms"], tr["fit_pA"])
            if tr["data_pA"] is not None:
                entry["data"] = protocol_features(item.protocol, tr["time_ms"], tr["data_pA"])
            elif item.targets is not None:
                entry["data"] = item.targets.values()
        except KingenError:
            pass
        out[name] = entry
    return out
