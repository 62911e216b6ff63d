"""Trace CSV: :func:`read_csv` and :func:`write_csv`, and the CSV table parsing that the
summary-target files share (see :mod:`kingen.experiment.recordings` for the format).
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kingen.base.files import atomic_write, check_replaceable, read_text
from kingen.errors import KingenError
from kingen.experiment.recordings.types import (
    MAX_CURRENT_PA,
    Recording,
    check_label,
    implausible_current,
)
from kingen.model import units

# --------------------------------------------------------------------------- CSV reading

@dataclass
class CsvTable:
    """A CSV file as read: its comments, header and columns (cells as text)."""

    name: str
    comments: list[str]
    header: list[str]
    columns: list[list[str]]
    first_row: int  # 1-based file line number of the first data row


def read_csv_table(path: Path) -> CsvTable:
    """Comments, header and columns of a CSV file (cells as text, trailing blanks kept)."""
    name = str(path)
    text = read_text(path, encoding="utf-8-sig")
    lines = text.splitlines()
    comments: list[str] = []
    i = 0
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
        if lines[i].strip():
            comments.append(lines[i].lstrip()[1:].strip())
        i += 1
    if i == len(lines):
        raise KingenError("no header row", file=name)
    reader = csv.reader(io.StringIO("\n".join(lines[i:])))
    try:
        rows = list(reader)
    except csv.Error as exc:  # e.g. a cell over the csv module's 128 KiB field limit
        raise KingenError(f"malformed CSV: {exc}", file=name,
                          field=f"row {i + reader.line_num}") from None
    header = [h.strip() for h in rows[0]]
    _check_separator(header[0], name)
    body = rows[1:]
    # Blank lines at the end of a file are not rows.
    while body and not any(c.strip() for c in body[-1]):
        body.pop()
    for k, row in enumerate(body):
        if len(row) != len(header):
            raise KingenError(f"{len(row)} fields where the header has {len(header)} "
                              "(mismatched column lengths)", file=name,
                              field=f"row {i + 2 + k}", value=",".join(row)[:60])
    columns = [list(col) for col in zip(*body, strict=True)] if body else [[] for _ in header]
    return CsvTable(name, comments, header, columns, i + 2)


# What a header's first cell holds when the file is separated by something else.
_OTHER_SEPARATORS = {
    ";": ("';' (as Excel writes CSV where the decimal mark is a comma)",
          "sep=';', decimal=','"),
    "\t": ("tabs", "sep='\\t'"),
}


def _check_separator(first: str, name: str) -> None:
    """Refuse a file whose columns are not separated by commas, in one line.

    Guessing the separator is not safe: a ';' file most often has decimal commas too
    ("0,02"), which cannot be told from a thousands separator, so like pandas and numpy the
    reader does not guess. No first column of a trace or targets file (``time_<unit>``,
    ``feature``, ...) can hold ';' or a tab, so no file that would read is refused."""
    for sep, (what, pandas) in _OTHER_SEPARATORS.items():
        if sep in first:
            raise KingenError(f"the columns seem to be separated by {what}; kingen reads "
                              "',' separated columns with '.' as the decimal mark: save "
                              f"the file that way (e.g. pandas: read_csv(path, {pandas})"
                              ".to_csv(new_path, index=False))", file=name,
                              field="header", value=first)


def parse_csv_column(table: CsvTable, j: int, *, allow_trailing_blank: bool, factor: float = 1.0,
                     unit: str = "", max_abs: float | None = None) -> np.ndarray:
    """A column as floats times ``factor`` (a unit conversion); trailing blank cells end it
    (a shorter sweep) when allowed; a value past ``max_abs`` (converted) is refused as a
    current no recording holds."""
    cells = table.columns[j]
    column = table.header[j]
    n = len(cells)
    if allow_trailing_blank:
        while n and not cells[n - 1].strip():
            n -= 1
    out = np.empty(n)
    for k in range(n):
        cell = cells[k].strip()
        row = table.first_row + k
        try:
            value = float(cell)
        except ValueError:
            what = "empty cell inside the column" if not cell else "not a number"
            raise KingenError(f"{what} (mismatched column lengths?)" if not cell else what,
                              file=table.name, field=f"{column} row {row}",
                              value=cell) from None
        if not math.isfinite(value):
            raise KingenError("NaN or infinite value", file=table.name,
                              field=f"{column} row {row}", value=cell)
        out[k] = converted_value(value, factor, unit, table.name, f"{column} row {row}", cell)
        if max_abs is not None and abs(out[k]) > max_abs:
            raise implausible_current(table.name, f"{column} row {row}", cell)
    return out


def converted_value(value: float, factor: float, unit: str, file: str, where: str, text: Any
               ) -> float:
    """``value * factor``, refused where the conversion overflows (as kingen.model.fields does)."""
    out = value * factor
    if not math.isfinite(out):
        raise KingenError(f"overflows once converted to {unit or 'internal units'} "
                          f"(x {factor:g})", file=file, field=where, value=text)
    return out


def split_column_name(column: str, table: str) -> tuple[str, str | None, str | None]:
    """``current_pA_5ms`` -> (``current``, ``pA``, ``5ms``)."""
    parts = column.split("_", 2)
    quantity = parts[0].lower()
    unit = parts[1] if len(parts) > 1 and parts[1] else None
    label = parts[2] if len(parts) > 2 and parts[2] else None
    return quantity, unit, label


_QUANTITY_KINDS = {"time": "time", "current": "current", "conc": "concentration",
                   "concentration": "concentration"}


def csv_unit_factor(table: CsvTable, column: str, kind: str, unit: str | None) -> float:
    """The factor to internal units of a column's ``unit``; KingenError where it has none."""
    if unit is None:
        example = {"time": "time_ms", "current": "current_pA",
                   "concentration": "conc_mM"}[kind]
        raise KingenError(f"unit missing from the column name (write e.g. {example})",
                          file=table.name, field="header", value=column)
    return units.factor(kind, unit, file=table.name, field=f"header {column!r} unit")


def _parse_comments(comments: list[str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"comments": list(comments)} if comments else {}
    for line in comments:
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key and " " not in key:
            meta[key] = _scalar(value.strip())
    return meta


def _scalar(text: str) -> Any:
    low = text.lower()
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    try:
        return float(text) if any(ch in text for ch in ".eE") else int(text)
    except ValueError:
        return text


def read_csv(path: str | os.PathLike[str]) -> Recording:
    """Read a trace CSV (see the module docstring for the format).

    Raises
    ------
    KingenError
        Naming the file, column and row of the first problem found.
    """
    table = read_csv_table(Path(path))
    name = table.name
    header = table.header
    quantity, unit, _ = split_column_name(header[0], name)
    if quantity != "time":
        raise KingenError("the first column must be the time, e.g. time_ms", file=name,
                          field="header", value=header[0])
    tf = csv_unit_factor(table, header[0], "time", unit)
    if not table.columns[0]:
        raise KingenError("no data rows (empty sweep)", file=name)
    time = parse_csv_column(table, 0, allow_trailing_blank=False, factor=tf, unit="ms")
    steps = np.diff(time)
    if np.any(steps <= 0):
        row = table.first_row + 1 + int(np.argmax(steps <= 0))
        raise KingenError("time does not increase", file=name, field=f"{header[0]} row {row}",
                          value=table.columns[0][row - table.first_row].strip())
    currents: dict[str, np.ndarray] = {}
    concs: dict[str, np.ndarray] = {}
    for j, column in enumerate(header[1:], start=1):
        check_label(column, name, "header")
        quantity, unit, label = split_column_name(column, name)
        kind = _QUANTITY_KINDS.get(quantity)
        if kind not in ("current", "concentration"):
            raise KingenError("unknown column (expected current_<unit>[_<label>] or "
                              "conc_<unit>[_<label>])", file=name, field="header",
                              value=column)
        f = csv_unit_factor(table, column, kind, unit)
        values = parse_csv_column(table, j, allow_trailing_blank=True, factor=f,
                                  unit=units.internal_unit(kind),
                                  max_abs=MAX_CURRENT_PA if kind == "current" else None)
        key = label if label is not None else "0"
        if values.size == 0:
            raise KingenError("empty sweep (no values)", file=name, field=column)
        target = currents if kind == "current" else concs
        if key in target:
            raise KingenError("duplicate sweep label", file=name, field="header", value=column)
        target[key] = values
    if not currents:
        raise KingenError("no current column (expected current_<unit>[_<label>])", file=name,
                          field="header", value=",".join(header))
    for key in concs:
        if key not in currents:
            raise KingenError("concentration column without a current column of that label",
                              file=name, field="header", value=key)
        if concs[key].size != currents[key].size:
            raise KingenError(f"{concs[key].size} concentration values for "
                              f"{currents[key].size} current values (mismatched column "
                              "lengths)", file=name, field="sweep", value=key)
    labels = list(currents)
    meta = _parse_comments(table.comments)
    conc_list = None
    if concs:
        if len(concs) != len(currents):
            missing = [k for k in labels if k not in concs]
            raise KingenError("some sweeps have a concentration column, others not", file=name,
                              field="sweep", value=missing[0])
        conc_list = [concs[k] for k in labels]
    holding = meta.get("holding_mV")
    return Recording(
        protocol=str(meta["protocol"]) if "protocol" in meta else None,
        time_ms=[time[: currents[k].size] for k in labels],
        current_pA=[currents[k] for k in labels],
        sweep_labels=labels,
        concentration_mM=conc_list,
        holding_mV=float(holding) if isinstance(holding, (int, float)) else None,
        source=name,
        meta=meta,
        # one unlabelled column (read as sweep '0') names no protocol sweep
        labelled=None if any(split_column_name(c, name)[2] is not None for c in header[1:])
        else False,
    )


def _shared_time(rec: Recording, path: str) -> np.ndarray:
    """The one time column of a CSV: the longest sweep's grid, if the others are prefixes."""
    times = rec.times_list()
    longest = max(times, key=lambda t: t.size)
    step = float(np.median(np.diff(longest))) if longest.size > 1 else 1.0
    for label, t in zip(rec.sweep_labels, times, strict=True):
        if not np.allclose(t, longest[: t.size], rtol=0.0, atol=1e-9 * step):
            raise KingenError("sweeps have different sampling grids; a CSV holds one time "
                              "column (write NWB instead)", file=path, field="sweep",
                              value=label)
    return longest


def _fmt(x: float) -> str:
    return repr(float(x))  # shortest text that reads back to the same float


def _header_line(header: list[str], path: str) -> str:
    """The header row as CSV text (a label with a comma or a quote is quoted), refused
    when two columns would read back as one sweep: :func:`read_csv` refuses such a file."""
    seen: dict[tuple[str, str], str] = {}
    for column in header[1:]:
        quantity, _, label = split_column_name(column.strip(), path)
        key = (quantity, label if label is not None else "0")
        if key in seen:
            raise KingenError(f"two sweeps would share the CSV column {column!r} (with "
                              f"{seen[key]!r}), which no reader can tell apart: give every "
                              "sweep its own label", file=path, field="sweep label",
                              value=key[1])
        seen[key] = column
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(header)
    return out.getvalue()


def write_csv(recording: Recording, path: str | os.PathLike[str]) -> None:
    """Write a recording as a trace CSV that :func:`read_csv` reads back exactly.

    One sweep gives ``time_ms,current_pA``; several give ``current_pA_<label>`` columns,
    then ``conc_mM_<label>`` columns when the concentration is known. ``protocol``,
    ``holding_mV`` and scalar ``meta`` entries become ``# key: value`` comments.
    """
    p = Path(path)
    name = str(p)
    time = _shared_time(recording, name)
    single = recording.n_sweeps == 1
    header = ["time_ms"]
    columns: list[np.ndarray] = []
    for label, _, current, _ in recording.sweeps():
        header.append("current_pA" if single else f"current_pA_{label}")
        columns.append(np.asarray(current))
    if recording.concentration_mM is not None:
        for label, _, _, conc in recording.sweeps():
            header.append("conc_mM" if single else f"conc_mM_{label}")
            columns.append(np.asarray(conc))
    comments = _comment_lines(recording)
    head = _header_line(header, name)

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            for line in comments:
                fh.write(f"# {line}\n")
            fh.write(head)
            for k, t in enumerate(time):
                cells = [_fmt(t)] + [_fmt(c[k]) if k < c.size else "" for c in columns]
                fh.write(",".join(cells) + "\n")

    atomic_write(p, write)


def write_current_csv(path: str | os.PathLike[str], protocol: Any, times: list[np.ndarray],
                      currents: list[np.ndarray]) -> None:
    """Write simulated currents: ``time_ms`` then one ``current_pA[_<sweep>]`` column per
    sweep of ``protocol``, atomically (the file ``kingen simulate --csv`` writes).

    Sweeps of different length leave their trailing cells empty.
    """
    from kingen._version import __version__

    longest = int(np.argmax([t.size for t in times]))
    grid = times[longest]
    if len(currents) == 1:
        names = ["current_pA"]
    else:
        names = [f"current_pA_{s.label}" for s in protocol.sweeps]
    path = Path(path)
    if not path.parent.exists():
        raise KingenError("folder does not exist", file=str(path.parent), field="--csv")
    check_replaceable(path, "--csv", kind="simulated csv")
    head = _header_line(["time_ms"] + names, str(path))

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            fh.write(f"# kingen {__version__} simulate\n"
                     f"# protocol: {_one_line(protocol.name)}\n")
            fh.write(head)
            for i, t in enumerate(grid):
                cells = [_fmt(t)]  # 6 digits made 10000.05 ms read back as 10000.1
                for c in currents:
                    cells.append(f"{c[i]:.9g}" if i < c.size else "")
                fh.write(",".join(cells) + "\n")

    atomic_write(path, write)


def _one_line(text: Any) -> str:
    """``text`` on one line: a line break inside a ``#`` comment would end the comment,
    and the reader would take the rest for the header."""
    return " ".join(str(text).splitlines())


def _comment_lines(rec: Recording) -> list[str]:
    lines = []
    meta = dict(rec.meta)
    for line in meta.pop("comments", []):
        key = line.partition(":")[0].strip()
        if key not in ("protocol", "holding_mV"):
            lines.append(line)
    seen = {line.partition(":")[0].strip() for line in lines}
    if rec.protocol is not None:
        lines.append(f"protocol: {rec.protocol}")
    if rec.holding_mV is not None:
        lines.append(f"holding_mV: {rec.holding_mV:g}")
    for key, value in meta.items():
        if key in seen or key in ("protocol", "holding_mV"):
            continue
        if isinstance(value, bool):
            lines.append(f"{key}: {'true' if value else 'false'}")
        elif isinstance(value, (int, float, str)) and len(str(value).splitlines()) <= 1:
            lines.append(f"{key}: {value}")
    return [_one_line(line) for line in lines]
