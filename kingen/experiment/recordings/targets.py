"""Summary-target files (feature CSV, dose-response and recovery tables): :func:`load_targets`."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kingen.errors import KingenError
from kingen.experiment.recordings.csv import (
    CsvTable,
    converted_value,
    parse_csv_column,
    read_csv_table,
    split_column_name,
)
from kingen.experiment.recordings.types import DoseResponseTable, RecoveryTable, Target, Targets
from kingen.model import units

# Feature keys of kingen.experiment.features with the kind of unit each carries
# (None: dimensionless).
FEATURE_KINDS: dict[str, str | None] = {
    "peak_pA": "current",
    "time_to_peak_ms": "time",
    "ss_to_peak": None,
    "end_to_peak": None,
    "tau_deact_ms": "time",
    "tau_des_ms": "time",
    "tau_rec_ms": "time",
    "ec50_peak_mM": "concentration",
    "ec50_ss_mM": "concentration",
    "hill_peak": None,
    "hill_ss": None,
}
_DIMENSIONLESS = ("", "1", "-", "none", "ratio")


def load_targets(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Targets:
    """Read summary targets: a feature CSV, a dose-response or a recovery table, or several.

    The kind of each file is told by its first column (``feature``, ``concentration_*`` or
    ``interval_*``); see the module docstring for the formats. Several files are merged,
    later ones winning.

    Raises
    ------
    KingenError
        If a file is missing or malformed (naming file, column and row).

    Examples
    --------
    >>> import kingen
    >>> targets = kingen.load_targets("tests/fixtures/data/targets.csv")
    >>> targets.values()["peak_pA"], targets.values()["tau_des_ms"]  # nA and s converted
    (-450.0, 9.0)
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = Targets()
    for p in paths:
        out = out.merge(_load_target_file(Path(p)))
    return out


# --------------------------------------------------------------------------- target files

def _load_target_file(path: Path) -> Targets:
    table = read_csv_table(path)
    first = table.header[0].lower()
    if first == "feature":
        return _feature_targets(table)
    if first.startswith("concentration") or first.startswith("conc_"):
        return _dose_table(table)
    if first.startswith("interval"):
        return _recovery_table(table)
    raise KingenError("unknown targets file: the first column must be 'feature', "
                      "'concentration_<unit>' or 'interval_<unit>'", file=table.name,
                      field="header", value=table.header[0])


def _canonical_feature(raw: str, table: CsvTable, row: int) -> tuple[str, str | None]:
    """(key of FEATURE_KINDS, unit given by the name's suffix or None)."""
    name = raw.strip()
    if name in FEATURE_KINDS:
        kind = FEATURE_KINDS[name]
        suffix = name.rsplit("_", 1)[1] if kind is not None else None
        return name, suffix
    for key, kind in FEATURE_KINDS.items():
        if kind is not None and key.rsplit("_", 1)[0] == name:
            return key, None
    known = ", ".join(k if v is None else k.rsplit("_", 1)[0] for k, v in FEATURE_KINDS.items())
    raise KingenError(f"unknown feature (use one of {known})", file=table.name,
                      field=f"feature row {row}", value=raw)


def _feature_targets(table: CsvTable) -> Targets:
    name = table.name
    cols = {h.lower(): j for j, h in enumerate(table.header)}
    if "value" not in cols:
        raise KingenError("missing column 'value' (header: feature,value,unit[,weight][,sd])",
                          file=name, field="header", value=",".join(table.header))
    if not table.columns[0]:
        raise KingenError("no data rows", file=name)
    features: dict[str, Target] = {}
    for k in range(len(table.columns[0])):
        row = table.first_row + k

        def cell(col: str, k: int = k) -> str:
            return table.columns[cols[col]][k].strip() if col in cols else ""

        key, suffix = _canonical_feature(cell("feature"), table, row)
        kind = FEATURE_KINDS[key]
        unit = cell("unit") or suffix
        if kind is None:
            if unit and unit.lower() not in _DIMENSIONLESS:
                raise KingenError("dimensionless feature takes no unit", file=name,
                                  field=f"unit row {row}", value=unit)
            f = 1.0
        else:
            if not unit:
                raise KingenError(f"unit missing for {key.rsplit('_', 1)[0]} (a {kind} unit, "
                                  "e.g. " + key.rsplit('_', 1)[1] + ")", file=name,
                                  field=f"unit row {row}", value=cell("feature"))
            if suffix and cell("unit") and suffix != unit:
                raise KingenError(f"the feature name says {suffix}, the unit column {unit}",
                                  file=name, field=f"unit row {row}", value=unit)
            f = units.factor(kind, unit, file=name, field=f"unit row {row}")
        unit_in = units.internal_unit(kind) if kind else ""
        value = converted_value(_number(cell("value"), name, f"value row {row}"), f, unit_in, name,
                                f"value row {row}", cell("value"))
        weight_text = cell("weight")
        weight = _number(weight_text, name, f"weight row {row}") if weight_text else 1.0
        if weight < 0:
            raise KingenError("weight must be >= 0", file=name, field=f"weight row {row}",
                              value=weight_text)
        sd_text = cell("sd")
        sd = abs(converted_value(_number(sd_text, name, f"sd row {row}"), f, unit_in, name,
                                 f"sd row {row}", sd_text)) if sd_text else None
        if key in features:
            raise KingenError("feature given twice", file=name, field=f"feature row {row}",
                              value=key)
        features[key] = Target(value, weight, sd)
    return Targets(features=features, sources=[name])


def _number(text: str, file: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise KingenError("not a number", file=file, field=where, value=text) from None
    if not math.isfinite(value):
        raise KingenError("NaN or infinite value", file=file, field=where, value=text)
    return value


def _table_column(table: CsvTable, j: int, kind: str | None) -> np.ndarray:
    column = table.header[j]
    if kind is None:
        f = 1.0
    else:
        _, unit, _ = split_column_name(column, table.name)
        if unit is None:
            raise KingenError(f"unit missing from the column name (write e.g. "
                              f"{column}_{units.internal_unit(kind)})", file=table.name,
                              field="header", value=column)
        f = units.factor(kind, unit, file=table.name, field=f"header {column!r} unit")
    values = parse_csv_column(table, j, allow_trailing_blank=False, factor=f,
                              unit=units.internal_unit(kind) if kind else "")
    if values.size == 0:
        raise KingenError("no data rows", file=table.name, field=column)
    return values


def _dose_table(table: CsvTable) -> Targets:
    heads = [h.split("_", 1)[0].lower() for h in table.header]
    if "peak" not in heads:
        raise KingenError("missing column peak_<unit> (header: concentration_mM,peak_pA"
                          "[,ss_pA])", file=table.name, field="header",
                          value=",".join(table.header))
    conc = _table_column(table, 0, "concentration")
    peak = _table_column(table, heads.index("peak"), "current")
    ss = _table_column(table, heads.index("ss"), "current") if "ss" in heads else None
    if np.any(conc <= 0):
        row = table.first_row + int(np.argmax(conc <= 0))
        raise KingenError("concentration must be > 0", file=table.name,
                          field=f"{table.header[0]} row {row}", value=float(conc.min()))
    return Targets(dose_response=DoseResponseTable(conc, peak, ss), sources=[table.name])


def _recovery_table(table: CsvTable) -> Targets:
    heads = [h.lower() for h in table.header]
    if "ratio" not in heads:
        raise KingenError("missing column 'ratio' (header: interval_ms,ratio)",
                          file=table.name, field="header", value=",".join(table.header))
    interval = _table_column(table, 0, "time")
    ratio = _table_column(table, heads.index("ratio"), None)
    if np.any(interval < 0):
        row = table.first_row + int(np.argmax(interval < 0))
        raise KingenError("interval must be >= 0", file=table.name,
                          field=f"{table.header[0]} row {row}", value=float(interval.min()))
    return Targets(recovery=RecoveryTable(interval, ratio), sources=[table.name])
