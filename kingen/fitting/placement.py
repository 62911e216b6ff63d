"""A protocol's recording placed on its sweeps' sample grid: pairing, baseline, weights.

Recordings. Each recorded sweep is resampled (``np.interp``) onto its protocol sweep's
sample grid; samples outside the recording or inside a user mask get weight 0, but a new
fit refuses a recording whose time starts after 0 (the protocol's start) unless the mask
covers the gap (:attr:`Objective.late_starts`), since it is most often a clock offset,
not a late start. The data
are compared as recorded by default (``baseline = "none"``): the model starts from rest,
where its current is that of the resting occupancies, normally 0, and a baseline estimated
from the few samples before the first pulse carries noise of its own, an offset constant
over the whole sweep that no rate can fit and that biases poorly determined rates (see the
docs, "Fit configuration"). A recording with a real DC offset (leak) is fitted with ``baseline =
"pre-pulse"`` (one offset per protocol: the mean of every sweep's pre-pulse samples, so
its noise is that of all of them) or ``"per-sweep"`` (each sweep's own pre-pulse mean, for
a baseline that drifts between sweeps; the noisiest). With ``"none"``, a pre-pulse mean
that is clearly not 0 (more than 5 standard errors and 1 % of the largest current) is
reported in :attr:`Objective.warnings`.of a protocol
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.experiment.features import baseline
from kingen.experiment.protocol import Protocol
from kingen.experiment.recordings import Recording
from kingen.fitting.targets import onset

# What ProtocolData.baseline may be (see the module docstring).
BASELINES = ("none", "pre-pulse", "per-sweep")
# With baseline = "none", a pre-pulse mean this many standard errors from 0, and at least
# this fraction of the largest recorded current, is worth a warning.
OFFSET_WARN_SE = 5.0
OFFSET_WARN_FRACTION = 0.01
_TINY = 1e-300


def place_recording(objective: Any, item: Any, first: int) -> None:
    """Resample ``item``'s recording onto ``objective``'s grid (its ``data`` and
    ``weight`` from sweep ``first`` on); notes and late starts go to its ``warnings`` and
    ``late_starts``."""
    rec = item.recording
    proto = item.protocol
    where = f"protocols.{proto.name}.recording"
    order = sweep_order(rec, proto, where)
    if item.baseline not in BASELINES:
        raise KingenError(f"must be one of {', '.join(BASELINES)}", file=item.source,
                          field=f"protocols.{proto.name}.baseline", value=item.baseline)
    sweeps = []
    for j in order:
        t_rec = np.asarray(rec.sweep_time(j), dtype=float)
        y_rec = np.asarray(rec.sweep_current(j), dtype=float)
        ok = np.isfinite(t_rec) & np.isfinite(y_rec)
        t_rec, y_rec = t_rec[ok], y_rec[ok]
        if t_rec.size < 2:
            raise KingenError("sweep has fewer than 2 samples", file=rec.source,
                              field=f"{where}.sweep", value=rec.sweep_labels[j])
        sweeps.append((t_rec, y_rec))
    refuse_all_before_the_pulses(proto, sweeps, rec, where)
    offset = pre_pulse_offset(objective, item, sweeps, where)
    total = 0
    short: list[tuple[str, float, float]] = []  # recorded sweeps that end early
    for k, (sweep, (t_rec, y_rec)) in enumerate(zip(proto.sweeps, sweeps, strict=True)):
        if item.baseline == "per-sweep" and sweep.pulses:
            y_rec = y_rec - baseline(t_rec, y_rec, onset(sweep, 0))
        elif offset:
            y_rec = y_rec - offset
        t = sweep.times()
        d = np.interp(t, t_rec, y_rec)
        w = ((t >= t_rec[0] - 1e-9) & (t <= t_rec[-1] + 1e-9)).astype(float)
        masked = np.zeros(t.size, dtype=bool)
        for lo, hi in item.mask:
            masked |= (t >= lo) & (t <= hi)
        w[masked] = 0.0
        # one sampling interval, the recording's or the protocol's, is no gap at either end
        step = max(float(t_rec[1] - t_rec[0]), float(t[1] - t[0]) if t.size > 1 else 0.0)
        late = late_start(t, t_rec, masked, step, rec, where, rec.sweep_labels[order[k]])
        if late is not None:
            objective.late_starts.append(late)
        if ((t > t_rec[-1] + step + 1e-9) & ~masked).any():
            short.append((rec.sweep_labels[order[k]], float(t_rec[-1]), float(t[-1])))
        start = objective.sample_start
        s = slice(int(start[first + k]), int(start[first + k + 1]))
        objective.data[s] = np.where(w > 0, d, 0.0)
        objective.weight[s] = w
        total += int(w.sum())
    if total == 0:
        raise KingenError("no recorded sample falls on the protocol's sweeps (check "
                          "time units and the mask)", file=rec.source, field=where)
    if short:
        label, end, last = short[0]
        first_end = min(e for _, e, _ in short)
        objective.warnings.append(
            f"note: {rec.source}: {where}: {len(short)} of {proto.n_sweeps} recorded "
            f"sweeps end before the protocol's sweep (the first, {label!r}, at {end:g} "
            f"of {last:g} ms): the protocol's samples after a recording's end are not "
            "fitted; check the time unit and the protocol's durations, or add mask = "
            f"[[{first_end:g}, {max(t for _, _, t in short):g}]] to the protocol's entry "
            "to say so")
    if not np.any(objective.data[objective._slice(len(objective.plans) - 1)] != 0):
        raise KingenError("the recording is all zero", file=rec.source, field=where)


def pre_pulse_offset(objective: Any, item: Any, sweeps: list[tuple[np.ndarray, np.ndarray]],
                     where: str) -> float:
    """The offset ``"pre-pulse"`` subtracts from every sweep (0 otherwise); with
    ``"none"``, a warning in ``objective.warnings`` when the pre-pulse mean is clearly not
    0."""
    if item.baseline == "per-sweep":
        return 0.0
    pre = [y[t < onset(s, 0)] for s, (t, y) in zip(item.protocol.sweeps, sweeps,
                                                    strict=True) if s.pulses]
    pre_all = np.concatenate(pre) if pre else np.zeros(0)
    if pre_all.size == 0:
        return 0.0
    mean = float(pre_all.mean())
    if item.baseline == "pre-pulse":
        return mean
    if pre_all.size >= 3 and item.chain.offset == "none":  # a fitted offset takes it
        se = float(pre_all.std(ddof=1)) / math.sqrt(pre_all.size)
        largest = max(float(np.max(np.abs(y - mean))) for _, y in sweeps)
        if abs(mean) > OFFSET_WARN_SE * se and abs(mean) > OFFSET_WARN_FRACTION * largest:
            objective.warnings.append(
                f"warning: {item.source}: {where}: the current before the first pulse "
                f"averages {mean:.4g} pA ({abs(mean) / max(se, _TINY):.3g} standard errors "
                f"from 0, {100 * abs(mean) / largest:.3g} % of the largest current), which "
                f"the model, starting from rest, cannot fit; set baseline = \"pre-pulse\" "
                f"if it is a DC offset")
    return 0.0


def late_start(t: np.ndarray, t_rec: np.ndarray, masked: np.ndarray, step: float,
                rec: Recording, where: str, label: str) -> KingenError | None:
    """The error for a recorded sweep that starts after the protocol's sweep (time 0) with
    the gap unmasked, or None: its first samples would be left out of the fit without a
    word, and a clock offset would shift every recorded event against the protocol's
    pulses. A first sample one sampling interval (``step``) after 0, as some rigs export,
    is no gap."""
    if not ((t < t_rec[0] - step - 1e-9) & ~masked).any():
        return None
    start = float(t_rec[0])
    last = float(t[(t < t_rec[0] - 1e-9) & ~masked][-1])
    return KingenError(f"the recorded time starts at {start:g} ms, not at 0 ms (the "
                       f"protocol's start): the protocol's samples from 0 to {last:g} ms have "
                       "no recorded data; time 0 of a recording is the start of the "
                       "protocol's sweep: shift the time column to start at 0 if the clock is "
                       f"offset, or add mask = [[0, {start:g}]] to the protocol's entry if "
                       "the recording begins late", file=rec.source, field=f"{where}.sweep",
                       value=label)


def refuse_all_before_the_pulses(proto: Protocol, sweeps: list[tuple[np.ndarray, np.ndarray]],
                                  rec: Recording, where: str) -> None:
    """Refuse a recording none of whose samples reach its sweep's first pulse: it holds no
    response to fit (a fit of it ends at fitness 1 with amplitude 0), and most often its
    time is in seconds under a ``time_ms`` header."""
    pulsed = [(onset(s, 0), float(t[-1])) for s, (t, _) in zip(proto.sweeps, sweeps,
                                                                 strict=True) if s.pulses]
    if not pulsed or any(end >= first for first, end in pulsed):
        return
    first, end = min(o for o, _ in pulsed), max(e for _, e in pulsed)
    likely = "check its time unit"
    for words, unit, factor in (("seconds", "s", 1e3), ("minutes", "min", 6e4)):
        if end > 0 and end * factor >= first:
            likely = (f"its time is likely in {words} under a ms header: name the column "
                      f"time_{unit}, or give the times in ms")
            break
    raise KingenError(f"no recorded sample reaches the first pulse (at {first:g} ms): the "
                      f"recording ends at {end:g} ms; {likely}", file=rec.source,
                      field=where)


def sweep_order(rec: Recording, proto: Protocol, where: str) -> list[int]:
    """The recorded sweep of each protocol sweep: by label where the recording's sweeps are
    labelled (a label that names no protocol sweep is refused), by position where they are
    only numbered."""
    labels = [s.label for s in proto.sweeps]
    recorded = rec.sweep_labels
    # by label only where labels name one sweep each: with a repeat (a protocol built in
    # Python), .index would give one recorded sweep to both protocol sweeps
    unique = len(set(labels)) == len(labels) and len(set(recorded)) == len(recorded)
    if rec.n_sweeps != proto.n_sweeps:
        raise KingenError(f"{rec.n_sweeps} recorded sweeps for a protocol of "
                          f"{proto.n_sweeps} ({', '.join(labels)})",
                          file=rec.source, field=where, value=proto.name)
    if rec.labelled and unique:
        stray = [lab for lab in recorded if lab not in labels]
        if stray:
            raise KingenError(
                f"this sweep label names no sweep of protocol '{proto.name}' (recorded: "
                f"{', '.join(recorded)}; protocol: {', '.join(labels)}): labelled sweeps "
                "are paired by label, so label each with its protocol sweep's label",
                file=rec.source, field=f"{where}.sweep", value=stray[0])
    if unique and sorted(recorded) == sorted(labels):
        return [recorded.index(lab) for lab in labels]
    return list(range(proto.n_sweeps))
