"""Protocol files: the TOML reader of :func:`kingen.experiment.protocol.load_protocol`.

A file's sweeps are explicit (``[[sweeps]]``) or generated (``[paired]``, ``[dose]``,
``[train]``); every field is checked and converted to internal units, and the sweeps' labels
must tell them apart (they name CSV columns and NWB series).
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kingen.errors import KingenError
from kingen.experiment.protocol import (
    MAX_CONCENTRATION_MM,
    MAX_POTENTIAL_MV,
    PROTOCOL_KINDS,
    Protocol,
    Pulse,
    Sweep,
    Transient,
    check_size,
)
from kingen.model import limits, units
from kingen.model.fields import MISSING, Fields

_PULSE_KEYS = ("start", "duration", "concentration", "rise", "decay", "exchange")
_KEYS = {
    "": ("protocol", "units", "sweeps", "paired", "dose", "train"),
    "protocol": ("name", "kind", "dt", "holding", "reversal", "exchange", "description"),
    "units": ("time", "concentration"),
    "sweep": ("label", "duration", "pulses", "transients", "holding", "reversal", "x",
              "description"),
    "pulse": _PULSE_KEYS,
    "transient": ("start", "peak", "tau_decay", "tau_rise"),
    "paired": _PULSE_KEYS + ("intervals", "tail"),
    "dose": ("start", "duration", "rise", "decay", "exchange", "concentrations", "tail"),
    "train": _PULSE_KEYS + ("n", "frequency", "tail"),
}


def protocol_from_dict(doc: dict[str, Any], *, source: str = "<protocol>",
                       force: bool = False) -> Protocol:
    """Build a protocol from a parsed TOML document (see :func:`load_protocol`)."""
    r = _Reader(source, force)
    f = r.f
    f.keys(doc, _KEYS[""], "")
    head = f.table(doc, "protocol")
    f.keys(head, _KEYS["protocol"], "protocol")
    unit_table = f.table(doc, "units")
    f.keys(unit_table, _KEYS["units"], "units")
    r.tf = tf = units.factor("time", f.string(unit_table, "time", "units", "ms"),
                             file=source, field="units.time")
    r.cf = cf = units.factor("concentration",
                             f.string(unit_table, "concentration", "units", "mM"),
                             file=source, field="units.concentration")
    name = f.string(head, "name", "protocol", Path(source).stem)
    kind = f.choice(head, "kind", PROTOCOL_KINDS, "protocol", "custom")
    dt = r.time(head, "dt", "protocol", 0.02 / tf, gt=0.0)
    holding = r.potential(head, "holding", "protocol", -60.0)
    reversal = r.potential(head, "reversal", "protocol", 0.0)
    measured = None
    if isinstance(head.get("exchange"), dict):  # a measured waveform, applied at the end
        from kingen.experiment.exchange import read_exchange_spec

        measured = read_exchange_spec(f, head["exchange"], "protocol.exchange",
                                      Path(source).parent)
    else:
        r.exchange = r.time(head, "exchange", "protocol", 0.0, ge=0.0)
    common = dict(dt=dt, holding=holding, reversal=reversal)

    sweeps: list[Sweep] = []
    origins: list[_Origin] = []  # where each sweep's label comes from, for the error
    for i, s in enumerate(f.array(doc, "sweeps", tables=True)):
        where = f"sweeps[{i}]"
        f.keys(s, _KEYS["sweep"], where)
        pulses = tuple(r.pulse(p, f"{where}.pulses[{j}]")
                       for j, p in enumerate(r.items(s, "pulses", where)))
        transients = tuple(r.transient(p, f"{where}.transients[{j}]")
                           for j, p in enumerate(r.items(s, "transients", where)))
        duration = r.time(s, "duration", where, gt=0.0)
        # x is an interval (time units) for recovery, a concentration for dose_response
        x = None if s.get("x") is None else f.number(
            s, "x", where, factor=tf if kind == "recovery" else
            cf if kind == "dose_response" else 1.0)
        label = s.get("label", i)
        if isinstance(label, (dict, list)):
            raise f.error("must be a string", f"{where}.label", label)
        label = str(label)
        if not label.strip() or any(unicodedata.category(ch) in ("Cc", "Zl", "Zp")
                                    for ch in label):
            # a label names a CSV column and an NWB series: a blank one reads back as
            # another sweep's, a line break splits the CSV header (a no-break space, as in a
            # pasted "10 µM", is fine)
            raise f.error("must be a non-empty label without control characters (tabs, line "
                          "breaks)", f"{where}.label", label)
        origins.append(_Origin(f"{where}.label" if "label" in s else where,
                               label if "label" in s else None, "sweep"))
        sweeps.append(Sweep(label, duration, pulses=pulses, transients=transients, x=x,
                            **{**common,
                               "holding": r.potential(s, "holding", where, holding),
                               "reversal": r.potential(s, "reversal", where, reversal)}))
    if "paired" in doc:
        t = f.table(doc, "paired")
        f.keys(t, _KEYS["paired"], "paired")
        base = r.pulse(t, "paired")
        intervals = f.numbers(t, "intervals", "paired", gt=0.0, factor=tf, unit="ms")
        limits.check(len(intervals), limits.MAX_SWEEPS, "sweeps", force=force, file=source,
                     field="paired.intervals")
        tail = r.time(t, "tail", "paired", 20.0 / tf, ge=0.0)
        labels = _number_labels(t["intervals"])
        for k, interval in enumerate(intervals):
            second = replace(base, start=base.end + interval)
            origins.append(_Origin(f"paired.intervals[{k}]", t["intervals"][k], "paired"))
            sweeps.append(Sweep(labels[k], second.end + tail,
                                pulses=(base, second), x=interval, **common))
        kind = f.choice(head, "kind", PROTOCOL_KINDS, "protocol", "recovery")
    if "dose" in doc:
        t = f.table(doc, "dose")
        f.keys(t, _KEYS["dose"], "dose")
        f.numbers(t, "concentrations", "dose", gt=0.0, factor=cf, unit="mM")
        limits.check(len(t["concentrations"]), limits.MAX_SWEEPS, "sweeps", force=force,
                     file=source, field="dose.concentrations")
        tail = r.time(t, "tail", "dose", 20.0 / tf, ge=0.0)
        labels = _number_labels(t["concentrations"])
        for k, c in enumerate(t["concentrations"]):
            pulse = r.pulse({**t, "concentration": c}, "dose",
                            concentration_field=f"dose.concentrations[{k}]")
            origins.append(_Origin(f"dose.concentrations[{k}]", c, "dose"))
            sweeps.append(Sweep(labels[k], pulse.end + tail, pulses=(pulse,),
                                x=pulse.concentration, **common))
        kind = f.choice(head, "kind", PROTOCOL_KINDS, "protocol", "dose_response")
    if "train" in doc:
        t = f.table(doc, "train")
        f.keys(t, _KEYS["train"], "train")
        base = r.pulse(t, "train")
        n = f.integer(t, "n", "train", ge=1)
        # before a tuple of n pulses is made
        limits.check(n, limits.MAX_PULSES_PER_SWEEP, "pulses in one sweep", force=force,
                     file=source, field="train.n", value=n,
                     hint="fewer pulses (kingen.model.limits.MAX_PULSES_PER_SWEEP)")
        period = 1000.0 / f.number(t, "frequency", "train", gt=0.0)  # Hz -> ms
        last = base.start + (n - 1) * period
        if not math.isfinite(last + base.duration):
            raise f.error("the train lasts longer than any float can count in ms",
                          "train.frequency", t["frequency"])
        pulses = tuple(replace(base, start=base.start + k * period) for k in range(n))
        tail = r.time(t, "tail", "train", 50.0 / tf, ge=0.0)
        origins.append(_Origin("train", None, "train"))
        sweeps.append(Sweep("train", pulses[-1].end + tail, pulses=pulses, **common))
        kind = f.choice(head, "kind", PROTOCOL_KINDS, "protocol", "train")
    if not sweeps:
        raise KingenError("no sweeps: give [[sweeps]], [paired], [dose] or [train]",
                          file=source, field="sweeps")
    _check_labels(sweeps, origins, source)
    for i, s in enumerate(sweeps):
        if not math.isfinite(s.duration):
            raise KingenError("the sweep lasts longer than any float can count in ms "
                              "(its pulses end too late)", file=source, field=f"sweeps[{i}]")
        if s.dt > s.duration:
            raise KingenError("sampling interval longer than the sweep", file=source,
                              field=f"sweeps[{i}].duration", value=s.duration)
    protocol = Protocol(str(name), kind, tuple(sweeps), source=source)
    check_size(protocol, file=source, force=force)
    if measured is not None:
        from kingen.experiment.exchange import apply_exchange

        protocol = apply_exchange(protocol, measured)
    return protocol


@dataclass(frozen=True)
class _Origin:
    """Where a sweep's label comes from: the field, its value in the file (None for a
    default label) and the part of the file (``sweep``, ``paired``, ``dose``, ``train``)."""

    field: str
    value: Any
    part: str


def _number_labels(values: list[Any]) -> list[str]:
    """The labels of a generated series: each interval or concentration as written, to 6
    significant digits (``f"{v:g}"``, the labels recordings already carry); in full only
    where that would give two different numbers one label (5.0000001 and 5.0000002 both
    print as '5'); and a value listed again (a control dose repeated at the end) labelled
    ``<value>_2``, ``_3``, ... (:func:`distinct_labels`)."""
    short = [f"{v:g}" for v in values]
    numbers: dict[str, set[float]] = {}
    for text, v in zip(short, values, strict=True):
        numbers.setdefault(text, set()).add(float(v))
    return distinct_labels([repr(float(v)).removesuffix(".0") if len(numbers[text]) > 1
                            else text for text, v in zip(short, values, strict=True)])


def distinct_labels(labels: list[str]) -> list[str]:
    """``labels`` with each repeat renamed ``<label>_2``, ``_3``, ... (a name no other sweep
    has), so that every sweep gets a CSV column and NWB series of its own (a generated
    series that lists a value twice; an export of a run made before labels had to differ).

    Parameters
    ----------
    labels
        Sweep labels in protocol order.

    Returns
    -------
    list of str
        The same labels where they are distinct; otherwise the first of each is kept.

    Examples
    --------
    >>> from kingen.experiment.protocol import distinct_labels
    >>> distinct_labels(["1", "3", "1", "1_2"])
    ['1', '3', '1_3', '1_2']
    """
    taken = set(labels)
    seen: set[str] = set()
    out = []
    for label in labels:
        new, n = label, 1
        # a new name must not be another sweep's own label, even one still to come
        while new in seen or (n > 1 and new in taken):
            n += 1
            new = f"{label}_{n}"
        seen.add(new)
        out.append(new)
    return out


def _check_labels(sweeps: list[Sweep], origins: list[_Origin], source: str) -> None:
    """Refuse two sweeps with one label: a label names the sweep's CSV column and NWB
    series, and pairs a recorded sweep with its protocol sweep, so a repeat would write a
    CSV no reader takes and could fit one sweep's data to another."""
    seen: dict[str, _Origin] = {}
    for sweep, here in zip(sweeps, origins, strict=True):
        first = seen.setdefault(sweep.label, here)
        if first is here:
            continue
        named = [o for o in (here, first) if o.part == "sweep"]
        if named:
            field = named[0].field.removesuffix(".label")
            hint = (f"give {field} another label" if named[0].value is not None else
                    f"give {field} a label (it is labelled by its index)")
        else:
            hint = ("[paired] and [dose] sweeps are labelled by their numbers alone: put "
                    "the two series in protocols of their own")
        earlier = first.field if first.value is not None or first.part != "sweep" else \
            f"{first.field}, labelled by its index"
        raise KingenError(f"duplicate sweep label {sweep.label!r} (also that of "
                          f"{earlier}); every sweep needs its own label, which names its "
                          f"CSV column and NWB series: {hint}", file=source,
                          field=here.field, value=here.value)


class _Reader:
    """Protocol fields in internal units, read with :class:`kingen.model.fields.Fields`."""

    def __init__(self, source: str, force: bool = False) -> None:
        self.source = source
        self.force = force
        self.f = Fields(source)
        self.tf = 1.0  # file time unit -> ms
        self.cf = 1.0  # file concentration unit -> mM
        self.exchange = 0.0  # the protocol's default edge, ms

    def time(self, t: dict, key: str, where: str, default: Any = None, **limits: Any
             ) -> float:
        """A time, ms (``default`` in file units; None: required)."""
        return self.f.number(t, key, where, MISSING if default is None else default,
                             factor=self.tf, unit="ms", **limits)

    def potential(self, t: dict, key: str, where: str, default: float) -> float:
        """A potential, mV."""
        return self.f.number(t, key, where, default, ge=-MAX_POTENTIAL_MV,
                             le=MAX_POTENTIAL_MV)

    def concentration(self, t: dict, key: str, where: str, *, gt: float | None = None,
                      ge: float | None = None, field: str | None = None) -> float:
        """A concentration, mM, at most :data:`MAX_CONCENTRATION_MM`."""
        value = self.f.number(t, key, where, gt=gt, ge=ge, factor=self.cf, unit="mM")
        if value > MAX_CONCENTRATION_MM:
            raise self.f.error(f"more than {MAX_CONCENTRATION_MM:g} mM once converted: not "
                               "a solution", field or f"{where}.{key}", t[key])
        return value

    def items(self, s: dict, key: str, where: str) -> list:
        """The pulses or transients of a sweep, at most the limit's number."""
        value = self.f.array(s, key, where, tables=True)
        limits.check(len(value), limits.MAX_PULSES_PER_SWEEP, f"{key} in one sweep",
                     force=self.force, file=self.source, field=f"{where}.{key}",
                     hint="fewer pulses (kingen.model.limits.MAX_PULSES_PER_SWEEP)")
        return value

    def pulse(self, p: dict, where: str, concentration_field: str | None = None) -> Pulse:
        if not isinstance(p, dict):
            raise self.f.error("must be a table", where, p)
        if where.startswith("sweeps"):
            self.f.keys(p, _KEYS["pulse"], where)

        def edge(key: str) -> float:
            # a pulse's own rise/decay, else its exchange, else the protocol's exchange
            name = key if key in p else "exchange"
            if name not in p:
                return self.exchange
            return self.time(p, name, where, ge=0.0)

        return Pulse(
            start=self.time(p, "start", where, ge=0.0),
            duration=self.time(p, "duration", where, gt=0.0),
            concentration=self.concentration(p, "concentration", where, ge=0.0,
                                             field=concentration_field),
            rise=edge("rise"),
            decay=edge("decay"),
        )

    def transient(self, p: dict, where: str) -> Transient:
        if not isinstance(p, dict):
            raise self.f.error("must be a table", where, p)
        self.f.keys(p, _KEYS["transient"], where)
        tau_rise = self.time(p, "tau_rise", where, 0.0, ge=0.0)
        tau_decay = self.time(p, "tau_decay", where, gt=0.0)
        if tau_rise >= tau_decay:
            raise self.f.error("tau_rise must be shorter than tau_decay", f"{where}.tau_rise",
                               p.get("tau_rise"))
        return Transient(self.time(p, "start", where, ge=0.0), self.concentration(
            p, "peak", where, gt=0.0), tau_decay, tau_rise)
