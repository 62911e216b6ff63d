"""NWB (Neurodata Without Borders) recordings: :func:`read_nwb` and :func:`write_nwb`, through
pynwb (the ``nwb`` extra).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from kingen.base.files import atomic_write
from kingen.errors import KingenError
from kingen.experiment.recordings.types import (
    Recording,
    check_label,
    check_sweep,
    install_hint,
    optional_module,
)
from kingen.model import units

NWB_INSTALL = install_hint("pynwb", "nwb")


# --------------------------------------------------------------------------- NWB


_AMPERE_NAMES = ("amperes", "ampere", "amps", "amp", "a")


def _to_pA(unit: str, conversion: float, offset: float, file: str, where: str
           ) -> tuple[float, float]:
    """(factor, offset) that turn stored data into pA: pA = data * factor + offset."""
    text = str(unit).strip()
    base = 1e12 if text.lower() in _AMPERE_NAMES else units.factor(
        "current", text, file=file, field=f"{where}.unit")
    factor, shift = conversion * base, offset * base
    if not (math.isfinite(factor) and math.isfinite(shift)):
        raise KingenError("conversion or offset is not a finite number once in pA", file=file,
                          field=f"{where}.conversion", value=conversion)
    return factor, shift


def _stored_unit(series: Any) -> str:
    """The unit as stored in the file: pynwb reports a VoltageClampSeries' fixed unit
    ('amperes') whatever the file says, so a file in furlongs would pass unseen."""
    attrs = getattr(getattr(series, "data", None), "attrs", None)
    unit = attrs.get("unit") if attrs is not None else None
    if isinstance(unit, bytes):
        unit = unit.decode("utf-8", "replace")
    return str(unit if unit is not None else series.unit)


def _numbers(data: Any, file: str, where: str) -> np.ndarray:
    """A stored dataset as floats, refusing text and other non-numbers."""
    try:
        return np.asarray(data[:], dtype=float)
    except (ValueError, TypeError):
        dtype = getattr(data, "dtype", type(data).__name__)
        raise KingenError(f"not numbers (stored as {dtype})", file=file,
                          field=where) from None


def _series_time_s(series: Any, n: int, file: str = "<nwb>", where: str = "series"
                   ) -> np.ndarray:
    """Absolute sample times of a TimeSeries, s."""
    if series.timestamps is not None:
        return _numbers(series.timestamps, file, f"{where}.timestamps")
    rate = float(series.rate)
    if not (math.isfinite(rate) and rate > 0):
        raise KingenError("sampling rate must be a finite number > 0 Hz", file=file,
                          field=f"{where}.rate", value=rate)
    start = float(series.starting_time or 0.0)
    if not math.isfinite(start):
        raise KingenError("must be a finite number", file=file,
                          field=f"{where}.starting_time", value=start)
    return start + np.arange(n) / rate


def _relative_time_ms(series: Any, t_abs: np.ndarray) -> np.ndarray:
    """Times from the sweep's first sample, ms.

    For a regular series this is ``k * (1000 / rate)``, not a difference of absolute times:
    a sweep that starts seconds into the file would otherwise carry rounding errors that
    make identical sampling grids differ.
    """
    if series.timestamps is None and series.rate:
        return np.arange(t_abs.size) * (1e3 / float(series.rate))
    return (t_abs - t_abs[0]) * 1e3


def read_nwb(path: str | os.PathLike[str]) -> Recording:
    """Read voltage-clamp sweeps and the agonist stimulus from an NWB file.

    Sweeps are the ``VoltageClampSeries`` responses of the intracellular-recordings table,
    in its row order, or else every ``VoltageClampSeries`` in ``/acquisition`` ordered by
    sweep number and name. Each is converted with its ``conversion``/``offset`` to pA; its
    time (``starting_time``/``rate`` or ``timestamps``) to ms from the sweep's start. The
    agonist concentration of a sweep is the ``/stimulus`` ``TimeSeries`` named in the
    table's ``agonist`` column, or else named ``agonist_<label>``, or else the n-th
    concentration-unit stimulus when there is one per sweep; it is interpolated onto the
    current's sample times.
    """
    name = str(path)
    pynwb = optional_module("pynwb", "nwb", name)
    try:
        io_ = pynwb.NWBHDF5IO(name, "r")
        nwb = io_.read()
    except UnicodeDecodeError as exc:  # hdmf does not say where: found here
        raise KingenError(f"not valid UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                          f"position {exc.start})", file=name,
                          field=_undecodable(name)) from None
    except Exception as exc:  # noqa: BLE001 -- h5py/hdmf raise many types on a bad file
        raise KingenError(f"cannot read NWB: {type(exc).__name__}: {exc}", file=name) from None
    try:
        return _recording_from_nwb(nwb, name, pynwb)
    finally:
        io_.close()


def _undecodable(path: str) -> str | None:
    """The first text of an HDF5 file that is not UTF-8: a dataset of text (``general/notes``)
    or an attribute (``acquisition/current_0.comments``)."""
    import h5py

    found: list[str] = []

    def bad(value: Any) -> bool:
        # h5py hands text over as bytes, which hdmf decodes
        for item in np.ravel(value) if isinstance(value, np.ndarray) else [value]:
            try:
                if isinstance(item, bytes):
                    item.decode("utf-8")
            except UnicodeDecodeError:
                return True
        return False

    def visit(where: str, obj: Any) -> bool | None:
        if (isinstance(obj, h5py.Dataset) and obj.dtype.kind in "SO" and obj.size <= 10_000
                and bad(obj[()])):
            found.append(where)
            return True
        for key in obj.attrs:
            if bad(obj.attrs[key]):
                found.append(f"{where}.{key}" if where != "/" else key)
                return True
        return None

    try:
        with h5py.File(path, "r") as f:
            if visit("/", f) is None:
                f.visititems(visit)
    except OSError:
        return None
    return found[0] if found else None


def _voltage_clamp_sweeps(nwb: Any, pynwb: Any) -> tuple[list[Any], list[str | None]]:
    """The response series in order, and the agonist stimulus name of each (if tabled)."""
    vc_type = pynwb.icephys.VoltageClampSeries
    table = nwb.intracellular_recordings
    series: list[Any] = []
    agonists: list[str | None] = []
    if table is not None and len(table) > 0:
        responses = table["responses"]["response"]
        names = table["agonist"][:] if "agonist" in table.colnames else [None] * len(table)
        for k in range(len(table)):
            ref = responses[k]
            if isinstance(ref.timeseries, vc_type):
                series.append(ref)
                agonists.append(None if names[k] is None else str(names[k]))
    if not series:
        found = [s for s in nwb.acquisition.values() if isinstance(s, vc_type)]
        found.sort(key=lambda s: (s.sweep_number if s.sweep_number is not None else -1,
                                  s.name))
        series = found
        agonists = [None] * len(found)
    return series, agonists


def _recording_from_nwb(nwb: Any, name: str, pynwb: Any) -> Recording:
    refs, agonist_names = _voltage_clamp_sweeps(nwb, pynwb)
    if not refs:
        raise KingenError("no VoltageClampSeries (voltage-clamp sweeps) in the file",
                          file=name, field="acquisition", value=", ".join(nwb.acquisition))
    stimuli = {k: v for k, v in nwb.stimulus.items()
               if not isinstance(v, pynwb.icephys.PatchClampSeries)}
    conc_stimuli = [v for v in stimuli.values() if _is_concentration(v.unit)]
    times, currents, labels, concs, starts = [], [], [], [], []
    sources: list[str] = []  # where each label was read
    for k, ref in enumerate(refs):
        ts = getattr(ref, "timeseries", ref)
        lo = getattr(ref, "idx_start", None)
        count = getattr(ref, "count", None)
        lo = 0 if lo is None or lo < 0 else int(lo)
        where = f"acquisition/{ts.name}"
        raw = _numbers(ts.data, name, f"{where}.data")
        hi = raw.size if count is None or count < 0 else lo + int(count)
        factor, shift = _to_pA(_stored_unit(ts), float(ts.conversion),
                               float(getattr(ts, "offset", 0.0) or 0.0), name, where)
        t_abs = _series_time_s(ts, raw.size, name, where)[lo:hi]
        if t_abs.size == 0:
            raise KingenError("empty sweep (no samples)", file=name, field=where)
        with np.errstate(over="ignore", invalid="ignore"):
            current = raw[lo:hi] * factor + shift
            t_ms = _relative_time_ms(ts, t_abs)
        check_sweep(t_ms, current, name, where)
        currents.append(current)
        times.append(t_ms)
        starts.append(float(t_abs[0]))
        label, source = _read_label(ts)
        check_label(label, name, source, label)
        _check_repeat(label, source, ts.name, labels, sources, name)
        labels.append(label)
        sources.append(source)
        named = ts.name[len("current_"):] if ts.name.startswith("current_") else ts.name
        stim = _match_stimulus(agonist_names[k], named, k, len(refs), stimuli, conc_stimuli)
        concs.append(None if stim is None else _concentration_on(stim, t_abs, name))
    have = [c is not None for c in concs]
    meta = _nwb_meta(nwb)
    meta["sweep_start_s"] = starts
    return Recording(
        protocol=nwb.protocol if nwb.protocol else meta.pop("protocol", None),
        time_ms=times, current_pA=currents, sweep_labels=labels,
        concentration_mM=concs if all(have) else None,
        holding_mV=_nwb_holding(nwb, pynwb, name), source=name, meta=meta,
        # series named current_<label> (as write_nwb names them) carry the protocol's
        # labels; other tools' names (VoltageClampSeries001) only order the sweeps
        labelled=None if all(_names_a_label(ref) for ref in refs) else False,
    )


def _names_a_label(ref: Any) -> bool:
    ts = getattr(ref, "timeseries", ref)
    return ts.name.startswith("current_") or _read_label(ts) != ts.name


def _check_repeat(label: str, source: str, series: str, labels: list[str],
                  sources: list[str], file: str) -> None:
    """Refuse a sweep label that another series already has (one series the table cuts
    into several sweeps keeps its one label, as it always did). A label kept in a comment
    is the one blamed: a name cannot repeat, but a comment can say anything."""
    for other, where in zip(labels, sources, strict=True):
        if other != label or _series_of(where) == f"acquisition/{series}":
            continue
        if where.endswith(".comments") and not source.endswith(".comments"):
            source, where = where, source
        raise KingenError(f"sweep label repeats that of {_series_of(where)}: every sweep "
                          "needs its own label", file=file, field=source, value=label)


def _series_of(where: str) -> str:
    return where.removesuffix(".comments")


def _is_concentration(unit: Any) -> bool:
    try:
        units.factor("concentration", str(unit))
    except KingenError:
        return False
    return True


def _match_stimulus(tabled: str | None, label: str, k: int, n: int, stimuli: dict[str, Any],
                    conc_stimuli: list[Any]) -> Any:
    if tabled and tabled in stimuli:
        return stimuli[tabled]
    if f"agonist_{label}" in stimuli:
        return stimuli[f"agonist_{label}"]
    if len(conc_stimuli) == n:
        return conc_stimuli[k]
    return None


def _concentration_on(stim: Any, t_abs: np.ndarray, file: str) -> np.ndarray:
    where = f"stimulus/{stim.name}"
    f = units.factor("concentration", _stored_unit(stim), file=file, field=f"{where}.unit")
    with np.errstate(over="ignore", invalid="ignore"):
        data = _numbers(stim.data, file, f"{where}.data") * float(stim.conversion) + float(
            getattr(stim, "offset", 0.0) or 0.0)
    ts = _series_time_s(stim, data.size, file, where)
    with np.errstate(over="ignore", invalid="ignore"):
        check_sweep(ts * 1e3, data * f, file, where, max_abs=None)
    if ts.size == t_abs.size and np.allclose(ts, t_abs, rtol=0, atol=1e-12):
        return data * f
    return np.interp(t_abs, ts, data) * f


def _nwb_meta(nwb: Any) -> dict[str, Any]:
    """File-level metadata; kingen writes its own meta as JSON into ``notes``."""
    meta: dict[str, Any] = {"session_description": nwb.session_description}
    if nwb.notes:
        try:
            saved = json.loads(nwb.notes)
        except ValueError:
            meta["notes"] = nwb.notes
        else:
            if isinstance(saved, dict):
                meta.update(saved)
            else:
                meta["notes"] = nwb.notes
    return meta


def _nwb_holding(nwb: Any, pynwb: Any, file: str = "<nwb>") -> float | None:
    """Holding potential from the first voltage-clamp stimulus (its first sample), mV."""
    for s in nwb.stimulus.values():
        if isinstance(s, pynwb.icephys.VoltageClampStimulusSeries) and len(s.data) > 0:
            unit = _stored_unit(s).strip()
            base = 1e3 if unit.lower() in ("volts", "volt", "v") else units.factor(
                "voltage", unit, file=file, field=f"stimulus/{s.name}.unit")
            value = float(_numbers(s.data, file, f"stimulus/{s.name}.data")[0]) * float(
                s.conversion) * base
            if not math.isfinite(value):
                raise KingenError("holding potential is not a finite number of mV", file=file,
                                  field=f"stimulus/{s.name}.data", value=value)
            return value
    return None


def write_nwb(
    recording: Recording,
    path: str | os.PathLike[str],
    *,
    session_description: str | None = None,
    identifier: str | None = None,
    session_start_time: _dt.datetime | None = None,
    electrode_description: str = "patch pipette",
) -> None:
    """Write a recording as an NWB intracellular-ephys file that :func:`read_nwb` reads.

    Each sweep becomes a ``VoltageClampSeries`` ``current_<label>`` (data in pA,
    ``conversion`` 1e-12 to amperes), with a ``VoltageClampStimulusSeries`` ``holding_<label>``
    when the holding potential is known and an agonist ``TimeSeries`` ``agonist_<label>``
    (unit mM) in ``/stimulus`` when the concentration is; each sweep is a row of the
    intracellular-recordings table, whose ``agonist`` column names its agonist series.
    ``meta`` is stored as JSON in ``notes``; ``meta["synthetic"]`` marks the
    ``session_description`` as SYNTHETIC. The file is written to a temporary name and moved
    into place.
    """
    name = str(path)
    series = _series_names(recording.sweep_labels, name)
    pynwb = optional_module("pynwb", "nwb", name)
    from pynwb.icephys import VoltageClampSeries, VoltageClampStimulusSeries

    meta = {k: v for k, v in recording.meta.items() if _jsonable(v)}
    synthetic = bool(meta.get("synthetic"))
    description = session_description or f"kingen recording {recording.protocol or ''}".strip()
    if synthetic and "synthetic" not in description.lower():
        description = f"SYNTHETIC data (not a real recording): {description}"
    nwb = pynwb.NWBFile(
        session_description=description,
        identifier=identifier or str(uuid.uuid4()),
        session_start_time=session_start_time or _dt.datetime.now(_dt.timezone.utc),
        notes=json.dumps(meta),
        protocol=recording.protocol,
    )
    device = nwb.create_device(name="amplifier")
    electrode = nwb.create_icephys_electrode(name="electrode", description=electrode_description,
                                             device=device)
    table = nwb.get_intracellular_recordings()
    table.add_column(name="agonist", description="name of the agonist concentration "
                     "TimeSeries of this sweep in /stimulus ('' if none)")
    start = 0.0
    for k, (label, t, current, conc) in enumerate(recording.sweeps()):
        timing = _nwb_timing(t, start)
        # the label as it is, where the series name could not hold it (read back first)
        kept = {} if series[k] == label else {"comments": json.dumps({LABEL_KEY: label})}
        response = VoltageClampSeries(name=f"current_{series[k]}", data=np.asarray(current),
                                      electrode=electrode, gain=1.0, conversion=1e-12,
                                      sweep_number=np.uint32(k), **kept, **timing)
        stimulus = None
        if recording.holding_mV is not None:
            stimulus = VoltageClampStimulusSeries(
                name=f"holding_{series[k]}", data=np.full(t.size, recording.holding_mV),
                electrode=electrode, gain=1.0, conversion=1e-3, sweep_number=np.uint32(k),
                **timing)
        agonist = ""
        if conc is not None:
            agonist = f"agonist_{series[k]}"
            nwb.add_stimulus(pynwb.TimeSeries(name=agonist, data=np.asarray(conc), unit="mM",
                                              description="agonist concentration", **timing))
        nwb.add_intracellular_recording(electrode=electrode, response=response,
                                        stimulus=stimulus, agonist=agonist)
        # Sweeps follow each other on the file's clock, 1 s apart, as an amplifier's would.
        start += (float(t[-1]) if t.size else 0.0) / 1e3 + 1.0

    def write(tmp: Path) -> None:
        with pynwb.NWBHDF5IO(str(tmp), "w") as io_:
            io_.write(nwb)

    atomic_write(Path(name), write)


LABEL_KEY = "kingen_sweep_label"
"""Key of the JSON a series' ``comments`` holds when its name could not hold the label."""


def _series_names(labels: list[str], file: str) -> list[str]:
    """What each sweep's series are named after (``current_<name>``): its label, with '/'
    and ':', which NWB names cannot hold, written '_' (the label itself goes in the
    series' comments). Two sweeps with one label are refused: pynwb fails on them deep in
    its build, and no reader could tell them apart."""
    if len(set(labels)) != len(labels):
        repeat = next(label for label in labels if labels.count(label) > 1)
        raise KingenError("two sweeps share this label, and a label names the sweep's NWB "
                          "series: give every sweep its own label", file=file,
                          field="sweep label", value=repeat)
    out: list[str] = []
    for label in labels:
        base = label.replace("/", "_").replace(":", "_")
        name, n = base, 1
        while name in out or (name != label and name in labels):
            n += 1
            name = f"{base}_{n}"
        out.append(name)
    return out


def _read_label(ts: Any) -> tuple[str, str]:
    """A series' sweep label: the one kingen kept in its comments, else its name without
    ``current_``; and where it was read (for messages)."""
    try:
        kept = json.loads(str(getattr(ts, "comments", "") or ""))
    except ValueError:
        kept = None
    if isinstance(kept, dict) and isinstance(kept.get(LABEL_KEY), str):
        return kept[LABEL_KEY], f"acquisition/{ts.name}.comments"
    label = ts.name[len("current_"):] if ts.name.startswith("current_") else ts.name
    return label, f"acquisition/{ts.name}"


def _nwb_timing(t_ms: np.ndarray, start_s: float) -> dict[str, Any]:
    """starting_time/rate for a regular grid, timestamps otherwise."""
    t = np.asarray(t_ms, dtype=float)
    if t.size > 1:
        steps = np.diff(t)
        if np.allclose(steps, steps[0], rtol=1e-9, atol=0) and abs(t[0]) < 1e-12:
            return {"starting_time": start_s, "rate": 1e3 / float(steps[0])}
    return {"timestamps": start_s + t / 1e3}


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
