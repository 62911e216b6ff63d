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
    _STR,
    _dataset,
    _dumps,
    _load,
    _padded,
    _strings,
    _table,
    _text,
    _text_dataset,
)


def _write_scheme(g: h5py.Group, s: Scheme) -> None:
    g.attrs.update({"name": s.name, "source": s.source, "path": s.path, "agonist": s.agonist,
                    "channels": s.channels, "file_units": _dumps(s.file_units),
                    "reversibility_tolerance": s.reversibility_tolerance})
    _text_dataset(g, "text", s.text)
    g["text"].attrs["description"] = "the scheme file as read; Scheme.loads(text) rebuilds it"
    init = s.initial if s.initial is not None else np.full(s.n_states, np.nan)
    _table(g, "states", [("name", s.states, _STR), ("conductance", s.conductance, "f8"),
                         ("initial", init, "f8")], s.n_states,
           {"conductance": "pS", "initial": "1"}, "initial NaN: equilibrium at zero agonist")
    pars = s.parameters
    fac = file_factors(s)
    _table(g, "parameters", [
        ("name", [p.name for p in pars], _STR),
        ("value", s.values, "f8"), ("lower", s.lower, "f8"), ("upper", s.upper, "f8"),
        ("unit", [p.internal_unit for p in pars], _STR),
        ("file_value", s.values / fac, "f8"), ("file_lower", s.lower / fac, "f8"),
        ("file_upper", s.upper / fac, "f8"), ("file_unit", [p.unit for p in pars], _STR),
        ("order", [p.order for p in pars], "i4"), ("scale", [p.scale for p in pars], _STR),
        ("fixed", [p.fixed for p in pars], "?"), ("derived", [p.derived for p in pars], "?"),
    ], s.n_params, {"value": "see column unit", "file_value": "see column file_unit"},
        "value/lower/upper in internal units; file_* in the scheme file's units")
    ts = s.transitions
    _table(g, "transitions", [
        ("source", [s.states[t.source] for t in ts], _STR),
        ("target", [s.states[t.target] for t in ts], _STR),
        ("rate", [t.expression for t in ts], _STR),
        ("factor", [t.factor for t in ts], "f8"),
        ("param", [s.parameters[t.param].name for t in ts], _STR),
        ("agonist", [t.agonist for t in ts], "?"), ("derived", [t.derived for t in ts], "?"),
    ], len(ts), doc="rate = factor * param [* agonist concentration]")


def _write_protocol(g: h5py.Group, p: Protocol) -> None:
    g.attrs.update({"name": p.name, "kind": p.kind, "source": p.source,
                    "meta": _dumps(p.meta)})
    sw = p.sweeps
    _table(g, "sweeps", [
        ("label", [s.label for s in sw], _STR), ("duration", [s.duration for s in sw], "f8"),
        ("dt", [s.dt for s in sw], "f8"), ("holding", [s.holding for s in sw], "f8"),
        ("reversal", [s.reversal for s in sw], "f8"),
        ("x", [np.nan if s.x is None else s.x for s in sw], "f8"),
    ], len(sw), {"duration": "ms", "dt": "ms", "holding": "mV", "reversal": "mV",
                 "x": "ms (recovery interval) or mM (dose); NaN: none"})
    pulses = [(i, q) for i, s in enumerate(sw) for q in s.pulses]
    _table(g, "pulses", [
        ("sweep", [i for i, _ in pulses], "i4"), ("start", [q.start for _, q in pulses], "f8"),
        ("duration", [q.duration for _, q in pulses], "f8"),
        ("concentration", [q.concentration for _, q in pulses], "f8"),
        ("rise", [q.rise for _, q in pulses], "f8"), ("decay", [q.decay for _, q in pulses], "f8"),
    ], len(pulses), {"start": "ms", "duration": "ms", "concentration": "mM",
                     "rise": "ms (10-90 %)", "decay": "ms (10-90 %)"})
    trs = [(i, q) for i, s in enumerate(sw) for q in s.transients]
    _table(g, "transients", [
        ("sweep", [i for i, _ in trs], "i4"), ("start", [q.start for _, q in trs], "f8"),
        ("peak", [q.peak for _, q in trs], "f8"),
        ("tau_decay", [q.tau_decay for _, q in trs], "f8"),
        ("tau_rise", [q.tau_rise for _, q in trs], "f8"),
    ], len(trs), {"start": "ms", "peak": "mM", "tau_decay": "ms", "tau_rise": "ms"})


def _read_protocol(g: h5py.Group) -> Protocol:
    sweeps = _load(g["sweeps"])
    pulses = _load(g["pulses"])
    trs = _load(g["transients"])
    out = []
    for i, row in enumerate(sweeps):
        ps = tuple(Pulse(float(q["start"]), float(q["duration"]), float(q["concentration"]),
                         float(q["rise"]), float(q["decay"])) for q in pulses if q["sweep"] == i)
        ts = tuple(Transient(float(q["start"]), float(q["peak"]), float(q["tau_decay"]),
                             float(q["tau_rise"])) for q in trs if q["sweep"] == i)
        x = float(row["x"])
        out.append(Sweep(_text(row["label"]), float(row["duration"]), float(row["dt"]), ps, ts,
                         float(row["holding"]), float(row["reversal"]),
                         None if math.isnan(x) else x))
    # measured exchange edges travel in the meta (kingen.experiment.exchange)
    return restore_exchange(Protocol(_text(g.attrs["name"]), _text(g.attrs["kind"]),
                                     tuple(out),
                                     source=_text(g.attrs.get("source", "<built-in>")),
                                     meta=json.loads(_text(g.attrs.get("meta", "{}")))))


def _write_recording(g: h5py.Group, name: str, rec: Recording) -> None:
    times = rec.times_list()
    width = max((t.size for t in times), default=0)
    g.attrs.update({"protocol": name, "source": rec.source,
                    "recording_protocol": rec.protocol or "",
                    "holding_mV": np.nan if rec.holding_mV is None else rec.holding_mV,
                    "meta": _dumps({k: v for k, v in rec.meta.items()}),
                    "labelled": bool(rec.labelled)})
    _dataset(g, "labels", _strings(rec.sweep_labels))
    _dataset(g, "n_samples", np.array([t.size for t in times], dtype=np.int64))
    for ds_name, rows, unit in (("time_ms", times, "ms"),
                                ("current_pA", rec.currents_list(), "pA")):
        _dataset(g, ds_name, _padded(rows, width), compress=True)
        g[ds_name].attrs["unit"] = unit
    if rec.concentration_mM is not None:
        concs = [np.asarray(rec.sweep_concentration(i)) for i in range(rec.n_sweeps)]
        _dataset(g, "concentration_mM", _padded(concs, width), compress=True)
        g["concentration_mM"].attrs["unit"] = "mM"
    g.attrs["description"] = "one row per sweep, NaN padded; n_samples gives each length"


def _read_recording(g: h5py.Group) -> Recording:
    n = _load(g["n_samples"])
    labels = [_text(v) for v in _load(g["labels"])]

    def rows(name: str) -> list[np.ndarray]:
        a = _load(g[name])
        return [a[i, : n[i]] for i in range(len(n))]

    hold = float(g.attrs.get("holding_mV", np.nan))
    return Recording(_text(g.attrs.get("recording_protocol", "")) or None, rows("time_ms"),
                     rows("current_pA"), labels,
                     rows("concentration_mM") if "concentration_mM" in g else None,
                     None if math.isnan(hold) else hold, _text(g.attrs.get("source", "")),
                     json.loads(_text(g.attrs.get("meta", "{}"))),
                     # older files paired by label only where both sets of labels agree
                     labelled=bool(g.attrs.get("labelled", False)))


def _write_targets(g: h5py.Group, name: str, t: Targets) -> None:
    g.attrs["protocol"] = name
    g.attrs["sources"] = _dumps(t.sources)
    feats = list(t.features.items())
    _table(g, "features", [
        ("name", [k for k, _ in feats], _STR), ("value", [v.value for _, v in feats], "f8"),
        ("weight", [v.weight for _, v in feats], "f8"),
        ("sd", [np.nan if v.sd is None else v.sd for _, v in feats], "f8"),
    ], len(feats), doc="value and sd in the unit of the feature name's suffix (internal)")
    if t.dose_response is not None:
        d = t.dose_response
        ss = np.full(len(d.concentration_mM), np.nan) if d.ss_pA is None else d.ss_pA
        _table(g, "dose_response", [("concentration", d.concentration_mM, "f8"),
                                    ("peak", d.peak_pA, "f8"), ("ss", ss, "f8")],
               len(d.concentration_mM), {"concentration": "mM", "peak": "pA", "ss": "pA"})
    if t.recovery is not None:
        r = t.recovery
        _table(g, "recovery", [("interval", r.interval_ms, "f8"), ("ratio", r.ratio, "f8")],
               len(r.interval_ms), {"interval": "ms", "ratio": "1"})


def _read_targets(g: h5py.Group) -> Targets:
    feats = {}
    for row in _load(g["features"]):
        sd = float(row["sd"])
        feats[_text(row["name"])] = Target(float(row["value"]), float(row["weight"]),
                                           None if math.isnan(sd) else sd)
    dose = rec = None
    if "dose_response" in g:
        d = _load(g["dose_response"])
        ss = np.asarray(d["ss"], dtype=float)
        dose = DoseResponseTable(np.asarray(d["concentration"], dtype=float),
                                 np.asarray(d["peak"], dtype=float),
                                 None if np.all(np.isnan(ss)) else ss)
    if "recovery" in g:
        r = _load(g["recovery"])
        rec = RecoveryTable(np.asarray(r["interval"], dtype=float),
                            np.asarray(r["ratio"], dtype=float))
    return Targets(feats, dose, rec, json.loads(_text(g.attrs.get("sources", "[]"))))
