"""A fit configuration's ``[[protocols]]`` entries: protocol, recordings, targets, chain.

:func:`read_protocol` turns one entry into a :class:`~kingen.fitting.objective.ProtocolData`:
a standard protocol or a protocol file, its recordings (several files are one recording,
sweeps in order), summary targets, weight, amplitude, mask, baseline, recording chain and
temperature, each checked with one line naming the file, field and value.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from kingen.experiment.chain import check_filter, read_chain
from kingen.experiment.exchange import apply_exchange, read_exchange_spec
from kingen.experiment.protocol import (
    STANDARD_PROTOCOLS,
    check_size,
    load_protocol,
    standard_protocol,
)
from kingen.experiment.recordings import Recording, load_recording, load_targets
from kingen.fitting.objective import BASELINES, ProtocolData
from kingen.fitting.temperature import with_temperature
from kingen.model.fields import Fields, join

PROTOCOL_KEYS = {"protocol", "name", "exchange", "dt", "recording", "targets", "weight",
                 "amplitude", "mask", "baseline", "subtract_baseline", "filter", "offset",
                 "temperature"}


class ConfigFields(Fields):
    """:class:`~kingen.model.fields.Fields` with the configuration's own file-list field."""

    def paths(self, t: dict, key: str, where: str, base: Path) -> list[Path]:
        value = t.get(key)
        if value is None:
            return []
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(
                isinstance(v, str) and v.strip() for v in items):
            raise self.error("must be a file name or a non-empty list of file names",
                             join(where, key), value)
        out = []
        for v in items:
            p = (base / v) if not Path(v).is_absolute() else Path(v)
            if not p.is_file():
                raise self.error("file not found", join(where, key), v)
            out.append(p)
        return out


def read_protocol(c: ConfigFields, t: dict, i: int, base: Path, force: bool = False
                  ) -> ProtocolData:
    """The ``[[protocols]]`` entry ``t`` (the ``i``-th), paths from ``base``."""
    w = f"protocols[{i}]"
    c.keys(t, PROTOCOL_KEYS, w)
    spec = c.string(t, "protocol", w, None)
    if spec is None:
        raise c.error("missing: a standard protocol name or a protocol file", f"{w}.protocol")
    recordings = c.paths(t, "recording", w, base)
    target_files = c.paths(t, "targets", w, base)
    recs = [load_recording(p) for p in recordings]
    for p, r in zip(recordings, recs, strict=True):
        if r.n_sweeps == 0 or all(np.asarray(r.sweep_current(k)).size == 0
                                  for k in range(r.n_sweeps)):
            raise c.error("empty recording: no sweeps", f"{w}.recording", str(p))
    standard = spec in STANDARD_PROTOCOLS
    measured = None
    if isinstance(t.get("exchange"), dict):  # a measured waveform, for any protocol
        measured = read_exchange_spec(c, t["exchange"], f"{w}.exchange", base)
    if standard:
        dt_default = recording_dt(recs) or 0.02
        exchange = 0.0 if measured else c.number(t, "exchange", w, 0.0, ge=0.0)
        dt = c.number(t, "dt", w, dt_default, gt=0.0)
        protocol = standard_protocol(spec, exchange=exchange, dt=dt, force=True)
        check_size(protocol, file=c.file, field=f"{w}.dt", value=dt, force=force)
    else:
        p = base / spec if not Path(spec).is_absolute() else Path(spec)
        if not p.is_file():
            raise c.error(f"not a standard protocol ({', '.join(STANDARD_PROTOCOLS)}) and no "
                          "such protocol file", f"{w}.protocol", spec)
        for key in ("exchange", "dt"):
            if key in t and not (key == "exchange" and measured):
                raise c.error("only for standard protocols (set it in the protocol file)",
                              f"{w}.{key}", t[key])
        protocol = load_protocol(p, force=force)
    if measured is not None:
        protocol = apply_exchange(protocol, measured)
    name = c.string(t, "name", w, None)
    if name is not None:
        protocol = replace(protocol, name=name)
    recording = merge_recordings(recs) if recs else None
    protocol = with_temperature(protocol, t, w, c.file, recording)
    if recording is not None and recording.protocol is not None:
        ok = {protocol.name, protocol.kind, Path(protocol.source).stem, spec}
        if recording.protocol not in ok:
            raise c.error(f"the recording is of protocol '{recording.protocol}', which is not "
                          f"the protocol it is given for ('{protocol.name}')",
                          f"{w}.recording", recording.source)
    targets = load_targets(target_files) if target_files else None
    if targets is not None and not (targets.features or targets.recovery is not None
                                    or targets.dose_response is not None):
        raise c.error("empty targets: no feature or table", f"{w}.targets",
                      target_files[0].name)
    if recording is None and targets is None:
        raise c.error("no data: give recording = ... and/or targets = ...", f"{w}.recording")
    amplitude = None
    if "amplitude" in t and not isinstance(t["amplitude"], str):
        amplitude = c.number(t, "amplitude", w, gt=0.0)
    chain = read_chain(c, t, w, base)
    if chain.filter is not None:
        check_filter(chain.filter, [s.dt for s in protocol.sweeps], file=c.file,
                     field=f"{w}.filter")
    if recording is None and not (chain.offset == "none" and chain.amplitude == "per-protocol"):
        key = "offset" if chain.offset != "none" else "amplitude"
        raise c.error("is fitted to a recording: this protocol has none", f"{w}.{key}",
                      t[key])
    mask = []
    for k, m in enumerate(c.array(t, "mask", w)):
        where = f"{w}.mask[{k}]"
        if not isinstance(m, list) or len(m) != 2:
            raise c.error("must be a [t0, t1] range (ms)", where, m)
        t0, t1 = (c.number(m, j, where) for j in range(2))
        if t0 >= t1:
            raise c.error("must be a [t0, t1] range with t0 < t1 (ms)", where, m)
        mask.append((t0, t1))
    return ProtocolData(
        protocol=protocol, recording=recording, targets=targets,
        weight=c.number(t, "weight", w, 1.0, gt=0.0), amplitude=amplitude, mask=mask,
        baseline=baseline_of(c, t, w), source=c.file, chain=chain)


def baseline_of(c: ConfigFields, t: dict, w: str) -> str:
    """``baseline``, or the ``subtract_baseline`` flag of earlier configurations (true was
    each sweep's own pre-pulse mean, the default then)."""
    if "subtract_baseline" in t:
        if "baseline" in t:
            raise c.error("give baseline or subtract_baseline (its older form), not both",
                          f"{w}.subtract_baseline", t["subtract_baseline"])
        return "per-sweep" if c.boolean(t, "subtract_baseline", w, True) else "none"
    return c.choice(t, "baseline", BASELINES, w, "none")


def recording_dt(recs: list[Recording]) -> float | None:
    for r in recs:
        t = np.asarray(r.sweep_time(0), dtype=float)
        if t.size > 1:
            return float(np.median(np.diff(t)))
    return None


def merge_recordings(recs: list[Recording]) -> Recording:
    if len(recs) == 1:
        return recs[0]
    times, currents, labels = [], [], []
    for r in recs:
        for label, t, y, _ in r.sweeps():
            times.append(t)
            currents.append(y)
            labels.append(label)
    return Recording(recs[0].protocol, times, currents, labels,
                     source=", ".join(r.source for r in recs),
                     meta={"files": [r.source for r in recs]},
                     labelled=any(r.labelled for r in recs))
