"""Encoding of the run's inputs as HDF5 groups and back: the scheme, the protocols, the
recordings and the summary targets.
"""

from __future__ import annotations

import json
import math

import h5py
import numpy as np

from kingen.experiment.exchange import restore_exchange
from kingen.experiment.protocol import Protocol, Pulse, Sweep, Transient
from kingen.experiment.recordings import (
    DoseResponseTable,
    Recording,
    RecoveryTable,
    Target,
    Targets,
)
from kingen.fitting.params import file_factors
from kingen.model.scheme import Scheme
from kingen.store.datasets import (
    TEXT,
    as_text,
    dumps,
    load,
    make_dataset,
    make_table,
    make_text_dataset,
    padded,
    strings,
)


def write_scheme(g: h5py.Group, s: Scheme) -> None:
    """Write a scheme (its file text, states, parameters, transitions) into ``g``."""
    g.attrs.update({"name": s.name, "source": s.source, "path": s.path, "agonist": s.agonist,
                    "channels": s.channels, "file_units": dumps(s.file_units),
                    "reversibility_tolerance": s.reversibility_tolerance})
    make_text_dataset(g, "text", s.text)
    g["text"].attrs["description"] = "the scheme file as read; Scheme.loads(text) rebuilds it"
    init = s.initial if s.initial is not None else np.full(s.n_states, np.nan)
    make_table(g, "states", [("name", s.states, TEXT), ("conductance", s.conductance, "f8"),
                         ("initial", init, "f8")], s.n_states,
           {"conductance": "pS", "initial": "1"}, "initial NaN: equilibrium at zero agonist")
    pars = s.parameters
    fac = file_factors(s)
    make_table(g, "parameters", [
        ("name", [p.name for p in pars], TEXT),
        ("value", s.values, "f8"), ("lower", s.lower, "f8"), ("upper", s.upper, "f8"),
        ("unit", [p.internal_unit for p in pars], TEXT),
        ("file_value", s.values / fac, "f8"), ("file_lower", s.lower / fac, "f8"),
        ("file_upper", s.upper / fac, "f8"), ("file_unit", [p.unit for p in pars], TEXT),
        ("order", [p.order for p in pars], "i4"), ("scale", [p.scale for p in pars], TEXT),
        ("fixed", [p.fixed for p in pars], "?"), ("derived", [p.derived for p in pars], "?"),
    ], s.n_params, {"value": "see column unit", "file_value": "see column file_unit"},
        "value/lower/upper in internal units; file_* in the scheme file's units")
    ts = s.transitions
    make_table(g, "transitions", [
        ("source", [s.states[t.source] for t in ts], TEXT),
        ("target", [s.states[t.target] for t in ts], TEXT),
        ("rate", [t.expression for t in ts], TEXT),
        ("factor", [t.factor for t in ts], "f8"),
        ("param", [s.parameters[t.param].name for t in ts], TEXT),
        ("agonist", [t.agonist for t in ts], "?"), ("derived", [t.derived for t in ts], "?"),
    ], len(ts), doc="rate = factor * param [* agonist concentration]")


def write_protocol(g: h5py.Group, p: Protocol) -> None:
    """Write a protocol (its settings and sweeps) into ``g``."""
    g.attrs.update({"name": p.name, "kind": p.kind, "source": p.source,
                    "meta": dumps(p.meta)})
    sw = p.sweeps
    make_table(g, "sweeps", [
        ("label", [s.label for s in sw], TEXT), ("duration", [s.duration for s in sw], "f8"),
        ("dt", [s.dt for s in sw], "f8"), ("holding", [s.holding for s in sw], "f8"),
        ("reversal", [s.reversal for s in sw], "f8"),
        ("x", [np.nan if s.x is None else s.x for s in sw], "f8"),
    ], len(sw), {"duration": "ms", "dt": "ms", "holding": "mV", "reversal": "mV",
                 "x": "ms (recovery interval) or mM (dose); NaN: none"})
    pulses = [(i, q) for i, s in enumerate(sw) for q in s.pulses]
    make_table(g, "pulses", [
        ("sweep", [i for i, _ in pulses], "i4"), ("start", [q.start for _, q in pulses], "f8"),
        ("duration", [q.duration for _, q in pulses], "f8"),
        ("concentration", [q.concentration for _, q in pulses], "f8"),
        ("rise", [q.rise for _, q in pulses], "f8"), ("decay", [q.decay for _, q in pulses], "f8"),
    ], len(pulses), {"start": "ms", "duration": "ms", "concentration": "mM",
                     "rise": "ms (10-90 %)", "decay": "ms (10-90 %)"})
    trs = [(i, q) for i, s in enumerate(sw) for q in s.transients]
    make_table(g, "transients", [
        ("sweep", [i for i, _ in trs], "i4"), ("start", [q.start for _, q in trs], "f8"),
        ("peak", [q.peak for _, q in trs], "f8"),
        ("tau_decay", [q.tau_decay for _, q in trs], "f8"),
        ("tau_rise", [q.tau_rise for _, q in trs], "f8"),
    ], len(trs), {"start": "ms", "peak": "mM", "tau_decay": "ms", "tau_rise": "ms"})


def read_protocol(g: h5py.Group) -> Protocol:
    """The protocol :func:`write_protocol` wrote into ``g``."""
    sweeps = load(g["sweeps"])
    pulses = load(g["pulses"])
    trs = load(g["transients"])
    out = []
    for i, row in enumerate(sweeps):
        ps = tuple(Pulse(float(q["start"]), float(q["duration"]), float(q["concentration"]),
                         float(q["rise"]), float(q["decay"])) for q in pulses if q["sweep"] == i)
        ts = tuple(Transient(float(q["start"]), float(q["peak"]), float(q["tau_decay"]),
                             float(q["tau_rise"])) for q in trs if q["sweep"] == i)
        x = float(row["x"])
        out.append(Sweep(as_text(row["label"]), float(row["duration"]), float(row["dt"]), ps, ts,
                         float(row["holding"]), float(row["reversal"]),
                         None if math.isnan(x) else x))
    # measured exchange edges travel in the meta (kingen.experiment.exchange)
    return restore_exchange(Protocol(as_text(g.attrs["name"]), as_text(g.attrs["kind"]),
                                     tuple(out),
                                     source=as_text(g.attrs.get("source", "<built-in>")),
                                     meta=json.loads(as_text(g.attrs.get("meta", "{}")))))


def write_recording(g: h5py.Group, name: str, rec: Recording) -> None:
    """Write the recording of protocol ``name`` into ``g``."""
    times = rec.times_list()
    width = max((t.size for t in times), default=0)
    g.attrs.update({"protocol": name, "source": rec.source,
                    "recording_protocol": rec.protocol or "",
                    "holding_mV": np.nan if rec.holding_mV is None else rec.holding_mV,
                    "meta": dumps({k: v for k, v in rec.meta.items()}),
                    "labelled": bool(rec.labelled)})
    make_dataset(g, "labels", strings(rec.sweep_labels))
    make_dataset(g, "n_samples", np.array([t.size for t in times], dtype=np.int64))
    for ds_name, rows, unit in (("time_ms", times, "ms"),
                                ("current_pA", rec.currents_list(), "pA")):
        make_dataset(g, ds_name, padded(rows, width), compress=True)
        g[ds_name].attrs["unit"] = unit
    if rec.concentration_mM is not None:
        concs = [np.asarray(rec.sweep_concentration(i)) for i in range(rec.n_sweeps)]
        make_dataset(g, "concentration_mM", padded(concs, width), compress=True)
        g["concentration_mM"].attrs["unit"] = "mM"
    g.attrs["description"] = "one row per sweep, NaN padded; n_samples gives each length"


def read_recording(g: h5py.Group) -> Recording:
    """The recording :func:`write_recording` wrote into ``g``."""
    n = load(g["n_samples"])
    labels = [as_text(v) for v in load(g["labels"])]

    def rows(name: str) -> list[np.ndarray]:
        a = load(g[name])
        return [a[i, : n[i]] for i in range(len(n))]

    hold = float(g.attrs.get("holding_mV", np.nan))
    return Recording(as_text(g.attrs.get("recording_protocol", "")) or None, rows("time_ms"),
                     rows("current_pA"), labels,
                     rows("concentration_mM") if "concentration_mM" in g else None,
                     None if math.isnan(hold) else hold, as_text(g.attrs.get("source", "")),
                     json.loads(as_text(g.attrs.get("meta", "{}"))),
                     # older files paired by label only where both sets of labels agree
                     labelled=bool(g.attrs.get("labelled", False)))


def write_targets(g: h5py.Group, name: str, t: Targets) -> None:
    """Write the summary targets of protocol ``name`` into ``g``."""
    g.attrs["protocol"] = name
    g.attrs["sources"] = dumps(t.sources)
    feats = list(t.features.items())
    make_table(g, "features", [
        ("name", [k for k, _ in feats], TEXT), ("value", [v.value for _, v in feats], "f8"),
        ("weight", [v.weight for _, v in feats], "f8"),
        ("sd", [np.nan if v.sd is None else v.sd for _, v in feats], "f8"),
    ], len(feats), doc="value and sd in the unit of the feature name's suffix (internal)")
    if t.dose_response is not None:
        d = t.dose_response
        ss = np.full(len(d.concentration_mM), np.nan) if d.ss_pA is None else d.ss_pA
        make_table(g, "dose_response", [("concentration", d.concentration_mM, "f8"),
                                    ("peak", d.peak_pA, "f8"), ("ss", ss, "f8")],
                   len(d.concentration_mM), {"concentration": "mM", "peak": "pA", "ss": "pA"})
    if t.recovery is not None:
        r = t.recovery
        make_table(g, "recovery", [("interval", r.interval_ms, "f8"), ("ratio", r.ratio, "f8")],
                   len(r.interval_ms), {"interval": "ms", "ratio": "1"})


def read_targets(g: h5py.Group) -> Targets:
    """The targets :func:`write_targets` wrote into ``g``."""
    feats = {}
    for row in load(g["features"]):
        sd = float(row["sd"])
        feats[as_text(row["name"])] = Target(float(row["value"]), float(row["weight"]),
                                             None if math.isnan(sd) else sd)
    dose = rec = None
    if "dose_response" in g:
        d = load(g["dose_response"])
        ss = np.asarray(d["ss"], dtype=float)
        dose = DoseResponseTable(np.asarray(d["concentration"], dtype=float),
                                 np.asarray(d["peak"], dtype=float),
                                 None if np.all(np.isnan(ss)) else ss)
    if "recovery" in g:
        r = load(g["recovery"])
        rec = RecoveryTable(np.asarray(r["interval"], dtype=float),
                            np.asarray(r["ratio"], dtype=float))
    return Targets(feats, dose, rec, json.loads(as_text(g.attrs.get("sources", "[]"))))
