"""Export a fit: the fitted model as a scheme file, the fitted traces as CSV and NWB.

The model export rewrites the run's own scheme file with the fitted values (in the file's
units), explicit bounds (the run's, so a refit searches the same box) and, when the fit
scaled the current, ``model.channels``; states and transitions are kept as they were. The
text is checked by parsing it with :meth:`Scheme.loads` before anything is written, and
every file is written to a temporary name and moved into place.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from kingen._version import __version__
from kingen.base.files import FITTED_MARK, atomic_write, check_replaceable
from kingen.errors import KingenError
from kingen.experiment.protocol_file import distinct_labels
from kingen.experiment.recordings import Recording, write_csv, write_nwb
from kingen.model.fields import loads_toml
from kingen.model.scheme import Scheme
from kingen.model.shipped import shipped_scheme
from kingen.model.temperature import temperature_field
from kingen.outputs.plot import safe_names
from kingen.store import RunStore, RunView, as_store

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


# --------------------------------------------------------------------------- values

# --------------------------------------------------------------------------- TOML

def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # shortest text that reads back to the same float
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dumps_toml(doc: dict[str, Any]) -> str:
    """TOML text of a scheme-like document: top-level tables of values or inline tables,
    and arrays of tables (``[[transitions]]``)."""
    lines: list[str] = []
    scalars = {k: v for k, v in doc.items() if not isinstance(v, (dict, list))
               or (isinstance(v, list) and not all(isinstance(x, dict) for x in v))}
    for k, v in scalars.items():
        lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    for k, v in doc.items():
        if k in scalars:
            continue
        if isinstance(v, dict):
            lines += ["", f"[{_toml_key(k)}]"]
            lines += [f"{_toml_key(kk)} = {_toml_value(vv)}" for kk, vv in v.items()]
        else:
            for item in v:
                lines += ["", f"[[{_toml_key(k)}]]"]
                lines += [f"{_toml_key(kk)} = {_toml_value(vv)}" for kk, vv in item.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def _leading_comments(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(line)
        elif line.strip():
            break
    return out


def choose_amplitude(run: RunView, protocol: str | None = None) -> tuple[float, str | None]:
    """(number of channels, protocol it was fitted for), or (scheme's channels, None).

    The fit's amplitude of a protocol is its number of channels: the fitted current is
    amplitude × the scheme's one-channel current. ``protocol`` picks one; by default the
    first protocol with an amplitude.
    """
    best = run.best
    amps = {} if best is None else best["amplitudes"]
    if protocol is not None:
        if protocol not in run.names:
            raise KingenError(f"unknown protocol (protocols are "
                              f"{', '.join(run.names)})", file=run.path,
                              field="protocol", value=protocol)
        if protocol not in amps:
            raise KingenError("the run stores no amplitude for this protocol",
                              file=run.path, field="protocol", value=protocol)
        return amps[protocol], protocol
    for name in run.names:
        if name in amps:
            return amps[name], name
    return run.scheme.channels, None


def _fitted(view: RunView, protocol: str | None) -> tuple:
    """What every export of a run states: the scheme, the fitted parameters and where they
    come from, the channel count and the protocol it was fitted for, the best fitness."""
    params, origin = view.fitted_params()
    amp, amp_from = choose_amplitude(view, protocol)
    fitness = math.nan if view.best is None else view.best["fitness"]
    return view.scheme, params, origin, amp, amp_from, fitness


def fitted_scheme_text(run: str | os.PathLike[str] | RunStore, *,
                       protocol: str | None = None) -> str:
    """The fitted model as scheme-file text (see :func:`export_model`)."""
    store, opened = as_store(run)
    try:
        view = RunView(store)
        scheme, params, origin, amp, amp_from, fitness = _fitted(view, protocol)
        best = view.best
        doc = loads_toml(scheme.text, scheme.path)
        values = view.in_file_units(params)
        lower, upper = (view.in_file_units(b) for b in view.bounds)
        table = doc.setdefault("parameters", {})
        for k, p in enumerate(scheme.parameters):
            if p.order == 0:  # a Q10 or activation energy: its [temperature] group's
                group, key = temperature_field(scheme, k)
                spec = doc["temperature"][group]
                spec[key] = float(values[k])
                spec["bounds"] = [float(lower[k]), float(upper[k])]
                continue
            spec = table.get(p.name)
            spec = {} if not isinstance(spec, dict) else dict(spec)
            spec["value"] = float(values[k])
            spec["unit"] = p.unit
            spec["bounds"] = [float(lower[k]), float(upper[k])]
            table[p.name] = dict(sorted(spec.items(), key=lambda kv: _FIELD_ORDER.get(kv[0], 9)))
        model = doc.setdefault("model", {})
        stem = Path(str(store.path)).name
        model["name"] = f"{scheme.name} (fitted, {stem})"
        model["channels"] = float(amp)
        when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        head = [
            f"# Fitted by kingen {__version__} on {when}",
            f"# from run file {store.path} ({store.n_generations} generations, "
            f"finished: {store.finished or 'no'}),",
            f"# {origin}, fitness {fitness:.6g}.",
            f"# Original scheme: {scheme.path}",
        ]
        if amp_from is not None:
            amps = "" if best is None else ", ".join(
                f"{k} {v:.6g}" for k, v in best["amplitudes"].items())
            head.append(f"# model.channels = {amp:.6g}: the amplitude (channels) fitted for "
                        f"protocol {amp_from!r} (all: {amps})")
        head.append("# Bounds are the run's; values and bounds in this file's units.")
        head += _interval_lines(view)
        original = _leading_comments(scheme.text)
        if original:
            head += ["#", "# The original file's header:"] + original
        text = "\n".join(head) + "\n\n" + dumps_toml(doc)
        # Never hand out a file that kingen cannot read back.
        try:
            Scheme.loads(text, path="<exported scheme>")
        except KingenError as exc:
            if "reversibility" not in str(exc):
                raise
            # A scheme without derived rates lets a fit break a cycle's balance; the file
            # must still reproduce the fit, so it says so and skips the check.
            model["check_reversibility"] = False
            head.append(f"# NOTE: the fitted rates break microscopic reversibility "
                        f"({exc.message}); model.check_reversibility is set to false.")
            text = "\n".join(head) + "\n\n" + dumps_toml(doc)
            Scheme.loads(text, path="<exported scheme>")
        return text
    finally:
        if opened:
            store.close()


def _interval_lines(view: RunView) -> list[str]:
    """Comment lines with each free rate's confidence interval and identifiability (from
    ``kingen profile``, else the local approximation at the end of the fit)."""
    from kingen.identify.table import identifiable_text

    found = view.uncertainty()
    if found is None:
        return []
    rows, what, level = found
    out = ["#", f"# {100 * level:g} % {what} intervals (this file's units):"]
    for r in rows:
        lo = "open" if r["lower"] is None else f"{r['lower']:.4g}"
        hi = "open" if r["upper"] is None else f"{r['upper']:.4g}"
        out.append(f"#   {r['name']:<10} {r['best']:<11.4g} [{lo}, {hi}] {r['unit']}  "
                   f"identifiable: {identifiable_text(r)}")
    return out


_FIELD_ORDER = {"value": 0, "unit": 1, "bounds": 2, "scale": 3, "fixed": 4, "description": 5}


def export_model(run: str | os.PathLike[str] | RunStore, out: str | os.PathLike[str], *,
                 protocol: str | None = None) -> Path:
    """Write the fitted model as a new scheme TOML file.

    Same states, transitions and bounds as the run's scheme, the fitted values, and a header
    comment saying where they came from. The current scale the fit found for ``protocol``
    (default: the first protocol with one), its number of channels, becomes
    ``model.channels``, so the file
    simulates that protocol's fitted current.

    Returns
    -------
    Path
        The file written.
    """
    path = Path(out)
    check_replaceable(path, "--model", kind="fitted scheme", inputs=_run_input(run))
    text = fitted_scheme_text(run, protocol=protocol)
    write_text_atomic(path, text)
    return path


def _run_input(run: str | os.PathLike[str] | RunStore) -> dict[str, str]:
    """The run file an export reads, as an input its outputs may never replace."""
    return {str(run.path if isinstance(run, RunStore) else run): "the run file being exported"}


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then move it into place."""

    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    atomic_write(path, write)


# --------------------------------------------------------------------------- traces

def fitted_recordings(run: RunView) -> dict[str, Recording]:
    """The best candidate's currents per protocol, as recordings (with the agonist): the
    model's own current, without a recording filter the fit compared it through."""
    best = run.best
    if best is None or not best["traces"]:
        raise KingenError("no fitted traces in the run file (the fit wrote no best "
                          "candidate yet)", file=run.path)
    protocols = {p.name: p for p in run.protocols}
    out = {}
    for name, tr in best["traces"].items():
        protocol = protocols[name]
        times = [np.asarray(t) for t in tr["time_ms"]]
        conc = [sweep.concentration(t) for sweep, t in zip(protocol.sweeps, times,
                                                               strict=False)]
        if len(conc) != len(times):
            conc = None
        holding = protocol.sweeps[0].holding if protocol.sweeps else None
        labels = [str(x) for x in tr["labels"]]
        meta = {"synthetic": FITTED_MARK,
                "kingen_run": run.path, "fitness": best["fitness"]}
        # the filter belongs to the recording: an export carries the model's own current
        fitted = tr.get("model_pA")
        if fitted is not None:
            meta["unfiltered"] = ("the model's current without the recording's filter (the "
                                  "fit compared it filtered)")
        else:
            fitted = tr["fit_pA"]
        distinct = distinct_labels(labels)
        if distinct != labels:
            renamed = ", ".join(f"sweep {k} {a!r} as {b!r}" for k, (a, b)
                                in enumerate(zip(labels, distinct, strict=True)) if a != b)
            meta["relabelled"] = (f"the run's protocol repeats sweep labels (runs made before "
                                  f"kingen labelled repeats apart); written {renamed}")
        out[name] = Recording(
            name, times, [np.asarray(y) for y in fitted], distinct,
            concentration_mM=conc, holding_mV=holding, source=run.path, meta=meta)
    return out


def export_csv(run: str | os.PathLike[str] | RunStore, out_dir: str | os.PathLike[str],
               ) -> list[Path]:
    """Write the fitted traces as one trace CSV per protocol, ``<out_dir>/<protocol>.csv``."""
    store, opened = as_store(run)
    try:
        recs = fitted_recordings(RunView(store))
        paths = [Path(out_dir) / f"{file_name}.csv" for file_name in safe_names(recs).values()]
        for path in paths:  # all checked before any is written
            check_replaceable(path, "--csv", kind="fitted csv", inputs=_run_input(store))
        for rec, path in zip(recs.values(), paths, strict=True):
            write_csv(rec, path)
        return paths
    finally:
        if opened:
            store.close()


def export_nwb(run: str | os.PathLike[str] | RunStore, out: str | os.PathLike[str], *,
               protocol: str | None = None) -> list[Path]:
    """Write the fitted traces as NWB.

    With ``protocol``, or when the run has one protocol, ``out`` is that protocol's file;
    otherwise one file per protocol, ``<out stem>_<protocol>.nwb`` beside ``out``.
    """
    store, opened = as_store(run)
    try:
        recs = fitted_recordings(RunView(store))
        base = Path(out)
        if protocol is not None:
            if protocol not in recs:
                raise KingenError(f"no fitted traces for this protocol (have "
                                  f"{', '.join(recs)})", file=str(store.path),
                                  field="protocol", value=protocol)
            recs = {protocol: recs[protocol]}
        paths = [base if len(recs) == 1 else base.with_name(
            f"{base.stem}_{file_name}{base.suffix or '.nwb'}")
            for file_name in safe_names(recs).values()]
        for path in paths:  # all checked before any is written
            check_replaceable(path, "--nwb", kind="fitted nwb", inputs=_run_input(store))
        for (name, rec), path in zip(recs.items(), paths, strict=True):
            write_nwb(rec, path, session_description=f"kingen fitted currents: {name}")
        return paths
    finally:
        if opened:
            store.close()


# --------------------------------------------------------------------------- other simulators

def profile_intervals(view: RunView) -> dict[str, tuple[float, float]]:
    """Profile-likelihood intervals per parameter (internal units) once ``kingen profile``
    has finished on the run; {} otherwise, and for intervals open on either side.

    The table (:meth:`RunView.uncertainty`) is in the model file's units; each row's
    ``file_value`` against the parameter's internal value gives the factor back.
    """
    found = view.uncertainty()
    if found is None or found[1] != "profile-likelihood":
        return {}
    values = {p.name: p.value for p in view.scheme.parameters}
    out: dict[str, tuple[float, float]] = {}
    for row in found[0]:
        lo, hi, shown = row.get("lower"), row.get("upper"), row.get("file_value")
        if lo is None or hi is None or not shown or row.get("name") not in values:
            continue
        factor = values[row["name"]] / shown
        out[row["name"]] = (float(lo) * factor, float(hi) * factor)
    return out


def export_foreign(source: str | os.PathLike[str], to: str, out: str | os.PathLike[str], *,
                   protocol: str | None = None) -> Path:
    """Write a run's fitted scheme, or a scheme file, for NEURON (``to="neuron"``, .mod) or
    Myokit (``to="myokit"``, .mmt), with the fit's provenance and profile intervals.

    ``source`` is a run file (the fitted values, the amplitude of ``protocol`` as the
    channel count) or a scheme TOML file (its own values).
    """
    from kingen.outputs.interop import EXPORTERS, export_scheme

    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    path = Path(source)
    is_scheme = path.suffix.lower() == ".toml" or (not path.is_file()
                                                   and shipped_scheme(path) is not None)
    inputs = {path: "the scheme being exported"} if is_scheme else _run_input(path)
    if to in EXPORTERS:  # before any work; an unknown format is export_scheme's to say
        check_replaceable(out, "-o", kind=to, inputs=inputs)
    if is_scheme:
        scheme = Scheme.load(path)
        lines = [f"Exported by kingen {__version__} on {when} from scheme file {scheme.path} "
                 f"(the file's values)."]
        return export_scheme(scheme, to, out, provenance=lines)
    store, opened = as_store(source)
    try:
        view = RunView(store)
        scheme, params, origin, amp, amp_from, fitness = _fitted(view, protocol)
        lines = [f"Fitted by kingen; exported by kingen {__version__} on {when}.",
                 f"Run file {store.path} (created {store.created or '?'}, "
                 f"{store.n_generations} generations, finished: {store.finished or 'no'}).",
                 f"Values: {origin}; error (fitness) {fitness:.6g}.",
                 f"Original scheme: {scheme.path}."]
        if amp_from is not None:
            lines.append(f"nchan = {amp:.6g}: the amplitude (channels) fitted for protocol "
                         f"{amp_from!r}.")
        intervals = profile_intervals(view)
        if intervals:
            lines.append("Profile-likelihood intervals of the run are given beside each rate.")
        return export_scheme(scheme, to, out, params=params, channels=amp, provenance=lines,
                             intervals=intervals, inputs=inputs)
    finally:
        if opened:
            store.close()


__all__ = ["dumps_toml", "export_csv", "export_foreign", "export_model", "export_nwb",
           "fitted_recordings", "fitted_scheme_text", "profile_intervals"]
