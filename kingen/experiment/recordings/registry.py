"""The importer registry: recording readers keyed by file suffix, and :func:`load_recording`.

Each format's module provides a reader (``read_csv``, ``read_nwb``, ``read_abf``); the
registry maps a suffix to it, so that :func:`load_recording` dispatches on the file name
(or an explicit ``format``). :func:`register_reader` adds a format (or replaces one).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path

from kingen.errors import KingenError
from kingen.experiment.recordings.abf import read_abf
from kingen.experiment.recordings.csv import read_csv
from kingen.experiment.recordings.nwb import read_nwb
from kingen.experiment.recordings.types import Recording

Reader = Callable[..., Recording]

# suffix (".csv") -> (reader, whether it takes a `channel` keyword)
_READERS: dict[str, tuple[Reader, bool]] = {}


def _suffix(suffix: str) -> str:
    s = suffix.strip().lower()
    return s if s.startswith(".") else "." + s


def register_reader(suffix: str, reader: Reader) -> None:
    """Read files ending in ``suffix`` (e.g. ``".csv"``) with ``reader(path) -> Recording``.

    A reader that takes a ``channel`` keyword is passed the channel asked for.
    """
    key = _suffix(suffix)
    if key == ".":
        raise ValueError("a reader needs a non-empty suffix")
    try:
        takes_channel = "channel" in inspect.signature(reader).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        takes_channel = False
    _READERS[key] = (reader, takes_channel)


def reader_suffixes() -> tuple[str, ...]:
    """The suffixes a reader is registered for, in registration order."""
    return tuple(_READERS)


def _known() -> str:
    known = list(_READERS)
    return known[0] if len(known) == 1 else f"{', '.join(known[:-1])} or {known[-1]}"


def load_recording(
    path: str | os.PathLike[str],
    *,
    protocol: str | None = None,
    format: str | None = None,
    channel: int = 0,
) -> Recording:
    """Read a recording from CSV, NWB or ABF, converted to ms, pA, mM, mV.

    Parameters
    ----------
    path
        The file.
    protocol
        The protocol the sweeps belong to; overrides what the file says.
    format
        ``csv``, ``nwb`` or ``abf`` (any registered suffix); by default from the suffix.
    channel
        ABF input channel to read (ignored for other formats).

    Raises
    ------
    KingenError
        If the file is missing, of unknown format, malformed, or needs an extra that is not
        installed.

    Examples
    --------
    >>> import kingen
    >>> rec = kingen.load_recording("data/deactivation.csv")
    >>> rec.protocol, rec.sweep_labels, rec.meta["synthetic"]
    ('deactivation', ['0'], True)
    """
    name = str(path)
    p = Path(name)
    fmt = (format or p.suffix.lstrip(".")).lower()
    entry = _READERS.get("." + fmt) if fmt else None
    if entry is None:
        raise KingenError(f"unknown recording format (use {_known()})", file=name,
                          field="format", value=fmt or p.suffix)
    if not p.is_file():
        raise KingenError("recording file not found", file=name)
    reader, takes_channel = entry
    rec = reader(p, channel=channel) if takes_channel else reader(p)
    if protocol is not None:
        rec.protocol = protocol
    return rec


register_reader(".csv", read_csv)
register_reader(".nwb", read_nwb)
register_reader(".abf", read_abf)

# The built-in formats (names without the dot).
FORMATS = ("csv", "nwb", "abf")
