"""Axon ABF recordings (ABF1 and ABF2): :func:`read_abf`, through pyabf (the ``abf`` extra)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.experiment.recordings.types import Recording, check_sweep, install_hint, optional_module
from kingen.model import units

ABF_INSTALL = install_hint("pyabf", "abf")


# --------------------------------------------------------------------------- ABF


def read_abf(path: str | os.PathLike[str], *, channel: int = 0) -> Recording:
    """Read every sweep of one channel of an Axon ABF file (ABF1 or ABF2).

    The channel's units (``sweepUnitsY``) must be a current (pA, nA, ...): converted to pA.
    Times (s in the file) become ms from each sweep's start. The holding potential is the
    command waveform's first sample when the command is in mV. The header's protocol name,
    sample rate, version and date are kept in ``meta``.
    """
    name = str(path)
    pyabf = optional_module("pyabf", "abf", name)
    abf = _open_abf(pyabf, name)
    if not 0 <= channel < abf.channelCount:
        raise KingenError(f"no such channel (the file has {abf.channelCount})", file=name,
                          field="channel", value=channel)
    currents, times = [], []
    holding = None
    try:
        for s in abf.sweepList:
            abf.setSweep(s, channel=channel)
            if s == 0:
                unit = str(abf.sweepUnitsY)
                f = units.factor("current", unit, file=name, field=f"channel {channel} units")
                holding = _abf_holding(abf)
            with np.errstate(over="ignore", invalid="ignore"):
                currents.append(np.asarray(abf.sweepY, dtype=float) * f)
                times.append(np.asarray(abf.sweepX, dtype=float) * 1e3 - abf.sweepX[0] * 1e3)
            check_sweep(times[-1], currents[-1], name, f"sweep {s} channel {channel}")
    except KingenError:
        raise
    except Exception as exc:  # noqa: BLE001 -- truncated data surface as assorted errors
        raise KingenError(f"cannot read ABF sweeps: {type(exc).__name__}: {exc}",
                          file=name) from None
    if not currents:
        raise KingenError("no sweeps in the file", file=name)
    meta = {"abf_protocol": str(abf.protocol), "sample_rate_hz": float(abf.sampleRate),
            "abf_version": str(abf.abfVersionString), "channel": channel,
            "channel_name": str(abf.adcNames[channel]),
            "recorded": str(getattr(abf, "abfDateTime", ""))}
    return Recording(protocol=None, time_ms=times, current_pA=currents,
                     sweep_labels=[str(s) for s in abf.sweepList], holding_mV=holding,
                     source=name, meta=meta, labelled=False)  # sweep numbers: positions


_SIGNATURES = (b"ABF ", b"ABF2")  # ABF1, ABF2: the first 4 bytes, as pyabf tells them


def _open_abf(pyabf: Any, name: str) -> Any:
    """The file opened by pyabf, data loaded; one-line errors for a file that is no ABF,
    and for a truncated or damaged one, which pyabf reports only as ``struct.error:
    unpack requires a buffer of 4 bytes`` or a failed reshape."""
    try:
        with open(name, "rb") as fh:
            signature = fh.read(4)
        size = os.path.getsize(name)
    except OSError as exc:
        raise KingenError(f"cannot read: {exc.strerror or exc}", file=name) from None
    if size == 0:
        raise KingenError("cannot read ABF: empty file (0 bytes)", file=name)
    damaged = "truncated or damaged ABF file"
    if size < 4 and any(sig.startswith(signature) for sig in _SIGNATURES):
        raise KingenError(f"{damaged}: {size} bytes", file=name)
    if signature not in _SIGNATURES:
        raise KingenError(f"cannot read ABF: not an ABF file (it begins with {signature!r}, "
                          "not 'ABF ' or 'ABF2')", file=name)
    try:
        head = pyabf.ABF(name, loadData=False)
    except Exception as exc:  # noqa: BLE001 -- pyabf raises many types on a bad header
        raise KingenError(f"{damaged}: its header cannot be read ({size} bytes; pyabf: "
                          f"{_named(exc)})", file=name) from None
    try:
        end = int(head.dataByteStart) + int(head.dataPointCount) * int(head.dataPointByteSize)
    except (AttributeError, TypeError, ValueError):
        end = None
    if end is not None and end > size:
        raise KingenError(f"{damaged}: its header places the samples up to byte {end}, but "
                          f"the file has {size} bytes", file=name)
    try:
        return pyabf.ABF(name)
    except Exception as exc:  # noqa: BLE001 -- pyabf raises many types on bad data
        raise KingenError(f"{damaged}: its data cannot be read (pyabf: {_named(exc)})",
                          file=name) from None


def _named(exc: Exception) -> str:
    """``struct.error: unpack requires ...``: the bare class name ``error`` says nothing."""
    kind = type(exc)
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    return f"{module}{kind.__name__}: {exc}"


def _abf_holding(abf: Any) -> float | None:
    try:
        unit = str(abf.sweepUnitsC)
        command = abf.sweepC
        return float(command[0]) * units.factor("voltage", unit) if len(command) else None
    except (KingenError, AttributeError, ValueError, IndexError):
        return None
