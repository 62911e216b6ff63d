"""The recording types: voltage-clamp sweeps (:class:`Recording`), summary targets
(:class:`Targets` and its tables), and the checks every reader applies to a sweep.
"""

from __future__ import annotations

import importlib
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kingen.errors import KingenError

MAX_CURRENT_PA = 1e9
"""The largest current magnitude a recording may hold, pA (1 mA): beyond any voltage-clamp
recording of a cell (a patch reaches nanoamperes, a two-electrode clamp of an oocyte tens of
microamperes). A larger value is a unit or export mistake, refused at load; it would also
overflow when squared (past 1e154 pA) in the fit's error."""

# --------------------------------------------------------------------------- data classes

ArrayOrList = np.ndarray | list[np.ndarray]


@dataclass
class Recording:
    """Voltage-clamp sweeps of one experiment, in internal units.

    Attributes
    ----------
    protocol
        Name of the protocol the sweeps belong to (None when the file does not say).
    time_ms
        Sample times from the start of each sweep, ms: one array (n_samples,) shared by all
        sweeps, or a list of per-sweep arrays when sweeps differ in length or grid.
    current_pA
        Currents, pA: an array (n_sweeps, n_samples), or a list of 1-D arrays.
    sweep_labels
        One label per sweep (column suffixes in CSV, series names in NWB, sweep numbers in
        ABF).
    concentration_mM
        The agonist concentration of every sample, mM, shaped like ``current_pA``; or None.
    holding_mV
        Holding potential, mV, when the file records it.
    source
        The file read (or ``<memory>``).
    meta
        Anything else worth keeping, e.g. ``{"synthetic": True}``, ABF header fields.
    labelled
        Whether ``sweep_labels`` name the protocol's sweeps (a fit pairs such sweeps by
        label only) or only number them (paired by position). None: labelled unless the
        labels are missing or are the sweep numbers ``0, 1, ...``.

    Examples
    --------
    >>> import numpy as np
    >>> Recording("recovery", np.arange(3.0), np.zeros((2, 3)), ["100ms", "5ms"]).labelled
    True
    >>> Recording("recovery", np.arange(3.0), np.zeros((2, 3)), []).labelled
    False
    """

    protocol: str | None
    time_ms: ArrayOrList
    current_pA: ArrayOrList
    sweep_labels: list[str]
    concentration_mM: ArrayOrList | None = None
    holding_mV: float | None = None
    source: str = "<memory>"
    meta: dict[str, Any] = field(default_factory=dict)
    labelled: bool | None = None

    def __post_init__(self) -> None:
        currents = _rows(self.current_pA)
        times = (_rows(self.time_ms) if _is_per_sweep(self.time_ms, len(currents))
                 else [np.asarray(self.time_ms, dtype=float)[: c.size] for c in currents])
        if len(times) != len(currents):
            raise KingenError(f"{len(times)} time arrays for {len(currents)} sweeps",
                              file=self.source, field="time_ms")
        for i, (t, c) in enumerate(zip(times, currents, strict=True)):
            if t.size != c.size:
                raise KingenError(f"{t.size} times for {c.size} current samples",
                                  file=self.source, field=f"current_pA[{i}]")
        concs = None if self.concentration_mM is None else _rows(self.concentration_mM)
        if concs is not None:
            if len(concs) != len(currents) or any(a.size != b.size
                                                 for a, b in zip(concs, currents, strict=True)):
                raise KingenError("concentration must have the shape of the current",
                                  file=self.source, field="concentration_mM")
        numbers = [str(i) for i in range(len(currents))]
        if not self.sweep_labels:
            self.sweep_labels = numbers
        self.sweep_labels = [str(s) for s in self.sweep_labels]
        if self.labelled is None:
            # sweep numbers (ABF, a CSV's unlabelled column, a list built in Python) say
            # nothing of which protocol sweep a recorded sweep is
            self.labelled = self.sweep_labels != numbers
        self.labelled = bool(self.labelled)
        if len(self.sweep_labels) != len(currents):
            raise KingenError(f"{len(self.sweep_labels)} labels for {len(currents)} sweeps",
                              file=self.source, field="sweep_labels")
        # Store the compact form whenever all sweeps share one grid, lists otherwise.
        same = all(t.size == times[0].size and np.array_equal(t, times[0]) for t in times)
        if same:
            self.time_ms = times[0]
            self.current_pA = np.vstack(currents) if currents else np.zeros((0, 0))
            self.concentration_mM = None if concs is None else np.vstack(concs)
        else:
            self.time_ms, self.current_pA, self.concentration_mM = times, currents, concs

    @property
    def n_sweeps(self) -> int:
        """Number of sweeps."""
        return len(self.sweep_labels)

    def sweep_time(self, i: int) -> np.ndarray:
        """Sample times of sweep ``i``, ms."""
        return self.time_ms[i] if isinstance(self.time_ms, list) else self.time_ms

    def sweep_current(self, i: int) -> np.ndarray:
        """Current of sweep ``i``, pA."""
        return self.current_pA[i]

    def sweep_concentration(self, i: int) -> np.ndarray | None:
        """Agonist concentration of sweep ``i``, mM, or None."""
        return None if self.concentration_mM is None else self.concentration_mM[i]

    def sweeps(self) -> Iterator[tuple[str, np.ndarray, np.ndarray, np.ndarray | None]]:
        """Yield ``(label, time_ms, current_pA, concentration_mM or None)`` per sweep."""
        for i, label in enumerate(self.sweep_labels):
            yield label, self.sweep_time(i), self.sweep_current(i), self.sweep_concentration(i)

    def times_list(self) -> list[np.ndarray]:
        """Per-sweep time arrays (for :func:`kingen.experiment.features.protocol_features`)."""
        return [self.sweep_time(i) for i in range(self.n_sweeps)]

    def currents_list(self) -> list[np.ndarray]:
        """Per-sweep current arrays."""
        return [np.asarray(self.sweep_current(i)) for i in range(self.n_sweeps)]


def _rows(x: Any) -> list[np.ndarray]:
    if isinstance(x, np.ndarray):
        return [np.asarray(r, dtype=float) for r in (x[None, :] if x.ndim == 1 else x)]
    return [np.asarray(r, dtype=float).ravel() for r in x]


def _is_per_sweep(t: Any, n_sweeps: int) -> bool:
    if isinstance(t, np.ndarray):
        return t.ndim == 2
    return bool(len(t)) and np.ndim(t[0]) == 1


@dataclass(frozen=True)
class Target:
    """One summary target: a value in internal units, its weight and standard deviation."""

    value: float
    weight: float = 1.0
    sd: float | None = None


@dataclass
class DoseResponseTable:
    """Measured dose-response: responses (pA, signed) per concentration (mM)."""

    concentration_mM: np.ndarray
    peak_pA: np.ndarray
    ss_pA: np.ndarray | None = None


@dataclass
class RecoveryTable:
    """Measured recovery: I2/I1 per interval (ms, first pulse end to second pulse start)."""

    interval_ms: np.ndarray
    ratio: np.ndarray


@dataclass
class Targets:
    """Summary targets: features (keys of ``protocol_features``) and measured tables."""

    features: dict[str, Target] = field(default_factory=dict)
    dose_response: DoseResponseTable | None = None
    recovery: RecoveryTable | None = None
    sources: list[str] = field(default_factory=list)

    def merge(self, other: Targets) -> Targets:
        """Both sets of targets; ``other`` wins where both give the same feature or table."""
        return Targets({**self.features, **other.features},
                       other.dose_response or self.dose_response,
                       other.recovery or self.recovery, self.sources + other.sources)

    def values(self) -> dict[str, Any]:
        """Target values keyed like ``protocol_features`` (tables as lists of rows)."""
        out: dict[str, Any] = {k: t.value for k, t in self.features.items()}
        if self.recovery is not None:
            out["recovery"] = [[float(a), float(b)] for a, b in
                               zip(self.recovery.interval_ms, self.recovery.ratio, strict=True)]
        if self.dose_response is not None:
            d = self.dose_response
            ss = d.ss_pA if d.ss_pA is not None else np.full(d.peak_pA.size, np.nan)
            rows = zip(d.concentration_mM, d.peak_pA, ss, strict=True)
            out["dose_response"] = [[float(a), float(b), float(c)] for a, b, c in rows]
        return out


def check_sweep(time_ms: np.ndarray, current_pA: np.ndarray, file: str, where: str, *,
                max_abs: float | None = MAX_CURRENT_PA) -> None:
    """The checks every reader applies to a sweep in internal units: samples present, every
    time and current finite, the current within ``max_abs`` (:data:`MAX_CURRENT_PA`; None:
    no bound, for a concentration), time increasing. (CSV makes the same checks cell by
    cell, to name the row.)"""
    if current_pA.size == 0:
        raise KingenError("empty sweep (no samples)", file=file, field=where)
    for what, values in (("current", current_pA), ("time", time_ms)):
        bad = ~np.isfinite(values)
        if bad.any():
            k = int(np.argmax(bad))
            raise KingenError(f"NaN or infinite value in the {what} (in internal units)",
                              file=file, field=f"{where} sample {k}", value=float(values[k]))
    if max_abs is not None:
        big = np.abs(current_pA) > max_abs
        if big.any():
            k = int(np.argmax(big))
            raise implausible_current(file, f"{where} sample {k}", float(current_pA[k]))
    steps = np.diff(time_ms)
    if np.any(steps <= 0):
        k = int(np.argmax(steps <= 0)) + 1
        raise KingenError("time does not increase", file=file, field=f"{where} sample {k}",
                          value=float(time_ms[k]))


def implausible_current(file: str, field: str, value: Any) -> KingenError:
    """The error for a current beyond :data:`MAX_CURRENT_PA`."""
    return KingenError(f"a current beyond any voltage-clamp recording (more than "
                       f"{MAX_CURRENT_PA:g} pA, 1 mA, in magnitude): check its unit",
                       file=file, field=field, value=value)


def check_label(label: str, file: str, field: str, value: Any = None) -> None:
    r"""Refuse a sweep label read from a file that holds a control character or text that
    is not valid UTF-8.

    A label names a CSV column and an NWB series and is stored in the run file: a tab or
    line break splits a CSV header, and text that is not UTF-8 (an undecodable byte, which
    h5py hands over as a lone surrogate) cannot be written anywhere. The rule is the one
    protocol files follow (a no-break space, as in a pasted "10 µM", is fine).

    Examples
    --------
    >>> check_label("10\u00a0µM", "r.csv", "header")
    >>> try:
    ...     check_label("a\tb", "r.csv", "header", "current_pA_a\tb")
    ... except KingenError as exc:
    ...     print(exc)  # doctest: +NORMALIZE_WHITESPACE
    r.csv: header = 'current_pA_a\tb': sweep label holds a control character ('\t'): write
    labels without tabs or line breaks
    """
    shown = label if value is None else value
    for ch in label:
        kind = unicodedata.category(ch)
        if kind == "Cs":
            raise KingenError("sweep label is not valid UTF-8 text", file=file, field=field,
                              value=shown)
        if kind in ("Cc", "Zl", "Zp"):
            raise KingenError(f"sweep label holds a control character ({ch!r}): write labels "
                              "without tabs or line breaks", file=file, field=field,
                              value=shown)


def install_hint(module: str, extra: str) -> str:
    """What to tell a user who lacks the optional ``module`` of a file format."""
    return f"{module} is not installed: pip install 'kingen[{extra}]'"


def optional_module(module: str, extra: str, file: str) -> Any:
    """``import module`` for a reader of the ``extra`` file format (abf, nwb), or a
    KingenError naming ``file`` and saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise KingenError(install_hint(module, extra), file=file, field="format",
                          value=extra) from None
